"""OTLP/protobuf requests -> ``SpanRecord``: the request's bytes through the private classes
(:func:`decode_protobuf`), or an already parsed official message (:func:`decode_request_message`)."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Any

from google.protobuf.message import DecodeError as _ProtobufDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans as _ScopeSpans

from ...core.spans import KIND_CONSUMER, KIND_UNSPECIFIED, STATUS_ERROR, STATUS_UNSET, SpanRecord
from .attributes import _pb_attrs, _raw_attrs
from .common import (LIMITS, _ERR_LINK_SPAN_ID, _ERR_LINK_TRACE_ID, _ERR_PARENT_ID, _ERR_SPAN_ID, _ERR_TIME,
                     _ERR_TRACE_ID, _INT64_MAX, _MAX_NAME, _ZERO_SPAN, _ZERO_TRACE, DecodeError, DecodeResult,
                     _bound_str)
from .messages import _FastRequest

def decode_protobuf(data: bytes, source: str = "otlp") -> DecodeResult:
    """Decode a serialized ``ExportTraceServiceRequest``."""
    try:
        msg = _FastRequest.FromString(data)
    except (_ProtobufDecodeError, RecursionError) as exc:
        # upb's message names our private copy of the type; keep only its detail, if any.
        detail = str(exc).partition("': ")[2]
        raise DecodeError(
            "invalid protobuf: not a parsable ExportTraceServiceRequest"
            + (f" ({detail})" if detail else " (truncated, corrupt or not protobuf)")
        ) from None
    except TypeError as exc:  # not bytes-like
        raise DecodeError(f"invalid protobuf: {exc}") from None
    return _decode_pb(msg, source, _raw_attrs, _fast_scope_spans)


def decode_request_message(msg: ExportTraceServiceRequest, source: str = "otlp") -> DecodeResult:
    """Decode an already parsed ``ExportTraceServiceRequest`` (the gRPC path).

    Given the request's bytes, :func:`decode_protobuf` is faster.
    """
    return _decode_pb(msg, source, _pb_attrs, _pb_scope_spans)


def _fast_scope_spans(rs: Any) -> Any:
    return rs.scope_spans or rs.instrumentation_library_spans


def _pb_scope_spans(rs: Any) -> Any:
    scope_spans = rs.scope_spans
    if scope_spans:
        return scope_spans
    # Spans under the removed ``instrumentation_library_spans`` field (1000) are unknown
    # fields to the current classes; InstrumentationLibrarySpans is wire-compatible with
    # ScopeSpans (library name and version are fields 1 and 2 like the scope's).
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet
    except ImportError:  # protobuf < 4.24
        return ()
    try:
        return [
            _ScopeSpans.FromString(f.data)
            for f in UnknownFieldSet(rs)
            if f.field_number == 1000 and f.wire_type == 2
        ]
    except _ProtobufDecodeError as exc:
        raise DecodeError(f"invalid protobuf: instrumentation_library_spans: {exc}") from None


# SpanRecord's fields in declaration order, so the hot loop can construct it positionally
# (cheaper than keywords, and it runs once a span); if records.py ever reorders them, the
# keyword form below takes over instead of silently mixing fields up.
_RECORD_ORDER = (
    "trace_id", "span_id", "parent_span_id", "service", "name", "kind", "start_ns", "end_ns",
    "status", "status_message", "attributes", "resource", "events", "source", "scope",
)  # fmt: skip


def _record_by_keyword(*args: Any) -> SpanRecord:
    return SpanRecord(**dict(zip(_RECORD_ORDER, args)))


if tuple(f.name for f in dataclass_fields(SpanRecord))[: len(_RECORD_ORDER)] == _RECORD_ORDER:
    _make_record: Any = SpanRecord
else:  # pragma: no cover - only if records.py changes
    _make_record = _record_by_keyword


def _decode_pb(msg: Any, source: str, attrs: Any, scope_spans_of: Any) -> DecodeResult:
    spans: list[SpanRecord] = []
    append = spans.append
    rejected = 0
    errors: dict[str, None] = {}
    zero_trace = _ZERO_TRACE
    zero_span = _ZERO_SPAN
    max_name = _MAX_NAME
    safe_chars = LIMITS.safe_chars
    record = _make_record

    for rs in msg.resource_spans:
        resource = attrs(rs.resource.attributes)
        service_name = resource.get("service.name")
        service = "unknown" if service_name is None or service_name == "" else str(service_name)
        for ss in scope_spans_of(rs):
            scope = ss.scope.name
            for sp in ss.spans:
                tid = sp.trace_id
                if len(tid) != 16 or tid == zero_trace:
                    rejected += 1
                    errors[_ERR_TRACE_ID] = None
                    continue
                sid = sp.span_id
                if len(sid) != 8 or sid == zero_span:
                    rejected += 1
                    errors[_ERR_SPAN_ID] = None
                    continue
                pid = sp.parent_span_id
                if not pid or pid == zero_span:
                    parent = None
                elif len(pid) == 8:
                    parent = pid.hex()
                else:
                    rejected += 1
                    errors[_ERR_PARENT_ID] = None
                    continue
                name = sp.name
                if len(name) > max_name:
                    name = name[:max_name]
                kind = sp.kind
                if kind > KIND_CONSUMER or kind < 0:  # a kind from a newer proto
                    kind = KIND_UNSPECIFIED
                start = sp.start_time_unix_nano
                end = sp.end_time_unix_nano
                if end < start:
                    end = start
                if end > _INT64_MAX:
                    rejected += 1
                    errors[_ERR_TIME] = None
                    continue
                if sp.HasField("status"):
                    st = sp.status
                    code = st.code
                    if code > STATUS_ERROR or code < 0:
                        code = STATUS_UNSET
                    message = st.message
                    if len(message) > safe_chars:
                        message = _bound_str(message)
                else:
                    code = STATUS_UNSET
                    message = ""
                sp_events = sp.events
                if sp_events:
                    events = [
                        {
                            "name": ev.name,
                            "time_unix_nano": ev.time_unix_nano,
                            "attributes": attrs(ev.attributes),
                        }
                        for ev in sp_events
                    ]
                else:
                    events = []
                sp_links = sp.links
                if sp_links:
                    links = _pb_links(sp_links, attrs)
                    if type(links) is str:
                        rejected += 1
                        errors[links] = None
                        continue
                else:
                    links = None
                rec = record(
                    tid.hex(),
                    sid.hex(),
                    parent,
                    service,
                    name,
                    kind,
                    start,
                    end,
                    code,
                    message,
                    attrs(sp.attributes),
                    resource,
                    events,
                    source,
                    scope,
                )
                if links:
                    rec.links = links
                append(rec)
    return DecodeResult(spans, rejected, list(errors))


def _pb_links(links: Any, attrs: Any) -> list[dict[str, Any]] | str:
    """A span's links as ``[{trace_id, span_id, attributes}]``, or the error that rejects it.

    Empty ids are kept as zeros: the SDKs export a link to an invalid context (all-zero
    ids) when it carries attributes, and the specification asks to record it.
    """
    out = []
    for ln in links:
        tid = ln.trace_id
        if len(tid) != 16:
            if tid:
                return _ERR_LINK_TRACE_ID
            tid = _ZERO_TRACE
        sid = ln.span_id
        if len(sid) != 8:
            if sid:
                return _ERR_LINK_SPAN_ID
            sid = _ZERO_SPAN
        out.append({"trace_id": tid.hex(), "span_id": sid.hex(), "attributes": attrs(ln.attributes)})
    return out
