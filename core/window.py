"""A time window, ``[start_ns, end_ns)`` in unix nanoseconds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9
