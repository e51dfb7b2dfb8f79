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
``MAX_NAME_CHARS`` characters, string values and status messages to
``MODALSCOPE_MAX_VALUE_BYTES`` of UTF-8, arrays and key-value lists to
``MODALSCOPE_MAX_VALUE_ITEMS`` elements (the span's ``modalscope.truncated`` lists what was cut). An attribute whose value is empty (no AnyValue field set) is left out.
Records decoded from one resource share one ``resource`` dict: treat it as read-only.
Every function here is safe to call from several threads at once.
"""

from .common import (LIMITS, MAX_NAME_CHARS, MAX_STRING_BYTES, MAX_VALUE_ITEMS, TRUNCATED_KEY, DecodeError,
                     DecodeResult, NotTracesError, set_value_limits)
from .json_decode import decode_json
from .messages import oldest_start_ns
from .protobuf import decode_protobuf, decode_request_message
from .responses import encode_response, encode_status, response_media_type

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
    "set_value_limits",
    "LIMITS",
    "MAX_NAME_CHARS",
    "MAX_STRING_BYTES",
    "MAX_VALUE_ITEMS",
    "TRUNCATED_KEY",
]
