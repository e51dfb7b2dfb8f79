"""The detectors of pipeline stages: ``fusion_sync_wait`` (the encoders finish out of step
and fusion waits for the slowest) and ``preprocessing_bound`` (preprocessing's share of
end-to-end latency grew)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...core.findings import Finding, Subject
from .frames import KIND_SERVER_CODES, NS_MIN, Frames, Thresholds, _clip_window, _reportable, finding, histogram_of
from .hints import HINTS
from .sketches import _block_of, _flagged_runs, _row_quantiles


def _encoder_ends(enc: pd.DataFrame) -> pd.DataFrame:
    """Per trace (index ``trace_id``, sorted) of encoder spans ``enc``: ``n`` encoder services,
    the ``first`` and ``last`` of their ends (each service's last end) and the earliest
    ``start``. Sorted reductions over codes, cheaper than two pandas named aggregations: an
    exemplar look-up of a fusion finding makes up to three calls."""
    if enc.empty:
        return pd.DataFrame({"n": [], "first": [], "last": [], "start": []}, index=pd.Index([], name="trace_id"))
    t_codes, traces = pd.factorize(enc["trace_id"], sort=True)
    s_codes, services = pd.factorize(enc["service"])
    key = t_codes.astype(np.int64) * len(services) + s_codes
    order = np.argsort(key, kind="stable")
    key = key[order]
    at = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])  # each (trace, service)'s first row
    start = enc["start_ns"].to_numpy(dtype=np.int64)[order]
    end = start + enc["duration_ns"].to_numpy(dtype=np.int64)[order]
    svc_end, svc_start = np.maximum.reduceat(end, at), np.minimum.reduceat(start, at)
    trace_of = key[at] // len(services)
    first_of = np.flatnonzero(np.r_[True, trace_of[1:] != trace_of[:-1]])  # each trace's first service
    return pd.DataFrame({"n": np.diff(np.r_[first_of, len(trace_of)]),
                         "first": np.minimum.reduceat(svc_end, first_of), "last": np.maximum.reduceat(svc_end, first_of),
                         "start": np.minimum.reduceat(svc_start, first_of)},
                        index=pd.Index(traces[trace_of[first_of]], name="trace_id"))


#: The stages whose raw spans the fusion detector reads: the encoders, and fusion.
SYNC_STAGES = ("encoder", "fusion")


def _sync_blocks(frames: Frames, th: Thresholds):
    """Per block: median encoder spread (ms) and trace count, plus a function giving the
    median over a set of blocks, and the fusion service. From raw spans when the frames
    carry them (exact, with per-trace exemplars), else from the ``sync`` rollups."""
    if frames.sync is None:
        df = frames.spans
        if df.empty:
            return None
        srv = df[df["kind"].isin(KIND_SERVER_CODES)]
        enc = srv[srv["stage"] == SYNC_STAGES[0]]
        fus = srv[srv["stage"] == SYNC_STAGES[1]]
        if enc.empty or fus.empty:
            return None
        enc = enc[enc["trace_id"].isin(set(fus["trace_id"]))]
        per = _encoder_ends(enc)
        per = per[per["n"] >= 2]
        if per.empty:
            return None
        per = per.assign(spread_ms=(per["last"] - per["first"]) / 1e6,
                         block=_block_of(per["start"].to_numpy() // NS_MIN, th))
        stats = per.groupby("block")["spread_ms"].agg(["median", "size"])

        def median_of(sel) -> tuple[float, int, list]:
            inside = per[sel(per["block"])]
            return (float(inside["spread_ms"].median()) if len(inside) else None, len(inside),
                    inside.sort_values("spread_ms", ascending=False).index.tolist())

        return stats, median_of, fus["service"].mode().iloc[0]
    df = frames.sync
    if df.empty:
        return None
    df = df.assign(block=_block_of(df["minute"].to_numpy(), th))
    blocks, row_block = np.unique(df["block"].to_numpy(), return_inverse=True)
    medians = _row_quantiles(row_block, df["keys"], df["counts"], len(blocks), 0.5) / 1e6
    sizes = np.bincount(row_block, weights=df["count"].to_numpy(dtype=np.float64), minlength=len(blocks))
    stats = pd.DataFrame({"block": blocks, "median": medians,
                          "size": np.rint(sizes).astype(np.int64)}).set_index("block")

    def median_of(sel) -> tuple[float, int, list]:
        inside = df[sel(df["block"])]
        h = histogram_of(inside["keys"], inside["counts"])
        return (h.quantile(0.5) / 1e6 if h.count else None, int(inside["count"].sum()), [])

    return stats, median_of, df.groupby("service")["count"].sum().idxmax()


def detect_fusion_sync_wait(frames: Frames, th: Thresholds) -> list[Finding]:
    """``fusion_sync_wait``: in traces with a fusion-stage span, the spread between the
    first and the last encoder to finish (per service, the end of its last encoder-stage
    SERVER span). Fires for blocks whose median spread, over at least ``min_samples``
    traces with two or more encoders, exceeds ``sync_spread_ms``. Reads the ``sync``
    rollups (one spread a trace), or computes them from raw spans.
    """
    got = _sync_blocks(frames, th)
    if got is None:
        return []
    stats, median_of, fusion_service = got
    flags = (stats["median"] > th.sync_spread_ms) & (stats["size"] >= th.min_samples)
    b = max(1, th.block_minutes)
    out = []
    blocks = stats.index.to_numpy()
    fl = flags.to_numpy()
    for k, j, s_min, e_min in _flagged_runs(blocks, fl, b):
        if _reportable(frames, s_min, e_min):
            med_in, n_in, exemplars = median_of(lambda blk: (blk >= s_min) & (blk < e_min))
            med_out, n_out, _ = median_of(lambda blk: (blk < s_min) | (blk >= e_min))
            s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
            out.append(finding("fusion_sync_wait", "warning", Subject(service=str(fusion_service), stage="fusion"),
                               s_ns, e_ns, {
                "median_spread_ms": round(float(med_in), 3),
                "baseline_spread_ms": round(float(med_out), 3) if n_out and med_out is not None else None,
                "threshold_ms": th.sync_spread_ms, "sample_count": int(n_in),
            }, HINTS["fusion_sync_wait"], exemplars))
    return out


def _block_table(df: pd.DataFrame, th: Thresholds, by: list[str], value_cols: list[str]) -> pd.DataFrame:
    d = df.assign(block=_block_of(df["minute"].to_numpy(), th))
    return d.groupby(by + ["block"])[value_cols].sum().reset_index()


def detect_preprocessing_bound(frames: Frames, th: Thresholds) -> list[Finding]:
    """``preprocessing_bound``: per input type and block, the preprocessing stage's share of
    end-to-end latency (``tstage`` self time over ``trace`` duration) reaches both
    ``preprocess_min_share`` and ``preprocess_ratio`` x its baseline (the median block
    share over the data); a block needs ``min_samples`` traces.
    """
    if frames.tstage.empty or frames.traces.empty:
        return []
    pre = frames.tstage[frames.tstage["stage"] == "preprocessing"]
    if pre.empty:
        return []
    pre_b = _block_table(pre, th, ["input_type"], ["sum_ns"]).rename(columns={"sum_ns": "pre_ns"})
    tr_b = _block_table(frames.traces, th, ["input_type"], ["sum_ns", "count"])
    t = tr_b.merge(pre_b, on=["input_type", "block"], how="left").fillna({"pre_ns": 0})
    t = t[t["sum_ns"] > 0]
    t = t.assign(share=t["pre_ns"].astype(float) / t["sum_ns"].astype(float))
    out = []
    b = max(1, th.block_minutes)
    for it, g in t.groupby("input_type"):
        g = g.sort_values("block")
        ok = g[g["count"] >= th.min_samples]
        if len(ok) < 2:
            continue
        base = float(ok["share"].median())
        fl = ((g["count"] >= th.min_samples) & (g["share"] >= th.preprocess_min_share)
              & (g["share"] >= th.preprocess_ratio * base)).to_numpy()
        blocks = g["block"].to_numpy()
        for k, j, s_min, e_min in _flagged_runs(blocks, fl, b):
            if _reportable(frames, s_min, e_min):
                inside = g.iloc[k:j + 1]
                share = float(inside["pre_ns"].sum() / inside["sum_ns"].sum())
                s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
                out.append(finding("preprocessing_bound", "warning", Subject(input_type=str(it), stage="preprocessing"),
                                   s_ns, e_ns, {
                    "share": round(share, 4), "baseline_share": round(base, 4),
                    "threshold_share": round(max(th.preprocess_min_share, th.preprocess_ratio * base), 4),
                    "sample_count": int(inside["count"].sum()),
                }, HINTS["preprocessing_bound"]))
    return out
