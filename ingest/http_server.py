"""The threaded HTTP server of the OTLP/HTTP receiver (and of ``modalscope serve``'s
development dashboard): Werkzeug's, with the socket bound by us, a cap on the connections it
serves and a deadline on each request head.

* At most ``MAX_CONNECTIONS`` connections are served at once (each is a thread); past it a
  connection is answered 503 with ``Retry-After`` and closed, and connections that have
  waited over ``EVICT_AFTER`` for a request head are closed to make room.
* No request head may take longer than ``HEAD_TIMEOUT``, however it trickles; a client
  silent for ``IDLE_TIMEOUT`` seconds is dropped.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time

from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler, get_sockaddr, select_address_family

from .errors import bind_error

__all__ = ["Connections", "HTTPReceiver", "MAX_CONNECTIONS", "serve_http"]

log = logging.getLogger(__name__)

#: Seconds a connection may send nothing before it is dropped.
IDLE_TIMEOUT = 30.0
#: Connections served at once; past it a new connection is answered 503 with Retry-After.
MAX_CONNECTIONS = 128
#: A request head (request line and headers) must be complete this many seconds after the
#: connection is ready for it, however it trickles; on a kept-alive connection the wait for
#: the next request counts too, so this also ends idle connections.
HEAD_TIMEOUT = IDLE_TIMEOUT
#: At the connection cap, connections that have waited this long for a request head (idle or
#: trickling) are closed to make room: an exporter sends its head at once.
EVICT_AFTER = 2.0


class Connections:
    """The connections being served: admits up to ``limit``, and closes those whose request
    head has not arrived ``head_timeout`` seconds after they were ready for one.

    A thread blocked reading a head that trickles in is never ended by the socket timeout;
    shutting the socket down from this watcher ends the read."""

    def __init__(self, limit: int = MAX_CONNECTIONS, head_timeout: float = HEAD_TIMEOUT,
                 evict_after: float = EVICT_AFTER, check_every_s: float = 0.5) -> None:
        self.limit, self.head_timeout, self.evict_after = limit, head_timeout, evict_after
        self.check_every_s = check_every_s
        self.active = 0
        self.refused = 0
        self.closed = 0
        self._heads: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modalscope-otlp-http-heads", daemon=True)
        self._thread.start()

    def admit(self) -> bool:
        with self._lock:
            if self.active >= self.limit:
                self.refused += 1
                return False
            self.active += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.active -= 1

    def awaiting_head(self, sock: socket.socket) -> None:
        with self._lock:
            self._heads[sock] = time.monotonic()

    def head_done(self, sock: socket.socket) -> None:
        with self._lock:
            self._heads.pop(sock, None)

    def close_waiting(self, seconds: float) -> int:
        """Close the connections that have waited ``seconds`` or more for a request head."""
        cutoff = time.monotonic() - seconds
        with self._lock:
            late = [sock for sock, since in self._heads.items() if since <= cutoff]
            for sock in late:
                del self._heads[sock]
        for sock in late:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.closed += len(late)
        return len(late)

    def _run(self) -> None:
        while not self._stop.wait(self.check_every_s):
            if self.close_waiting(self.head_timeout):
                log.debug("OTLP/HTTP: closed connections whose request head took over %g s", self.head_timeout)

    def stop(self) -> None:
        self._stop.set()


_BUSY_BODY = b'{"code":14,"message":"receiver busy: too many connections; retry in a second"}'
_BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)


class _Refuser:
    """Answers refused connections 503 and closes them, in a thread of its own so the accept
    loop never waits on a client; the request is drained briefly first, so the answer is not
    lost to a reset. Past ``backlog`` waiting, connections are closed without an answer."""

    def __init__(self, backlog: int = 64) -> None:
        self._queue: queue.Queue = queue.Queue(backlog)
        threading.Thread(target=self._run, name="modalscope-otlp-http-refuser", daemon=True).start()

    def refuse(self, sock: socket.socket) -> None:
        try:
            self._queue.put_nowait(sock)
        except queue.Full:
            sock.close()

    def _run(self) -> None:
        while True:
            sock = self._queue.get()
            try:
                sock.settimeout(0.5)
                sock.sendall(_BUSY_RESPONSE)
                sock.shutdown(socket.SHUT_WR)
                drained = 0
                while drained < 1 << 20:
                    data = sock.recv(65536)
                    if not data:
                        break
                    drained += len(data)
            except OSError:
                pass
            finally:
                sock.close()


class _ReceiverServer(ThreadedWSGIServer):
    """Werkzeug's threaded server, serving at most ``connections.limit`` connections."""

    connections: Connections
    refuser: _Refuser

    def process_request(self, request, client_address) -> None:
        if not self.connections.admit():
            self.connections.close_waiting(self.connections.evict_after)
            self.refuser.refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.head_done(request)
            self.connections.release()


class _RequestHandler(WSGIRequestHandler):
    """Werkzeug's handler, with access logs sent to our logger at DEBUG (not stderr), a socket
    timeout (a client silent for IDLE_TIMEOUT seconds is dropped), and each request head
    watched by the server's :class:`Connections`."""

    timeout = IDLE_TIMEOUT

    def handle_one_request(self) -> None:
        connections = getattr(self.server, "connections", None)
        if connections is not None:
            connections.awaiting_head(self.connection)
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()  # reads the headers
        connections = getattr(self.server, "connections", None)
        if connections is not None:
            connections.head_done(self.connection)
        return ok

    def log(self, type: str, message: str, *args) -> None:  # noqa: A002 - Werkzeug's signature
        level = logging.DEBUG if type == "info" else logging.WARNING
        if log.isEnabledFor(level):
            log.log(level, "%s - %s", self.address_string(), message % args if args else message)


class HTTPReceiver:
    """A running Werkzeug server in a daemon thread; :meth:`shutdown` stops it."""

    def __init__(self, server, thread: threading.Thread, what: str) -> None:
        self.server = server
        self.thread = thread
        self.what = what
        self.host = server.server_address[0]
        self.port = int(server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop accepting, let the serving loop end and close the listening socket."""
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join(timeout)
        self.server.server_close()
        self.server.connections.stop()

    def __enter__(self) -> "HTTPReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _listen(host: str, port: int, what: str, reuse_port: bool = False) -> socket.socket:
    family = select_address_family(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:  # receiver processes sharing one port (ingest/receivers.py)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(get_sockaddr(host, int(port), family))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise bind_error(exc, host, port, what) from None
    except BaseException:
        sock.close()
        raise
    return sock


def serve_http(app, host: str, port: int, *, what: str = "OTLP/HTTP",
               poll_interval: float = 0.1, reuse_port: bool = False,
               connections: Connections | None = None) -> HTTPReceiver:
    """Serve ``app`` on ``host:port`` (``port`` 0: any free port, see ``.port``), threaded.

    The socket is bound here, not by Werkzeug (which prints and calls ``sys.exit`` when it
    cannot bind), so a taken port raises :class:`PortInUse` naming it. ``reuse_port``: bind
    with SO_REUSEPORT, so other receiver processes of ours can share the port.
    ``connections``: the connection cap and head deadline (default :class:`Connections`).
    """
    sock = _listen(host, port, what, reuse_port)
    try:
        # Werkzeug duplicates the descriptor; ours is closed right after.
        server = _ReceiverServer(host, int(port), app, _RequestHandler, fd=sock.fileno())
    finally:
        sock.close()
    server.connections = connections if connections is not None else Connections()
    server.refuser = _Refuser()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval},
                              name=f"modalscope-{what.lower().replace('/', '-')}-{server.port}", daemon=True)
    thread.start()
    log.info("%s listening on %s:%d", what, host, server.port)
    return HTTPReceiver(server, thread, what)
