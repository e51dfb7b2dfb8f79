"""The bodies the OTLP receivers answer with: ``ExportTraceServiceResponse`` and
``google.rpc.Status``, in the request's content type."""

from __future__ import annotations

import json
from typing import Any

from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

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
