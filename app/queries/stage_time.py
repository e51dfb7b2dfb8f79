"""The Stages page and ``/api/v1/stages``: where time goes per stage and input type —
span percentiles, per-trace stage time, the stack of the slowest traces (``at=``), stage
time over time and the ViT layers."""

from __future__ import annotations

import math

import numpy as np
from sqlalchemy import String, func, literal, select

from ...core.spans import STAGES
from ...ingest.rollup_deltas import unpack_contributions
from ...models import Series, Trace, sketch
from ...models.dialect import no_sequential_scans, one_of
from ...models.reader import NS_PER_MINUTE, Filters, RollupQuery, StoreReader, minute_range, plain_rows
from ...models.sketch import Histogram
from ..params import Window, rfc3339
from .common import INPUT_TYPE_ORDER, _ms
from ...durations import MINUTE_NS

VIT_LAYERS = ("patch_embed", "attention", "mlp")


def stages(reader: StoreReader, window: Window, filters: Filters = Filters(), group_by: str | None = "input_type",
           at: str | None = None) -> list[dict]:
    """Per (input type,) stage: span count and span-duration percentiles, and the stage's
    share of self time; with ``at`` (``p50`` … ``p99``) the mean stage self time of the
    traces at or above that end-to-end percentile instead (``stage_time_at``)."""
    if at is not None:
        return stage_time_at(reader, window, filters, at, group_by)["stages"]
    dims = ("input_type", "stage") if group_by == "input_type" else ("stage",)
    groups = reader.rollups.merged(RollupQuery("op", window.start_ns, window.end_ns, filters, dims))
    time_groups = reader.rollups.merged(RollupQuery("tstage", window.start_ns, window.end_ns,
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
    with reader.engine.connect() as conn:
        return {int(i): s or "other" for i, s in conn.execute(select(Series.id, Series.stage)
                                                                .where(Series.kind == "tstage"))}


def _band(conn, lo_ns: int, hi_ns: int, filters: Filters, input_type: str | None,
          min_ns: int, by_duration: bool = False, contributions: bool = False) -> list[tuple]:
    """``(trace_id, duration_ns, contributions or None)`` of the traces the rollups count
    (those holding contributions) starting in [lo_ns, hi_ns), at least ``min_ns`` long (of
    ``input_type`` unless None); ``contributions``: read them too (a band of the tail is
    about the tail: the rows are looked up anyway). ``by_duration``: read through a duration
    index (the slow tail of every stored trace of the input type: ``ix_traces_input_type_tail``,
    or without an input type ``ix_traces_duration_tail``) rather than the ``start_ns`` one
    (every trace of the window); ``+ 0`` and ``|| ''`` keep the planner off the other index.
    (Both duration indexes hold the start: the window is checked in them, before the table.)"""
    start = Trace.start_ns + 0 if by_duration else Trace.start_ns
    conds = [start >= lo_ns, start < hi_ns, Trace.contributions.is_not(None)]
    if min_ns > 0:
        conds.append(Trace.duration_ns >= min_ns if by_duration else Trace.duration_ns + 0 >= min_ns)
    if input_type is not None:
        conds.append(Trace.input_type == input_type if by_duration else Trace.input_type.concat("") == input_type)
    if filters.service:
        conds.append(Trace.root_service == filters.service)  # the trace series' service
    blob = Trace.contributions if contributions else literal(None)
    return [(t, int(d), b) for t, d, b in plain_rows(conn, select(Trace.trace_id, Trace.duration_ns, blob).where(*conds))]


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
    q = AT_QUANTILES[at]
    dims = ("input_type",) if group_by == "input_type" else ()
    rollup_filters = Filters(service=filters.service, input_type=filters.input_type)
    groups = [g for g in reader.rollups.merged(RollupQuery("trace", window.start_ns, window.end_ns, rollup_filters,
                                                           dims))
              if g.count > 0]
    first, last = minute_range(window.start_ns, window.end_ns)
    lo_ns, hi_ns = first * NS_PER_MINUTE, last * NS_PER_MINUTE  # the minutes the rollups count
    tails: dict[str, tuple[float, list[str], int]] = {}
    with reader.engine.connect() as conn:  # (a transaction: no_sequential_scans' SET LOCAL)
        no_sequential_scans(conn)
        # The duration indexes read the tail of every stored trace (of the input type), the
        # start index every trace of the window: the first when that tail, counted in its
        # index, is smaller.
        for g in groups:
            it = g.key[0] if dims else filters.input_type
            n = int(g.histogram.counts.sum())
            cum = np.cumsum(g.histogram.counts)
            k_lo = int(np.searchsorted(cum, math.floor(q * (n - 1)), side="right"))
            # Just below the order statistic's bucket (its lower edge, less float slack).
            min_ns = max(int(sketch.bucket_upper(k_lo - 1) * (1 - 1e-9)) - 1, 0) if k_lo > 1 else 0
            # (counted in an index alone: an input type's in its partial tail index)
            tail = [Trace.duration_ns >= min_ns] + (
                [Trace.input_type == it, Trace.contributions.is_not(None)] if it is not None else [])
            stored_tail = (conn.execute(select(func.count()).select_from(Trace).where(*tail)).scalar_one()
                           if min_ns > 0 else None)
            band = _band(conn, lo_ns, hi_ns, filters, it, min_ns,
                         by_duration=stored_tail is not None and stored_tail < n, contributions=True)
            band.sort(key=lambda r: r[1])
            durations = np.array([d for _, d, _ in band], dtype=np.int64)
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
                found = _tail_of(np.array([d for _, d, _ in band], dtype=np.int64), len(band), q)
                n = len(band)
            value, mask = found  # type: ignore[misc]  # (a band of every trace always holds them)
            tails[g.key[0] if dims else ""] = (value, [r for r, keep in zip(band, mask.tolist()) if keep], n)
        stage_of = _tstage_of_series(reader) if tails else {}
        sids = np.array(sorted(stage_of), dtype=np.int64)
        out: list[dict] = []
        meta: dict[str, dict] = {}
        for key, (value, tail, n) in tails.items():
            blobs = [b for _, _, b in tail if b is not None]
            total = sum(d for _, d, b in tail if b is not None)
            ids_ = [t for t, _, b in tail if b is None]  # (a fallback band's: looked up now)
            for i in range(0, len(ids_), 500):
                for dur, blob in conn.execute(select(Trace.duration_ns, Trace.contributions)
                                              .where(one_of(conn, Trace.trace_id, ids_[i : i + 500], String))):
                    blobs.append(blob)
                    total += int(dur)
            rec = unpack_contributions(b"".join(blobs))  # fixed-size records: one array for all the tail
            rec = rec[np.isin(rec["series"], sids)]
            sums = np.zeros(len(sids), dtype=np.int64)  # integer ns: exact however many traces
            np.add.at(sums, np.searchsorted(sids, rec["series"]), rec["value"])
            per_stage: dict[str, int] = {}
            for sid, v in zip(sids.tolist(), sums.tolist()):
                if v:
                    per_stage[stage_of[sid]] = per_stage.get(stage_of[sid], 0) + v
            count = len(tail)
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


def stage_breakdown(reader: StoreReader, window: Window, filters: Filters = Filters()) -> dict:
    """Per input type: each stage's per-trace time (self time summed over the trace's
    spans in that stage) at P50 and P99, from the ``tstage`` rollups, and the trace's own
    end-to-end P50/P99 for comparison. (Per-stage percentiles do not add up to the
    trace's percentile; the end-to-end marker shows how far apart they are.)"""
    f = Filters(service=filters.service, input_type=filters.input_type, stage=filters.stage)
    groups = reader.rollups.merged(RollupQuery("tstage", window.start_ns, window.end_ns, f, ("input_type", "stage")))
    traces = reader.rollups.merged(RollupQuery("trace", window.start_ns, window.end_ns,
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
    groups = reader.rollups.steps(RollupQuery("tstage", window.start_ns, window.end_ns, f, ("stage",)), step_minutes)
    out = []
    for g in sorted(groups, key=lambda g: (g.key[-1], g.key[0])):
        if g.count > 0:
            out.append({"t": rfc3339(g.key[-1] * MINUTE_NS), "stage": g.key[0], "count": g.count,
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
    if reader.rollups.series_ids("layer"):
        groups = reader.rollups.merged(RollupQuery("layer", window.start_ns, window.end_ns,
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
    enc = reader.rollups.merged(RollupQuery("tstage", window.start_ns, window.end_ns,
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
    ops = reader.attributes.ops("mm.layer", window.start_ns, window.end_ns)
    if filters.service:
        ops = [o for o in ops if o[0] == filters.service]
    if not ops:
        return []
    layer_of = {(s, n): str(v) for s, n, v in ops}
    groups = reader.rollups.op_histograms(window.start_ns, window.end_ns, layer_of, input_type=filters.input_type)
    return [(layer_of[key], key[1], g) for key, g in groups.items()]
