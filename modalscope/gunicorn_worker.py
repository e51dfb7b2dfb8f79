"""A gunicorn worker whose threads never wait on a slow client: :class:`HeadFirstWorker`.

gunicorn's ``gthread`` worker hands a connection to a thread as soon as its first byte
arrives; the thread then blocks reading the rest of the request head. A client that sends
its headers a byte at a time (slowloris) holds a thread for as long as it likes, and a few
dozen such connections hold every thread of every worker: the dashboard stops answering.

This worker reads each request head in its main loop instead, non-blocking, beside the
accept loop and the kept-alive connections: a connection reaches a thread only once its
whole head (up to the blank line) is here. A head not complete within
``MODALSCOPE_HEAD_TIMEOUT_S`` (default 10 s), or larger than 64 KiB, closes the connection
with one log line. In the thread, reading the body waits at most that long for each piece
and three times that in all: a stalled upload is a 408, not a held thread.

Use it through ``modalscope.gunicorn_conf`` (``worker_class``); the Docker image does.
"""

from __future__ import annotations

import errno
import select
import selectors
import time
from collections import deque
from functools import partial

from gunicorn.http.errors import NoMoreData
from gunicorn.workers.gthread import TConn, ThreadWorker
from werkzeug.exceptions import RequestTimeout

from .settings import setting_from_env

HEAD_TIMEOUT_S = setting_from_env("head_timeout_s")
MAX_HEAD_BYTES = 64 * 1024
# Connections one client address may have waiting for their head at once: one address cannot
# take all of a worker's ``worker_connections`` (1000). Behind a proxy every client shares its
# address, but a proxy sends whole heads.
MAX_HEADING_PER_CLIENT = 128
# A body may pause as long as a head may take, and take three times that in all (the
# dashboard's bodies are small: callback requests and the sign-in form).
BODY_IDLE_S = HEAD_TIMEOUT_S
BODY_TIMEOUT_S = 3 * HEAD_TIMEOUT_S

_HEAD_END = b"\r\n\r\n"
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
              b"Content-Type: text/plain\r\nContent-Length: 29\r\n\r\nrequest head larger than 64K\n")


class BodyTimeout(RequestTimeout):
    """A request body that stalled while the app reads it: a werkzeug 408, which Flask
    answers (not an ``OSError``: werkzeug would take that for a disconnection, a 400)."""

    def __str__(self) -> str:
        return str(self.description)


class StalledBody(NoMoreData):
    """A body that stalled while gunicorn itself reads it (draining what the app left):
    a premature disconnection to gunicorn, which closes the connection quietly."""


class _BodyReader:
    """The client socket as the request parser reads it: each ``recv`` waits at most
    ``idle`` seconds and never past ``deadline``."""

    def __init__(self, sock, idle: float = BODY_IDLE_S, total: float = BODY_TIMEOUT_S) -> None:
        self._sock = sock
        self._idle = idle
        self._deadline = time.monotonic() + total
        self.in_app = False  # the app is reading (a 408) or gunicorn is (a quiet close)

    def recv(self, size: int, *flags) -> bytes:
        wait = min(self._idle, self._deadline - time.monotonic())
        if wait > 0:
            try:
                ready, _, _ = select.select([self._sock], [], [], wait)
            except ValueError:  # closed meanwhile
                return b""
            if ready:
                return self._sock.recv(size, *flags)
        why = (f"the request body did not arrive in time (it may pause {self._idle:g} s at most, "
               f"and take {BODY_TIMEOUT_S:g} s in all)")
        if self.in_app:
            raise BodyTimeout(description=why)
        raise StalledBody()

    def __getattr__(self, name):
        return getattr(self._sock, name)


class HeadFirstWorker(ThreadWorker):
    """``gthread`` with request heads read in the main loop (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.heading: deque = deque()  # (deadline, conn), in deadline order
        self.heading_by_client: dict[str, int] = {}

    # -- connections waiting for their head, in the main loop ---------------------------
    def accept(self, listener) -> None:
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())  # non-blocking
        if self.heading_by_client.get(_host(conn), 0) >= MAX_HEADING_PER_CLIENT:
            self.log.warning("closed a connection from %s: %d connections of it already sending a head",
                             _peer(conn), MAX_HEADING_PER_CLIENT)
            self.nr_conns -= 1
            conn.close()
            return
        self._await_head(conn)

    def on_client_socket_readable(self, conn, client) -> None:
        """A kept-alive connection has a next request coming: read its head here too."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        conn.sock.setblocking(False)
        self._await_head(conn)
        self._read_head(conn, client)

    def _await_head(self, conn) -> None:
        conn.ms_head = bytearray()
        conn.ms_deadline = time.monotonic() + HEAD_TIMEOUT_S
        self.heading.append((conn.ms_deadline, conn))
        host = _host(conn)
        self.heading_by_client[host] = self.heading_by_client.get(host, 0) + 1
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._read_head, conn))

    def _read_head(self, conn, client) -> None:
        try:
            data = conn.sock.recv(16384)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._drop(conn)
            return
        conn.ms_head += data
        # A blank line (CRLF CRLF) ends the head; a bare LF LF is no valid HTTP/1.1 head,
        # but let the parser refuse it rather than wait for a CRLF that never comes.
        if _HEAD_END in conn.ms_head or b"\n\n" in conn.ms_head:
            self.poller.unregister(conn.sock)
            self._done_heading(conn)
            conn.data_ready = True
            conn.sock.setblocking(True)
            self.enqueue_req(conn)
        elif len(conn.ms_head) > MAX_HEAD_BYTES:
            self.log.warning("closed a connection from %s: request head over %d bytes", _peer(conn), MAX_HEAD_BYTES)
            try:
                conn.sock.send(_TOO_LARGE)
            except OSError:
                pass
            self._drop(conn)

    def _done_heading(self, conn) -> None:
        if conn.ms_deadline is None:
            return
        conn.ms_deadline = None
        host = _host(conn)
        left = self.heading_by_client.get(host, 1) - 1
        if left > 0:
            self.heading_by_client[host] = left
        else:
            self.heading_by_client.pop(host, None)

    def _drop(self, conn) -> None:
        self._done_heading(conn)
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        self.nr_conns -= 1
        conn.close()

    def murder_keepalived(self, force: bool = False) -> None:
        super().murder_keepalived(force)
        now = time.monotonic()
        while self.heading and (force or self.heading[0][0] <= now):
            deadline, conn = self.heading.popleft()
            if conn.ms_deadline is None or conn.ms_deadline != deadline:
                continue  # its head arrived (or it left) before its deadline
            if not force:
                self.log.warning("closed a connection from %s: request head not complete within %g s "
                                 "(%d bytes)", _peer(conn), HEAD_TIMEOUT_S, len(conn.ms_head))
            self._drop(conn)

    # -- in a thread: the head is here --------------------------------------------------
    def handle(self, conn):
        head = bytes(getattr(conn, "ms_head", b""))
        conn.ms_head = bytearray()
        if head or conn.initialized:
            try:
                conn.init()
            except Exception as exc:  # noqa: BLE001 - gunicorn's handle() reports it the same way
                self.handle_error(None, conn.sock, conn.client, exc)
                return False
            unreader = getattr(conn.parser, "unreader", None)
            if unreader is not None:
                if head:
                    unreader.unread(head)
                if hasattr(unreader, "sock"):  # a fresh deadline for each request's body
                    unreader.sock = _BodyReader(conn.sock)
        return super().handle(conn)

    def handle_request(self, req, conn):
        reader = getattr(getattr(conn.parser, "unreader", None), "sock", None)
        if isinstance(reader, _BodyReader):
            reader.in_app = True
        try:
            return super().handle_request(req, conn)
        finally:
            if isinstance(reader, _BodyReader):
                reader.in_app = False


def _host(conn) -> str:
    client = conn.client
    return str(client[0]) if isinstance(client, tuple) and client else str(client)


def _peer(conn) -> str:
    client = conn.client
    return f"{client[0]}:{client[1]}" if isinstance(client, tuple) and len(client) >= 2 else str(client)


__all__ = ["BodyTimeout", "HeadFirstWorker", "StalledBody"]
