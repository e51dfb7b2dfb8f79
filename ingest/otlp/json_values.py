"""OTLP/JSON values: attribute lists, ``AnyValue`` and 64-bit integers as JSON writes them,
and snake_case field names renamed to camelCase.

A span whose value cannot be used raises :class:`_SpanProblem`; the message walk
(``json_decode.py``) rejects that span alone.
"""

from __future__ import annotations

from typing import Any

from .common import LIMITS, _INT64_MAX, _INT64_MIN, _UINT64_MAX, _Budget, _mark_cut


class _SpanProblem(Exception):
    """One span cannot be used; the message goes to ``DecodeResult.errors``."""


# snake_case OTLP/JSON field names (proto field names, which protobuf's JSON parsers accept
# as well as the camelCase ones) -> the camelCase this decoder reads.
_SNAKE_TO_CAMEL = {
    name: name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:])
    for name in (
        "resource_spans", "scope_spans", "instrumentation_library_spans", "instrumentation_library",
        "schema_url", "trace_id", "span_id", "parent_span_id", "trace_state", "start_time_unix_nano",
        "end_time_unix_nano", "time_unix_nano", "dropped_attributes_count", "dropped_events_count",
        "dropped_links_count", "string_value", "bool_value", "int_value", "double_value", "array_value",
        "kvlist_value", "bytes_value", "resource_logs", "resource_metrics", "scope_logs", "scope_metrics",
    )
}  # fmt: skip
_SNAKE_KEYS = set(_SNAKE_TO_CAMEL)


def _camel(obj: Any) -> Any:
    """``obj`` with snake_case OTLP field names renamed to camelCase, at every depth. Only
    object keys are renamed (attribute keys are values of ``key``, never touched)."""
    if type(obj) is dict:
        rename = _SNAKE_TO_CAMEL.get
        return {rename(k, k): _camel(v) for k, v in obj.items()}
    if type(obj) is list:
        return [_camel(v) for v in obj]
    return obj


def _json_uint64(value: Any, what: str) -> int:
    """A fixed64 as OTLP/JSON writes it: a decimal string or a number; absent is 0."""
    t = type(value)
    if t is str:
        try:
            n = int(value)
        except ValueError:
            raise _SpanProblem(f"{what} must be an unsigned 64-bit integer") from None
    elif t is int:
        n = value
    elif value is None:
        return 0
    elif t is float and value.is_integer():
        n = int(value)
    else:
        raise _SpanProblem(f"{what} must be an unsigned 64-bit integer")
    if n < 0 or n > _UINT64_MAX:
        raise _SpanProblem(f"{what} must be an unsigned 64-bit integer")
    return n


def _json_attrs(kvs: Any) -> dict[str, Any]:
    """OTLP/JSON ``[{key, value: AnyValue}]`` -> dict. Keys without a value are left out."""
    if kvs is None:
        return {}
    if type(kvs) is not list:
        raise _SpanProblem("attributes must be a list of {key, value}")
    out: dict[str, Any] = {}
    for kv in kvs:
        if type(kv) is not dict:
            raise _SpanProblem("attribute must be a {key, value} object")
        key = kv.get("key")
        if type(key) is not str:
            if key is not None:
                raise _SpanProblem("attribute key must be a string")
            key = ""  # proto3 JSON leaves out an empty string: the Collector writes no "key"
        v = kv.get("value")
        if type(v) is dict:
            s = v.get("stringValue")
            if type(s) is str and len(s) <= LIMITS.safe_chars:  # the fast path: most attributes are strings
                out[key] = s
                continue
            budget = _Budget()
            value = _json_any(v, budget)
            if value is not None:
                out[key] = value
                if budget.cut:
                    _mark_cut(out, key)
        elif v is not None:
            raise _SpanProblem("attribute value must be an AnyValue object")
    return out


def _json_any(v: Any, budget: _Budget) -> Any:
    """OTLP/JSON AnyValue -> Python value (None for an empty AnyValue)."""
    if type(v) is not dict:
        if v is None:
            return None
        raise _SpanProblem("attribute value must be an AnyValue object")
    if "stringValue" in v:
        s = v["stringValue"]
        if type(s) is not str:
            raise _SpanProblem("stringValue must be a string")
        return budget.bound(s)
    if "intValue" in v:
        i = v["intValue"]
        t = type(i)
        if t is str:
            try:
                i = int(i)
            except ValueError:
                raise _SpanProblem("intValue must be a 64-bit integer") from None
        elif t is float and i.is_integer():
            i = int(i)
        elif t is not int:
            raise _SpanProblem("intValue must be a 64-bit integer")
        if i < _INT64_MIN or i > _INT64_MAX:
            raise _SpanProblem("intValue must be a 64-bit integer")
        return i
    if "boolValue" in v:
        b = v["boolValue"]
        if type(b) is not bool:
            raise _SpanProblem("boolValue must be true or false")
        return b
    if "doubleValue" in v:
        d = v["doubleValue"]
        t = type(d)
        if t is float:
            return d
        if t is int:
            return float(d)
        if t is str:
            try:
                return float(d)  # "NaN", "Infinity", "-Infinity", or a number as text
            except ValueError:
                raise _SpanProblem("doubleValue must be a number") from None
        raise _SpanProblem("doubleValue must be a number")
    if "arrayValue" in v:
        arr = v["arrayValue"]
        if arr is None:
            return []
        if type(arr) is not dict:
            raise _SpanProblem("arrayValue must be an object with values")
        values = arr.get("values")
        if values is None:
            return []
        if type(values) is not list:
            raise _SpanProblem("arrayValue.values must be a list")
        items = []
        for x in values:
            if not budget.take():
                break
            items.append(_json_any(x, budget))
        return items
    if "kvlistValue" in v:
        kvl = v["kvlistValue"]
        if kvl is None:
            return {}
        if type(kvl) is not dict:
            raise _SpanProblem("kvlistValue must be an object with values")
        values = kvl.get("values")
        if values is None:
            return {}
        if type(values) is not list:
            raise _SpanProblem("kvlistValue.values must be a list")
        out: dict[str, Any] = {}
        for kv in values:
            if not budget.take():
                break
            if type(kv) is not dict:
                raise _SpanProblem("kvlistValue entry must be a {key, value} object")
            key = kv.get("key", "")  # proto3 JSON leaves an empty key out
            if type(key) is not str:
                raise _SpanProblem("kvlistValue entry must be a {key, value} object")
            out[key] = _json_any(kv.get("value"), budget)
        return out
    if "bytesValue" in v:
        b64 = v["bytesValue"]
        if type(b64) is not str:
            raise _SpanProblem("bytesValue must be a base64 string")
        # Kept as the base64 text it came as (what protobuf bytes become too); bounded
        # like any string, cut on a 4-character boundary so it stays decodable.
        if len(b64) > LIMITS.string_bytes:
            b64 = b64[:LIMITS.string_bytes]
            budget.cut = True
        return b64
    if not _SNAKE_KEYS.isdisjoint(v):  # snake_case: string_value, int_value, ...
        return _json_any(_camel(v), budget)
    return None  # empty AnyValue, or only fields we do not know
