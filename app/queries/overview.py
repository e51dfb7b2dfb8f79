"""The Overview page and ``/api/v1/input-types``: per input type, end-to-end latency
against the reference table, the bottleneck stage, tokens and traffic over time."""

from __future__ import annotations

import math

from ...models.reader import Filters, RollupQuery, StoreReader
from ..params import Window, rfc3339
from ..tokens import input_type_tokens, per_request
from .common import INPUT_TYPE_ORDER, _ms
from ...durations import MINUTE_NS

# The seed document's table: P50 / P95 per input type, in milliseconds.
SEED_BASELINE: dict[str, tuple[float, float]] = {
    "text": (320.0, 410.0),
    "image": (1300.0, 2100.0),
    "multi_image": (3700.0, 6400.0),
}
DEFAULT_MARGIN = 0.10  # a P95 more than 10 % over its baseline is a regression


def input_types(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """Per input type: traces, P50/P95/P99 end-to-end latency, the stage taking most time and
    ``tokens``, the model calls' mean tokens a request (``tokens.per_request``: the window's
    ``tokens`` rollups per key over the type's trace count; ``input`` per modality, a
    ``total`` entry only when no call named a modality; None when no span carried usage).
    ``service`` narrows both to that service: traces rooted in it, model calls made by it."""
    f = Filters(service=filters.service, input_type=filters.input_type)
    token_sums = input_type_tokens(reader, window, f)
    groups = reader.rollups.merged(RollupQuery("trace", window.start_ns, window.end_ns, f, ("input_type",)))
    stage_groups = reader.rollups.merged(RollupQuery("tstage", window.start_ns, window.end_ns, f,
                                                     ("input_type", "stage")))
    stage_time: dict[str, dict[str, int]] = {}
    for g in stage_groups:
        stage_time.setdefault(g.key[0], {})[g.key[1]] = g.sum_ns
    out = []
    for g in groups:
        if g.count <= 0:
            continue
        it = g.key[0]
        p50, p95, p99 = g.histogram.quantiles([0.5, 0.95, 0.99])
        stages = stage_time.get(it, {})
        bottleneck = max(sorted(stages), key=lambda s: stages[s]) if stages else None
        out.append({"input_type": it, "count": g.count, "p50_ms": _ms(p50), "p95_ms": _ms(p95),
                    "p99_ms": _ms(p99), "bottleneck_stage": bottleneck,
                    "error_rate": round(g.error_count / g.count, 6),
                    "tokens": per_request(token_sums.get(it, {}), g.count)})
    order = {t: i for i, t in enumerate(INPUT_TYPE_ORDER)}
    out.sort(key=lambda r: (order.get(r["input_type"], 99), r["input_type"]))
    return out


def parse_baseline(text: str | None) -> dict[str, tuple[float, float]]:
    """``text:320:410,image:1300:2100`` -> {input type: (P50 ms, P95 ms)}; the reference latency table
    for input types not named. Raises ValueError naming the bad entry."""
    base = dict(SEED_BASELINE)
    if not text:
        return base
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) != 3:
            raise ValueError(f"baseline entry {entry!r} must be input_type:p50_ms:p95_ms")
        try:
            p50, p95 = float(parts[1]), float(parts[2])
        except ValueError:
            raise ValueError(f"baseline entry {entry!r} must be input_type:p50_ms:p95_ms") from None
        if not (math.isfinite(p50) and math.isfinite(p95) and p50 > 0 and p95 > 0):
            raise ValueError(f"baseline entry {entry!r} needs positive numbers")
        base[parts[0].strip()] = (p50, p95)
    return base


def overview_rows(reader: StoreReader, window: Window, filters: Filters = Filters(),
                  baseline: dict[str, tuple[float, float]] | None = None,
                  margin: float = DEFAULT_MARGIN) -> list[dict]:
    """``input_types`` rows with the baseline, the P95 change and a regression mark.

    A row regresses when its P95 is more than ``margin`` over the baseline P95 (the
    ``baseline_regression`` rule of docs/design.md); input types without a baseline are never
    marked. Every baseline type appears, with no traffic if none was seen.
    """
    baseline = SEED_BASELINE if baseline is None else baseline
    rows = {r["input_type"]: dict(r) for r in input_types(reader, window, filters)}
    minutes = max(window.seconds / 60, 1e-9)
    for it in baseline:
        if filters.input_type and it != filters.input_type:
            continue
        rows.setdefault(it, {"input_type": it, "count": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None,
                             "bottleneck_stage": None, "error_rate": 0.0})
    out = []
    for it, r in rows.items():
        b = baseline.get(it)
        r["rate_per_min"] = round(r["count"] / minutes, 3)
        r["baseline_p50_ms"], r["baseline_p95_ms"] = b if b else (None, None)
        change = None
        if b and r["p95_ms"] is not None:
            change = r["p95_ms"] / b[1] - 1
        r["p95_change"] = None if change is None else round(change, 4)
        r["regression"] = bool(change is not None and change > margin)
        out.append(r)
    order = {t: i for i, t in enumerate(INPUT_TYPE_ORDER)}
    out.sort(key=lambda r: (order.get(r["input_type"], 99), r["input_type"]))
    return out


def traffic_series(reader: StoreReader, window: Window, filters: Filters = Filters(),
                   step_minutes: int = 1) -> list[dict]:
    """Per input type and time step: requests per minute and P99 (``trace`` rollups)."""
    f = Filters(service=filters.service, input_type=filters.input_type)
    groups = reader.rollups.steps(RollupQuery("trace", window.start_ns, window.end_ns, f, ("input_type",)),
                                  step_minutes)
    out = []
    for g in sorted(groups, key=lambda g: (g.key[-1], g.key[0])):
        if g.count <= 0:
            continue
        p50, p99 = (_ms(v) for v in g.histogram.quantiles([0.5, 0.99]))
        out.append({"t": rfc3339(g.key[-1] * MINUTE_NS), "input_type": g.key[0], "count": g.count,
                    "rate_per_min": round(g.count / step_minutes, 3), "p50_ms": p50, "p99_ms": p99,
                    "error_count": g.error_count})
    return out
