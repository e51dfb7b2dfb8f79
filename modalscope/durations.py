"""Time units and window lengths, shared by every layer (the store keeps unix nanoseconds)."""

from __future__ import annotations

import re

NS = 1_000_000_000
MINUTE_NS = 60 * NS
HOUR_NS = 3600 * NS
DAY_NS = 86_400 * NS

_LENGTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_LENGTH_S = 400 * 86400


def window_seconds(value: str, what: str = "range") -> float:
    """A window length as the API and the settings write it (``15m``, ``1h``, ``24h``, ``7d``)
    in seconds; ValueError names ``what`` in one line."""
    m = _LENGTH.match(value or "")
    if not m:
        raise ValueError(f"{what} must look like 15m, 1h, 24h or 7d, not {value!r}")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds <= 0 or seconds > MAX_LENGTH_S:
        raise ValueError(f"{what} must be between 1s and 400d")
    return seconds
