"""The detectors of a request's and an instance's life, and of the reference table:
``lb_timeout_truncation`` (long requests cut at a load balancer's timeout), ``cold_start``
(a new instance's first requests) and ``baseline_regression`` (P95 over its reference)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ...core.findings import Attribute, Finding, Subject
from ...models import sketch
from .frames import (KIND_SERVER_CODES, NS_MIN, Frames, Thresholds, _clip_window, _ms, _reportable, finding,
                     histogram_of)
from .hints import HINTS
from .sketches import _block_of, _counts_above, _flagged_runs


def detect_lb_timeout_truncation(frames: Frames, th: Thresholds) -> list[Finding]:
    """``lb_timeout_truncation``: per root service, the longest traces pile up just under a
    ceiling and end in errors: at least ``min_events`` traces within ``lb_band`` (a
    fraction) below the longest one, at least 80 % of them errors, the ceiling at least
    ``lb_min_ceiling_s`` seconds, and nothing longer.
    """
    df = frames.long_traces
    if df.empty:
        return []
    df = df[df["start_ns"] >= frames.start_ns]
    out = []
    for root, g in df.groupby("root_service"):
        top = float(g["duration_ns"].max())
        if top < th.lb_min_ceiling_s * 1e9:
            continue
        band = g[g["duration_ns"] >= top * (1 - th.lb_band)]
        if len(band) < th.min_events:
            continue
        err = band["error"].astype(bool)
        if err.mean() < 0.8:
            continue
        types = band["input_type"].value_counts()
        subject = Subject(service=str(root), input_type=str(types.index[0])
                          if len(types) and types.iloc[0] / len(band) >= 0.8 else None)
        ceiling_s = math.ceil(top / 1e9)
        s_ns = int(band["start_ns"].min()) // NS_MIN * NS_MIN
        e_ns = (int(band["start_ns"].max()) // NS_MIN + 1) * NS_MIN
        out.append(finding("lb_timeout_truncation", "critical", subject, s_ns, e_ns, {
            "ceiling_s": ceiling_s, "max_duration_ms": _ms(top), "band_ms": _ms(top * th.lb_band),
            "truncated": int(len(band)), "error_share": round(float(err.mean()), 4),
            "threshold_count": th.min_events, "sample_count": int(len(band)),
        }, HINTS["lb_timeout_truncation"].format(ceiling_s=ceiling_s),
            band.sort_values("start_ns")["trace_id"].tolist()))
    return out


COLD_STEADY_NS = 30 * NS_MIN  # the steady state: the half hour after a new instance's warm-up


def cold_start_candidate(first: pd.DataFrame, steady: pd.DataFrame, th: Thresholds) -> bool:
    """Pre-check on ``inst`` rollups (one request a trace and instance, per minute): a new
    instance's first minutes (``first``) against its service's next half hour
    (``steady``, all instances): worth reading raw spans when the median is at least half
    ``cold_factor`` x slower (minutes and mixed operations blur the exact rule)."""
    return cold_start_histograms_candidate(histogram_of(first["keys"], first["counts"]),
                                           histogram_of(steady["keys"], steady["counts"]), th)


def cold_start_histograms_candidate(first: sketch.Histogram, steady: sketch.Histogram, th: Thresholds) -> bool:
    """``cold_start_candidate`` on the two merged histograms."""
    if first.count < th.min_events or steady.count < th.min_samples:
        return False
    return first.quantile(0.5) >= 0.5 * th.cold_factor * steady.quantile(0.5)


def detect_cold_start(frames: Frames, th: Thresholds) -> list[Finding]:
    """``cold_start``: a ``service.instance.id`` first seen after the data began (a new
    instance) whose requests (SERVER/CONSUMER spans) in its first ``cold_warmup_s`` are,
    at the median, ``cold_factor`` x slower than the same operations' steady state (the
    service's other spans in the half hour after that instance's warm-up, all instances).
    Needs ``min_events`` first requests and ``min_samples`` steady ones.
    """
    known = [f for f in frames.cold_starts_known or ()
             if _reportable(frames, f.start_ns // NS_MIN, -(-f.end_ns // NS_MIN))]
    return known + _cold_starts_from_spans(frames, th)


def _cold_starts_from_spans(frames: Frames, th: Thresholds) -> list[Finding]:
    df = frames.spans
    if df.empty:
        return []
    srv = df.loc[df["kind"].isin(KIND_SERVER_CODES) & df["instance"].notna(),
                 ["trace_id", "service", "name", "start_ns", "duration_ns", "instance"]]
    if srv.empty:
        return []
    out = []
    grace = 2 * NS_MIN
    warm = int(th.cold_warmup_s * 1e9)
    spans_start = frames.data_start_ns if frames.spans_start_ns is None else frames.spans_start_ns
    # Only instances first seen after the data began can be new: find them with one grouped
    # minimum, then look at their spans (most instances live through the whole window).
    births = srv.groupby(["service", "instance"], sort=True)["start_ns"].min()
    if frames.new_instances is None:
        births = births[births >= spans_start + grace]
    else:  # the rollups found the new instances; the raw spans are those around their births
        births = births[[key in frames.new_instances for key in births.index]]
    if births.empty:
        return []
    by_service = {service: sg for service, sg in srv.groupby("service", sort=True)}
    # Per service and operation, durations ordered by start: the steady state after a
    # birth is a suffix of each (searchsorted), not a new group-by per instance.
    ops: dict[Any, list[tuple[Any, np.ndarray, np.ndarray]]] = {}
    by_instance: dict[Any, dict[Any, pd.DataFrame]] = {}
    for service in births.index.get_level_values(0).unique():
        sg = by_service[service]
        lst = []
        for name, ng in sg.groupby("name", sort=True):
            order = np.argsort(ng["start_ns"].to_numpy(), kind="stable")
            lst.append((name, ng["start_ns"].to_numpy()[order], ng["duration_ns"].to_numpy()[order]))
        ops[service] = lst
        by_instance[service] = {inst: g for inst, g in sg.groupby("instance", sort=True)}
    for (service, inst), born in births.items():
        born = int(born)
        g = by_instance[service][inst]
        first = g[g["start_ns"] < born + warm]
        if len(first) < th.min_events:
            continue
        med: dict[Any, float] = {}
        total = 0
        for name, st, du in ops[service]:
            i = int(np.searchsorted(st, born + warm, side="left"))
            e = int(np.searchsorted(st, born + warm + COLD_STEADY_NS, side="left"))
            cnt = e - i
            total += cnt
            if cnt and cnt >= th.min_samples:
                med[name] = float(np.median(du[i:e]))
        steady = pd.Series(med, dtype=float)
        counts = pd.Series({"_": total})
        f = first[first["name"].isin(steady.index)]
        if len(f) < th.min_events:
            continue
        ratio = f["duration_ns"].to_numpy() / steady.reindex(f["name"]).to_numpy()
        if np.median(ratio) < th.cold_factor:
            continue
        mine = g[g["name"].isin(steady.index)].sort_values("start_ns")
        r_all = mine["duration_ns"].to_numpy() / steady.reindex(mine["name"]).to_numpy()
        starts = mine["start_ns"].to_numpy()
        # The cold period ends before the first run of min_events requests at steady speed.
        last, calm = born, 0
        for st_ns, rr in zip(starts, r_all):
            if rr >= th.cold_factor:
                last, calm = int(st_ns), 0
            else:
                calm += 1
                if calm >= th.min_events:
                    break
        s_ns = born // NS_MIN * NS_MIN
        e_ns = (last // NS_MIN + 1) * NS_MIN
        if not _reportable(frames, s_ns // NS_MIN, e_ns // NS_MIN):
            continue
        out.append(finding("cold_start", "warning",
                           Subject(service=str(service), attribute=Attribute("service.instance.id", str(inst))),
                           s_ns, e_ns, {
            "first_median_ms": _ms(float(np.median(f["duration_ns"]))),
            "steady_median_ms": _ms(float(np.median(steady.reindex(f["name"]).to_numpy()))),
            "ratio": round(float(np.median(ratio)), 3), "threshold_ratio": th.cold_factor,
            "warmup_s": th.cold_warmup_s, "sample_count": int(len(f)), "steady_count": int(counts.sum()),
        }, HINTS["cold_start"], f.sort_values("duration_ns", ascending=False)["trace_id"].tolist()))
    return out


def _wilson_lower(k: float, n: float, z: float = 3.0) -> float:
    if n <= 0:
        return 0.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return centre - half


def detect_baseline_regression(frames: Frames, th: Thresholds) -> list[Finding]:
    """``baseline_regression``: P95 per input type over its baseline P95 (``baseline``
    setting, default the reference latency table) by more than ``baseline_margin``.

    Blocks (with ``min_samples`` traces) where more than 5 % of the traces are slower
    than baseline x (1 + margin) merge into runs; a run fires only when that share is
    over 5 % with confidence (Wilson lower bound, z = 3: a few slow requests in a small
    window do not fire) and its P95 (from the rollup histograms) is past the limit.
    Critical past twice the margin.
    """
    df = frames.traces
    if df.empty:
        return []
    table = th.baseline_table()
    b = max(1, th.block_minutes)
    out = []
    for it, g in df.groupby("input_type"):
        if it not in table:
            continue
        base95 = table[it][1] * 1e6
        limit = base95 * (1 + th.baseline_margin)
        k_lim = sketch.key_of(limit)
        above = _counts_above(g["keys"], g["counts"], k_lim)
        block = _block_of(g["minute"].to_numpy(), th)
        g = g.assign(above=above, block=block)
        stats = g.groupby("block")[["count", "above"]].sum()
        fl = np.array([n >= th.min_samples and a / n > 0.05
                       for n, a in zip(stats["count"], stats["above"])], dtype=bool)
        blocks = stats.index.to_numpy()
        # (each run's rows by numpy masks: a frame mask per run was most of this detector)
        count, keys_col, counts_col = g["count"].to_numpy(), g["keys"].to_numpy(), g["counts"].to_numpy()
        for k, j, s_min, e_min in _flagged_runs(blocks, fl, b):
            if not _reportable(frames, s_min, e_min):
                continue
            sel = (block >= s_min) & (block < e_min)
            n_above = int(above[sel].sum())
            if _wilson_lower(n_above, count[sel].sum()) <= 0.05:
                continue
            h = histogram_of(keys_col[sel], counts_col[sel])
            p95 = h.quantile(0.95)
            if p95 is None or p95 <= limit:
                continue
            change = p95 / base95 - 1
            sev = "critical" if change > 2 * th.baseline_margin else "warning"
            s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
            out.append(finding("baseline_regression", sev, Subject(input_type=str(it)), s_ns, e_ns, {
                "p95_ms": _ms(p95), "baseline_p95_ms": _ms(base95), "threshold_ms": _ms(limit),
                "change": round(change, 4), "margin": th.baseline_margin,
                "over_threshold": n_above, "sample_count": int(h.count),
            }, HINTS["baseline_regression"].format(input_type=it, margin=th.baseline_margin * 100)))
    return out
