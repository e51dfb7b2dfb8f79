"""The Anomalies page's finding charts (``anomalies.py`` is the page; a module whose name
starts with ``_`` is never taken for a page by Dash): what a card keeps for its chart, and
the chart drawn from that, per finding kind the measure that fired it against its threshold."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np

from modalscope.app import components as c
from modalscope.app import figures, findings, links, queries
from modalscope.app import state as st
from modalscope.app.params import ParamError, Window, parse_time, rfc3339
from modalscope.core.findings import Finding
from modalscope.models.reader import Filters, RollupQuery

CONTEXT_NS = 45 * 60_000_000_000  # before the finding's window, on its chart
# A finding's window is at most the detectors' longest (its run may start in the baseline
# look-back before the judged window): a longer one came from an edited request.
MAX_CHART_S = findings.MAX_WINDOW_S + 2 * 3600
# What a card's chart shows until its callback draws it: no template, a few bytes.
CHART_HEIGHT = 220
PLACEHOLDER = {"data": [], "layout": {"height": CHART_HEIGHT, "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
                                      "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                      "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)"}}


def evidence_window(f: Finding) -> tuple[Window, int, int] | None:
    """The window a finding's chart shows (its own with context around it), its start and end."""
    return _window_around(f.start, f.end)


def _window_around(start, end) -> tuple[Window, int, int] | None:
    try:
        s, e = parse_time(str(start), "start"), parse_time(str(end), "end")
    except ParamError:
        return None
    return Window(s - CONTEXT_NS, e + CONTEXT_NS // 3), s, e


def chart_spec(f: Finding) -> dict:
    """What a finding's chart needs (kept in the card, sent back by the browser, so plain
    JSON): its kind, window, subject filters, attribute, cache and evidence numbers."""
    spec = {"kind": f.kind, "start": f.start, "end": f.end, "subject": links.finding_filters(f),
            "evidence": {str(k): v for k, v in f.evidence.items() if _number(v) is not None}}
    attr = f.subject.attribute
    if attr is not None:
        spec["attribute"] = {"key": attr.key, "value": str(attr.value)}
    if f.subject.cache is not None:
        spec["cache"] = f.subject.cache
    return spec


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def chart_title(spec: dict) -> str:
    """The line above a finding's chart: what it draws."""
    kind, subject = spec.get("kind"), spec.get("subject") or {}
    attr = spec.get("attribute") or {}
    f = Filters(**{k: v for k, v in subject.items() if k in links.SUBJECT_FILTERS and isinstance(v, str)})
    if kind == "cache_penetration":
        return f"Hit rate of {attr.get('key')}={attr.get('value')} in cache {spec.get('cache')}, against the floor"
    if kind == "preprocessing_bound":
        return f"Preprocessing's share of end-to-end time ({f.input_type or 'all'} requests)"
    if kind == "batching_failure":
        return f"Share of batches of one on {f.service}"
    if kind == "cuda_graph_fallback":
        return f"Share of CUDA Graph fallbacks on {f.service}"
    if kind == "fusion_sync_wait":
        return "Median spread between the first and last encoder to finish, before fusion"
    if kind == "cold_start":
        return f"Median request time of {f.service}'s new instance {attr.get('value')}"
    if kind == "lb_timeout_truncation":
        return f"Slowest {f.input_type + ' ' if f.input_type else ''}requests against the timeout ceiling"
    if kind == "baseline_regression":
        return f"P50 / P95 of end-to-end {f.input_type} requests against the baseline"
    return f"P50 / P99 of {queries.subject_label(f)}"


def chart_figure(spec: dict | None):
    """A finding's chart: what fired it around its window, with its threshold (``spec``: the
    card's store, which the browser sends back, so it is checked like a query)."""
    spec = spec if isinstance(spec, dict) else {}
    subject = spec.get("subject") if isinstance(spec.get("subject"), dict) else {}
    subject = {k: v for k, v in subject.items() if k in links.SUBJECT_FILTERS and isinstance(v, str)}
    ew = _window_around(spec["start"], spec["end"]) if "start" in spec and "end" in spec else None
    if ew is None:
        return figures.empty_figure("This finding has no valid window.", CHART_HEIGHT)
    window, s, e = ew
    if window.seconds > MAX_CHART_S:
        return figures.empty_figure("This finding's window is too long to chart.", CHART_HEIGHT)
    ev = spec.get("evidence") if isinstance(spec.get("evidence"), dict) else {}
    ev = {str(k): _number(v) for k, v in ev.items()}
    attr = spec.get("attribute") if isinstance(spec.get("attribute"), dict) else {}
    attr = {k: str(attr[k]) for k in ("key", "value") if isinstance(attr.get(k), (str, int, float))}
    cache = spec.get("cache") if isinstance(spec.get("cache"), str) else None
    step = st.step_minutes(window, 60)
    rows, series, lines, unit = evidence_series(str(spec.get("kind") or ""), window, Filters(**subject), step, ev,
                                                attr, cache)
    return figures.evidence_figure(rows, datetime.fromtimestamp(s / 1e9, tz=timezone.utc),
                                   datetime.fromtimestamp(e / 1e9, tz=timezone.utc), CHART_HEIGHT,
                                   series=series, lines=lines, unit=unit)


def evidence_series(kind: str, window: Window, filters: Filters, step: int, ev: dict, attr: dict,
                    cache: str | None):
    """``(rows, series, lines, unit)`` of a finding's chart (``figures.evidence_figure``): per
    kind, the measure that fired it per ``step`` minutes, and the threshold, ceiling or
    baseline it was judged against (from its evidence, else the detectors' thresholds)."""
    th = c.thresholds()
    reader = c.reader()
    p = figures.PCT_STYLE
    if kind == "baseline_regression":
        rows = _quantile_rows(reader, RollupQuery("trace", window.start_ns, window.end_ns,
                                                  Filters(input_type=filters.input_type)), step, {"p50_ms": 0.5,
                                                                                                 "p95_ms": 0.95})
        margin = ev.get("margin") if ev.get("margin") is not None else th.baseline_margin
        return rows, [("p50_ms", "P50", p["p50"][1]), ("p95_ms", "P95", p["p99"][1])], \
            [("baseline P95", ev.get("baseline_p95_ms")), (f"threshold (+{margin * 100:.0f} %)", ev.get("threshold_ms"))], "ms"
    if kind == "lb_timeout_truncation":
        rows = _quantile_rows(reader, RollupQuery("trace", window.start_ns, window.end_ns,
                                                  Filters(input_type=filters.input_type)), step,
                              {"p50_ms": 0.5, "p99_ms": 0.99, "max_ms": 1.0})
        ceiling = ev.get("ceiling_s")
        return rows, [("p50_ms", "P50", p["p50"][1]), ("p99_ms", "P99", p["p99"][1]),
                      ("max_ms", "slowest", figures.CRITICAL)], \
            [("timeout ceiling", ceiling * 1000 if ceiling is not None else None)], "ms"
    if kind == "cold_start":
        return _cold_start_rows(reader, window, filters, step, ev, attr, th)
    if kind == "fusion_sync_wait":
        frame = _frame(reader, "sync", window, ("service",), Filters(service=filters.service), sketches=True)
        rows = _sketch_steps(frame, step, {"spread_ms": 0.5})
        return rows, [("spread_ms", "median encoder spread", figures.stage_color("fusion"))], \
            [("threshold", _or(ev.get("threshold_ms"), th.sync_spread_ms)),
             ("baseline", ev.get("baseline_spread_ms"))], "ms"
    if kind == "cache_penetration":
        return _cache_rows(reader, window, step, ev, attr, cache)
    if kind == "preprocessing_bound":
        pre = _frame(reader, "tstage", window, ("input_type",), Filters(stage="preprocessing",
                                                                        input_type=filters.input_type),
                     sketches=False, with_sum=True)
        tr = _frame(reader, "trace", window, ("input_type",), Filters(input_type=filters.input_type),
                    sketches=False, with_sum=True)
        part, whole = _sum_steps(pre, step, "sum_ns"), _sum_steps(tr, step, "sum_ns")
        rows = [{"t": _t(m), "share": part.get(m, 0) / whole[m]} for m in sorted(whole) if whole[m] > 0]
        return rows, [("share", "preprocessing share", figures.stage_color("preprocessing"))], \
            [("threshold", _or(ev.get("threshold_share"), th.preprocess_min_share)),
             ("baseline", ev.get("baseline_share"))], "pct"
    if kind == "batching_failure":
        frame = _frame(reader, "batch", window, ("service",), Filters(service=filters.service), sketches=False)
        ones, total = _sum_steps(frame, step, "errors"), _sum_steps(frame, step, "count")
        rows = [{"t": _t(m), "share": ones.get(m, 0) / total[m]} for m in sorted(total) if total[m] > 0]
        return rows, [("share", "batches of one", figures.stage_color("encoder"))], \
            [("stuck threshold", _or(ev.get("threshold_share"), th.batch_stuck_share)),
             ("baseline", ev.get("baseline_batch_one_share"))], "pct"
    if kind == "cuda_graph_fallback":
        frame = _frame(reader, "cuda", window, ("service", "callee"), Filters(service=filters.service),
                       sketches=False)
        total = _sum_steps(frame, step, "count")
        fb = _sum_steps(frame[frame["callee"] == "fallback"] if len(frame) else frame, step, "count")
        rows = [{"t": _t(m), "share": fb.get(m, 0) / total[m]} for m in sorted(total) if total[m] > 0]
        return rows, [("share", "fallback share", figures.stage_color("inference"))], \
            [("threshold", _or(ev.get("threshold_share"), th.fallback_share)),
             ("baseline", ev.get("baseline_fallback_share"))], "pct"
    # The pair kinds (hot spot, band break) and any other: the subject's P50/P99.
    rows = queries.percentile_series(reader, window, filters, step)
    if kind == "p99_band_break":
        lines = [("baseline P99", ev.get("baseline_p99_ms")),
                 (f"break threshold (×{_or(ev.get('threshold_ratio'), th.band_ratio):g})", ev.get("threshold_ms"))]
    elif kind == "hot_spot":
        lines = [("median P99 of the pairs", ev.get("median_pair_p99_ms"))]
    else:
        lines = []
    return rows, None, lines, "ms"


def _or(v, default):
    return default if v is None else v


def _t(minute: int) -> str:
    return rfc3339(int(minute) * 60_000_000_000)


def _frame(reader, kind: str, window: Window, dims: tuple[str, ...], filters: Filters, sketches: bool,
           with_sum: bool = False):
    """One rollup kind's minute rows in the window (``findings._columns_frame``)."""
    cols, dims_of = reader.rollups.columns(kind, window.start_ns, window.end_ns, dims, filters, sketches=sketches)
    return findings._columns_frame(cols, dims_of, dims, with_sum=with_sum, sketches=sketches)


def _sum_steps(frame, step: int, column: str) -> dict[int, float]:
    """``column`` summed per step (start minute -> sum)."""
    if frame is None or not len(frame):
        return {}
    steps = frame["minute"].to_numpy(dtype=np.int64) // step * step
    values = frame[column].to_numpy(dtype=np.float64)
    keys, at = np.unique(steps, return_inverse=True)
    return dict(zip(keys.tolist(), np.bincount(at, weights=values, minlength=len(keys)).tolist()))


def _sketch_steps(frame, step: int, quantiles: dict[str, float]) -> list[dict]:
    """Per step, the quantiles (ms) of the merged sketches of ``frame``'s rows."""
    if frame is None or not len(frame):
        return []
    steps = frame["minute"].to_numpy(dtype=np.int64) // step * step
    rows = []
    for m in sorted(set(steps.tolist())):
        sel = steps == m
        h = findings.d.histogram_of(frame["keys"].to_numpy()[sel], frame["counts"].to_numpy()[sel])
        if h.count:
            rows.append({"t": _t(m), **{k: h.quantile(q) / 1e6 for k, q in quantiles.items()}})
    return rows


def _quantile_rows(reader, q: RollupQuery, step: int, quantiles: dict[str, float]) -> list[dict]:
    rows = []
    for g in sorted(reader.rollups.steps(q, step), key=lambda g: g.key[-1]):
        if g.count > 0:
            values = g.histogram.quantiles(list(quantiles.values()))
            rows.append({"t": _t(g.key[-1]), **{k: (v / 1e6 if v is not None else None)
                                                for k, v in zip(quantiles, values)}})
    return rows


def _cold_start_rows(reader, window: Window, filters: Filters, step: int, ev: dict, attr: dict, th):
    """The new instance's median request time per step (``inst`` rollups: a request a trace
    and instance) beside all the service's instances', against the steady median and the
    cold threshold (``cold_factor`` x it)."""
    frame = _frame(reader, "inst", window, ("name",), Filters(service=filters.service), sketches=True)
    mine = frame[frame["name"] == attr.get("value")] if len(frame) else frame
    rows_all = {r["t"]: r for r in _sketch_steps(frame, step, {"all_ms": 0.5})}
    for r in _sketch_steps(mine, step, {"new_ms": 0.5}):
        rows_all.setdefault(r["t"], {"t": r["t"]}).update(r)
    rows = [rows_all[t] for t in sorted(rows_all)]
    steady = ev.get("steady_median_ms")
    factor = _or(ev.get("threshold_ratio"), th.cold_factor)
    return rows, [("all_ms", "all instances' median", figures.PCT_STYLE["p50"][1]),
                  ("new_ms", f"{attr.get('value', 'new instance')} median", figures.PCT_STYLE["p99"][1])], \
        [("steady median", steady), (f"cold threshold (×{factor:g})", steady * factor if steady is not None else None)], \
        "ms"


def _cache_rows(reader, window: Window, step: int, ev: dict, attr: dict, cache: str | None):
    """Hit rate per step of the finding's tag value and of the cache's other values of that
    tag (``cache`` rollups: lookups and misses), against the hit-rate floor."""
    frame = _frame(reader, "cache", window, ("name", "caller", "callee"), Filters(), sketches=False)
    key, value = attr.get("key"), attr.get("value")
    if len(frame):
        frame = frame[(frame["name"] == cache) & (frame["caller"] == key)]
    rows: dict[int, dict] = {}
    for label, part in (("mine", frame[frame["callee"] == value] if len(frame) else frame),
                        ("others", frame[frame["callee"] != value] if len(frame) else frame)):
        looked, missed = _sum_steps(part, step, "count"), _sum_steps(part, step, "errors")
        for m, n in looked.items():
            if n > 0:
                rows.setdefault(m, {"t": _t(m)})[label] = 1 - missed.get(m, 0) / n
    return [rows[m] for m in sorted(rows)], \
        [("others", f"other {key} values", figures.PCT_STYLE["p50"][1]),
         ("mine", f"{key}={value}", figures.PCT_STYLE["p99"][1])], \
        [("hit-rate floor", ev.get("threshold_hit_rate")), ("baseline", ev.get("baseline_hit_rate"))], "pct"
