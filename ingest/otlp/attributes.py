"""Attribute values from protobuf: the parsed classes' ``AnyValue``, raw ``KeyValue`` bytes
(cached when short and recurring, read by hand in the canonical encodings), and large
``KeyValue``s read field by field so the value limits apply before anything is built."""

from __future__ import annotations

import struct
from typing import Any

from google.protobuf.message import DecodeError as _ProtobufDecodeError
from opentelemetry.proto.common.v1.common_pb2 import KeyValue as _KeyValue

from .common import LIMITS, ON_LIMITS_CHANGED, DecodeError, _b64, _Budget, _mark_cut, _MAX_DEPTH, _WIRE_WALK_BYTES

# raw KeyValue bytes -> (key, value), for immutable values of short attributes only.
_KV_CACHE: dict[bytes, tuple[str, Any]] = {}
_KV_CACHE_MAX_ENTRIES = 32768  # a few MB at most; cleared when full
_KV_CACHE_MAX_RAW = 256  # longer attributes are likely unique (ids, prompts): not cached

ON_LIMITS_CHANGED.append(_KV_CACHE.clear)


def _pb_any(v: Any, budget: _Budget) -> Any:
    """Protobuf AnyValue -> str, bool, int, float, list, dict, base64 str, or None."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return budget.bound(v.string_value)
    if which == "int_value":
        return v.int_value
    if which == "bool_value":
        return v.bool_value
    if which == "double_value":
        return v.double_value
    if which == "array_value":
        out = []
        for x in v.array_value.values:
            if not budget.take():
                break
            out.append(_pb_any(x, budget))
        return out
    if which == "kvlist_value":
        kvs = {}
        for kv in v.kvlist_value.values:
            if not budget.take():
                break
            kvs[kv.key] = _pb_any(kv.value, budget)
        return kvs
    if which == "bytes_value":
        raw = v.bytes_value
        if len(raw) > LIMITS.raw_bytes:
            budget.cut = True
        return _b64(raw)
    return None


def _pb_attrs(kvs: Any) -> dict[str, Any]:
    """Repeated ``KeyValue`` messages -> dict. Keys without a value are left out."""
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        if which == "string_value":
            s = v.string_value
            if len(s) <= LIMITS.safe_chars:
                out[kv.key] = s
                continue
        elif which == "int_value":
            out[kv.key] = v.int_value
            continue
        elif which == "bool_value":
            out[kv.key] = v.bool_value
            continue
        elif which == "double_value":
            out[kv.key] = v.double_value
            continue
        elif which is None:
            continue
        budget = _Budget()
        out[kv.key] = _pb_any(v, budget)
        if budget.cut:
            _mark_cut(out, kv.key)
    return out


def _raw_attrs(raws: Any) -> dict[str, Any]:
    """Repeated raw ``KeyValue`` encodings -> dict. Keys without a value are left out."""
    out: dict[str, Any] = {}
    get = _KV_CACHE.get
    for raw in raws:
        pair = get(raw)
        if pair is None:
            pair = _kv_miss(raw)
            if pair is None:  # a key without a value
                continue
            if len(pair) == 3:  # (key, value, cut)
                _mark_cut(out, pair[0])
        out[pair[0]] = pair[1]
    return out


def _kv_miss(raw: bytes) -> tuple[str, Any] | tuple[str, Any, bool] | None:
    pair = _scalar_kv(raw)
    if pair is None:
        pair = _any_kv(raw)
        if pair is None or len(pair) == 3 or type(pair[1]) is list or type(pair[1]) is dict:
            return pair  # mutable or cut values are never cached, so never shared by two records
    if len(raw) <= _KV_CACHE_MAX_RAW:
        if len(_KV_CACHE) >= _KV_CACHE_MAX_ENTRIES:
            _KV_CACHE.clear()
        _KV_CACHE[raw] = pair
    return pair


_unpack_double = struct.Struct("<d").unpack_from


def _scalar_kv(raw: bytes) -> tuple[str, Any] | None:
    """``(key, value)`` of a KeyValue in the canonical encoding every SDK writes, holding a
    string (< 16 KiB), int, bool or double; None for anything else (then parsed by
    :func:`_any_kv`). Reading these few shapes by hand is about twice as fast as a
    protobuf parse plus attribute access; UTF-8 is checked as strictly as protobuf does.
    """
    n = len(raw)
    if n < 6 or raw[0] != 0x0A:  # field 1 (key), length-delimited
        return None
    p = 2 + raw[1]
    if raw[1] >= 0x80 or p + 2 > n or raw[p] != 0x12:  # field 2 (value), length-delimited
        return None
    q = p + 2
    length = raw[p + 1]
    if length >= 0x80:
        if q >= n or raw[q] >= 0x80:
            return None
        length = (length & 0x7F) | (raw[q] << 7)
        q += 1
    if q + length != n or length < 2:
        return None
    tag = raw[q]
    if tag == 0x0A:  # AnyValue.string_value
        r = q + 2
        length = raw[q + 1]
        if length >= 0x80:
            if r >= n or raw[r] >= 0x80:
                return None
            length = (length & 0x7F) | (raw[r] << 7)
            r += 1
        if r + length != n:
            return None
        try:
            return raw[2:p].decode(), raw[r:].decode()
        except UnicodeDecodeError:
            return None  # the protobuf parse says what is wrong
    if tag == 0x18:  # AnyValue.int_value: varint, two's complement
        value = 0
        shift = 0
        r = q + 1
        while r < n:
            b = raw[r]
            value |= (b & 0x7F) << shift
            r += 1
            if b < 0x80:
                break
            shift += 7
        else:
            return None
        if r != n or shift > 63:
            return None
        value &= 0xFFFFFFFFFFFFFFFF
        if value >= 0x8000000000000000:
            value -= 0x10000000000000000
        key = raw[2:p]
    elif tag == 0x10:  # AnyValue.bool_value
        if length != 2 or raw[q + 1] > 1:
            return None
        value = raw[q + 1] == 1
        key = raw[2:p]
    elif tag == 0x21:  # AnyValue.double_value: fixed64
        if length != 9:
            return None
        value = _unpack_double(raw, q + 1)[0]
        key = raw[2:p]
    else:
        return None
    try:
        return key.decode(), value
    except UnicodeDecodeError:
        return None


def _any_kv(raw: bytes) -> tuple[str, Any] | tuple[str, Any, bool] | None:
    """``(key, value)`` of any KeyValue, ``(key, value, True)`` when the value was cut to the
    limits; None without a value."""
    budget = _Budget()
    if len(raw) > _WIRE_WALK_BYTES:
        key, value = _wire_kv(memoryview(raw), 0, len(raw), budget, 0)
    else:
        try:
            kv = _KeyValue.FromString(raw)
        except (_ProtobufDecodeError, RecursionError) as exc:
            detail = str(exc).partition("': ")[2] or "corrupt"
            raise DecodeError(f"invalid protobuf: an attribute is not a parsable KeyValue ({detail})") from None
        key, value = kv.key, _pb_any(kv.value, budget)
    if value is None:
        return None
    return (key, value, True) if budget.cut else (key, value)


# -- large KeyValues, field by field --------------------------------------------------


def _corrupt(what: str) -> DecodeError:
    return DecodeError(f"invalid protobuf: an attribute is not a parsable KeyValue ({what})")


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while i < end:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            break
    raise _corrupt("bad varint")


def _fields(buf: memoryview, i: int, end: int):
    """``(field number, wire type, value)`` of each field in ``buf[i:end]``: the varint, the
    offset of a fixed64/fixed32, or ``(start, end)`` of a length-delimited field."""
    while i < end:
        key, i = _varint(buf, i, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i, end)
        elif wire == 2:
            length, i = _varint(buf, i, end)
            if i + length > end:
                raise _corrupt("truncated")
            value = (i, i + length)
            i += length
        elif wire == 1 or wire == 5:
            value = i
            i += 8 if wire == 1 else 4
            if i > end:
                raise _corrupt("truncated")
        else:  # groups: no OTLP message has them
            raise _corrupt(f"unexpected wire type {wire}")
        yield number, wire, value


def _text(buf: memoryview, span: tuple[int, int]) -> str:
    try:
        return str(buf[span[0]:span[1]], "utf-8")
    except UnicodeDecodeError:
        raise _corrupt("string field has invalid UTF-8") from None


def _wire_kv(buf: memoryview, i: int, end: int, budget: _Budget, depth: int) -> tuple[str, Any]:
    key = ""
    value = None
    for number, wire, v in _fields(buf, i, end):
        if number == 1 and wire == 2:
            key = _text(buf, v)
        elif number == 2 and wire == 2:
            value = _wire_any(buf, v[0], v[1], budget, depth + 1)
    return key, value


def _wire_any(buf: memoryview, i: int, end: int, budget: _Budget, depth: int) -> Any:
    """An AnyValue read field by field: arrays and key-value lists stop at the budget, so the
    elements past it are never built (the last field of the oneof wins, as in protobuf)."""
    if depth > _MAX_DEPTH:
        raise _corrupt("nested too deeply")
    value = None
    for number, wire, v in _fields(buf, i, end):
        if number == 1 and wire == 2:
            value = budget.bound(_text(buf, v))
        elif number == 2 and wire == 0:
            value = v != 0
        elif number == 3 and wire == 0:
            value = v - (1 << 64) if v >= 1 << 63 else v
        elif number == 4 and wire == 1:
            value = _unpack_double(buf, v)[0]
        elif number == 5 and wire == 2:
            value = []
            for n, w, element in _fields(buf, v[0], v[1]):
                if n == 1 and w == 2:
                    if not budget.take():
                        break
                    value.append(_wire_any(buf, element[0], element[1], budget, depth + 1))
        elif number == 6 and wire == 2:
            value = {}
            for n, w, entry in _fields(buf, v[0], v[1]):
                if n == 1 and w == 2:
                    if not budget.take():
                        break
                    k, item = _wire_kv(buf, entry[0], entry[1], budget, depth + 1)
                    value[k] = item
        elif number == 7 and wire == 2:
            if v[1] - v[0] > LIMITS.raw_bytes:
                budget.cut = True
            value = _b64(bytes(buf[v[0]:min(v[1], v[0] + LIMITS.raw_bytes)]))
    return value
