"""The OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

The method is registered with a generic handler and *no* request deserializer, so the
receiver parses the request bytes itself: grpcio's default deserializer answers
``INTERNAL`` to garbage, the OTLP specification wants ``INVALID_ARGUMENT`` (not retryable).

* bad data -> ``INVALID_ARGUMENT`` with the decoder's message;
* larger than ``MODALSCOPE_MAX_REQUEST_BYTES`` -> ``RESOURCE_EXHAUSTED`` (grpc itself
  refuses bigger messages through ``grpc.max_receive_message_length``; the decoded size
  is checked again here);
* writer full, the settler too far behind, shutting down, or no commit in time ->
  ``UNAVAILABLE`` with a ``google.rpc.RetryInfo``: inside a ``google.rpc.Status`` in the
  ``grpc-status-details-bin`` trailer (what the Go and Java exporters and ``grpc_status``
  read) and bare in the ``google.rpc.retryinfo-bin`` trailer (what opentelemetry-python's
  exporter reads);
* with ``MODALSCOPE_INGEST_TOKEN`` set, metadata ``authorization: Bearer <token>`` is
  required -> ``UNAUTHENTICATED`` otherwise;
* gzip-compressed requests are inflated by grpc;
* success (after the commit) -> ``ExportTraceServiceResponse``, with ``partial_success``
  when spans were rejected one by one.
* The method is served as client-streaming (the same on the wire as unary), so a call takes
  a thread as it starts and the receiver sees how long its message takes to arrive. At most
  ``MAX_RECEIVING`` calls wait for their message at once; past that a call is answered
  ``UNAVAILABLE`` with a ``RetryInfo`` at once, and the calls that have waited longer than
  ``EVICT_AFTER`` are cancelled to make room. No message may take longer than
  ``RECEIVE_TIMEOUT``. So streams that announce a message and trickle it cannot hold the
  receiver against exporters that send theirs at once.
* An Export then holds a worker thread until its spans are committed; when all but
  ``RESERVED_WORKERS`` are held (a slow or locked store), further Exports are answered
  ``UNAVAILABLE`` with a ``RetryInfo`` at once by the reserved ones, instead of queueing
  behind the held workers until the client's deadline passes. ``MAX_DECODING`` decode at
  once (CPU work under the GIL; each holds its request's bytes).
"""

from __future__ import annotations

import concurrent.futures
import hmac
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from ..settings import Settings
from .errors import ListenError, PortInUse, probe_bind_error, storage_unavailable
from .otlp import DecodeError, decode_protobuf, encode_response
from .inflight import InflightBytes
from .memory import trim
from .otlp_http_limits import COMMIT_TIMEOUT, MAX_DECODING, SHUTDOWN_RETRY_AFTER
from .pipeline import BODY_WEIGHT, INFLIGHT_BYTES, IngestPipeline, WriterClosed, WriterFull

__all__ = ["SERVICE", "METHOD", "FULL_METHOD", "ListenError", "PortInUse", "serve_grpc"]

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
METHOD = "Export"
FULL_METHOD = f"/{SERVICE}/{METHOD}"

#: Worker threads that never wait for a commit, so a busy receiver can still say so.
RESERVED_WORKERS = 2
#: Calls receiving their request message at once. Each may buffer up to the size cap and grpc
#: copies it once more into the bytes handed over: two at once held too much memory in a
#: receiver fed 16 MiB calls; an exporter's message arrives quickly, so one slot costs little.
MAX_RECEIVING = 1
#: Seconds a call waits for a receiving slot before it is refused.
RECEIVE_SLOT_WAIT = 1.0
#: Seconds a call may take to deliver its message; then it is cancelled.
RECEIVE_TIMEOUT = 60.0
#: When every receiving slot is taken, calls still waiting for their message after this many
#: seconds are cancelled to make room: an exporter's message arrives in milliseconds.
EVICT_AFTER = 2.0
#: Seconds a received request waits for room in the process's body budget before UNAVAILABLE.
DECODE_WAIT = 10.0

_PROTOBUF = "application/x-protobuf"


class _Failure:
    """An Export that ends with a non-OK status (and maybe trailing metadata)."""

    __slots__ = ("code", "message", "trailing")

    def __init__(self, code: grpc.StatusCode, message: str, trailing: tuple = ()) -> None:
        self.code = code
        self.message = message
        self.trailing = trailing


def _unavailable(message: str, retry_after: float) -> _Failure:
    """UNAVAILABLE with a RetryInfo, in both trailers the OTel exporters read."""
    try:
        seconds = max(1, min(int(math.ceil(float(retry_after))), 3600))
    except (TypeError, ValueError, OverflowError):
        seconds = 1
    retry_info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds))
    detail = any_pb2.Any()
    detail.Pack(retry_info)
    status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message=message, details=[detail])
    trailing = (
        ("grpc-status-details-bin", status.SerializeToString()),
        ("google.rpc.retryinfo-bin", retry_info.SerializeToString()),
    )
    return _Failure(grpc.StatusCode.UNAVAILABLE, message, trailing)


def _short(text: object, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Receiving:
    """The calls waiting for their request message, and a thread that cancels the ones past
    ``RECEIVE_TIMEOUT`` (a trickle never ends on its own)."""

    def __init__(self, slots: int, timeout: float = RECEIVE_TIMEOUT, evict_after: float = EVICT_AFTER,
                 check_every: float = 0.5) -> None:
        self.slots = threading.BoundedSemaphore(max(1, slots))
        self.timeout = timeout
        self.evict_after = evict_after
        self.check_every = check_every
        self.cancelled = 0
        self._waiting: dict[int, tuple[float, grpc.ServicerContext]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modalscope-otlp-grpc-receiving", daemon=True)
        self._thread.start()

    def watch(self, context: grpc.ServicerContext) -> int:
        key = id(context)
        with self._lock:
            self._waiting[key] = (time.monotonic(), context)
        return key

    def done(self, key: int) -> None:
        with self._lock:
            self._waiting.pop(key, None)

    def cancel_older_than(self, seconds: float) -> int:
        cutoff = time.monotonic() - seconds
        with self._lock:
            late = [key for key, (since, _) in self._waiting.items() if since <= cutoff]
            contexts = [self._waiting.pop(key)[1] for key in late]
        for context in contexts:
            context.cancel()  # the handler's wait for the message ends; its slot is freed
        self.cancelled += len(contexts)
        return len(contexts)

    def _run(self) -> None:
        while not self._stop.wait(self.check_every):
            if self.cancel_older_than(self.timeout):
                log.debug("OTLP/gRPC: cancelled calls whose message took over %g s", self.timeout)

    def stop(self) -> None:
        self._stop.set()


class _TraceService:
    def __init__(self, pipeline: IngestPipeline, settings: Settings, commit_timeout: float,
                 max_busy: int = 1 << 30, receiving: _Receiving | None = None) -> None:
        self.pipeline = pipeline
        self.cap = int(settings.max_request_bytes)
        self.token = settings.ingest_token.encode("utf-8") if settings.ingest_token else None
        self.commit_timeout = commit_timeout
        self._busy = threading.BoundedSemaphore(max(1, max_busy))
        self._decoding = threading.BoundedSemaphore(MAX_DECODING)
        self.inflight = getattr(pipeline, "inflight", None) or InflightBytes(max(INFLIGHT_BYTES, BODY_WEIGHT * self.cap))
        self.receiving = receiving if receiving is not None else _Receiving(MAX_RECEIVING)

    def export_call(self, request_iterator, context: grpc.ServicerContext) -> bytes:
        """The Export call as it starts: wait (bounded) for its one message, then export it."""
        receiving = self.receiving
        if not receiving.slots.acquire(timeout=RECEIVE_SLOT_WAIT):
            evicted = receiving.cancel_older_than(receiving.evict_after)
            return self._finish(_unavailable(
                "receiver busy receiving other requests; retry" + (" (slow senders cut)" if evicted else ""), 1),
                context)
        try:
            key = receiving.watch(context)
            try:
                request = next(request_iterator, None)
            except Exception:  # noqa: BLE001 - cancelled (by us or the client) while waiting
                request = None
            finally:
                receiving.done(key)
        finally:
            receiving.slots.release()
        if request is None:
            if not context.is_active():
                return b""  # cancelled: nobody is listening for an answer
            return self._finish(_Failure(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message"),
                                context)
        size = len(request)
        try:
            return self.export(request, context)
        finally:
            del request
            trim(size)

    def export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if not self._busy.acquire(blocking=False):
            writer = getattr(self.pipeline, "writer", None)
            outcome: bytes | _Failure = _unavailable(
                "receiver busy: every worker is waiting for the store; retry later",
                writer.retry_after() if writer is not None else 1)
        else:
            try:
                outcome = self._guarded_export(request, context)
            finally:
                self._busy.release()
        return self._finish(outcome, context)

    @staticmethod
    def _finish(outcome: "bytes | _Failure", context: grpc.ServicerContext) -> bytes:
        if isinstance(outcome, _Failure):
            level = logging.DEBUG if outcome.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE) \
                else logging.INFO
            log.log(level, "OTLP/gRPC %s from %s: %s", outcome.code.name, context.peer(), outcome.message)
            if outcome.trailing:
                context.set_trailing_metadata(outcome.trailing)
            context.abort(outcome.code, outcome.message)  # raises
        return outcome

    def _guarded_export(self, request: bytes, context: grpc.ServicerContext) -> bytes | _Failure:
        try:
            return self._export(request, context)
        except Exception:  # noqa: BLE001 - a bug must not take the receiver down
            log.exception("OTLP/gRPC: unexpected error handling an Export from %s", context.peer())
            return _Failure(grpc.StatusCode.INTERNAL, "internal error while receiving spans (logged by the receiver)")

    def _authorized(self, context: grpc.ServicerContext) -> bool:
        # (the interceptor refused callers without the token before their message was read)
        return self.token is None or bearer_matches(context.invocation_metadata(), self.token)

    def _export(self, request: bytes, context: grpc.ServicerContext) -> bytes | _Failure:
        if not self._authorized(context):
            return _Failure(grpc.StatusCode.UNAUTHENTICATED,
                            "missing or invalid ingest token: send metadata authorization: Bearer <token>")
        writer = getattr(self.pipeline, "writer", None)
        if writer is not None and writer.closed:
            return _unavailable("receiver is shutting down; retry", SHUTDOWN_RETRY_AFTER)
        busy = writer.busy() if writer is not None else None
        if busy:  # refuse before spending a decode on it
            return _unavailable(f"receiver busy: {busy}; retry later", writer.retry_after())
        if len(request) > self.cap:  # grpc checks the wire size; this is the inflated size
            return _Failure(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"request of {len(request)} bytes exceeds the limit of {self.cap} bytes "
                            "(MODALSCOPE_MAX_REQUEST_BYTES)")
        nbytes = len(request)
        hold = self.inflight.hold(BODY_WEIGHT * nbytes, DECODE_WAIT)
        if hold is None:
            return _unavailable("receiver busy decoding other requests; retry", 1)
        try:
            with self._decoding:
                result = decode_protobuf(request, source="otlp")
        except DecodeError as exc:
            return _Failure(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            hold.release()

        if result.spans:
            try:
                future = self.pipeline.accept(result.spans, nbytes)
            except WriterFull as exc:
                return _unavailable(f"receiver busy: {exc.reason}; retry later", exc.retry_after)
            except WriterClosed:
                return _unavailable("receiver is shutting down; retry", SHUTDOWN_RETRY_AFTER)
            timeout = self.commit_timeout
            remaining = context.time_remaining()
            if remaining is not None:
                timeout = max(0.001, min(timeout, remaining))
            try:
                future.result(timeout=timeout)
            except concurrent.futures.TimeoutError:
                # The spans may still be committed later: resending them is safe (idempotent).
                return _unavailable(f"spans not committed within {timeout:g} s; retry", self.pipeline.retry_after())
            except Exception as exc:
                if storage_unavailable(exc):
                    # The writer logs the outage once; a line a request would flood the log.
                    log.debug("OTLP/gRPC: store unavailable: %s", _short(exc))
                    return _unavailable("the span store is unavailable; retry", self.pipeline.retry_after())
                raise
        if result.rejected:
            log.info("OTLP/gRPC: %d span(s) rejected from %s: %s", result.rejected, context.peer(),
                     result.error_message)
        return encode_response(result.rejected, result.error_message, _PROTOBUF)


def bearer_matches(metadata, token: bytes) -> bool:
    """Whether gRPC ``metadata`` carries ``authorization: Bearer <token>`` (constant time)."""
    value = ""
    for key, v in metadata or ():
        if key.lower() == "authorization":
            value = v.decode("latin-1") if isinstance(v, bytes) else str(v)
            break
    scheme, _, credentials = value.strip().partition(" ")
    ok = hmac.compare_digest(credentials.strip().encode("utf-8", "replace"), token)
    return scheme.lower() == "bearer" and ok


class _TokenInterceptor(grpc.ServerInterceptor):
    """Checks the ingest token in the call's metadata before the request message is read.

    A unary handler's worker thread waits for the whole message, so a caller without the
    token that announces a large message and trickles it would hold a thread for as long as
    it likes; refused here, the call is answered by a handler that never reads its request,
    and the thread is free at once."""

    def __init__(self, token: bytes) -> None:
        self.token = token
        self._refuse = grpc.stream_unary_rpc_method_handler(self._unauthenticated)

    def intercept_service(self, continuation, handler_call_details):
        if bearer_matches(handler_call_details.invocation_metadata, self.token):
            return continuation(handler_call_details)
        return self._refuse

    @staticmethod
    def _unauthenticated(request_iterator, context):
        log.debug("OTLP/gRPC UNAUTHENTICATED from %s (before reading the request)", context.peer())
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      "missing or invalid ingest token: send metadata authorization: Bearer <token>")


def _address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


EARLY_WINDOW = 64 * 1024  # HTTP/2 stream window before the receiver reads a call's message


def serve_grpc(pipeline: IngestPipeline, settings: Settings, host: str, port: int,
               max_workers: int = 16, *, commit_timeout: float = COMMIT_TIMEOUT,
               reuse_port: bool = False, max_receiving: int = MAX_RECEIVING,
               receive_timeout: float = RECEIVE_TIMEOUT) -> grpc.Server:
    """Start the OTLP/gRPC receiver on ``host:port`` and return the started server.

    ``port`` 0 binds any free port; the bound port is set as ``server.port``. A taken port
    raises :class:`PortInUse` naming it; ``server.stop(grace)`` stops the receiver.
    ``reuse_port``: share the port with other receiver processes of ours (SO_REUSEPORT).
    ``max_workers``: threads for calls past their message; ``max_receiving`` more wait for
    messages (at most ``receive_timeout`` seconds each).
    """
    cap = int(settings.max_request_bytes)
    token = settings.ingest_token.encode("utf-8") if settings.ingest_token else None
    server = grpc.server(
        # the receiving calls wait in threads of their own, beside the workers
        ThreadPoolExecutor(max_workers=max_workers + max_receiving, thread_name_prefix="modalscope-otlp-grpc"),
        interceptors=[_TokenInterceptor(token)] if token else None,
        options=[
            ("grpc.max_receive_message_length", cap),
            # grpc sets SO_REUSEPORT by default on Linux, so a second receiver would silently
            # share a port already in use instead of failing: off unless we share on purpose.
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            # A call may send only EARLY_WINDOW bytes before its message is asked for (then the
            # window covers the message): grpc's probing otherwise lets each waiting call's
            # client push megabytes into the receiver's memory before a slot frees.
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", EARLY_WINDOW),
        ],
    )
    receiving = _Receiving(max_receiving, timeout=receive_timeout)
    service = _TraceService(pipeline, settings, commit_timeout, max_busy=max_workers - RESERVED_WORKERS,
                            receiving=receiving)
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {METHOD: grpc.stream_unary_rpc_method_handler(service.export_call, request_deserializer=None,
                                                      response_serializer=None)},
    )
    server.add_generic_rpc_handlers((handler,))
    try:
        bound = server.add_insecure_port(_address(host, port))
    except RuntimeError:  # recent grpcio raises instead of returning 0
        bound = 0
    if not bound:
        server.stop(None)
        receiving.stop()
        raise probe_bind_error(host, port, "OTLP/gRPC")
    server.start()
    server.port = bound  # type: ignore[attr-defined]
    server.receiving = receiving  # type: ignore[attr-defined]
    grpc_stop = server.stop

    def stop(grace):  # grpc's Server cannot be subclassed: its watchdog stops with it this way
        receiving.stop()
        return grpc_stop(grace)

    server.stop = stop  # type: ignore[method-assign]
    log.info("OTLP/gRPC receiver listening on %s:%d", host, bound)
    return server
