"""Cloud Trace (v1 API) spans -> ``SpanRecord``: what the poller (``cloud_trace.py``) writes.

Mapping (docs/design.md, "Cloud Trace mapping"): uint64 ids -> 16 lowercase hex digits;
``RPC_SERVER`` -> SERVER, ``RPC_CLIENT`` -> CLIENT, unspecified -> INTERNAL; labels ->
attributes (values of known numeric keys coerced to numbers, ``cache.hit`` to a bool);
``/http/status_code`` >= 500 or an error label -> status ERROR; the service from the
``service.name`` label, else ``g.co/r/*/container_name`` or ``g.co/gae/app/module``, else
``/component``, else ``unknown``. ``source`` is ``cloud-trace``.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any

from ..core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, STATUS_ERROR, STATUS_OK, STATUS_UNSET, SpanRecord
from ..durations import NS

__all__ = ["BOOL_KEYS", "NUMERIC_KEYS", "SOURCE", "coerce_label", "instance_of", "normalize_trace_id",
           "service_of", "span_record", "trace_records"]

SOURCE = "cloud-trace"

#: Label keys whose values are numbers (Cloud Trace labels are all strings).
NUMERIC_KEYS = frozenset({
    "mm.image_count", "mm.audio_count", "mm.prompt_chars", "batch.size",
    "/http/status_code", "http.status_code", "http.response.status_code",
    "/http/request/size", "/http/response/size", "http.request.body.size", "http.response.body.size",
    "rpc.grpc.status_code", "server.port", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
    "gen_ai.request.max_tokens", "gen_ai.request.temperature", "gen_ai.request.top_p",
    "mm.image_width", "mm.image_height", "mm.image_bytes",
})
#: Label keys whose values are booleans.
BOOL_KEYS = frozenset({"cache.hit"})
_STATUS_KEYS = ("/http/status_code", "http.response.status_code", "http.status_code")
_ERROR_MESSAGE_KEYS = ("/error/message", "otel.status_description", "error.message", "exception.message")
_KINDS = {1: KIND_SERVER, 2: KIND_CLIENT}  # TraceSpan.SpanKind: RPC_SERVER=1, RPC_CLIENT=2
_MAX_U64 = (1 << 64) - 1
_MAX_I64 = (1 << 63) - 1


def coerce_label(key: str, value: str) -> Any:
    """A label value as an attribute: numbers for NUMERIC_KEYS, bools for BOOL_KEYS, else the string."""
    if key in NUMERIC_KEYS:
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                return value
            return f if math.isfinite(f) else value
    if key in BOOL_KEYS:
        low = value.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
    return value


def service_of(labels: dict[str, str]) -> str:
    """``service.name``, else ``g.co/r/*/container_name`` or ``g.co/gae/app/module``, else ``/component``."""
    name = labels.get("service.name")
    if name:
        return name
    for key in sorted(labels):
        if key.startswith("g.co/r/") and key.endswith("/container_name") and labels[key]:
            return labels[key]
    for key in ("g.co/gae/app/module", "/component"):
        if labels.get(key):
            return labels[key]
    return "unknown"


def instance_of(labels: dict[str, str]) -> str | None:
    value = labels.get("service.instance.id")
    if value:
        return value
    for pattern in ("g.co/r/*/pod_name", "g.co/r/*/pod_id", "g.co/r/*/instance_id", "g.co/gae/app/instance"):
        for key in sorted(labels):
            if fnmatch.fnmatchcase(key, pattern) and labels[key]:
                return labels[key]
    return None


def _status(labels: dict[str, str], attributes: dict[str, Any]) -> tuple[int, str]:
    message = next((labels[k] for k in _ERROR_MESSAGE_KEYS if labels.get(k)), "")
    for key in _STATUS_KEYS:
        code = attributes.get(key)
        if isinstance(code, int) and not isinstance(code, bool) and code >= 500:
            return STATUS_ERROR, message or f"HTTP {code}"
    otel = labels.get("otel.status_code", "").upper()
    if otel == "ERROR":
        return STATUS_ERROR, message
    err = labels.get("error")
    if err is not None and err.strip().lower() not in ("", "false", "0", "no"):
        return STATUS_ERROR, message or err
    if labels.get("/error/message") or labels.get("/error/name") or labels.get("/stacktrace"):
        return STATUS_ERROR, message or labels.get("/error/name", "")
    if otel == "OK":
        return STATUS_OK, ""
    return STATUS_UNSET, ""


def _ns(ts) -> int:
    return ts.seconds * NS + ts.nanos


def _raw(message):
    """The protobuf message under a proto-plus wrapper (or the message itself)."""
    pb = getattr(type(message), "pb", None)
    return pb(message) if callable(pb) and not hasattr(message, "DESCRIPTOR") else message


def normalize_trace_id(trace_id: str) -> str | None:
    tid = trace_id.strip().lower()
    if not tid or len(tid) > 32 or any(c not in "0123456789abcdef" for c in tid):
        return None
    tid = tid.zfill(32)
    return None if tid == "0" * 32 else tid


def span_record(trace_id: str, span) -> SpanRecord | None:
    """One v1 ``TraceSpan`` (proto-plus or protobuf) as a record; None when its id or its
    times are unusable."""
    span = _raw(span)
    if not 0 < span.span_id <= _MAX_U64:
        return None
    labels = dict(span.labels)
    attributes = {k: coerce_label(k, v) for k, v in labels.items()}
    status, message = _status(labels, attributes)
    resource: dict[str, Any] = {"service.name": service_of(labels)}
    instance = instance_of(labels)
    if instance is not None:
        resource["service.instance.id"] = instance
    start = _ns(span.start_time)
    end = _ns(span.end_time)
    if not 0 <= start <= _MAX_I64 or end > _MAX_I64:
        return None  # before 1970 or past 2262: the store's signed 64-bit nanoseconds cannot hold it
    return SpanRecord(
        trace_id=trace_id,
        span_id=f"{span.span_id:016x}",
        parent_span_id=f"{span.parent_span_id:016x}" if span.parent_span_id else None,
        service=resource["service.name"],
        name=span.name,
        kind=_KINDS.get(int(span.kind), KIND_INTERNAL),
        start_ns=start,
        end_ns=max(start, end),
        status=status,
        status_message=message,
        attributes=attributes,
        resource=resource,
        source=SOURCE,
    )


def trace_records(trace) -> list[SpanRecord]:
    """Every usable span of one v1 ``Trace``."""
    trace = _raw(trace)
    tid = normalize_trace_id(trace.trace_id)
    if tid is None:
        return []
    out = []
    for span in trace.spans:
        rec = span_record(tid, span)
        if rec is not None:
            out.append(rec)
    return out
