"""Readable durations and rates: 850 µs, 12.3 ms, 320 ms, 1.30 s, 4.2 min."""

from __future__ import annotations

import math


def fmt_ms(ms: float | None) -> str:
    """A duration given in milliseconds, in the unit a person reads fastest."""
    if ms is None or (isinstance(ms, float) and not math.isfinite(ms)):
        return "—"
    if ms < 0:
        return "-" + fmt_ms(-ms)
    if ms == 0:
        return "0 ms"
    if ms < 1:
        us = ms * 1000
        return f"{us:.3g} µs" if us >= 1 else f"{us:.2f} µs"
    if ms < 1000:
        return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"
    s = ms / 1000
    if s < 120:
        return f"{s:.3g} s" if s < 100 else f"{s:.0f} s"
    return f"{s / 60:.3g} min"


def fmt_count(n: float | None) -> str:
    if n is None:
        return "—"
    n = float(n)
    if abs(n) >= 1e6:
        return f"{n / 1e6:.3g} M"
    if abs(n) >= 1e4:
        return f"{n / 1e3:.3g} k"
    if n == int(n):
        return f"{int(n):,}"
    return f"{n:.3g}"


def fmt_pct(frac: float | None, digits: int = 1) -> str:
    if frac is None:
        return "—"
    return f"{frac * 100:.{digits}f} %"


def fmt_rank(rank: float | None) -> str:
    """A share at-or-below (0..1) as a percentile label: P50, P97, P99.7, P100."""
    if rank is None:
        return "—"
    pct = max(0.0, min(1.0, rank)) * 100
    if pct >= 99 and pct < 100:
        return f"P{math.floor(pct * 10) / 10:g}"
    return f"P{math.floor(pct)}"


def time_unit(max_ms: float | None) -> tuple[float, str]:
    """(divisor, unit) for an axis whose largest value is ``max_ms`` milliseconds."""
    if max_ms is not None and max_ms >= 2000:
        return 1000.0, "s"
    return 1.0, "ms"
