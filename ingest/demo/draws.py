"""Seeded random draws: lognormal latencies, Poisson counts, the daily traffic curve and
one generator per minute of traffic (so any minute can be generated on its own)."""

from __future__ import annotations

import math
import random

from .profiles import HOUR_NS


def _lognorm(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def _daily_curve(t_ns: int) -> float:
    """Relative traffic by time of day (UTC): 0.5x at 03:00, 1.5x at 15:00."""
    hour = (t_ns / HOUR_NS) % 24.0
    return 1.0 + 0.5 * math.sin(2 * math.pi * (hour - 9.0) / 24.0)


def _minute_rng(seed: int, stream: str, minute: int) -> random.Random:
    return random.Random(f"modalscope-demo:{seed}:{stream}:{minute}")


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 50:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    # Knuth, for small means.
    limit = math.exp(-lam)
    k, p = 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k
