"""When periodic work is due, for the loops that turn often and do it now and then (the
settler's packing, retention and findings ahead)."""

from __future__ import annotations

import time


class Every:
    """Due once every ``interval_s`` seconds of the monotonic clock; an interval of 0 is never
    due. The first time comes ``first_after_s`` after it is made (None: at the first ask,
    whatever clock the caller passes)."""

    def __init__(self, interval_s: float, first_after_s: float | None = None) -> None:
        self.interval_s = interval_s
        self._next = 0.0 if first_after_s is None else time.monotonic() + first_after_s

    def due(self, now: float | None = None) -> bool:
        """Whether the work is due at ``now`` (monotonic seconds); if so, the next time is one
        interval on."""
        if not self.interval_s:
            return False
        now = time.monotonic() if now is None else now
        if now < self._next:
            return False
        self._next = now + self.interval_s
        return True

    def seconds_left(self) -> float:
        """Seconds until it is next due (0 or less: due)."""
        return self._next - time.monotonic()

    def again_in(self, delay_s: float) -> None:
        """Due next ``delay_s`` from now instead (a backlog to continue, a failure to retry)."""
        self._next = time.monotonic() + delay_s


__all__ = ["Every"]
