"""Query functions shared by the JSON API and the pages.

Each takes a ``StoreReader``, a time window and filters, and returns plain rows (lists of
dicts, JSON-ready). Percentiles come from merged rollup histograms, never from raw spans;
raw spans serve only the single-trace view, exemplar traces and the discovery of which
operations are ViT layers.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from functools import lru_cache
from itertools import chain
from typing import Any, Iterable

import numpy as np
import orjson as _orjson

from ..ingest.records import KIND_CLIENT, KIND_PRODUCER, KIND_NAMES, STAGES, STATUS_NAMES, SpanRecord
from ..ingest.traces import (Call, critical_path, find_root, input_type_of, self_times, trace_calls,
                              trace_duration_ns)
from ..models import sketch
from ..models.reader import Filters, RollupQuery, SpanQuery, StoreReader, TierPlan, tier_plan
from ..models.sketch import Histogram
from .params import Window, rfc3339


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def pairs(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """Service pairs (``traces.trace_calls``: CLIENT spans, model calls, queue hand-offs),
    busiest first, each with the ``models`` its calls requested (sorted; [] for none).
    A ``stage`` filter keeps the calls whose calling span is in that stage (a model call:
    inference, or encoder for embeddings); ``model`` keeps that model's calls."""
    groups = reader.rollups(RollupQuery("pair", window.start_ns, window.end_ns, filters,
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


def input_types(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """Per input type: traces, P50/P95/P99 end-to-end latency, the stage taking most time and
    ``tokens``, the model calls' mean tokens a request (``tokens.per_request``: the window's
    ``tokens`` rollups per key over the type's trace count; ``input`` per modality, a
    ``total`` entry only when no call named a modality; None when no span carried usage).
    ``service`` narrows both to that service: traces rooted in it, model calls made by it."""
    from .tokens import input_type_tokens, per_request

    f = Filters(service=filters.service, input_type=filters.input_type)
    token_sums = input_type_tokens(reader, window, f)
    groups = reader.rollups(RollupQuery("trace", window.start_ns, window.end_ns, f, ("input_type",)))
    stage_groups = reader.rollups(RollupQuery("tstage", window.start_ns, window.end_ns, f, ("input_type", "stage")))
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


def stages(reader: StoreReader, window: Window, filters: Filters = Filters(), group_by: str | None = "input_type",
           at: str | None = None) -> list[dict]:
    """Per (input type,) stage: span count and span-duration percentiles, and the stage's
    share of self time; with ``at`` (``p50`` … ``p99``) the mean stage self time of the
    traces at or above that end-to-end percentile instead (``stage_time_at``)."""
    if at is not None:
        return stage_time_at(reader, window, filters, at, group_by)["stages"]
    dims = ("input_type", "stage") if group_by == "input_type" else ("stage",)
    groups = reader.rollups(RollupQuery("op", window.start_ns, window.end_ns, filters, dims))
    time_groups = reader.rollups(RollupQuery("tstage", window.start_ns, window.end_ns,
                                             Filters(input_type=filters.input_type, stage=filters.stage), dims))
    stage_time = {g.key: g.sum_ns for g in time_groups}
    totals: dict[tuple, int] = {}
    for key, total in stage_time.items():
        totals[key[:-1]] = totals.get(key[:-1], 0) + total
    out = []
    for g in groups:
        if g.count <= 0:
            continue
        p50, p95, p99 = g.histogram.quantiles([0.5, 0.95, 0.99])
        denom = totals.get(g.key[:-1], 0)
        row = {"stage": g.key[-1], "count": g.count, "p50_ms": _ms(p50), "p95_ms": _ms(p95),
               "p99_ms": _ms(p99), "share": round(stage_time.get(g.key, 0) / denom, 6) if denom else 0.0}
        if group_by == "input_type":
            row = {"input_type": g.key[0], **row}
        out.append(row)
    order = {s: i for i, s in enumerate(STAGES)}
    out.sort(key=lambda r: (r.get("input_type", ""), order.get(r["stage"], 99)))
    return out


# -- stage time of the traces at or above a percentile (``/stages?at=``) ----------------
#: ``at=`` values and the quantile each names.
AT_QUANTILES = {"p50": 0.5, "p75": 0.75, "p90": 0.9, "p95": 0.95, "p99": 0.99}
#: What a ``/stages`` answer measures (its ``X-Modalscope-Measure`` header).
MEASURE_SPAN_PERCENTILES = "span-duration-percentiles"
MEASURE_AT_PERCENTILE = "trace-self-time-at-percentile"


def _tstage_of_series(reader: StoreReader) -> dict[int, str]:
    """tstage series id -> stage: what a trace's ``contributions`` records name."""
    from sqlalchemy import select

    from ..models import Series

    with reader.engine.connect() as conn:
        return {int(i): s or "other" for i, s in conn.execute(select(Series.id, Series.stage)
                                                                .where(Series.kind == "tstage"))}


def _band(conn, lo_ns: int, hi_ns: int, filters: Filters, input_type: str | None,
          min_ns: int) -> list[tuple[str, int]]:
    """``(trace_id, duration_ns)`` of the traces the rollups count (those holding
    contributions) starting in [lo_ns, hi_ns), at least ``min_ns`` long."""
    from sqlalchemy import select

    from ..models import Trace

    conds = [Trace.start_ns >= lo_ns, Trace.start_ns < hi_ns, Trace.contributions.is_not(None)]
    if min_ns > 0:
        conds.append(Trace.duration_ns >= min_ns)
    if input_type is not None:
        conds.append(Trace.input_type == input_type)
    if filters.service:
        conds.append(Trace.root_service == filters.service)  # the trace series' service
    return [(t, int(d)) for t, d in conn.execute(select(Trace.trace_id, Trace.duration_ns).where(*conds))]


def _tail_of(durations: np.ndarray, n: int, q: float) -> tuple[float, np.ndarray] | None:
    """The exact ``q`` quantile (numpy's linear definition, as the rollup histograms'
    estimate) of ``n`` durations of which ``durations`` are the largest, ascending, and the
    mask of those at or above it; None when the band does not reach the order statistics."""
    h = q * (n - 1)
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    offset = n - len(durations)  # durations below the band
    if lo < offset or hi - offset >= len(durations):
        return None
    x_lo, x_hi = float(durations[lo - offset]), float(durations[hi - offset])
    at = x_lo + (h - lo) * (x_hi - x_lo)
    return at, durations >= at


def stage_time_at(reader: StoreReader, window: Window, filters: Filters = Filters(), at: str = "p99",
                  group_by: str | None = "input_type") -> dict:
    """Where the ``at`` (e.g. P99) time goes: per (input type,) stage, the mean self time of
    the traces at or above that percentile of end-to-end latency in the window. Stage times
    of a trace add up to its duration, so a group's ``self_ms`` add up to the mean duration
    of its tail traces (``traces[group]["mean_ms"]``) — when siblings run one after another:
    concurrent siblings (a fan-out) each keep their self time (``traces.self_times``), so
    the stack then exceeds it by their overlap (0–5 % per input type in the demo).

    The rollups hold histograms, so the tail is found in the ``traces`` table: the trace
    rollup gives each group's count and the histogram bucket of the order statistic, which
    bounds a band of the slowest traces (about ``(1 - q)`` of them plus one bucket's width);
    the exact percentile is read from that band, and each tail trace's stage self times from
    its settled ``contributions`` (the exact ``tstage`` records the rollups were given). If
    the table and the rollups disagree (pruned raw traces, a re-settle in flight) every
    trace of the window is read instead.

    Returns ``{"at", "stages": [{"input_type", "stage", "self_ms", "share"}], "traces": {group:
    {"count", "traces", "at_ms", "mean_ms"}}}`` (group: the input type, or "" ungrouped)."""
    from sqlalchemy import select

    from ..ingest.settle import _unpack
    from ..models import Trace
    from ..models.reader import NS_PER_MINUTE, minute_range

    q = AT_QUANTILES[at]
    dims = ("input_type",) if group_by == "input_type" else ()
    rollup_filters = Filters(service=filters.service, input_type=filters.input_type)
    groups = [g for g in reader.rollups(RollupQuery("trace", window.start_ns, window.end_ns, rollup_filters, dims))
              if g.count > 0]
    first, last = minute_range(window.start_ns, window.end_ns)
    lo_ns, hi_ns = first * NS_PER_MINUTE, last * NS_PER_MINUTE  # the minutes the rollups count
    tails: dict[str, tuple[float, list[str], int]] = {}
    with reader.engine.connect() as conn:
        for g in groups:
            it = g.key[0] if dims else filters.input_type
            n = int(g.histogram.counts.sum())
            cum = np.cumsum(g.histogram.counts)
            k_lo = int(np.searchsorted(cum, math.floor(q * (n - 1)), side="right"))
            # Just below the order statistic's bucket (its lower edge, less float slack).
            min_ns = max(int(sketch.bucket_upper(k_lo - 1) * (1 - 1e-9)) - 1, 0) if k_lo > 1 else 0
            band = sorted(_band(conn, lo_ns, hi_ns, filters, it, min_ns), key=lambda r: r[1])
            durations = np.array([d for _, d in band], dtype=np.int64)
            keys = sketch.keys_of(durations)
            band = [r for r, k in zip(band, keys.tolist()) if k >= k_lo]
            durations = durations[keys >= k_lo]
            # The band must hold exactly the traces the histogram has from that bucket up.
            same = np.array_equal(np.bincount(keys[keys >= k_lo] - k_lo, minlength=len(cum) - k_lo),
                                  g.histogram.counts[k_lo:])
            found = _tail_of(durations, n, q) if same else None
            if found is None:  # the table does not hold what the rollups count
                band = sorted(_band(conn, lo_ns, hi_ns, filters, it, 0), key=lambda r: r[1])
                if not band:
                    continue
                found = _tail_of(np.array([d for _, d in band], dtype=np.int64), len(band), q)
                n = len(band)
            value, mask = found  # type: ignore[misc]  # (a band of every trace always holds them)
            tails[g.key[0] if dims else ""] = (value, [t for (t, _), keep in zip(band, mask.tolist()) if keep], n)
        stage_of = _tstage_of_series(reader) if tails else {}
        sids = np.array(sorted(stage_of), dtype=np.int64)
        out: list[dict] = []
        meta: dict[str, dict] = {}
        for key, (value, ids_, n) in tails.items():
            blobs: list[bytes] = []
            total = 0
            for i in range(0, len(ids_), 500):
                for dur, blob in conn.execute(select(Trace.duration_ns, Trace.contributions)
                                              .where(Trace.trace_id.in_(ids_[i : i + 500]))):
                    blobs.append(blob)
                    total += int(dur)
            rec = _unpack(b"".join(blobs))  # fixed-size records: one array for all the tail
            rec = rec[np.isin(rec["series"], sids)]
            sums = np.zeros(len(sids), dtype=np.int64)  # integer ns: exact however many traces
            np.add.at(sums, np.searchsorted(sids, rec["series"]), rec["value"])
            per_stage: dict[str, int] = {}
            for sid, v in zip(sids.tolist(), sums.tolist()):
                if v:
                    per_stage[stage_of[sid]] = per_stage.get(stage_of[sid], 0) + v
            count = len(ids_)
            stage_sum = sum(per_stage.values())
            meta[key] = {"count": count, "traces": n, "at_ms": _ms(value), "mean_ms": _ms(total / count)}
            for stage, v in per_stage.items():
                if filters.stage and stage != filters.stage:
                    continue
                row = {"stage": stage, "self_ms": _ms(v / count), "share": round(v / stage_sum, 6) if stage_sum else 0.0}
                out.append({"input_type": key, **row} if dims else row)
    order = {s: i for i, s in enumerate(STAGES)}
    out.sort(key=lambda r: (r.get("input_type", ""), order.get(r["stage"], 99), r["stage"]))
    return {"at": at, "stages": out, "traces": meta}


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity: such floats (legal in OTLP) are returned as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def trace_detail(reader: StoreReader, trace_id: str, *, ranks: bool = True) -> dict | None:
    """One trace with every span, self times and stages; None when no span is stored.

    Each span says whether it is on the critical path (``critical``) and, with ``ranks``,
    its percentile rank 0-100 (``rank_pct``) against the ``op`` rollups of its service and
    name in the hour centred on the trace's start (None without samples)."""
    rows = reader.trace_spans(trace_id)
    if not rows:
        return None
    records = _records(rows, with_attributes=True)  # with signals: the settler's input type
    selfs = self_times(records)
    on_path = set(critical_path(records))
    start, half_hour = min(int(r["start_ns"]) for r in rows), 1_800_000_000_000
    groups = reader.op_histograms(start - half_hour, start + half_hour,
                                  {(r["service"], r["name"]) for r in rows}) if ranks else {}
    trace_row = reader.trace_row(trace_id)
    settled = trace_row is not None and not trace_row["pending"] and trace_row["settled_ns"] is not None
    input_type = trace_row["input_type"] if settled else input_type_of(records)
    duration = trace_row["duration_ns"] if settled else trace_duration_ns(records)
    spans = []
    for r, rec in zip(rows, records):
        g = groups.get((r["service"], r["name"]))
        rank = g.histogram.rank_of(r["duration_ns"]) if g is not None and g.count > 0 else None
        span = {
            "span_id": r["span_id"],
            "parent_span_id": r["parent_span_id"],
            "service": r["service"],
            "name": r["name"],
            "kind": KIND_NAMES.get(r["kind"], "INTERNAL"),
            "stage": r["stage"],
            "start_unix_nano": int(r["start_ns"]),
            "duration_ms": _ms(r["duration_ns"]),
            "self_ms": _ms(selfs.get(r["span_id"], 0)),
            "status": STATUS_NAMES.get(r["status"], "UNSET"),
            "status_message": r["status_message"] or "",
            "source": r["source"],
            "instance": r["instance"],
            "attributes": _json_safe(rec.attributes),
            "resource": _json_safe(json.loads(r["resource"]) if r["resource"] else {}),
            "events": _json_safe(json.loads(r["events"]) if r["events"] else []),
            # [{"trace_id", "span_id", "attributes"}] as decoded (ids lowercase hex); a row
            # stored before links were (NULL) has none
            "links": _json_safe(json.loads(r["links"]) if r.get("links") else []),
            "critical": r["span_id"] in on_path,
        }
        if ranks:
            span["rank_pct"] = None if rank is None else 100.0 * rank
        spans.append(span)
    root = find_root(records)
    return {
        "trace_id": trace_id,
        "input_type": input_type,
        "duration_ms": _ms(duration),
        "root_service": root.service if root else None,
        "root_name": root.name if root else None,
        "span_count": len(spans),
        "settled": settled,
        "spans": spans,
    }


# ======================================================================================
# Dashboard queries: the pages and /api/v1 call these same functions.
# ======================================================================================


BINS_PER_DECADE = 10
INPUT_TYPE_ORDER = ("text", "image", "multi_image", "audio", "video", "unknown")
# The seed document's table: P50 / P95 per input type, in milliseconds.
SEED_BASELINE: dict[str, tuple[float, float]] = {
    "text": (320.0, 410.0),
    "image": (1300.0, 2100.0),
    "multi_image": (3700.0, 6400.0),
}
DEFAULT_MARGIN = 0.10  # a P95 more than 10 % over its baseline is a regression
VIT_LAYERS = ("patch_embed", "attention", "mlp")


# -- latency bins: display bins made of whole sketch buckets ---------------------------
@lru_cache(maxsize=1)
def _bin_tables() -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(bin index per sketch key, first bin number, lower edge ns per bin, upper edge ns per bin).

    Display bin j holds the sketch keys whose representative lies in
    [10^(j/B), 10^((j+1)/B)) ms. Its value range is exactly the union of those buckets'
    ranges (lower exclusive, upper inclusive), so a band read off a heatmap or histogram
    selects precisely the spans the rollups counted in it.
    """
    keys = np.arange(sketch.NUM_KEYS)
    rep_ms = np.asarray(sketch.representative(keys), dtype=np.float64) / 1e6
    rep_ms[0] = rep_ms[1]  # exact zeros go with the smallest bucket
    bins = np.floor(np.log10(rep_ms) * BINS_PER_DECADE + 1e-9).astype(np.int64)
    first = int(bins.min())
    idx = bins - first
    n = int(idx.max()) + 1
    upper = np.asarray(sketch.bucket_upper(keys), dtype=np.float64)
    lower = np.concatenate([[0.0], upper[:-1]])
    lo = np.full(n, np.inf)
    hi = np.zeros(n)
    np.minimum.at(lo, idx, lower)
    np.maximum.at(hi, idx, upper)
    return idx, first, lo, hi


def binned_counts(hist) -> np.ndarray:
    """Counts per display bin (dense, length = number of bins) of a Histogram."""
    idx, _, lo, _ = _bin_tables()
    return np.bincount(idx, weights=hist.counts, minlength=len(lo)).astype(np.int64)


def bin_band_ms(i: int) -> tuple[float, float]:
    """(min_ms, max_ms) of display bin ``i``, widened outward to whole microseconds."""
    _, _, lo, hi = _bin_tables()
    return math.floor(lo[i] / 1e3) / 1e3, math.ceil(hi[i] / 1e3) / 1e3


def bin_edges_ms(first: int, last: int) -> list[float]:
    """Nominal edges (10^(j/B) ms) of bins first..last, for drawing on a log scale."""
    _, base, _, _ = _bin_tables()
    return [10 ** ((base + j) / BINS_PER_DECADE) for j in range(first, last + 2)]


def _nonzero_range(arrays: list[np.ndarray], pad: int = 1) -> tuple[int, int] | None:
    mask = np.zeros_like(arrays[0], dtype=bool) if arrays else None
    if mask is None:
        return None
    for a in arrays:
        mask |= a > 0
    nz = np.flatnonzero(mask)
    if not len(nz):
        return None
    return max(0, int(nz[0]) - pad), min(len(mask) - 1, int(nz[-1]) + pad)


def _pcts(hist, qs=(0.5, 0.9, 0.99)) -> list[float | None]:
    return [_ms(v) for v in hist.quantiles(list(qs))]


# -- what a drilldown measures ---------------------------------------------------------
def subject_of(filters: Filters) -> str:
    """What a drilldown or exemplar query measures, first match wins:

    ``pair`` (caller or callee given: the calls, i.e. CLIENT spans of the pair),
    ``stage`` (spans of that stage, in ``service`` if given), ``service`` (every span of
    the service), else ``trace`` (end-to-end trace latency). ``input_type`` narrows all.
    """
    if filters.caller or filters.callee:
        return "pair"
    if filters.stage:
        return "stage"
    if filters.service:
        return "service"
    return "trace"


def subject_label(filters: Filters) -> str:
    subject = subject_of(filters)
    it = f" ({filters.input_type} requests)" if filters.input_type else ""
    if subject == "pair":
        model = f" of model {filters.model}" if filters.model else ""
        return f"calls {filters.caller or 'any'} → {filters.callee or 'any'}{model}{it}"
    if subject == "stage":
        where = f" in {filters.service}" if filters.service else ""
        return f"{filters.stage} spans{where}{it}"
    if subject == "service":
        return f"every span of {filters.service}{it}"
    return f"end-to-end {filters.input_type + ' ' if filters.input_type else ''}requests"


def _subject_query(filters: Filters, window: Window, **kw) -> RollupQuery:
    subject = subject_of(filters)
    if subject == "pair":
        return RollupQuery("pair", window.start_ns, window.end_ns, filters, **kw)
    if subject in ("stage", "service"):
        f = Filters(service=filters.service, stage=filters.stage, input_type=filters.input_type)
        return RollupQuery("op", window.start_ns, window.end_ns, f, **kw)
    f = Filters(input_type=filters.input_type)
    return RollupQuery("trace", window.start_ns, window.end_ns, f, **kw)


def latency_distribution(reader: StoreReader, window: Window, filters: Filters = Filters()) -> dict:
    """Histogram (display bins) and CDF of the subject's latency, with P50/P90/P99."""
    groups = reader.rollups(_subject_query(filters, window))
    hist = Histogram()
    errors = 0
    for g in groups:
        hist.merge(g.histogram)
        errors += g.error_count
    total = hist.count
    out = {"subject": subject_of(filters), "label": subject_label(filters), "count": total,
           "error_rate": round(errors / total, 6) if total else 0.0,
           "p50_ms": None, "p90_ms": None, "p99_ms": None, "bins": []}
    if total <= 0:
        return out
    out["p50_ms"], out["p90_ms"], out["p99_ms"] = _pcts(hist)
    counts = binned_counts(hist)
    rng = _nonzero_range([counts], pad=0)
    first, last = rng
    edges = bin_edges_ms(first, last)
    cum = 0
    for j in range(first, last + 1):
        c = int(counts[j])
        cum += c
        lo, hi = bin_band_ms(j)
        out["bins"].append({"bin": j, "lo_ms": edges[j - first], "hi_ms": edges[j - first + 1],
                            "min_ms": lo, "max_ms": hi, "count": c, "cdf": cum / total})
    return out


def percentile_series(reader: StoreReader, window: Window, filters: Filters = Filters(),
                      step_minutes: int = 1) -> list[dict]:
    """P50/P90/P99 and count of the subject per time step: ``[{"t", "count", "p50_ms", ...}]``."""
    groups = reader.rollup_steps(_subject_query(filters, window), step_minutes)
    out = []
    for g in sorted(groups, key=lambda g: g.key[-1]):
        if g.count <= 0:
            continue
        p50, p90, p99 = _pcts(g.histogram)
        out.append({"t": rfc3339(g.key[-1] * 60_000_000_000), "count": g.count,
                    "rate_per_min": round(g.count / step_minutes, 3), "error_count": g.error_count,
                    "p50_ms": p50, "p90_ms": p90, "p99_ms": p99})
    return out


# -- service pairs heatmap -------------------------------------------------------------
def pair_heatmap(reader: StoreReader, window: Window, filters: Filters = Filters()) -> dict:
    """The service-pair heatmap: pairs ordered by call volume (quietest first, so the
    busiest sit on the right), latency bins of the calls, and P50/P90/P99 per pair."""
    groups = [g for g in reader.rollups(RollupQuery("pair", window.start_ns, window.end_ns, filters,
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
    for g in reader.rollups(RollupQuery("pair", window.start_ns, window.end_ns, f, ("name",))):
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


# -- exemplar traces -------------------------------------------------------------------
EXEMPLAR_SCAN_LIMIT = 20_000  # raw spans examined at most for one exemplar query


def _trace_summary(row: dict) -> dict:
    return {
        "trace_id": row["trace_id"],
        "start_unix_nano": int(row["start_ns"]),
        "duration_ms": _ms(row["duration_ns"]),
        "root_service": row["root_service"],
        "root_name": row["root_name"],
        "input_type": row["input_type"],
        "span_count": int(row["span_count"]),
        "error": bool(row["error"]),
    }


def _unsettled_summary(reader: StoreReader, trace_id: str) -> dict | None:
    detail = trace_detail(reader, trace_id, ranks=False)
    if detail is None:
        return None
    start = min(s["start_unix_nano"] for s in detail["spans"])
    return {"trace_id": trace_id, "start_unix_nano": start, "duration_ms": detail["duration_ms"],
            "root_service": detail["root_service"], "root_name": detail["root_name"],
            "input_type": detail["input_type"], "span_count": detail["span_count"],
            "error": any(s["status"] == "ERROR" for s in detail["spans"])}


def _loads(text: Any) -> Any:
    """A JSON column's value; None for NULL, empty or malformed text."""
    if not text:
        return None
    try:
        return _orjson.loads(text)
    except _orjson.JSONDecodeError:
        return None


def _records(rows: list[dict], with_attributes: bool) -> list[SpanRecord]:
    """SpanRecords of span rows, with their stored ``signals`` and ``links`` (when the rows
    carry them) so the settler's rules (input type, inherited stages, calls) read them."""
    out = []
    for r in rows:
        attrs = _loads(r.get("attributes")) if with_attributes else None
        sig = _loads(r.get("signals"))
        links = _loads(r.get("links"))
        out.append(SpanRecord(r["trace_id"], r["span_id"], r["parent_span_id"], r["service"], r["name"],
                              r["kind"], r["start_ns"], r["start_ns"] + r["duration_ns"], r["status"],
                              attributes=attrs if isinstance(attrs, dict) else {}, stage=r["stage"],
                              links=links if isinstance(links, list) else [],
                              signals=sig if isinstance(sig, dict) else None))
    return out


def _pair_of_candidates(reader: StoreReader, rows: list[dict]) -> dict[str, Call]:
    """(trace_id/span_id) -> the :class:`Call` of each CLIENT span row, as settling makes it
    (``traces.trace_calls``): from the row, its SERVER/CONSUMER children and, for a transport
    span that may take its stage from a model-call parent (signals ``inh``), that parent."""
    kids = reader.callee_children((r["trace_id"], r["span_id"]) for r in rows)
    by_parent: dict[tuple[str, str], list[dict]] = {}
    for k in kids:
        by_parent.setdefault((k["trace_id"], k["parent_span_id"]), []).append(k)
    heirs = [(r["trace_id"], r["parent_span_id"]) for r in rows
             if r.get("parent_span_id") and r.get("signals") and '"inh"' in r["signals"]]
    parents = {(p["trace_id"], p["span_id"]): p for p in reader.spans_by_id(heirs)} if heirs else {}
    out = {}
    for r in rows:
        spans = _records([r], with_attributes=True)
        parent = parents.get((r["trace_id"], r["parent_span_id"])) if r.get("parent_span_id") else None
        if parent is not None:
            spans += _records([parent], with_attributes=True)
        spans += _records(by_parent.get((r["trace_id"], r["span_id"]), []), False)
        call = trace_calls(spans).get(r["span_id"])
        if call:
            out[r["trace_id"] + r["span_id"]] = call
    return out


def exemplar_traces(reader: StoreReader, window: Window, filters: Filters = Filters(),
                    min_ms: float | None = None, max_ms: float | None = None, limit: int = 20) -> list[dict]:
    """Traces behind a drilldown band, slowest first (raw spans, not rollups).

    The band bounds what ``subject_of(filters)`` measures: the call for a pair, the span
    for a stage or service, the trace otherwise; rows are ordered by that duration, one
    row per trace (its slowest matching span). Span-level rows add ``span_id``,
    ``span_name``, ``span_service`` and ``span_ms`` to the API's trace fields.
    """
    min_ns = None if min_ms is None else int(math.floor(min_ms * 1e6))
    max_ns = None if max_ms is None else int(math.ceil(max_ms * 1e6))
    subject = subject_of(filters)
    if subject == "trace":
        rows = reader.slow_traces(window.start_ns, window.end_ns, input_type=filters.input_type,
                                  min_ns=min_ns, max_ns=max_ns, limit=limit)
        return [_trace_summary(r) for r in rows]

    if subject == "pair":
        found = _slowest_calls(reader, window, filters, min_ns, max_ns, limit)
        if found is not None:
            return _exemplar_rows(reader, found)
        callers = () if filters.caller else tuple(reader.services_of("pair", filters))
        sq = SpanQuery(window.start_ns, window.end_ns, kind=KIND_CLIENT, service=filters.caller,
                       stage=filters.stage, input_type=filters.input_type, min_ns=min_ns, max_ns=max_ns,
                       services=callers, may_call=filters.callee, model=filters.model)
    else:
        services = () if filters.service else tuple(reader.services_of("op", filters))
        sq = SpanQuery(window.start_ns, window.end_ns, service=filters.service, stage=filters.stage,
                       input_type=filters.input_type, min_ns=min_ns, max_ns=max_ns, services=services)
    found: dict[str, dict] = {}
    page = max(20, limit * 3)  # grows x4 a page when rows share traces or fail the pair check
    offset = 0
    while len(found) < limit and offset < EXEMPLAR_SCAN_LIMIT:
        rows = reader.slow_spans(SpanQuery(**{**sq.__dict__, "limit": page, "offset": offset}))
        offset += len(rows)
        exhausted = len(rows) < page
        rows = [r for r in rows if r["trace_id"] not in found]
        if subject == "pair" and rows:
            rows = _calls_of_pair(reader, rows, filters)
        for r in rows:
            if r["trace_id"] not in found and len(found) < limit:
                found[r["trace_id"]] = r
        if exhausted:  # a short page: nothing more to read
            break
        # Each page re-reads the ones before it (OFFSET): grow pages so a search that needs
        # many rows (one trace holding many of the slowest spans) takes a few reads, not many.
        page = min(page * 4, EXEMPLAR_SCAN_LIMIT - offset)
    return _exemplar_rows(reader, found)


def _calls_of_pair(reader: StoreReader, rows: list[dict], filters: Filters) -> list[dict]:
    """The CLIENT span rows whose pair (as settling pairs them) matches ``filters``."""
    calls_of = _pair_of_candidates(reader, rows)
    keep = []
    for r in rows:
        call = calls_of.get(r["trace_id"] + r["span_id"])
        if call is None:
            continue
        if filters.caller and call.caller != filters.caller:
            continue
        if filters.callee and call.callee != filters.callee:
            continue
        if filters.service and filters.service not in (call.caller, call.callee):
            continue
        if filters.model and call.model != filters.model:
            continue
        keep.append(r)
    return keep


def _call_order(r: dict) -> tuple[int, int, int]:
    return -r["duration_ns"], r["start_ns"], r["_id"]


def _slowest_calls(reader: StoreReader, window: Window, filters: Filters, min_ns: int | None,
                   max_ns: int | None, limit: int) -> dict[str, dict] | None:
    """trace id -> its slowest call of the pair, for the ``limit`` traces with the slowest
    calls: the settled calls from ``pair_calls`` (an index walk a pair series) and the
    calls of traces still pending, checked as the raw-span search checks them. None when
    ``pair_calls`` does not cover the window (an upgraded store) or settling is far behind:
    then the raw spans are searched."""
    if window.start_ns < reader.pair_calls_complete_from():
        return None
    callers = [filters.caller] if filters.caller else reader.services_of("pair", filters)
    n = max(20, limit * 3)
    pending_floor: int | None = -1  # the floor the pending calls below were read with
    pending: list[dict] = []
    while True:
        settled, more = reader.slow_calls(filters, window.start_ns, window.end_ns, min_ns=min_ns, max_ns=max_ns,
                                          limit=n)
        # A pending call slower than none of the n slowest settled ones cannot be among the
        # n slowest of all: read only those at least as slow (with a backlog, most are not).
        floor = settled[-1]["duration_ns"] if more and settled else None
        if pending_floor == -1 or (pending_floor is not None and (floor is None or floor < pending_floor)):
            bounds = [b for b in (floor, min_ns) if b is not None]
            lower = max(bounds) if bounds else None
            got = reader.pending_calls(window.start_ns, window.end_ns, callers, input_type=filters.input_type,
                                       min_ns=lower, max_ns=max_ns, may_call=filters.callee, stage=filters.stage,
                                       model=filters.model)
            if got is None:
                return None
            pending = _calls_of_pair(reader, got, filters) if got else []
            pending_floor = floor
        found: dict[str, dict] = {}
        seen: set[int] = set()
        # With more settled calls unread, only what sorts before the last one read is known
        # to be in its final order.
        last = _call_order(settled[-1]) if more and settled else None
        for r in sorted(settled + pending, key=_call_order):
            if last is not None and _call_order(r) > last:
                break
            if r["_id"] in seen:  # a re-opened trace: its call is both settled and pending
                continue
            seen.add(r["_id"])
            if r["trace_id"] not in found:
                found[r["trace_id"]] = r
                if len(found) >= limit:
                    return found
        if not more:
            return found
        n *= 4  # many of the slowest calls share traces: read deeper


def _exemplar_rows(reader: StoreReader, found: dict[str, dict]) -> list[dict]:
    """API rows for exemplar spans (trace id -> span row): the trace's summary and the span."""
    trace_rows = reader.trace_rows(found)
    out = []
    for tid, span in found.items():
        tr = trace_rows.get(tid)
        if tr is not None and tr["settled_ns"] is not None:
            row = _trace_summary(tr)
        else:
            row = _unsettled_summary(reader, tid)
            if row is None:
                continue
        row.update({"span_id": span["span_id"], "span_name": span["name"], "span_service": span["service"],
                    "span_ms": _ms(span["duration_ns"])})
        out.append(row)
    return out


# -- overview --------------------------------------------------------------------------
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
    groups = reader.rollup_steps(RollupQuery("trace", window.start_ns, window.end_ns, f, ("input_type",)),
                                 step_minutes)
    out = []
    for g in sorted(groups, key=lambda g: (g.key[-1], g.key[0])):
        if g.count <= 0:
            continue
        p50, p99 = (_ms(v) for v in g.histogram.quantiles([0.5, 0.99]))
        out.append({"t": rfc3339(g.key[-1] * 60_000_000_000), "input_type": g.key[0], "count": g.count,
                    "rate_per_min": round(g.count / step_minutes, 3), "p50_ms": p50, "p99_ms": p99,
                    "error_count": g.error_count})
    return out


# -- stages ----------------------------------------------------------------------------
def stage_breakdown(reader: StoreReader, window: Window, filters: Filters = Filters()) -> dict:
    """Per input type: each stage's per-trace time (self time summed over the trace's
    spans in that stage) at P50 and P99, from the ``tstage`` rollups, and the trace's own
    end-to-end P50/P99 for comparison. (Per-stage percentiles do not add up to the
    trace's percentile; the end-to-end marker shows how far apart they are.)"""
    f = Filters(service=filters.service, input_type=filters.input_type, stage=filters.stage)
    groups = reader.rollups(RollupQuery("tstage", window.start_ns, window.end_ns, f, ("input_type", "stage")))
    traces = reader.rollups(RollupQuery("trace", window.start_ns, window.end_ns,
                                        Filters(service=filters.service, input_type=filters.input_type),
                                        ("input_type",)))
    order = {s: i for i, s in enumerate(STAGES)}
    it_order = {t: i for i, t in enumerate(INPUT_TYPE_ORDER)}
    rows = []
    for g in groups:
        if g.count <= 0:
            continue
        p50, p99 = (_ms(v) for v in g.histogram.quantiles([0.5, 0.99]))
        rows.append({"input_type": g.key[0], "stage": g.key[1], "traces": g.count, "p50_ms": p50, "p99_ms": p99,
                     "mean_ms": _ms(g.sum_ns / g.count), "total_ms": _ms(g.sum_ns)})
    rows.sort(key=lambda r: (it_order.get(r["input_type"], 99), r["input_type"], order.get(r["stage"], 99)))
    e2e = {}
    for g in traces:
        if g.count > 0:
            p50, p99 = (_ms(v) for v in g.histogram.quantiles([0.5, 0.99]))
            e2e[g.key[0]] = {"count": g.count, "p50_ms": p50, "p99_ms": p99}
    return {"stages": rows, "traces": e2e}


def stage_series(reader: StoreReader, window: Window, filters: Filters = Filters(),
                 step_minutes: int = 1, q: float = 0.99) -> list[dict]:
    """Per stage and time step: the ``q`` quantile of per-trace stage time (``tstage``)."""
    f = Filters(service=filters.service, input_type=filters.input_type, stage=filters.stage)
    groups = reader.rollup_steps(RollupQuery("tstage", window.start_ns, window.end_ns, f, ("stage",)), step_minutes)
    out = []
    for g in sorted(groups, key=lambda g: (g.key[-1], g.key[0])):
        if g.count > 0:
            out.append({"t": rfc3339(g.key[-1] * 60_000_000_000), "stage": g.key[0], "count": g.count,
                        "value_ms": _ms(g.histogram.quantile(q))})
    return out


def vit_layers(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """ViT layer breakdown from spans carrying ``mm.layer`` (patch_embed/attention/mlp).

    Counts, time and percentiles come from the ``layer`` rollups the settler writes (one
    series per operation, stage, input type and layer). ``share`` is the layer's time over
    the encoder stage's self time in the window (per docs/design.md, ViT MLP ~36 %, attention
    ~18 %). A store settled before ``layer`` rollups existed (no such series at all) is
    read as before: the layer operations from the newest raw spans, their numbers from the
    ``op`` rollups (``modalscope retag`` writes the rollups for its old spans).
    """
    merged: dict[str, list] = {}
    if reader.series_ids("layer"):
        groups = reader.rollups(RollupQuery("layer", window.start_ns, window.end_ns,
                                            Filters(service=filters.service, input_type=filters.input_type),
                                            ("callee", "name")))
        parts = [(g.key[0], g.key[1], g) for g in groups]
    else:
        parts = _layers_from_raw_spans(reader, window, filters)
    for layer, name, g in parts:
        m = merged.setdefault(layer, [0, 0, Histogram(), set()])
        m[0] += g.count
        m[1] += g.sum_ns
        m[2].merge(g.histogram)
        m[3].add(name)
    if not merged:
        return []
    enc = reader.rollups(RollupQuery("tstage", window.start_ns, window.end_ns,
                                     Filters(service=None, input_type=filters.input_type, stage="encoder"), ()))
    enc_total = sum(g.sum_ns for g in enc)
    order = {n: i for i, n in enumerate(VIT_LAYERS)}
    out = []
    for layer, (count, total, hist, names) in merged.items():
        if count <= 0:
            continue
        p50, p99 = (_ms(v) for v in hist.quantiles([0.5, 0.99]))
        out.append({"layer": layer, "count": count, "total_ms": _ms(total), "mean_ms": _ms(total / count),
                    "p50_ms": p50, "p99_ms": p99, "operations": sorted(names),
                    "share": round(total / enc_total, 6) if enc_total else None})
    out.sort(key=lambda r: (order.get(r["layer"], 99), r["layer"]))
    return out


def _layers_from_raw_spans(reader: StoreReader, window: Window, filters: Filters) -> list[tuple]:
    """(layer, span name, op histogram group) with the layer operations read from the newest
    raw spans of the window (a bounded scan), for stores without ``layer`` rollups."""
    ops = reader.attribute_ops("mm.layer", window.start_ns, window.end_ns)
    if filters.service:
        ops = [o for o in ops if o[0] == filters.service]
    if not ops:
        return []
    layer_of = {(s, n): str(v) for s, n, v in ops}
    groups = reader.op_histograms(window.start_ns, window.end_ns, layer_of, input_type=filters.input_type)
    return [(layer_of[key], key[1], g) for key, g in groups.items()]


# -- one trace -------------------------------------------------------------------------
def trace_view(reader: StoreReader, trace_id: str, window: Window) -> dict | None:
    """``trace_detail`` plus depth, critical path and each span's percentile rank against
    its own operation (service, name) in the window, from the ``op`` rollups."""
    detail = trace_detail(reader, trace_id, ranks=False)  # ranked here against the page's window
    if detail is None:
        return None
    spans = detail["spans"]
    ids = {s["span_id"] for s in spans}
    parent = {s["span_id"]: s["parent_span_id"] for s in spans}
    depth: dict[str, int] = {}

    def depth_of(sid: str) -> int:
        chain = []
        while sid not in depth:
            chain.append(sid)
            p = parent.get(sid)
            if not p or p not in ids or p in chain or len(chain) > 512:
                depth[sid] = 0
                break
            sid = p
        for c in reversed(chain):
            if c not in depth:
                depth[c] = depth[parent[c]] + 1
        return depth[chain[0]] if chain else depth[sid]

    for s in spans:
        depth_of(s["span_id"])
    groups = reader.op_histograms(window.start_ns, window.end_ns, {(s["service"], s["name"]) for s in spans})
    for s in spans:
        g = groups.get((s["service"], s["name"]))
        s["depth"] = depth[s["span_id"]]
        s["rank"] = g.histogram.rank_of(s["duration_ms"] * 1e6) if g is not None and g.count > 0 else None
        s["op_count"] = g.count if g is not None else 0
    # Display order: depth-first from the roots, children by start time.
    children: dict[str | None, list[dict]] = {}
    for s in spans:
        p = s["parent_span_id"] if s["parent_span_id"] in ids else None
        children.setdefault(p, []).append(s)
    ordered: list[dict] = []
    stack = sorted(children.get(None, []), key=lambda s: (s["start_unix_nano"], s["span_id"]), reverse=True)
    seen = set()
    while stack:
        s = stack.pop()
        if s["span_id"] in seen:
            continue
        seen.add(s["span_id"])
        ordered.append(s)
        stack.extend(sorted(children.get(s["span_id"], []), key=lambda c: (c["start_unix_nano"], c["span_id"]),
                            reverse=True))
    ordered.extend(s for s in spans if s["span_id"] not in seen)  # cycles: shown, unindented
    _mark_queue_waits(reader, trace_id, spans)
    detail["spans"] = ordered
    detail["start_unix_nano"] = min(s["start_unix_nano"] for s in spans)
    detail["in_window"] = window.start_ns <= detail["start_unix_nano"] < window.end_ns
    return detail


MAX_LINKED_LOOKUPS = 64  # consumers whose linked producers a trace page looks up


def _mark_queue_waits(reader: StoreReader, trace_id: str, spans: list[dict]) -> None:
    """Each CONSUMER span's hand-off: ``queued_ms`` (its start minus the end of the PRODUCER
    span it came from: its parent, else the earliest producer its links name, in any trace)
    and ``producer_service``; the pair's latency includes this wait."""
    by_id = {s["span_id"]: s for s in spans}
    consumers = [s for s in spans if s["kind"] == "CONSUMER"]
    wanted: set[tuple[str, str]] = set()
    for s in consumers[:MAX_LINKED_LOOKUPS]:
        for ln in s.get("links") or []:
            if isinstance(ln, dict) and isinstance(ln.get("trace_id"), str) and isinstance(ln.get("span_id"), str):
                if ln["trace_id"] != trace_id:
                    wanted.add((ln["trace_id"], ln["span_id"]))
    linked = {(r["trace_id"], r["span_id"]): r for r in reader.spans_by_id(wanted)} if wanted else {}
    for s in consumers:
        producer = None  # (service, end_ns)
        parent = by_id.get(s["parent_span_id"] or "")
        if parent is not None and parent["kind"] == "PRODUCER":
            producer = (parent["service"], parent["start_unix_nano"] + int(round(parent["duration_ms"] * 1e6)))
        else:
            best = None
            for ln in s.get("links") or []:
                if not isinstance(ln, dict):
                    continue
                key = (ln.get("trace_id"), ln.get("span_id"))
                if key[0] == trace_id:
                    p = by_id.get(key[1])
                    cand = (p["start_unix_nano"], p["service"], p["start_unix_nano"] + int(round(p["duration_ms"] * 1e6))) \
                        if p is not None and p["kind"] == "PRODUCER" else None
                else:
                    r = linked.get(key)
                    cand = (r["start_ns"], r["service"], r["start_ns"] + r["duration_ns"]) \
                        if r is not None and r["kind"] == KIND_PRODUCER else None
                if cand is not None and (best is None or cand[0] < best[0]):
                    best = cand
            if best is not None:
                producer = (best[1], best[2])
        if producer is not None:
            s["producer_service"] = producer[0]
            s["queued_ms"] = _ms(max(0, s["start_unix_nano"] - producer[1]))


def filter_options(reader: StoreReader) -> dict[str, list]:
    """Values the filter pickers offer (every known series dimension value)."""
    values = reader.series_values()
    order = {s: i for i, s in enumerate(STAGES)}
    it_order = {t: i for i, t in enumerate(INPUT_TYPE_ORDER)}
    values["stages"] = sorted(set(values["stages"]) | set(STAGES), key=lambda s: (order.get(s, 99), s))
    values["input_types"] = sorted(set(values["input_types"]) | set(INPUT_TYPE_ORDER),
                                   key=lambda t: (it_order.get(t, 99), t))
    return values


# ======================================================================================
# Cache analytics and triage compare: /api/v1/cache, /api/v1/compare, pages.
# ======================================================================================

import re as _re

import orjson as _orjson

from ..ingest.settle_fast import CACHE_GROUP_KEY, CACHE_UNTAGGED_KIND
from ..ingest.settle_fast import cache_hit_value as _cache_hit_value

CACHE_MAX_SPANS = 500_000  # cache spans read per window (newest first): bounded work
GROUP_BY_PATTERN = CACHE_GROUP_KEY  # whole-string match (fullmatch)
NO_GROUP = None  # the group of a span without the group_by attribute
_NS_MIN = 60_000_000_000


def valid_group_by(value: str | None) -> bool:
    """An attribute key a cache breakdown can group by: 1-128 characters of
    letters, digits and ``_ . : / -`` (OpenTelemetry keys and label names)."""
    return isinstance(value, str) and bool(GROUP_BY_PATTERN.fullmatch(value))


def cache_hit_value(value: Any) -> bool | None:
    """``cache.hit`` as sent: a boolean, or a string/number from sources without booleans
    (Cloud Trace labels). None when it says neither hit nor miss. The settler's rule too
    (``settle_fast.cache_hit_value``), so rollup and raw answers agree."""
    return _cache_hit_value(value)


def _group_value(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def cache_events(rows: Iterable[tuple], group_by: str | None) -> list[tuple[int, str, str | None, bool]]:
    """Pure: ``(start_ns, cache, group, hit)`` from ``StoreReader.cache_spans`` rows.

    The group is the span attribute ``group_by``, else the resource attribute of that
    name, else None. Spans whose ``cache.hit`` says neither hit nor miss are dropped.
    """
    out = []
    for start_ns, attrs_json, resource_json in rows:
        try:
            attrs = _orjson.loads(attrs_json) if attrs_json else {}
        except _orjson.JSONDecodeError:
            continue
        if not isinstance(attrs, dict):
            continue
        cache = attrs.get("cache.name")
        hit = cache_hit_value(attrs.get("cache.hit"))
        if cache is None or isinstance(cache, (dict, list)) or hit is None:
            continue
        group = None
        if group_by:
            value = attrs.get(group_by)
            if value is None and resource_json:
                try:
                    res = _orjson.loads(resource_json)
                except _orjson.JSONDecodeError:
                    res = {}
                value = res.get(group_by) if isinstance(res, dict) else None
            group = _group_value(value)
        out.append((int(start_ns), str(cache), group, hit))
    return out


def _group_sort_key(r: dict) -> tuple:
    return (r["cache"], r["group"] is None, r["group"] or "")


# Lookup counts, the common form of raw events and rollup cells: (t_ns, cache, group, hits, misses).
def _counted(events: Iterable[tuple[int, str, str | None, bool]]) -> Iterable[tuple[int, str, str | None, int, int]]:
    for t, cache, group, hit in events:
        yield (t, cache, group, 1 if hit else 0, 0 if hit else 1)


def _rates_table(counted: Iterable[tuple[int, str, str | None, int, int]]) -> list[dict]:
    counts: dict[tuple[str, str | None], list[int]] = {}
    for _, cache, group, h, m in counted:
        c = counts.setdefault((cache, group), [0, 0])
        c[0] += h
        c[1] += m
    counts = {k: v for k, v in counts.items() if v[0] + v[1] > 0}
    totals: dict[str, int] = {}
    for (cache, _), (h, m) in counts.items():
        totals[cache] = totals.get(cache, 0) + h + m
    out = []
    for (cache, group), (h, m) in counts.items():
        out.append({"cache": cache, "group": group, "hits": h, "misses": m,
                    "hit_rate": round(h / (h + m), 6), "share": round((h + m) / totals[cache], 6)})
    out.sort(key=_group_sort_key)
    return out


def _rates_buckets(counted: Iterable[tuple[int, str, str | None, int, int]], start_ns: int,
                   step_minutes: int) -> list[dict]:
    step = max(1, int(step_minutes))
    step_ns = step * _NS_MIN
    # Steps of whole quarter hours lie on a grid of their own (as the percentile charts'
    # steps: ``StoreReader.rollup_steps``), so hourly and quarter rollup rows fall in one
    # bucket each; shorter steps start at the window's first minute.
    origin = 0 if step % 15 == 0 else start_ns // _NS_MIN * _NS_MIN
    counts: dict[tuple[int, str, str | None], list[int]] = {}
    for t, cache, group, h, m in counted:
        b = origin + (t - origin) // step_ns * step_ns
        c = counts.setdefault((b, cache, group), [0, 0])
        c[0] += h
        c[1] += m
    out = []
    for (b, cache, group), (h, m) in counts.items():
        if h + m > 0:
            out.append({"t": rfc3339(b), "t_ns": b, "cache": cache, "group": group, "hits": h, "misses": m,
                        "hit_rate": round(h / (h + m), 6)})
    out.sort(key=lambda r: (r["t_ns"], *_group_sort_key(r)))
    return out


def cache_table(events: Iterable[tuple[int, str, str | None, bool]]) -> list[dict]:
    """Pure: hits, misses and hit rate per (cache, group); ``share`` is the group's part of
    its cache's lookups."""
    return _rates_table(_counted(events))


def cache_buckets(events: Iterable[tuple[int, str, str | None, bool]], start_ns: int,
                  step_minutes: int) -> list[dict]:
    """Pure: hit rate per (cache, group) and time step: ``[{"t", "cache", "group", "hits",
    "misses", "hit_rate"}]`` in time order, on ``_rates_buckets``' grid (steps of whole quarter
    hours aligned to the clock, shorter ones to ``start_ns``'s minute)."""
    return _rates_buckets(_counted(events), start_ns, step_minutes)


def _cache_events(reader: StoreReader, window: Window, group_by: str | None, cache: str | None) -> list[tuple]:
    rows = reader.cache_spans(window.start_ns, window.end_ns, limit=CACHE_MAX_SPANS)
    events = cache_events(rows, group_by)
    return [e for e in events if e[1] == cache] if cache else events


def cache_rollup_cells(rows: Iterable[tuple], untagged_rows: Iterable[tuple], group_by: str | None,
                       cache: str | None = None) -> dict[tuple[int, str, str | None], list[int]] | None:
    """Pure: lookups per (minute, cache, group) as ``[hits, misses]`` from the ``cache``
    rollup rows ``(minute, count, error_count, sum_ns, sketch, service, name, caller,
    callee)`` and the ``cache_untagged`` rows ``(minute, count, error_count, sum_ns, sketch,
    service, name, caller)`` of the same minutes (``settle_fast.cache_contributions``), or
    None when they cannot give exactly what the raw spans give (then read those):

    * ungrouped: each cache's TOTAL series (caller = callee = '');
    * ``group_by`` = key: the key's tag series (callee = the value); the rest of the TOTAL
      is the group None. Only when no lookup of the minutes has the key untagged (a
      ``cache_untagged`` row naming the key, or "*": a value that is no tag, or a resource
      attribute) and none went to the key's overflow series (more than
      ``settle.CACHE_TAG_VALUES`` values): every group is then known exactly;
    * ``cache.*`` keys are never tags: None;
    * a (service, cache, minute) with tag rows but no TOTAL (settled before TOTAL series
      existed), or with more tagged lookups than its TOTAL: None;
    * no rows at all: None (the window may hold lookups settled before TOTAL series
      existed, without tags; the raw read is cheap when there are none).
    """
    if group_by is not None and (not valid_group_by(group_by) or group_by.startswith("cache.")):
        return None
    totals: dict[tuple[int, str, str], list[int]] = {}  # (minute, service, cache) -> [count, errors]
    tagged: dict[tuple[int, str, str], list[int]] = {}
    values: dict[tuple[int, str, str | None], list[int]] = {}  # (minute, cache, value) -> [count, errors]
    seen: set[tuple[int, str, str]] = set()
    any_rows = False
    for minute, count, errors, _sum, _sketch, service, name, caller, callee in rows:
        if count <= 0 or (cache is not None and name != cache):
            continue
        any_rows = True
        cell = (minute, service, name)
        seen.add(cell)
        if caller == "" and callee == "":
            t = totals.setdefault(cell, [0, 0])
            t[0] += count
            t[1] += errors
        elif group_by is not None and caller == group_by:
            if callee == "":
                return None  # the key overflowed its value cap: values unknown
            t = tagged.setdefault(cell, [0, 0])
            t[0] += count
            t[1] += errors
            v = values.setdefault((minute, name, callee), [0, 0])
            v[0] += count
            v[1] += errors
    if not any_rows or any(cell not in totals for cell in seen):
        return None
    if group_by is not None:
        parsed: dict[str, bool] = {}
        for _minute, count, _errors, _sum, _sketch, _service, name, caller in untagged_rows:
            if count <= 0 or (cache is not None and name != cache):
                continue
            names_key = parsed.get(caller)
            if names_key is None:
                try:
                    keys = _orjson.loads(caller) if caller != "*" else None
                except _orjson.JSONDecodeError:
                    keys = None
                names_key = parsed[caller] = not isinstance(keys, list) or group_by in keys
            if names_key:
                return None  # some lookups have the key as no tag shows it
    out: dict[tuple[int, str, str | None], list[int]] = {}
    for (minute, service, name), (count, errors) in totals.items():
        got = tagged.get((minute, service, name), (0, 0))
        rest, rest_err = count - got[0], errors - got[1]
        if rest < 0 or rest_err < 0 or rest - rest_err < 0:
            return None
        if rest:
            o = out.setdefault((minute, name, None), [0, 0])
            o[0] += rest - rest_err
            o[1] += rest_err
    for key, (count, errors) in values.items():
        o = out.setdefault(key, [0, 0])
        o[0] += count - errors
        o[1] += errors
    return out


def _cache_plan(lo_ns: int, hi_ns: int, step_minutes: int | None, kept_from: int | None) -> TierPlan | None:
    """Which rollup rows answer the whole minutes ``[lo, hi)`` of a cache view: the coarsest
    tier whose rows fall wholly in one ``step_minutes`` bucket (``_rates_buckets``: steps of
    whole quarters lie on a quarter-aligned grid; no step, a table over the window: hours).
    A window reaching before the minute rows retention keeps (``kept_from``) is rounded out
    to whole hours there, as every rollup view is, when its step allows hours; else None
    (its raw spans answer it)."""
    step = None if step_minutes is None else max(1, int(step_minutes))  # as _rates_buckets reads it
    hours = step is None or step % 60 == 0
    if kept_from is not None and lo_ns // _NS_MIN < kept_from:
        return tier_plan(lo_ns, hi_ns, kept_from) if hours else None
    if hours or step % 15 == 0:
        return tier_plan(lo_ns, hi_ns, hours=hours)
    return TierPlan(((lo_ns // _NS_MIN, hi_ns // _NS_MIN),), (0, 0))


def _plan_bounds(plan: TierPlan) -> tuple[int, int]:
    """First and end minute a tier plan's rows cover (rounding out included)."""
    spans = [(a, b) for a, b in plan.minute_ranges] + [(a * 15, b * 15) for a, b in plan.quarter_ranges]
    if plan.hours[1] > plan.hours[0]:
        spans.append((plan.hours[0] * 60, plan.hours[1] * 60))
    return min(a for a, _ in spans), max(b for _, b in spans)


def _cache_lookups(reader: StoreReader, window: Window, group_by: str | None, cache: str | None,
                   rollups: bool, step_minutes: int | None = None) -> list[tuple[int, str, str | None, int, int]]:
    """The window's lookups as ``(t_ns, cache, group, hits, misses)``: its whole minutes from
    the rollups when ``cache_rollup_cells`` can answer them — whole hours and quarter hours
    from the coarser tiers where every row falls in one ``step_minutes`` bucket (a week is
    168 hourly rows a series, not 10,080 minute rows; ``_cache_plan``) — the ragged edges
    (and everything otherwise) from the raw spans. The checks of ``cache_rollup_cells`` hold
    per tier row as they do per minute: a tier row is the sum of its minutes' rows (except
    in the one hour a store settled before TOTAL series existed was upgraded: a minute
    without its TOTAL row can hide in an hour that has one)."""
    m0, m1 = -(-window.start_ns // _NS_MIN), window.end_ns // _NS_MIN
    plan, rows = None, {}
    if rollups and m1 > m0:
        kinds = {"cache": ("service", "name", "caller", "callee")}
        if group_by is not None:
            kinds[CACHE_UNTAGGED_KIND] = ("service", "name", "caller")
        plan, rows = reader.tier_rows_of_kinds(
            kinds, lambda kept_from: _cache_plan(m0 * _NS_MIN, m1 * _NS_MIN, step_minutes, kept_from), sketches=False)
    if plan is not None:
        cells = cache_rollup_cells(rows["cache"], rows.get(CACHE_UNTAGGED_KIND, ()), group_by, cache)
        if cells is not None:
            out = [(m * _NS_MIN, name, group, h, mi) for (m, name, group), (h, mi) in cells.items()]
            first, end = _plan_bounds(plan)
            for a, b in ((window.start_ns, first * _NS_MIN), (end * _NS_MIN, window.end_ns)):
                if b > a:  # a ragged edge (none where the window was rounded out to an hour)
                    out.extend(_counted(_cache_events(reader, Window(a, b), group_by, cache)))
            return out
    return list(_counted(_cache_events(reader, window, group_by, cache)))


def cache_rates(reader: StoreReader, window: Window, group_by: str | None = None,
                cache: str | None = None, *, rollups: bool = True) -> list[dict]:
    """Hit rate per cache (``cache.name``) and value of the span attribute ``group_by``
    (``cache.hit``: hits, misses) over the window.

    From the ``cache`` rollups of the window's whole minutes where they give exactly the
    raw spans' answer (``cache_rollup_cells``; the partial minutes at the edges from raw
    spans), else (``rollups=False`` too) from the raw spans carrying ``cache.name`` (window
    and key filtered in SQL; only those spans' attributes are parsed; at most
    ``CACHE_MAX_SPANS``, newest first). Rollups hold settled traces, as every rollup view."""
    return _rates_table(_cache_lookups(reader, window, group_by, cache, rollups))


def cache_series(reader: StoreReader, window: Window, group_by: str | None = None, cache: str | None = None,
                 step_minutes: int = 1, *, rollups: bool = True) -> list[dict]:
    """Hit rate per cache and group over time (``step_minutes`` buckets, on the grid
    ``_rates_buckets`` gives), read as ``cache_rates``."""
    return _rates_buckets(_cache_lookups(reader, window, group_by, cache, rollups, step_minutes),
                          window.start_ns, step_minutes)


def cache_rates_and_series(reader: StoreReader, window: Window, group_by: str | None = None,
                           cache: str | None = None, step_minutes: int = 1) -> tuple[list[dict], list[dict]]:
    """``cache_rates`` and ``cache_series`` from one read of the lookups (the Cache page
    shows both; reading them twice cost it a third of its time)."""
    lookups = _cache_lookups(reader, window, group_by, cache, True, step_minutes)
    return _rates_table(lookups), _rates_buckets(lookups, window.start_ns, step_minutes)


# -- triage compare --------------------------------------------------------------------
#: Subject spans read per window: a sample spread over the window when it holds more
#: (``StoreReader.subject_spans``). The selection's are its slow spans only.
COMPARE_MAX_SPANS = 2_000
COMPARE_MAX_VALUES = 50  # keys with more distinct values are skipped (ids, free text)
COMPARE_TOP = 10
COMPARE_MIN_SELECTION = 5  # slow spans in the selection carrying the value
COMPARE_MIN_SHARE = 0.05  # ... and at least this share of them
SLOW_QUANTILE = 0.9
_ID_KEY = _re.compile(r"(^|[._])(id|uuid|guid|trace_?id|span_?id|request_?id)$", _re.I)
_TIME_KEY = _re.compile(r"(time|timestamp|_ns|_ms|date|unix)", _re.I)
KEEP_ID_KEYS = ("service.instance.id", "host.id", "k8s.pod.uid", "cloud.availability_zone")


def default_baseline(window: Window) -> Window:
    """The same length just before the selection."""
    length = window.end_ns - window.start_ns
    return Window(window.start_ns - length, window.start_ns)


@lru_cache(maxsize=4096)  # (a few dozen keys, each tested once a span otherwise)
def _compare_key_ok(key: str) -> bool:
    if key in KEEP_ID_KEYS:
        return True
    return not (_ID_KEY.search(key) or _TIME_KEY.search(key))


def _blob_facets(blob) -> dict[str, str]:
    """The rankable scalars of one attributes or resource JSON object (``span_facets``)."""
    out: dict[str, str] = {}
    try:
        d = _orjson.loads(blob) if isinstance(blob, (str, bytes)) else blob
    except _orjson.JSONDecodeError:
        return out
    if not isinstance(d, dict):
        return out
    for k, v in d.items():
        if not isinstance(k, str) or not _compare_key_ok(k):
            continue
        g = _group_value(v)
        if g is not None and len(g) <= 256:
            out[k] = g
    return out


def span_facets(row: dict, resources: dict | None = None) -> dict[str, str]:
    """Pure: the attribute values of one subject span a Compare ranks: span attributes,
    resource attributes (span wins on a clash), ``service.instance.id`` and the trace's
    ``input_type``; scalars only, keys that look like ids or timestamps dropped.
    ``resources``: resource JSON text -> its facets, filled as spans are seen (a service's
    instances share a few resources: parsing each span's copy was a third of a Compare)."""
    res = row.get("resource")
    if not res:
        out = {}
    elif resources is None or not isinstance(res, (str, bytes)):
        out = _blob_facets(res)
    else:
        known = resources.get(res)
        if known is None:
            known = resources[res] = _blob_facets(res)
        out = dict(known)
    if row.get("attributes"):
        out.update(_blob_facets(row["attributes"]))
    if row.get("instance"):
        out.setdefault("service.instance.id", str(row["instance"]))
    if row.get("input_type"):
        out["input_type"] = str(row["input_type"])
    return out


def attribute_lift(selection: list[dict[str, str]], baseline: list[dict[str, str]], *,
                   max_values: int = COMPARE_MAX_VALUES, top: int = COMPARE_TOP,
                   min_count: int = COMPARE_MIN_SELECTION, min_share: float = COMPARE_MIN_SHARE) -> list[dict]:
    """Pure: attribute values over-represented in ``selection`` (the slow spans' facets)
    against ``baseline`` (the baseline spans' facets).

    ``selection_share`` / ``baseline_share``: the part of each population carrying the
    value; ``lift`` = their ratio, the baseline share smoothed by half a span so a value
    never seen before has a finite lift. Keys with more than ``max_values`` distinct values
    across both populations are skipped; a value needs ``min_count`` selection spans and
    ``min_share`` of them. Top ``top`` by lift (then count), lift above 1 only.
    """
    if not selection or not baseline:
        return []
    # (Counter counts the (key, value) pairs in C: 3,800 spans of 14 facets 15 -> 12 ms)
    sel_counts = Counter(chain.from_iterable(facets.items() for facets in selection))
    base_counts = Counter(chain.from_iterable(facets.items() for facets in baseline))
    distinct = Counter(k for k, _ in sel_counts.keys() | base_counts.keys())  # values a key takes
    n_sel, n_base = len(selection), len(baseline)
    out = []
    for (k, v), c in sel_counts.items():
        if distinct[k] > max_values or c < min_count or c / n_sel < min_share:
            continue
        b = base_counts.get((k, v), 0)
        sel_share = c / n_sel
        base_share = b / n_base
        lift = sel_share / ((b + 0.5) / (n_base + 0.5)) if b == 0 else sel_share / base_share
        if lift <= 1.0:
            continue
        out.append({"key": k, "value": v, "selection_share": round(sel_share, 6),
                    "baseline_share": round(base_share, 6), "lift": round(lift, 4),
                    "selection_count": c, "baseline_count": b})
    out.sort(key=lambda r: (-r["lift"], -r["selection_count"], r["key"], r["value"]))
    return out[:top]


def _stage_query(filters: Filters, window: Window, kind: str = "tstage") -> RollupQuery:
    """Per-trace stage self time (``tstage``) of the window's traces, narrowed by input
    type and stage only (stage time is a trace's, whichever pair or service is the subject);
    ``kind="trace"`` gives the traces themselves (the per-trace denominator)."""
    if kind == "trace":
        return RollupQuery("trace", window.start_ns, window.end_ns, Filters(input_type=filters.input_type))
    return RollupQuery("tstage", window.start_ns, window.end_ns,
                       Filters(input_type=filters.input_type, stage=filters.stage), ("stage",))


def stage_deltas(sel: dict[str, tuple[int, int, Histogram]], base: dict[str, tuple[int, int, Histogram]],
                 sel_units: int, base_units: int) -> list[dict]:
    """Pure: per stage, selection vs baseline P50/P99 and each stage's share of the added
    time. ``sel``/``base``: stage -> (count, sum_ns, histogram); the added time of a stage
    is its time per trace (``sum_ns / units``, units = traces) in the selection minus the
    baseline's, and ``share_of_added_time`` is its part of the stages' positive additions."""
    order = {s: i for i, s in enumerate(STAGES)}
    rows = []
    added: dict[str, float] = {}
    for stage in sorted(set(sel) | set(base), key=lambda s: (order.get(s, 99), s)):
        sc, ss, sh = sel.get(stage, (0, 0, None))
        bc, bs, bh = base.get(stage, (0, 0, None))
        s50, s99 = (_ms(v) for v in sh.quantiles([0.5, 0.99])) if sc > 0 else (None, None)
        b50, b99 = (_ms(v) for v in bh.quantiles([0.5, 0.99])) if bc > 0 else (None, None)
        per_sel = ss / sel_units if sel_units else 0.0
        per_base = bs / base_units if base_units else 0.0
        added[stage] = per_sel - per_base
        rows.append({"stage": stage, "selection_p50_ms": s50, "baseline_p50_ms": b50,
                     "selection_p99_ms": s99, "baseline_p99_ms": b99,
                     "delta_p50_ms": None if s50 is None or b50 is None else round(s50 - b50, 3),
                     "delta_p99_ms": None if s99 is None or b99 is None else round(s99 - b99, 3),
                     "added_ms": _ms(per_sel - per_base) if sel_units and base_units else None,
                     "share_of_added_time": 0.0})
    positive = sum(v for v in added.values() if v > 0)
    if positive > 0 and sel_units and base_units:
        for r in rows:
            r["share_of_added_time"] = round(max(added[r["stage"]], 0.0) / positive, 6)
    return rows


def _subject_rows(reader: StoreReader, window: Window, filters: Filters, limit: int, *,
                  min_ns: int | None = None, expected: int | None = None) -> list[dict]:
    """The subject's spans of the window (at least ``min_ns`` long), at most ``limit``: a
    sample spread over the window when the rollups ``expected`` more."""
    subject = subject_of(filters)
    kw = dict(input_type=filters.input_type, limit=limit, min_ns=min_ns, expected=expected)
    if subject == "pair":
        if filters.callee:  # the callee's side of the calls: its instances, its attributes
            return reader.subject_spans(window.start_ns, window.end_ns, kind=2, service=filters.callee, **kw)
        return reader.subject_spans(window.start_ns, window.end_ns, kind=KIND_CLIENT, service=filters.caller, **kw)
    if subject in ("stage", "service"):
        return reader.subject_spans(window.start_ns, window.end_ns, service=filters.service, stage=filters.stage, **kw)
    return reader.subject_spans(window.start_ns, window.end_ns, root_only=True, **kw)


def compare(reader: StoreReader, window: Window, baseline: Window | None = None,
            filters: Filters = Filters()) -> dict:
    """What changed in ``window`` (the selection) against ``baseline`` (default: the same
    length just before).

    ``stages``: per stage, P50/P99 of per-trace stage self time in both windows, their
    deltas, and the stage's share of the added time per trace (``tstage`` rollups of the
    window's traces, narrowed by ``input_type`` and ``stage``).

    ``attributes``: attribute values over-represented among the SLOW spans of the selection,
    slow meaning above the selection's P90 of the subject (``subject_of(filters)``: a pair's
    calls, read on the callee's SERVER spans when a callee is named; a stage's or service's
    spans; else root spans, i.e. whole traces), against every subject span of the baseline.
    Span and resource attributes plus the trace's ``input_type``; keys with more than 50
    distinct values, ids and timestamps skipped; top 10 by lift with minimum counts
    (``attribute_lift``). At most ``COMPARE_MAX_SPANS`` raw spans a window: where it holds
    more, a sample spread over it (``StoreReader.subject_spans``), the selection's read among
    its slow spans only.
    """
    baseline = baseline or default_baseline(window)
    # stage deltas (rollups)
    stage_sel, stage_base = {}, {}
    for w, dest in ((window, stage_sel), (baseline, stage_base)):
        q = _stage_query(filters, w)
        for g in reader.rollups(q):
            if g.count > 0:
                dest[g.key[0]] = (g.count, g.sum_ns, g.histogram)
    units = [sum(g.count for g in reader.rollups(_stage_query(filters, w, "trace"))) for w in (window, baseline)]
    stages_out = stage_deltas(stage_sel, stage_base, units[0], units[1])
    counts = []
    sel_hist = Histogram()
    for w in (window, baseline):
        groups = reader.rollups(_subject_query(filters, w))
        counts.append(sum(g.count for g in groups))
        if w is window:
            for g in groups:
                sel_hist.merge(g.histogram)
    # slow-span attributes (raw spans)
    threshold_ns = sel_hist.quantile(SLOW_QUANTILE) if sel_hist.count > 0 else None
    attributes: list[dict] = []
    if threshold_ns is not None:
        # (only spans at or past the threshold are read: about a tenth of the selection's)
        sel_rows = _subject_rows(reader, window, filters, COMPARE_MAX_SPANS, min_ns=int(threshold_ns),
                                 expected=math.ceil(counts[0] * (1 - SLOW_QUANTILE)))
        resources: dict = {}
        slow = [span_facets(r, resources) for r in sel_rows if r["duration_ns"] > threshold_ns]
        if not slow:  # a sketch bucket's representative may sit above every span in it
            slow = [span_facets(r, resources) for r in sel_rows if r["duration_ns"] >= threshold_ns]
        base_rows = _subject_rows(reader, baseline, filters, COMPARE_MAX_SPANS, expected=counts[1])
        attributes = attribute_lift(slow, [span_facets(r, resources) for r in base_rows])
    return {
        "selection": {"start": rfc3339(window.start_ns), "end": rfc3339(window.end_ns), "count": counts[0], "traces": units[0]},
        "baseline": {"start": rfc3339(baseline.start_ns), "end": rfc3339(baseline.end_ns), "count": counts[1], "traces": units[1]},
        "subject": subject_of(filters),
        "slow_threshold_ms": _ms(threshold_ns),
        "stages": stages_out,
        "attributes": attributes,
    }
