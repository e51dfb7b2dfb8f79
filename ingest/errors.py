"""Errors shared by the receivers (OTLP/HTTP, OTLP/gRPC) and the commands that start them.

Binding problems surface as ``OSError`` subclasses whose ``str()`` is one line naming the
port, so a command can print it as is ("port 4318 (OTLP/HTTP) is already in use").
"""

from __future__ import annotations

import errno
import socket

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError

__all__ = ["ListenError", "PortInUse", "bind_error", "probe_bind_error", "storage_unavailable"]


class ListenError(OSError):
    """A receiver cannot listen on its address; ``str()`` is the one-line message."""

    def __str__(self) -> str:  # OSError's default is "[Errno 98] ..."
        return self.strerror or super().__str__()


class PortInUse(ListenError):
    """A receiver's port is taken by another program."""

    def __init__(self, port: int, what: str) -> None:
        super().__init__(errno.EADDRINUSE, f"port {port} ({what}) is already in use")
        self.port = port
        self.what = what


def bind_error(exc: OSError, host: str, port: int, what: str) -> ListenError:
    """Turn a failed ``bind``/``listen`` into a one-line error naming the port."""
    if exc.errno == errno.EADDRINUSE:
        return PortInUse(port, what)
    reason = exc.strerror or str(exc)
    return ListenError(exc.errno, f"cannot listen on {host}:{port} ({what}): {reason}")


def probe_bind_error(host: str, port: int, what: str) -> ListenError:
    """Why can ``host:port`` not be bound? For servers that only say "failed" (gRPC)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return ListenError(errno.EADDRNOTAVAIL, f"cannot listen on {host}:{port} ({what}): {exc.strerror}")
    last: OSError | None = None
    for family, type_, proto, _canon, addr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return PortInUse(port, what)
            last = exc
        finally:
            sock.close()
    if last is not None:
        return bind_error(last, host, port, what)
    return ListenError(errno.EADDRNOTAVAIL, f"cannot listen on {host}:{port} ({what})")


def storage_unavailable(exc: BaseException) -> bool:
    """Is ``exc`` the store being unreachable (retry later) rather than a bug (don't)?

    A receiver answers the first with 503/UNAVAILABLE and a retry delay, the second with
    500/INTERNAL: OTLP clients retry only the former.
    """
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)
