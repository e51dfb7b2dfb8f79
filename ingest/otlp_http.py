"""The OTLP/HTTP receiver: ``POST /v1/traces``, as the OTLP specification says.

* ``Content-Type``: ``application/x-protobuf`` or ``application/json`` (parameters such as
  ``; charset=utf-8`` are ignored); anything else -> 415.
* ``Content-Encoding``: ``gzip``, ``deflate`` (zlib-wrapped or raw) or none/``identity``;
  any other coding -> 415 (RFC 9110 §15.5.16: 415 covers an unsupported *content coding*
  as well as media type, with ``Accept-Encoding`` naming what is supported).
* Size cap ``MODALSCOPE_MAX_REQUEST_BYTES``: a ``Content-Length`` past it -> 413 before
  anything is read; a chunked body (no ``Content-Length``, as the JavaScript exporter
  sends) is read in pieces and refused as soon as it passes the cap; a compressed body is
  inflated incrementally and refused once the *inflated* size passes the cap, so a gzip
  bomb never allocates more than cap + 1 bytes.
* Bad data -> 400; writer full or the settler too far behind -> 429, writer shutting down or
  no commit in time -> 503, both with ``Retry-After``; ingest token missing or wrong -> 401;
  a bug -> 500, logged, never a traceback to the client.
* Memory stays bounded under any load: a full writer is answered 429 before the body is
  kept (it is read and discarded, so the client sees the answer, not a reset); at most
  ``MAX_READING`` requests hold a body at once (the others wait their turn, 503 after
  ``READ_WAIT`` seconds) and ``MAX_DECODING`` decode at once; the writer's queue is capped
  in spans. A client that stops sending for ``IDLE_TIMEOUT`` seconds is cut off, and a body
  that arrives slower than ``MIN_BODY_BYTES_PER_S`` (after ``BODY_GRACE_S``) or takes over
  ``MAX_BODY_S`` too (:class:`SlowBodyReaper`), so trickled uploads cannot hold the slots.
  Connections are capped and request heads have a deadline (``ingest/http_server.py``).
* Stopping (:class:`IngestGate`): requests arriving after the stop began get 503 with
  ``Retry-After``; the ones already taken are answered once their spans are committed.
* 200 means committed: the response is sent after the writer's commit, with an
  ``ExportTraceServiceResponse`` carrying ``partial_success`` when spans were rejected one
  by one. Error bodies are a ``google.rpc.Status`` in the request's content type (JSON for
  a 415 and for requests that are not protobuf).

:func:`serve_http` runs the app on Werkzeug's threaded server (which de-chunks request
bodies and sets ``wsgi.input_terminated``) in a daemon thread. The slots, body reading and
decompression limits are in ``otlp_http_limits.py``; their names are re-exported here.
"""

from __future__ import annotations

import concurrent.futures
import hmac
import logging
import math

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from ..settings import Settings
from .errors import ListenError, PortInUse, storage_unavailable
from .http_server import MAX_CONNECTIONS, HTTPReceiver, serve_http
from .otlp import DecodeError, decode_json, decode_protobuf, encode_response, encode_status
from .inflight import InflightBytes
from .memory import trim
from .otlp_http_limits import (_ACCEPT_ENCODING, _BODY_READ, _CODINGS, _INTERNAL, _INVALID_ARGUMENT, _NOT_FOUND,
                               _RESOURCE_EXHAUSTED, _UNAUTHENTICATED, _UNAVAILABLE, _UNIMPLEMENTED, READ_WAIT,
                               IngestGate, SlowBodyReaper, _discard_body, _inflate, _read_body, _Reject, _short)
from .otlp_http_limits import (  # noqa: F401 - re-exported: the receiver's limits are named from here
    BODY_GRACE_S, COMMIT_TIMEOUT, MAX_BODY_S, MAX_DECODING, MAX_READING, MIN_BODY_BYTES_PER_S, SHUTDOWN_RETRY_AFTER,
    _BodyProgress)
from .pipeline import BODY_WEIGHT, INFLIGHT_BYTES, IngestPipeline, WriterClosed, WriterFull

__all__ = [
    "COMMIT_TIMEOUT",
    "ListenError",
    "PortInUse",
    "HTTPReceiver",
    "IngestGate",
    "MAX_CONNECTIONS",
    "create_ingest_app",
    "serve_http",
]

log = logging.getLogger(__name__)

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_PROTOBUF_TYPES = frozenset((_PROTOBUF, "application/protobuf"))


def _media_of(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _response_media(content_type: str | None) -> str:
    """Error and success bodies use the request's content type (JSON when it is not protobuf)."""
    return _PROTOBUF if _media_of(content_type) in _PROTOBUF_TYPES else _JSON


def _status_response(http_status: int, code: int, message: str, media: str,
                     headers: dict[str, str] | None = None) -> Response:
    resp = Response(encode_status(code, message, media), status=http_status, content_type=media)
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def _retry_after(seconds: float) -> str:
    """``Retry-After`` is a whole number of seconds (RFC 9110 §10.2.3), at least 1."""
    try:
        n = math.ceil(float(seconds))
    except (TypeError, ValueError, OverflowError):
        n = 1
    return str(max(1, min(n, 3600)))


# --------------------------------------------------------------------------- app


def create_ingest_app(pipeline: IngestPipeline, settings: Settings, *,
                      commit_timeout: float = COMMIT_TIMEOUT, gate: IngestGate | None = None) -> Flask:
    """The OTLP/HTTP receiver as a Flask app (``POST /v1/traces``); its :class:`IngestGate`
    is ``app.extensions["modalscope_ingest_gate"]``."""
    app = Flask("modalscope.ingest.otlp_http", static_folder=None)
    cap = int(settings.max_request_bytes)
    token = settings.ingest_token.encode("utf-8") if settings.ingest_token else None
    gate = gate or IngestGate()
    app.extensions["modalscope_ingest_gate"] = gate
    reaper = app.extensions["modalscope_slow_bodies"] = SlowBodyReaper()
    inflight = getattr(pipeline, "inflight", None) or InflightBytes(max(INFLIGHT_BYTES, BODY_WEIGHT * cap))

    def refuse_early() -> None:
        """Refuse without keeping the body when the writer cannot take it anyway."""
        writer = getattr(pipeline, "writer", None)
        if writer is None:
            return
        if writer.closed:
            _discard_body(request.stream, cap)
            raise _Reject(503, _UNAVAILABLE, "receiver is shutting down; retry",
                          {"Retry-After": str(SHUTDOWN_RETRY_AFTER)})
        busy = writer.busy()
        if busy:
            _discard_body(request.stream, cap)
            wait = _retry_after(writer.retry_after())
            raise _Reject(429, _UNAVAILABLE, f"receiver busy: {busy}; retry after {wait} s", {"Retry-After": wait})

    def check_token() -> None:
        if token is None:
            return
        scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
        # WSGI header values are latin-1 decoded text: encode back to the bytes sent.
        given = credentials.strip().encode("latin-1", "replace")
        ok = hmac.compare_digest(given, token)  # always compared: constant time either way
        if scheme.lower() != "bearer" or not ok:
            raise _Reject(401, _UNAUTHENTICATED,
                          "missing or invalid ingest token: send Authorization: Bearer <token>",
                          {"WWW-Authenticate": 'Bearer realm="otlp"'})

    def export() -> Response:
        check_token()

        raw_type = request.headers.get("Content-Type", "")
        media = _media_of(raw_type)
        if media in _PROTOBUF_TYPES:
            decode = decode_protobuf
        elif media == _JSON:
            decode = decode_json
        else:
            raise _Reject(415, _INVALID_ARGUMENT,
                          f"unsupported Content-Type {_short(raw_type)!r}: "
                          "send application/x-protobuf or application/json",
                          {"Accept-Post": f"{_PROTOBUF}, {_JSON}"}, media=_JSON)

        codings = [c.strip() for c in request.headers.get("Content-Encoding", "").lower().split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in _CODINGS):
            raise _Reject(415, _INVALID_ARGUMENT,
                          f"unsupported Content-Encoding {_short(request.headers.get('Content-Encoding', ''))!r}: "
                          "send gzip, deflate or no encoding",
                          {"Accept-Encoding": _ACCEPT_ENCODING})
        coding = _CODINGS[codings[0]] if codings else None

        raw_length = request.headers.get("Content-Length")
        if raw_length is not None and not raw_length.strip().isdigit():
            # Werkzeug would read a malformed length as "no body": say so instead.
            raise _Reject(400, _INVALID_ARGUMENT, f"malformed Content-Length {_short(raw_length)!r}")
        length = request.content_length
        if length is not None and length > cap:
            raise _Reject(413, _RESOURCE_EXHAUSTED,
                          f"request body of {length} bytes exceeds the limit of {cap} bytes "
                          "(MODALSCOPE_MAX_REQUEST_BYTES)")

        refuse_early()
        if not gate.reading.acquire(timeout=READ_WAIT):
            _discard_body(request.stream, cap)
            raise _Reject(503, _UNAVAILABLE, "receiver busy reading other requests; retry",
                          {"Retry-After": "1"})
        hold = inflight.hold(BODY_WEIGHT * (length if length is not None else _BODY_READ), READ_WAIT)
        if hold is None:
            gate.reading.release()
            _discard_body(request.stream, cap)
            raise _Reject(503, _UNAVAILABLE, "receiver busy reading other requests; retry", {"Retry-After": "1"})
        sock = request.environ.get("werkzeug.socket")
        progress = reaper.watch(sock) if sock is not None else None
        try:
            try:
                body = _read_body(request.stream, cap, progress, hold if length is None else None)
            finally:
                if progress is not None:
                    reaper.done(progress)
            with gate.decoding:
                if coding is not None:
                    body = _inflate(body, coding, cap)
                    if not hold.grow(BODY_WEIGHT * len(body), READ_WAIT):
                        raise _Reject(503, _UNAVAILABLE, "receiver busy decoding other requests; retry",
                                      {"Retry-After": "1"})
                try:
                    result = decode(body, source="otlp")
                except DecodeError as exc:
                    raise _Reject(400, _INVALID_ARGUMENT, str(exc)) from None
            nbytes = len(body)
            del body
        finally:
            hold.release()
            gate.reading.release()
            trim(length or 0)

        if result.spans:
            try:
                future = pipeline.accept(result.spans, nbytes)
            except WriterFull as exc:
                wait = _retry_after(exc.retry_after)
                raise _Reject(429, _UNAVAILABLE, f"receiver busy: {exc.reason}; retry after {wait} s",
                              {"Retry-After": wait}) from None
            except WriterClosed:
                raise _Reject(503, _UNAVAILABLE, "receiver is shutting down; retry",
                              {"Retry-After": str(SHUTDOWN_RETRY_AFTER)}) from None
            try:
                future.result(timeout=commit_timeout)
            except concurrent.futures.TimeoutError:
                # The spans may still be committed later: resending them is safe (idempotent).
                raise _Reject(503, _UNAVAILABLE,
                              f"spans not committed within {commit_timeout:g} s; retry",
                              {"Retry-After": _retry_after(pipeline.retry_after())}) from None
            except Exception as exc:
                if storage_unavailable(exc):
                    # The writer logs the outage once; a line a request would flood the log.
                    log.debug("OTLP/HTTP: store unavailable: %s", _short(exc, 200))
                    raise _Reject(503, _UNAVAILABLE, "the span store is unavailable; retry",
                                  {"Retry-After": _retry_after(pipeline.retry_after())}) from None
                raise
        if result.rejected:
            log.info("OTLP/HTTP: %d span(s) rejected from %s: %s", result.rejected,
                     request.remote_addr, result.error_message)
        media_out = _response_media(raw_type)
        return Response(encode_response(result.rejected, result.error_message, media_out),
                        status=200, content_type=media_out)

    @app.post("/v1/traces")
    def v1_traces() -> Response:
        media = _response_media(request.headers.get("Content-Type"))
        if not gate.enter():
            _discard_body(request.stream, cap)
            return _status_response(503, _UNAVAILABLE, "receiver is shutting down; retry", media,
                                    {"Retry-After": str(SHUTDOWN_RETRY_AFTER)})
        try:
            return export()
        except _Reject as r:
            level = logging.DEBUG if r.http_status in (401, 429) else logging.INFO
            log.log(level, "OTLP/HTTP %d from %s: %s", r.http_status, request.remote_addr, r.message)
            return _status_response(r.http_status, r.code, r.message, r.media or media, r.headers)
        except Exception:  # noqa: BLE001 - a bug must not take the receiver down or leak a traceback
            log.exception("OTLP/HTTP: unexpected error handling a request from %s", request.remote_addr)
            return _status_response(500, _INTERNAL, "internal error while receiving spans (logged by the receiver)",
                                    media)
        finally:
            gate.leave()

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        # 404 for other paths, 405 for GET /v1/traces, ...: a Status body, never HTML.
        code = {404: _NOT_FOUND, 405: _UNIMPLEMENTED}.get(exc.code or 500, _INVALID_ARGUMENT)
        message = {404: "not found: the OTLP/HTTP receiver serves POST /v1/traces",
                   405: "method not allowed: use POST /v1/traces"}.get(exc.code or 500, exc.name)
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return _status_response(exc.code or 500, code, message, _JSON, headers)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:  # outside the view (e.g. request parsing)
        log.exception("OTLP/HTTP: unexpected error")
        return _status_response(500, _INTERNAL, "internal error (logged by the receiver)", _JSON)

    return app
