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
bodies and sets ``wsgi.input_terminated``) in a daemon thread.
"""

from __future__ import annotations

import concurrent.futures
import hmac
import logging
import math
import socket
import time
import threading
import zlib

from flask import Flask, Response, request
from werkzeug.exceptions import ClientDisconnected, HTTPException

from ..settings import Settings
from .errors import ListenError, PortInUse, storage_unavailable
from .http_server import MAX_CONNECTIONS, HTTPReceiver, serve_http
from .otlp import DecodeError, decode_json, decode_protobuf, encode_response, encode_status
from .inflight import Hold, InflightBytes
from .memory import trim
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

#: Seconds a request waits for its spans to be committed before answering 503.
COMMIT_TIMEOUT = 60.0
#: ``Retry-After`` when the writer is shutting down (a restart is expected).
SHUTDOWN_RETRY_AFTER = 5
_READ_CHUNK = 256 * 1024
#: Requests holding a body at once (each up to the size cap, plus its decoded spans).
MAX_READING = 16
#: Requests decompressing or decoding at once: CPU work, more gain nothing under the GIL.
MAX_DECODING = 4
#: Seconds a request waits for a reading slot before 503.
READ_WAIT = 10.0
#: A body being read must keep arriving at this rate after a grace period, or its connection
#: is closed: a byte every few seconds never trips the idle timeout, but would hold a reading
#: slot for as long as the client likes.
MIN_BODY_BYTES_PER_S = 8 * 1024
BODY_GRACE_S = 5.0
#: No body is read for longer than this, however fast it trickles.
MAX_BODY_S = 120.0

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_PROTOBUF_TYPES = frozenset((_PROTOBUF, "application/protobuf"))

# gRPC status codes, for the ``code`` of google.rpc.Status bodies.
_INVALID_ARGUMENT = 3
_NOT_FOUND = 5
_RESOURCE_EXHAUSTED = 8
_UNIMPLEMENTED = 12
_INTERNAL = 13
_UNAVAILABLE = 14
_UNAUTHENTICATED = 16

# Content codings: name -> zlib wbits (None: not compressed). gzip accepts a zlib header
# too (wbits 32+15 auto-detects); deflate is zlib-wrapped per RFC 9110, but some clients
# send raw deflate, recognised by the missing zlib header.
_GZIP = 32 + zlib.MAX_WBITS
_DEFLATE = "deflate"
_CODINGS: dict[str, object] = {"gzip": _GZIP, "x-gzip": _GZIP, "deflate": _DEFLATE}
_ACCEPT_ENCODING = "gzip, deflate, identity"


class _Reject(Exception):
    """Answer the request with an error status and a google.rpc.Status body."""

    def __init__(self, http_status: int, code: int, message: str,
                 headers: dict[str, str] | None = None, media: str | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.media = media


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


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- gate


class IngestGate:
    """The requests one receiver has taken: how many decode at once, and draining on stop.

    ``drain()`` makes every later request a 503 and waits for the ones in flight (they
    are waiting for their commits) so a stopping receiver answers what it took.
    """

    def __init__(self, max_reading: int = MAX_READING, max_decoding: int = MAX_DECODING) -> None:
        self.reading = threading.BoundedSemaphore(max_reading)
        self.decoding = threading.BoundedSemaphore(max_decoding)
        self._idle = threading.Condition()
        self._inflight = 0
        self.draining = False

    def enter(self) -> bool:
        with self._idle:
            if self.draining:
                return False
            self._inflight += 1
            return True

    def leave(self) -> None:
        with self._idle:
            self._inflight -= 1
            if self._inflight <= 0:
                self._idle.notify_all()

    @property
    def inflight(self) -> int:
        return self._inflight

    def drain(self, timeout: float) -> bool:
        """Refuse new requests; wait up to ``timeout`` s for those in flight. True when none is left."""
        with self._idle:
            self.draining = True
            return self._idle.wait_for(lambda: self._inflight <= 0, timeout)


# --------------------------------------------------------------------------- body


def _discard_body(stream, cap: int) -> None:
    """Read and drop a body we refuse, so the client reads our answer instead of a reset
    (closing a socket with unread data sends RST). Holds one chunk at a time."""
    size = 0
    try:
        while size <= cap:
            chunk = stream.read(_READ_CHUNK)
            if not chunk:
                return
            size += len(chunk)
    except (ClientDisconnected, OSError, ValueError):
        pass


class _BodyProgress:
    __slots__ = ("sock", "started", "read")

    def __init__(self, sock) -> None:
        self.sock = sock
        self.started = time.monotonic()
        self.read = 0


class SlowBodyReaper:
    """Closes the connection of a body that arrives slower than ``MIN_BODY_BYTES_PER_S``
    (after ``BODY_GRACE_S``, with one read's worth of credit) or takes over ``MAX_BODY_S``.

    The reading thread is blocked inside a socket read, which the idle timeout never ends
    while bytes keep trickling in; shutting the socket down from this watcher ends the read,
    and the request is answered as a body that ended early."""

    def __init__(self, min_rate: float = MIN_BODY_BYTES_PER_S, grace_s: float = BODY_GRACE_S,
                 max_s: float = MAX_BODY_S, check_every_s: float = 0.5) -> None:
        self.min_rate, self.grace_s, self.max_s, self.check_every_s = min_rate, grace_s, max_s, check_every_s
        self._reading: set[_BodyProgress] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.cut = 0

    def watch(self, sock) -> _BodyProgress:
        progress = _BodyProgress(sock)
        with self._lock:
            self._reading.add(progress)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="modalscope-slow-bodies", daemon=True)
                self._thread.start()
        return progress

    def done(self, progress: _BodyProgress) -> None:
        with self._lock:
            self._reading.discard(progress)

    def too_slow(self, progress: _BodyProgress, now: float) -> bool:
        elapsed = now - progress.started
        owed = self.min_rate * (elapsed - self.grace_s)
        return elapsed > self.max_s or progress.read + _BODY_READ < owed

    def _run(self) -> None:
        while True:
            time.sleep(self.check_every_s)
            now = time.monotonic()
            with self._lock:
                slow = [p for p in self._reading if self.too_slow(p, now)]
                self._reading.difference_update(slow)
            for p in slow:
                self.cut += 1
                log.info("OTLP/HTTP: closed a connection whose body arrived too slowly (%d bytes in %.0f s)",
                         p.read, now - p.started)
                try:
                    p.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


#: Bytes a body read asks for at once while watched: small enough that a legitimate slow
#: client's progress shows within the grace period.
_BODY_READ = 64 * 1024


def _read_body(stream, cap: int, progress: _BodyProgress | None = None, hold: Hold | None = None) -> bytes:
    """Read the whole body, refusing it (413) as soon as it passes ``cap`` bytes.

    Never holds more than cap + 1 bytes. Works for ``Content-Length`` bodies (Werkzeug
    limits the stream to it) and chunked ones (the server de-chunks and ends the stream).
    ``progress`` counts what has arrived, for :class:`SlowBodyReaper`; ``hold`` grows with
    a body of unknown length (503 when the process's body budget stays full).
    """
    parts: list[bytes] = []
    size = 0
    step = _BODY_READ if progress is not None else _READ_CHUNK
    try:
        while True:
            chunk = stream.read(min(step, cap + 1 - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
            if hold is not None and not hold.grow(BODY_WEIGHT * (size + step), READ_WAIT):
                raise _Reject(503, _UNAVAILABLE, "receiver busy reading other requests; retry",
                              {"Retry-After": "1"})
            if progress is not None:
                progress.read = size
            if size > cap:
                raise _Reject(413, _RESOURCE_EXHAUSTED,
                              f"request body exceeds the limit of {cap} bytes (MODALSCOPE_MAX_REQUEST_BYTES)")
    except ClientDisconnected:
        raise _Reject(400, _INVALID_ARGUMENT, "request body ended before its Content-Length") from None
    except (OSError, ValueError) as exc:  # a malformed chunked encoding
        raise _Reject(400, _INVALID_ARGUMENT, f"cannot read request body: {_short(exc)}") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _is_zlib_header(data: bytes) -> bool:
    return len(data) >= 2 and (data[0] & 0x0F) == 8 and (data[0] >> 4) <= 7 and (data[0] << 8 | data[1]) % 31 == 0


def _inflate(data: bytes, coding: object, cap: int) -> bytes:
    """Decompress ``data``, refusing (413) once the output passes ``cap`` bytes.

    zlib's ``max_length`` bounds every step, so a bomb costs at most cap + 1 bytes.
    Concatenated gzip members (RFC 1952 allows them) are all inflated.
    """
    name = "gzip" if coding == _GZIP else "deflate"
    if coding == _DEFLATE:
        wbits = zlib.MAX_WBITS if _is_zlib_header(data) else -zlib.MAX_WBITS
    else:
        wbits = int(coding)  # type: ignore[call-overload]
    parts: list[bytes] = []
    size = 0
    pending = data
    try:
        while True:
            d = zlib.decompressobj(wbits)
            while True:
                out = d.decompress(pending, cap + 1 - size)  # max_length >= 1: never 0 (= unbounded)
                if out:
                    size += len(out)
                    if size > cap:
                        raise _Reject(413, _RESOURCE_EXHAUSTED,
                                      f"decompressed request body exceeds the limit of {cap} bytes "
                                      "(MODALSCOPE_MAX_REQUEST_BYTES)")
                    parts.append(out)
                pending = d.unconsumed_tail
                if d.eof or (not pending and not out):
                    break
            if not d.eof:
                raise _Reject(400, _INVALID_ARGUMENT, f"invalid {name} body: compressed data is truncated")
            pending = d.unused_data
            if not pending or wbits != _GZIP:
                if pending and pending.strip(b"\x00"):
                    raise _Reject(400, _INVALID_ARGUMENT, f"invalid {name} body: trailing data after the end")
                break
            if not pending.strip(b"\x00"):  # zero padding after the last member
                break
    except zlib.error as exc:
        raise _Reject(400, _INVALID_ARGUMENT, f"invalid {name} body: {_short(exc)}") from None
    return b"".join(parts)


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
