"""What keeps the OTLP/HTTP receiver bounded in memory and threads: the reading and
decoding slots (:class:`IngestGate`), a body read within the size cap and the byte-rate
floor (:class:`SlowBodyReaper`), and decompression that stops at the cap.

A request refused here raises :class:`_Reject`, which ``otlp_http.py`` answers with a
``google.rpc.Status`` body.
"""

from __future__ import annotations

import logging
import socket
import time
import threading
import zlib

from werkzeug.exceptions import ClientDisconnected

from .inflight import Hold
from .pipeline import BODY_WEIGHT

__all__ = ["BODY_GRACE_S", "MAX_BODY_S", "MAX_DECODING", "MAX_READING", "MIN_BODY_BYTES_PER_S", "READ_WAIT",
           "IngestGate", "SlowBodyReaper"]

log = logging.getLogger("modalscope.ingest.otlp_http")  # the receiver's one logger, configured as one

_READ_CHUNK = 256 * 1024
#: Requests holding a body at once (each up to the size cap, plus its decoded spans).
MAX_READING = 16
#: Requests decompressing or decoding at once: CPU work, more gain nothing under the GIL
#: (each receiver, HTTP and gRPC, has as many).
MAX_DECODING = 4
#: Seconds a request (an Export: bounded by the call's deadline too) waits for its spans to
#: be committed before it is answered 503 / UNAVAILABLE.
COMMIT_TIMEOUT = 60.0
#: ``Retry-After`` (gRPC: the RetryInfo delay) when the writer is shutting down (a restart
#: is expected).
SHUTDOWN_RETRY_AFTER = 5
#: Seconds a request waits for a reading slot before 503.
READ_WAIT = 10.0
#: A body being read must keep arriving at this rate after a grace period, or its connection
#: is closed: a byte every few seconds never trips the idle timeout, but would hold a reading
#: slot for as long as the client likes.
MIN_BODY_BYTES_PER_S = 8 * 1024
BODY_GRACE_S = 5.0
#: No body is read for longer than this, however fast it trickles.
MAX_BODY_S = 120.0

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
