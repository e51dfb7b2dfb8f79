"""Errors shared by the receivers (OTLP/HTTP, OTLP/gRPC) and the commands that start them."""

from __future__ import annotations

import errno
import socket

__all__ = ["PortInUse", "bind_error", "probe_bind_error"]


class PortInUse(OSError):
    """A receiver's port is taken. The message names the port, for one clear CLI line."""

    def __init__(self, port: int, what: str, host: str | None = None) -> None:
        where = f"port {port}" if not host else f"port {port} on {host}"
        super().__init__(errno.EADDRINUSE, f"{where} ({what}) is already in use")
        self.port = port
        self.what = what
        self.host = host

    def __str__(self) -> str:  # OSError's default str is "[Errno 98] ..."
        return self.strerror


def bind_error(exc: OSError, host: str, port: int, what: str) -> OSError:
    """Turn a failed ``bind``/``listen`` into a one-line error naming the port."""
    if exc.errno == errno.EADDRINUSE:
        return PortInUse(port, what)
    reason = exc.strerror or str(exc)
    err = OSError(exc.errno, f"cannot listen on {host}:{port} ({what}): {reason}")
    err.__str__ = None  # type: ignore[method-assign]  # (kept simple below)
    return _OneLineOSError(exc.errno, f"cannot listen on {host}:{port} ({what}): {reason}")


class _OneLineOSError(OSError):
    def __str__(self) -> str:
        return self.strerror or super().__str__()


def probe_bind_error(host: str, port: int, what: str) -> OSError:
    """Why can ``host:port`` not be bound? (For servers that only say "failed", like gRPC.)"""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return _OneLineOSError(errno.EADDRNOTAVAIL, f"cannot listen on {host}:{port} ({what}): {exc.strerror}")
    last: OSError | None = None
    for family, type_, proto, _canon, addr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1)
        except OSError as exc:
            last = exc
            if exc.errno == errno.EADDRINUSE:
                return PortInUse(port, what)
        finally:
            sock.close()
    if last is not None:
        return bind_error(last, host, port, what)
    return _OneLineOSError(None, f"cannot listen on {host}:{port} ({what})")
