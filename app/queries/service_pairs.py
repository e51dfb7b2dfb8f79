"""The Pairs page and ``/api/v1/pairs``: service pairs (caller -> callee), their latency
heatmap and table, and the models a pair's calls requested (the pair drilldown's list)."""

from __future__ import annotations

from ...models.reader import Filters, RollupQuery, StoreReader
from ...models.sketch import Histogram
from ..params import Window
from .bins import _nonzero_range, bin_band_ms, bin_edges_ms, binned_counts
from .common import _ms, _pcts


def pairs(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """Service pairs (``traces.trace_calls``: CLIENT spans, model calls, queue hand-offs),
    busiest first, each with the ``models`` its calls requested (sorted; [] for none).
    A ``stage`` filter keeps the calls whose calling span is in that stage (a model call:
    inference, or encoder for embeddings); ``model`` keeps that model's calls."""
    groups = reader.rollups.merged(RollupQuery("pair", window.start_ns, window.end_ns, filters,
                                               ("caller", "callee", "name")))
    merged: dict[tuple[str, str], list] = {}
    for g in groups:
        if g.count <= 0:
            continue
        caller, callee, model = g.key
        m = merged.get((caller, callee))
        if m is None:
            m = merged[(caller, callee)] = [0, 0, Histogram(), set()]
        m[0] += g.count
        m[1] += g.error_count
        m[2].merge(g.histogram)
        if model:
            m[3].add(model)
    out = []
    for (caller, callee), (count, errors, hist, models) in merged.items():
        p50, p90, p99 = hist.quantiles([0.5, 0.9, 0.99])
        out.append({
            "caller": caller, "callee": callee, "count": count,
            "p50_ms": _ms(p50), "p90_ms": _ms(p90), "p99_ms": _ms(p99),
            "error_rate": round(errors / count, 6),
            "models": sorted(models),
        })
    out.sort(key=lambda r: (-r["count"], r["caller"], r["callee"]))
    return out


def pair_heatmap(reader: StoreReader, window: Window, filters: Filters = Filters()) -> dict:
    """The service-pair heatmap: pairs ordered by call volume (quietest first, so the
    busiest sit on the right), latency bins of the calls, and P50/P90/P99 per pair."""
    groups = [g for g in reader.rollups.merged(RollupQuery("pair", window.start_ns, window.end_ns, filters,
                                                           ("caller", "callee"))) if g.count > 0]
    groups.sort(key=lambda g: (g.count, g.key))
    counts = [binned_counts(g.histogram) for g in groups]
    rng = _nonzero_range(counts, pad=1)
    if rng is None:
        return {"pairs": [], "bins": []}
    first, last = rng
    edges = bin_edges_ms(first, last)
    days = max(window.seconds / 86400, 1e-9)
    pairs = []
    for g, c in zip(groups, counts):
        p50, p90, p99 = _pcts(g.histogram)
        pairs.append({"caller": g.key[0], "callee": g.key[1], "count": g.count,
                      "calls_per_day": round(g.count / days, 1),
                      "error_rate": round(g.error_count / g.count, 6),
                      "p50_ms": p50, "p90_ms": p90, "p99_ms": p99,
                      "counts": [int(x) for x in c[first : last + 1]]})
    bins = []
    for j in range(first, last + 1):
        lo, hi = bin_band_ms(j)
        bins.append({"lo_ms": edges[j - first], "hi_ms": edges[j - first + 1], "min_ms": lo, "max_ms": hi})
    return {"pairs": pairs, "bins": bins}


def pair_models(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """The models requested by the pair's calls (the series' ``name``), busiest first:
    ``[{"model", "count", "p50_ms", "p99_ms", "error_rate"}]``; calls without a model are
    left out. The ``model`` filter itself is ignored (every model of the pair is listed)."""
    f = Filters(service=filters.service, caller=filters.caller, callee=filters.callee, stage=filters.stage,
                input_type=filters.input_type)
    out = []
    for g in reader.rollups.merged(RollupQuery("pair", window.start_ns, window.end_ns, f, ("name",))):
        if g.count <= 0 or not g.key[0]:
            continue
        p50, p99 = g.histogram.quantiles([0.5, 0.99])
        out.append({"model": g.key[0], "count": g.count, "p50_ms": _ms(p50), "p99_ms": _ms(p99),
                    "error_rate": round(g.error_count / g.count, 6)})
    out.sort(key=lambda r: (-r["count"], r["model"]))
    return out


def pair_table(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """``pairs`` plus calls/day (the count scaled to 24 h of this window's rate)."""
    days = max(window.seconds / 86400, 1e-9)
    return [{**r, "calls_per_day": round(r["count"] / days, 1)} for r in pairs(reader, window, filters)]
