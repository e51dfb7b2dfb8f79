"""The bytes of request bodies a receiver process holds at once, bounded.

A body being read, inflated or decoded costs its size two or three times over (the body, the
parser's copy, the attribute bytes); both receivers reserve it here first, so a burst of
large requests waits its turn (and is answered 503/UNAVAILABLE after a bounded wait) instead
of multiplying the process's memory.
"""

from __future__ import annotations

import threading

__all__ = ["InflightBytes", "Hold"]


class InflightBytes:
    """A byte budget shared by the receivers of one process."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.used = 0
        self._cond = threading.Condition()

    def hold(self, nbytes: int, timeout: float) -> "Hold | None":
        """Reserve ``nbytes`` (waiting up to ``timeout`` s), or None if the budget stays full."""
        held = Hold(self)
        return held if held.grow(nbytes, timeout) else None

    def _take(self, nbytes: int, timeout: float) -> bool:
        with self._cond:
            # A request larger than the whole budget goes through alone, once nothing else is held.
            fits = lambda: self.used + nbytes <= self.limit or self.used == 0  # noqa: E731
            if not self._cond.wait_for(fits, timeout):
                return False
            self.used += nbytes
            return True

    def _give(self, nbytes: int) -> None:
        with self._cond:
            self.used -= nbytes
            self._cond.notify_all()


class Hold:
    """Bytes one request holds of an :class:`InflightBytes` budget; ``release()`` when done."""

    __slots__ = ("budget", "nbytes")

    def __init__(self, budget: InflightBytes) -> None:
        self.budget = budget
        self.nbytes = 0

    def grow(self, nbytes: int, timeout: float) -> bool:
        """Hold ``nbytes`` in all (a request whose size shows as it is read or inflated)."""
        extra = int(nbytes) - self.nbytes
        if extra <= 0:
            return True
        if not self.budget._take(extra, timeout):
            return False
        self.nbytes += extra
        return True

    def release(self) -> None:
        if self.nbytes:
            self.budget._give(self.nbytes)
            self.nbytes = 0

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
