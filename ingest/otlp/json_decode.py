"""OTLP/JSON requests -> ``SpanRecord``, as real producers write them (see the package's
docstring): the text parsed, then the request walked down to its spans, their ids, times,
status, events and links. The values inside (attributes, ``AnyValue``, 64-bit integers,
snake_case names) are read by ``json_values.py``."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import orjson

from ...core.spans import KIND_CONSUMER, KIND_UNSPECIFIED, STATUS_ERROR, STATUS_UNSET, SpanRecord
from .common import (MAX_NAME_CHARS, _ERR_LINK_SPAN_ID, _ERR_LINK_TRACE_ID, _ERR_LINKS, _ERR_PARENT_ID, _ERR_SPAN_ID,
                     _ERR_TIME, _ERR_TRACE_ID, _INT64_MAX, _ZERO_SPAN_HEX, _ZERO_TRACE_HEX, DecodeError, DecodeResult,
                     NotTracesError, _bound_str)
from .json_values import _SpanProblem, _camel, _json_attrs, _json_uint64
from .protobuf import _make_record

_HEX32 = re.compile(r"[0-9a-fA-F]{32}").fullmatch
_HEX16 = re.compile(r"[0-9a-fA-F]{16}").fullmatch
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]").search

_KIND_BY_JSON_NAME = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_KIND_BY_JSON_NAME.update({k[len("SPAN_KIND_") :]: v for k, v in list(_KIND_BY_JSON_NAME.items())})
_STATUS_BY_JSON_NAME = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_STATUS_BY_JSON_NAME.update(
    {k[len("STATUS_CODE_") :]: v for k, v in list(_STATUS_BY_JSON_NAME.items())}
)


def decode_json(data: bytes | str | dict, source: str = "otlp") -> DecodeResult:
    """Decode an OTLP/JSON ``ExportTraceServiceRequest`` (bytes, text or parsed object)."""
    try:
        return _decode_json_obj(_load_json(data), source)
    except RecursionError:
        raise DecodeError("invalid OTLP JSON: nested too deeply") from None


def _short_reason(exc: Exception) -> str:
    text = str(exc).split(";")[0]
    return text if len(text) <= 120 else text[:117] + "..."


def _load_json(data: bytes | str | dict) -> Any:
    if isinstance(data, dict):
        # Already parsed, so escapes cannot be seen: check the strings themselves (this
        # costs about as much as the parse; pass bytes when speed matters).
        return data if _utf8_clean(data) else _fix_surrogates(data)
    try:
        # orjson parses faster than json, and parsing is much of decoding OTLP/JSON. What it
        # refuses (a byte order mark, NaN, lone surrogates, bad UTF-8, numbers out of range)
        # goes the way below, which accepts or explains it as before.
        return orjson.loads(data)  # parsed without error: no lone surrogate to fix either
    except orjson.JSONDecodeError:
        pass
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"invalid JSON: not UTF-8 (bad byte at offset {exc.start})") from None
    elif isinstance(data, str):
        text = data
    else:
        raise DecodeError(f"invalid JSON: expected bytes, str or dict, got {type(data).__name__}")
    if text.startswith("\ufeff"):  # a byte order mark some Windows tools write
        text = text[1:]
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        raise DecodeError(f"invalid OTLP JSON: {_short_reason(exc)}") from None
    # A lone surrogate (\ud800) cannot be encoded as UTF-8 and would fail in the writer;
    # valid UTF-8 text holds one only as an escape, so the search is cheap and rarely true.
    if _SURROGATE_ESCAPE(text) is not None or (isinstance(data, str) and not _encodable(text)):
        obj = _fix_surrogates(obj)
    return obj


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _utf8_clean(obj: Any) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except (TypeError, ValueError, RecursionError):
        return True  # not JSON-shaped: the decoder below says what is wrong
    return True


def _fix_surrogates(obj: Any) -> Any:
    """Replace lone surrogates (from ``\\ud800``-style escapes) with U+FFFD, everywhere."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
            return obj
        except UnicodeEncodeError:
            return obj.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(obj, dict):
        return {_fix_surrogates(k): _fix_surrogates(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fix_surrogates(v) for v in obj]
    return obj


def _json_list(container: dict, key: str, where: str) -> list:
    value = container.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DecodeError(f"invalid OTLP JSON: {where}.{key} must be a list")
    return value


def _json_obj(container: dict, key: str, where: str) -> dict:
    value = container.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DecodeError(f"invalid OTLP JSON: {where}.{key} must be an object")
    return value


def _decode_json_obj(obj: Any, source: str) -> DecodeResult:
    if not isinstance(obj, dict):
        raise DecodeError(f"invalid OTLP JSON: top level must be an object, got {_json_type(obj)}")
    if "resourceSpans" not in obj:
        if "resource_spans" in obj:
            obj = _camel(obj)
        else:
            _refuse_other_signals(obj)
    spans: list[SpanRecord] = []
    rejected = 0
    errors: dict[str, None] = {}
    decode_span = _json_span

    for i, rs in enumerate(_json_list(obj, "resourceSpans", "request")):
        where = f"resourceSpans[{i}]"
        if not isinstance(rs, dict):
            raise DecodeError(f"invalid OTLP JSON: {where} must be an object")
        res = _json_obj(rs, "resource", where)
        try:
            resource = _json_attrs(res.get("attributes"))
        except _SpanProblem as exc:
            raise DecodeError(f"invalid OTLP JSON: {where}.resource: {exc}") from None
        service_name = resource.get("service.name")
        service = "unknown" if service_name is None or service_name == "" else str(service_name)
        scope_spans = _json_list(rs, "scopeSpans", where)
        if not scope_spans:
            if "scope_spans" in rs or "instrumentation_library_spans" in rs:
                rs = _camel(rs)
                scope_spans = _json_list(rs, "scopeSpans", where)
            if not scope_spans:
                scope_spans = _json_list(rs, "instrumentationLibrarySpans", where)
        for j, ss in enumerate(scope_spans):
            swhere = f"{where}.scopeSpans[{j}]"
            if not isinstance(ss, dict):
                raise DecodeError(f"invalid OTLP JSON: {swhere} must be an object")
            scope_obj = ss.get("scope")
            if scope_obj is None:
                scope_obj = ss.get("instrumentationLibrary")
            scope = ""
            if scope_obj is not None:
                if not isinstance(scope_obj, dict):
                    raise DecodeError(f"invalid OTLP JSON: {swhere}.scope must be an object")
                scope = scope_obj.get("name") or ""
                if not isinstance(scope, str):
                    raise DecodeError(f"invalid OTLP JSON: {swhere}.scope.name must be a string")
            for sp in _json_list(ss, "spans", swhere):
                try:
                    spans.append(decode_span(sp, service, resource, scope, source))
                except _SpanProblem as exc:
                    rejected += 1
                    errors[str(exc)] = None
    return DecodeResult(spans, rejected, list(errors))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _json_span(sp: Any, service: str, resource: dict, scope: str, source: str) -> SpanRecord:
    if type(sp) is not dict:
        raise _SpanProblem("span is not an object")
    get = sp.get

    tid = get("traceId")
    if tid is None and "trace_id" in sp:  # snake_case field names, as protobuf's own JSON allows
        sp = _camel(sp)
        get = sp.get
        tid = get("traceId")
    if type(tid) is not str or _HEX32(tid) is None:
        raise _SpanProblem(_id_problem(_ERR_TRACE_ID, tid, 16))
    tid = tid.lower()
    if tid == _ZERO_TRACE_HEX:
        raise _SpanProblem(_ERR_TRACE_ID)
    sid = get("spanId")
    if type(sid) is not str or _HEX16(sid) is None:
        raise _SpanProblem(_id_problem(_ERR_SPAN_ID, sid, 8))
    sid = sid.lower()
    if sid == _ZERO_SPAN_HEX:
        raise _SpanProblem(_ERR_SPAN_ID)
    parent = get("parentSpanId")
    if parent is not None:
        if type(parent) is not str:
            raise _SpanProblem(_ERR_PARENT_ID)
        if not parent:
            parent = None
        elif _HEX16(parent) is None:
            raise _SpanProblem(_id_problem(_ERR_PARENT_ID, parent, 8))
        else:
            parent = parent.lower()
            if parent == _ZERO_SPAN_HEX:
                parent = None

    name = get("name")
    if name is None:
        name = ""
    elif type(name) is not str:
        raise _SpanProblem("span name must be a string")
    elif len(name) > MAX_NAME_CHARS:
        name = name[:MAX_NAME_CHARS]

    kind = get("kind")
    if kind is None:
        kind = KIND_UNSPECIFIED
    elif type(kind) is int:
        if kind < 0 or kind > KIND_CONSUMER:
            kind = KIND_UNSPECIFIED
    elif type(kind) is str:
        kind = _KIND_BY_JSON_NAME.get(kind.upper(), KIND_UNSPECIFIED)
    else:
        raise _SpanProblem("span kind must be an integer or a SPAN_KIND_* name")

    start = _json_uint64(get("startTimeUnixNano"), "startTimeUnixNano")
    end = _json_uint64(get("endTimeUnixNano"), "endTimeUnixNano")
    if end < start:
        end = start
    if end > _INT64_MAX:
        raise _SpanProblem(_ERR_TIME)

    code = STATUS_UNSET
    message = ""
    status = get("status")
    if status is not None:
        if type(status) is not dict:
            raise _SpanProblem("span status must be an object")
        c = status.get("code")
        if c is None:
            pass
        elif type(c) is int:
            code = c if 0 <= c <= STATUS_ERROR else STATUS_UNSET
        elif type(c) is str:
            code = _STATUS_BY_JSON_NAME.get(c.upper(), STATUS_UNSET)
        else:
            raise _SpanProblem("status code must be an integer or a STATUS_CODE_* name")
        m = status.get("message")
        if m is not None:
            if type(m) is not str:
                raise _SpanProblem("status message must be a string")
            message = _bound_str(m)

    raw_attrs = get("attributes")
    attributes = _json_attrs(raw_attrs) if raw_attrs else {}

    raw_events = get("events")
    events: list[dict[str, Any]] = []
    if raw_events:
        if type(raw_events) is not list:
            raise _SpanProblem("span events must be a list")
        for ev in raw_events:
            if type(ev) is not dict:
                raise _SpanProblem("span event must be an object")
            ev_name = ev.get("name")
            if ev_name is None:
                ev_name = ""
            elif type(ev_name) is not str:
                raise _SpanProblem("event name must be a string")
            ev_attrs = ev.get("attributes")
            events.append(
                {
                    "name": ev_name,
                    "time_unix_nano": _json_uint64(ev.get("timeUnixNano"), "timeUnixNano"),
                    "attributes": _json_attrs(ev_attrs) if ev_attrs else {},
                }
            )

    rec = _make_record(
        tid, sid, parent, service, name, kind, start, end, code, message, attributes, resource,
        events, source, scope,
    )  # fmt: skip
    raw_links = get("links")
    if raw_links:
        rec.links = _json_links(raw_links)
    return rec


def _json_links(raw: Any) -> list[dict[str, Any]]:
    """OTLP/JSON span links -> ``[{trace_id, span_id, attributes}]`` (empty ids as zeros,
    as :func:`_pb_links` keeps them)."""
    if type(raw) is not list:
        raise _SpanProblem(_ERR_LINKS)
    out = []
    for ln in raw:
        if type(ln) is not dict:
            raise _SpanProblem(_ERR_LINKS)
        tid = ln.get("traceId")
        if tid is None and ("trace_id" in ln or "span_id" in ln):
            ln = _camel(ln)
            tid = ln.get("traceId")
        if tid is None or tid == "":
            tid = _ZERO_TRACE_HEX
        elif type(tid) is not str or _HEX32(tid) is None:
            raise _SpanProblem(_id_problem(_ERR_LINK_TRACE_ID, tid, 16))
        sid = ln.get("spanId")
        if sid is None or sid == "":
            sid = _ZERO_SPAN_HEX
        elif type(sid) is not str or _HEX16(sid) is None:
            raise _SpanProblem(_id_problem(_ERR_LINK_SPAN_ID, sid, 8))
        out.append({"trace_id": tid.lower(), "span_id": sid.lower(), "attributes": _json_attrs(ln.get("attributes"))})
    return out


def _id_problem(message: str, value: Any, size: int) -> str:
    """``message``, with a hint when ``value`` is the base64 of ``size`` bytes: protobuf's
    own JSON mapping (``json_format``, and converters built on it) writes ids that way."""
    if type(value) is str and len(value) == (size + 2) // 3 * 4:
        try:
            if len(base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)) == size:
                return f"{message}; it looks like base64; OTLP/JSON wants hex"
        except ValueError:
            pass
    return message


_OTHER_SIGNALS = {
    "resourceLogs": "logs", "resource_logs": "logs",
    "resourceMetrics": "metrics", "resource_metrics": "metrics",
    "resourceProfiles": "profiles", "resource_profiles": "profiles",
}  # fmt: skip


def _refuse_other_signals(obj: dict) -> None:
    """A logs or metrics request (no ``resourceSpans``) is not traces: say so, not "0 spans"."""
    for key, signal in _OTHER_SIGNALS.items():
        if key in obj:
            raise NotTracesError(f"OTLP {signal}, not traces ({key!r} where resourceSpans was expected)")
