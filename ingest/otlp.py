"""OTLP trace export requests -> ``SpanRecord``, and the receiver's response bodies.

Three entry points decode a request, one per transport: :func:`decode_protobuf`
(OTLP/HTTP ``application/x-protobuf`` and protobuf files), :func:`decode_json`
(OTLP/HTTP ``application/json`` and JSON files) and :func:`decode_request_message`
(an already parsed message, as the gRPC servicer has). All return a
:class:`DecodeResult`; a request that cannot be used at all raises :class:`DecodeError`.

A span is rejected on its own (counted in ``DecodeResult.rejected``, its problem named
once in ``DecodeResult.errors``) when its ids or its links' ids are unusable or, in JSON, a
field has the wrong type; the rest of the request still decodes (the receivers answer 200
with ``partial_success``; ``modalscope import`` skips the whole request). Span links become
``SpanRecord.links``, ``[{trace_id, span_id, attributes}]`` with lowercase hex ids; a link
with empty ids (the SDKs export a link to an invalid context when it has attributes) is
kept with all-zero ids.

OTLP/JSON as real producers write it: camelCase or snake_case field names (protobuf's
JSON parsers accept both), a KeyValue without ``key`` (proto3 JSON leaves an empty string
out) kept with key ``""``, and ids that look like base64 (what ``json_format`` writes)
rejected with a hint that OTLP/JSON wants hex. A logs or metrics request raises
:class:`NotTracesError` instead of decoding to nothing. Everything the receiver sends back
(``ExportTraceServiceResponse`` with ``partial_success``, a ``google.rpc.Status`` error
body) is built by :func:`encode_response` and :func:`encode_status`.

JSON is parsed with the stdlib on purpose: protobuf's ``json_format`` reads the hex ids of
OTLP/JSON as base64, and it is slower.

Values are kept as sent: names, keys and strings may hold any Unicode, control characters
and NUL included (rendering escapes them; a lone surrogate from a JSON escape, which no
database can store, becomes U+FFFD). Only sizes are bounded: span names to
``MAX_NAME_CHARS`` characters, string values and status messages to ``MAX_STRING_BYTES``
of UTF-8. An attribute whose value is empty (no AnyValue field set) is left out.
Records decoded from one resource share one ``resource`` dict: treat it as read-only.
Every function here is safe to call from several threads at once.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

import orjson
from google.protobuf.message import DecodeError as _ProtobufDecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue as _KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans as _ScopeSpans

from .records import (
    KIND_CONSUMER,
    KIND_UNSPECIFIED,
    STATUS_ERROR,
    STATUS_UNSET,
    SpanRecord,
)

__all__ = [
    "DecodeError",
    "DecodeResult",
    "NotTracesError",
    "decode_protobuf",
    "decode_json",
    "decode_request_message",
    "oldest_start_ns",
    "encode_response",
    "encode_status",
    "response_media_type",
    "MAX_NAME_CHARS",
    "MAX_STRING_BYTES",
]

#: Span names are cut to this many characters.
MAX_NAME_CHARS = 1024
_MAX_NAME = MAX_NAME_CHARS
#: String attribute values (and status messages) are cut to this many UTF-8 bytes
#: (``MODALSCOPE_MAX_VALUE_BYTES``). This bounds the size of a stored row: one runaway
#: attribute (a whole prompt, a base64 image) must not blow up the spans table or the memory
#: of a dashboard worker reading it.
MAX_STRING_BYTES = 64 * 1024
#: Array and key-value-list values keep this many elements, nested ones counted
#: (``MODALSCOPE_MAX_VALUE_ITEMS``): a legal 16 MiB request of one 4-million-element array
#: would otherwise become gigabytes of Python objects.
MAX_VALUE_ITEMS = 4096
#: The span attribute listing the keys whose values were cut by either limit.
TRUNCATED_KEY = "modalscope.truncated"
# A string of at most this many characters is at most MAX_STRING_BYTES bytes in UTF-8
# (4 bytes a character at most), so the common case is bounded without encoding it.
_SAFE_CHARS = MAX_STRING_BYTES // 4
# Raw bytes values are cut before base64 so the encoded text stays within the bound and
# is still valid base64 (3 bytes -> 4 characters).
_MAX_RAW_BYTES = MAX_STRING_BYTES // 4 * 3
# KeyValues longer than this are read field by field (_wire_any) rather than by the protobuf
# parser, which would build every element of a huge array before the cap could drop it.
_WIRE_WALK_BYTES = 64 * 1024
# Values nested deeper than this are refused, as the protobuf parser does past its limit.
_MAX_DEPTH = 64


def set_value_limits(max_value_bytes: int, max_value_items: int) -> None:
    """Apply ``MODALSCOPE_MAX_VALUE_BYTES`` / ``MODALSCOPE_MAX_VALUE_ITEMS`` to this process's
    decoders (called once by the ingest pipeline; the defaults hold until then)."""
    global MAX_STRING_BYTES, MAX_VALUE_ITEMS, _SAFE_CHARS, _MAX_RAW_BYTES
    # The hand decoder of short KeyValues (_scalar_kv) never cuts strings under 16 KiB.
    MAX_STRING_BYTES = max(16 * 1024, int(max_value_bytes))
    MAX_VALUE_ITEMS = max(1, int(max_value_items))
    _SAFE_CHARS = MAX_STRING_BYTES // 4
    _MAX_RAW_BYTES = MAX_STRING_BYTES // 4 * 3
    _KV_CACHE.clear()


class _Budget:
    """Elements an attribute value may still take, and whether anything was cut."""

    __slots__ = ("items", "cut")

    def __init__(self) -> None:
        self.items = MAX_VALUE_ITEMS
        self.cut = False

    def take(self) -> bool:
        if self.items <= 0:
            self.cut = True
            return False
        self.items -= 1
        return True

    def bound(self, s: str) -> str:
        if len(s) <= _SAFE_CHARS:
            return s
        out = _bound_str(s)
        if out is not s:
            self.cut = True
        return out


def _mark_cut(out: dict[str, Any], key: str) -> None:
    cut = out.get(TRUNCATED_KEY)
    if type(cut) is not list:  # (a client's own attribute of that name is replaced)
        cut = out[TRUNCATED_KEY] = []
    cut.append(key)

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
_ZERO_TRACE_HEX = "0" * 32
_ZERO_SPAN_HEX = "0" * 16

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1

_ERR_TRACE_ID = "invalid or missing trace id (must be 16 bytes, 32 hex digits, not all zeros)"
_ERR_SPAN_ID = "invalid or missing span id (must be 8 bytes, 16 hex digits, not all zeros)"
_ERR_PARENT_ID = "invalid parent span id (must be 8 bytes, 16 hex digits, or empty)"
_ERR_LINK_TRACE_ID = "invalid link trace id (must be 16 bytes, 32 hex digits, or empty)"
_ERR_LINK_SPAN_ID = "invalid link span id (must be 8 bytes, 16 hex digits, or empty)"
_ERR_LINKS = "span links must be a list of {traceId, spanId, attributes} objects"
# The store keeps times as signed 64-bit nanoseconds (up to the year 2262): a later time
# would fail the whole write, so the span is rejected here, alone.
_INT64_MAX = (1 << 63) - 1
_ERR_TIME = "span start or end time is past the year 2262 (more than 2^63-1 ns)"


class DecodeError(ValueError):
    """Whole request is unusable (malformed protobuf/JSON, wrong shape). Message is one line, user-facing."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))


class NotTracesError(DecodeError):
    """The request is an OTLP logs or metrics request, not traces."""


@dataclass
class DecodeResult:
    spans: list[SpanRecord]
    rejected: int = 0  # spans dropped individually (bad/missing trace or span id, etc.)
    errors: list[str] = field(default_factory=list)  # one short message per distinct problem

    @property
    def error_message(self) -> str:
        """The errors joined for ``partial_success.error_message`` ("" when none)."""
        return "; ".join(self.errors)


def _one_line(text: str, limit: int = 500) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# A run of base64 this long is inline media (a captured image or audio clip), not text.
_BLOB_RUN = re.compile(r"[A-Za-z0-9+/_-]{2048,}={0,2}")


def _elide_blob(m: re.Match) -> str:
    run = m.group(0)
    # Encoded bytes mix cases and digits within any 2 KiB; a run of letters alone is text.
    head = run[:4096]
    if head.isalpha() or head.isdigit() or head.islower() or head.isupper():
        return run
    return f"[{len(run)} base64 characters elided]"


def _bound_str(s: str) -> str:
    """Cut ``s`` to MAX_STRING_BYTES of UTF-8 (without splitting a character).

    Inline media is elided first: captured GenAI messages with two images run far past the
    cap, and cutting them whole would lose the second image's part (and so the input type).
    """
    if len(s) <= _SAFE_CHARS:
        return s
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_STRING_BYTES:
        return s
    s = _BLOB_RUN.sub(_elide_blob, s)
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_STRING_BYTES:
        return s
    return raw[:MAX_STRING_BYTES].decode("utf-8", "ignore")


def _b64(data: bytes) -> str:
    if len(data) > _MAX_RAW_BYTES:
        data = data[:_MAX_RAW_BYTES]
    return base64.b64encode(data).decode("ascii")


# --------------------------------------------------------------------------- protobuf
#
# Two readers of one wire format. ``decode_request_message`` walks an already parsed
# official message. ``decode_protobuf`` parses the bytes with a private, wire-compatible
# copy of the trace messages (built below) that declares every ``KeyValue`` as ``bytes``,
# so an attribute arrives as its raw encoding; a bounded cache maps the raw encoding of a
# recurring attribute (``rpc.system=grpc``, ``cache.hit=true``) straight to its
# ``(key, value)``, skipping the per-attribute protobuf wrapper objects that otherwise
# dominate decoding (about twice as fast as the plain walk when most attribute values
# repeat, as in real traffic; about 1.25x slower in the worst case, where nearly every
# value is unique and the cache only churns). An attribute the cache misses is
# read by hand when it is in the canonical encoding of a string, int, bool or double, or
# else parsed with the real ``KeyValue`` class; either way its UTF-8 is checked as the full
# parse checks it, and one that fails is never cached, so the same bytes always get the
# same answer. Fields the copy does not declare (trace_state, flags, dropped counts) are
# skipped as unknown fields, unvalidated. A span without links pays one empty repeated
# field access for them: about 0.1 us, 3-5 % of decoding a 1,000-span request (min of
# runs 2.80-2.90 ms before links were read, 2.93-3.06 ms after).


def _build_fast_request_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool

    fd = descriptor_pb2.FieldDescriptorProto
    package = "modalscope.otlp_fast"
    proto = descriptor_pb2.FileDescriptorProto(
        name="modalscope/otlp_fast.proto", package=package, syntax="proto3"
    )
    one, many = fd.LABEL_OPTIONAL, fd.LABEL_REPEATED

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> None:
        m = proto.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".{package}.{type_name}"

    msg, raw = fd.TYPE_MESSAGE, fd.TYPE_BYTES
    # Field numbers are opentelemetry/proto/trace/v1/trace.proto's; enums read as int32.
    message("ExportTraceServiceRequest", ("resource_spans", 1, msg, many, "ResourceSpans"))
    message(
        "ResourceSpans",
        ("resource", 1, msg, one, "Resource"),
        ("scope_spans", 2, msg, many, "ScopeSpans"),
        # The removed InstrumentationLibrarySpans is wire-compatible with ScopeSpans.
        ("instrumentation_library_spans", 1000, msg, many, "ScopeSpans"),
    )
    message("Resource", ("attributes", 1, raw, many, None))
    message("ScopeSpans", ("scope", 1, msg, one, "Scope"), ("spans", 2, msg, many, "Span"))
    message("Scope", ("name", 1, fd.TYPE_STRING, one, None))
    message(
        "Span",
        ("trace_id", 1, raw, one, None),
        ("span_id", 2, raw, one, None),
        ("parent_span_id", 4, raw, one, None),
        ("name", 5, fd.TYPE_STRING, one, None),
        ("kind", 6, fd.TYPE_INT32, one, None),
        ("start_time_unix_nano", 7, fd.TYPE_FIXED64, one, None),
        ("end_time_unix_nano", 8, fd.TYPE_FIXED64, one, None),
        ("attributes", 9, raw, many, None),
        ("events", 11, msg, many, "Event"),
        ("links", 13, msg, many, "Link"),
        ("status", 15, msg, one, "Status"),
    )
    message(
        "Link",
        ("trace_id", 1, raw, one, None),
        ("span_id", 2, raw, one, None),
        ("attributes", 4, raw, many, None),
    )
    message(
        "Event",
        ("time_unix_nano", 1, fd.TYPE_FIXED64, one, None),
        ("name", 2, fd.TYPE_STRING, one, None),
        ("attributes", 3, raw, many, None),
    )
    message("Status", ("message", 2, fd.TYPE_STRING, one, None), ("code", 3, fd.TYPE_INT32, one, None))

    pool = descriptor_pool.DescriptorPool()  # private: nothing registered globally
    pool.AddSerializedFile(proto.SerializeToString())
    descriptor = pool.FindMessageTypeByName(f"{package}.ExportTraceServiceRequest")
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.22
        from google.protobuf.message_factory import MessageFactory

        return MessageFactory(pool).GetPrototype(descriptor)
    return GetMessageClass(descriptor)


_FastRequest = _build_fast_request_class()


def _build_starts_class() -> Any:
    """A request that reads only each span's start time (the rest is skipped unparsed)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    fd = descriptor_pb2.FieldDescriptorProto
    package = "modalscope.otlp_starts"
    proto = descriptor_pb2.FileDescriptorProto(
        name="modalscope/otlp_starts.proto", package=package, syntax="proto3"
    )
    for name, fields in (
        ("Request", [("resource_spans", 1, "ResourceSpans")]),
        ("ResourceSpans", [("scope_spans", 2, "ScopeSpans"), ("instrumentation_library_spans", 1000, "ScopeSpans")]),
        ("ScopeSpans", [("spans", 2, "Span")]),
    ):
        m = proto.message_type.add(name=name)
        for fname, number, type_name in fields:
            m.field.add(name=fname, number=number, type=fd.TYPE_MESSAGE, label=fd.LABEL_REPEATED,
                        type_name=f".{package}.{type_name}")
    span = proto.message_type.add(name="Span")
    span.field.add(name="start_time_unix_nano", number=7, type=fd.TYPE_FIXED64, label=fd.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    descriptor = pool.FindMessageTypeByName(f"{package}.Request")
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.22
        from google.protobuf.message_factory import MessageFactory

        return MessageFactory(pool).GetPrototype(descriptor)
    return GetMessageClass(descriptor)


_StartsRequest = _build_starts_class()


def oldest_start_ns(data: bytes) -> int | None:
    """The earliest span start in a serialized ``ExportTraceServiceRequest`` (None: no
    spans), without decoding the spans; :class:`DecodeError` when it does not parse."""
    try:
        msg = _StartsRequest.FromString(data)
    except (_ProtobufDecodeError, RecursionError, TypeError):
        raise DecodeError("invalid protobuf: not a parsable ExportTraceServiceRequest") from None
    starts = [
        sp.start_time_unix_nano
        for rs in msg.resource_spans
        for ss in (rs.scope_spans or rs.instrumentation_library_spans)
        for sp in ss.spans
    ]
    return min(starts) if starts else None

# raw KeyValue bytes -> (key, value), for immutable values of short attributes only.
_KV_CACHE: dict[bytes, tuple[str, Any]] = {}
_KV_CACHE_MAX_ENTRIES = 32768  # a few MB at most; cleared when full
_KV_CACHE_MAX_RAW = 256  # longer attributes are likely unique (ids, prompts): not cached


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
        if len(raw) > _MAX_RAW_BYTES:
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
            if len(s) <= _SAFE_CHARS:
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
            if v[1] - v[0] > _MAX_RAW_BYTES:
                budget.cut = True
            value = _b64(bytes(buf[v[0]:min(v[1], v[0] + _MAX_RAW_BYTES)]))
    return value


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
# (about 0.3 µs a span cheaper than keywords); if records.py ever reorders them, the
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
    safe_chars = _SAFE_CHARS
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


# --------------------------------------------------------------------------- JSON


class _SpanProblem(Exception):
    """One span cannot be used; the message goes to ``DecodeResult.errors``."""


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
        # orjson parses a request in three quarters of json's time (9.5 against 12.9 us a
        # span; parsing is half of decoding OTLP/JSON). What it refuses (a byte order mark,
        # NaN, lone surrogates, bad UTF-8, numbers out of range) goes the way below, which
        # accepts or explains it as before.
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
            if type(s) is str and len(s) <= _SAFE_CHARS:  # the fast path: most attributes are strings
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
        if len(b64) > MAX_STRING_BYTES:
            b64 = b64[:MAX_STRING_BYTES]
            budget.cut = True
        return b64
    if not _SNAKE_KEYS.isdisjoint(v):  # snake_case: string_value, int_value, ...
        return _json_any(_camel(v), budget)
    return None  # empty AnyValue, or only fields we do not know


# --------------------------------------------------------------------------- responses

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"


def response_media_type(content_type: str | None) -> str:
    """The media type a response body is written in for a request's ``Content-Type``.

    ``application/x-protobuf`` (or ``application/protobuf``) -> protobuf; anything else,
    including JSON with parameters (``; charset=utf-8``) and unsupported types (a 415's
    body), -> ``application/json``. Use it for the response's ``Content-Type`` header.
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in (_PROTOBUF, "application/protobuf"):
        return _PROTOBUF
    return _JSON


def _clean_text(text: str) -> str:
    """Text safe to put in a protobuf string (lone surrogates would fail to encode)."""
    text = str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def encode_response(rejected: int, error_message: str, content_type: str) -> bytes:
    """An ``ExportTraceServiceResponse`` body; ``partial_success`` only when something to say."""
    rejected = int(rejected)
    message = _clean_text(error_message or "")
    if response_media_type(content_type) == _PROTOBUF:
        resp = ExportTraceServiceResponse()
        if rejected > 0 or message:
            resp.partial_success.rejected_spans = rejected
            resp.partial_success.error_message = message
        return resp.SerializeToString()
    body: dict[str, Any] = {}
    if rejected > 0 or message:
        partial: dict[str, Any] = {}
        if rejected:
            partial["rejectedSpans"] = str(rejected)  # int64 -> string in proto3 JSON
        if message:
            partial["errorMessage"] = message
        body["partialSuccess"] = partial
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def encode_status(code: int, message: str, content_type: str) -> bytes:
    """A ``google.rpc.Status`` error body (``code`` is a gRPC status code number)."""
    message = _clean_text(message or "")
    if response_media_type(content_type) == _PROTOBUF:
        return status_pb2.Status(code=int(code), message=message).SerializeToString()
    return json.dumps({"code": int(code), "message": message}, separators=(",", ":")).encode("utf-8")
