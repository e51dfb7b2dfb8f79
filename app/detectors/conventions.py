"""The detectors of span attribute conventions (docs/design.md): ``cache_penetration``
(``cache.name``/``cache.hit``), ``batching_failure`` (``batch.size``) and
``cuda_graph_fallback`` (``gpu.cuda_graph``). Each reads its convention rollups, or computes
them from raw spans exactly as the settler does (``ingest/settle_fast.py``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...ingest.settle_fast import cache_hit_value, convention_contributions
from ...models import sketch
from ...core.findings import Attribute, Finding, Subject
from .frames import NS_MIN, Frames, Thresholds, _clip_window, _reportable, empty_frame, finding, histogram_of
from .hints import HINTS
from .sketches import _block_of, _flagged_runs


def _with_attrs(frames: Frames) -> pd.DataFrame:
    """The spans that carry attributes (most raw spans are SERVER spans without any), found
    once per ``frames.spans`` and shared by the attribute detectors."""
    df = frames.spans
    return frames.derived("spans_with_attrs", df, lambda: df[np.fromiter(
        (isinstance(a, dict) and bool(a) for a in df["attrs"]), dtype=bool, count=len(df))])


def _attr_spans(frames: Frames, key: str) -> pd.DataFrame:
    """Spans carrying attribute ``key``, its value in column ``_v`` (in ``frames.spans`` order)."""
    if frames.spans.empty:
        return frames.spans
    df = _with_attrs(frames)
    vals = [a.get(key) for a in df["attrs"]]
    out = df.assign(_v=vals)
    return out[out["_v"].notna()]


CACHE_COLUMNS = ("service", "cache", "key", "value", "minute", "count", "misses")
BATCH_COLUMNS = ("service", "minute", "count", "ones", "sum")
CUDA_COLUMNS = ("service", "name", "fallback", "minute", "count", "keys", "counts")
SYNC_COLUMNS = ("service", "minute", "count", "keys", "counts")
MAX_TAG_VALUES = 20  # a cache tag has 2..20 values in the data


def _convention_rows(frames: Frames, kind: str) -> list[tuple]:
    """(series key, minute, value, error) of the raw spans' convention contributions: the
    rollups the settler writes (``ingest/settle_fast.py``), computed from ``frames.spans``."""
    out = []
    df = _with_attrs(frames)
    for service, name, start, dur, attrs in zip(df["service"], df["name"], df["start_ns"], df["duration_ns"],
                                                df["attrs"]):
        out.extend(c for c in convention_contributions(service, name, int(start), int(dur), attrs)
                   if c[0][0] == kind)
    return out


def _cache_frame(frames: Frames) -> pd.DataFrame:
    """Cache lookups and misses per (service, cache, tag key, tag value, minute): the
    ``cache`` rollups' tag rows, or the same from raw spans (a cache's TOTAL series, tag
    key '', is no tag)."""
    if frames.cache is not None:
        return frames.cache
    rows = [(k[1], k[2], k[5], k[6], m, 1, e) for k, m, v, e in _convention_rows(frames, "cache") if k[5]]
    if not rows:
        return empty_frame(CACHE_COLUMNS)
    df = pd.DataFrame(rows, columns=list(CACHE_COLUMNS))
    return df.groupby(list(CACHE_COLUMNS[:5]), as_index=False)[["count", "misses"]].sum()


def _in_run(frames: Frames, df: pd.DataFrame, s_min: int, e_min: int) -> pd.DataFrame:
    """Raw spans of ``df`` starting in the run's minutes (exemplars and exact evidence)."""
    return df[(df["start_ns"] >= s_min * NS_MIN) & (df["start_ns"] < e_min * NS_MIN)]


def _penetrated(stats: pd.DataFrame, th: Thresholds) -> dict[str, list[tuple[int, str, float, float, int, float]]]:
    """Tag value -> ``(block, dominant value, hit rate, dominant's hit rate, lookups, dominant's
    share)`` of the blocks where its hit rate fell below ``(1 - cache_drop)`` x the dominant
    value's (the busiest, the first of equals, with ``cache_dominant_share`` of the block's
    lookups and ``min_samples``), in block order. ``stats``: ``block``, ``tag``, ``n``,
    ``hits`` per block and value, sorted by both. All blocks at once: a loop per block was
    most of the detector's time over a week."""
    if stats.empty:
        return {}
    by_block = stats.groupby("block", sort=False)
    dom_at = stats.index.get_indexer(by_block["n"].idxmax())  # the first of equal maxima
    block_of_row = by_block.ngroup().to_numpy()
    n = stats["n"].to_numpy()
    hits = stats["hits"].to_numpy()
    tags = stats["tag"].to_numpy()
    total = by_block["n"].transform("sum").to_numpy()
    dom = dom_at[block_of_row]  # each row's block's dominant row
    dom_n, dom_hits, dom_tag = n[dom], hits[dom], tags[dom]
    with np.errstate(invalid="ignore", divide="ignore"):  # (blocks of no lookups: nan, never flagged)
        share = dom_n / total
        dom_rate = dom_hits / dom_n
        rate = hits / n
        fell = ((share >= th.cache_dominant_share) & (dom_n >= th.min_samples) & (tags != dom_tag)
                & (n >= th.min_samples) & (rate < (1 - th.cache_drop) * dom_rate))
    flagged: dict[str, list[tuple[int, str, float, float, int, float]]] = {}
    blocks = stats["block"].to_numpy()
    for i in np.flatnonzero(fell):
        flagged.setdefault(tags[i], []).append((int(blocks[i]), str(dom_tag[i]), rate[i], dom_rate[i], int(n[i]),
                                                share[i]))
    return flagged


def detect_cache_penetration(frames: Frames, th: Thresholds) -> list[Finding]:
    """``cache_penetration``: per cache (``cache.name``, hits from ``cache.hit``) and per tag
    (a string attribute of the lookups with 2-20 values), the hit rate of one tag value
    falls below ``(1 - cache_drop)`` x the dominant value's in the same block, while the
    dominant value (the busiest, at least ``cache_dominant_share`` of the lookups) keeps
    its own rate. Each side needs ``min_samples`` lookups a block. Reads the ``cache``
    rollups (a tag whose values overflowed the settler's cap is no bounded tag).
    """
    df = _cache_frame(frames)
    if df.empty:
        return []
    df = df.assign(block=_block_of(df["minute"].to_numpy(), th), hits=df["count"] - df["misses"])
    out = []
    b = max(1, th.block_minutes)
    raw = _attr_spans(frames, "cache.name") if frames.cache is None and not frames.spans.empty else None
    for (cache, key), kdf in df.groupby(["cache", "key"], sort=True):
        # (as plain objects: iterating a pandas string column is a Python call a value)
        values = set(kdf["value"].to_numpy(dtype=object)[kdf["count"].to_numpy() > 0].tolist())
        if "" in values or not 2 <= len(values) <= MAX_TAG_VALUES:
            continue
        stats = kdf.groupby(["block", "value"], as_index=False)[["count", "hits"]].sum()
        stats = stats.rename(columns={"count": "n", "value": "tag"})
        flagged = _penetrated(stats, th)
        for value, items in flagged.items():
            items.sort()
            blks = np.array([x[0] for x in items])
            runs, s = [], 0
            for k in range(1, len(blks) + 1):
                if k == len(blks) or blks[k] != blks[k - 1] + b:
                    runs.append(items[s:k])
                    s = k
            for run in runs:
                s_min, e_min = run[0][0], run[-1][0] + b
                if not _reportable(frames, s_min, e_min):
                    continue
                in_run = stats[(stats["block"] >= s_min) & (stats["block"] < e_min)]
                mine = in_run[in_run["tag"] == value]
                dominant = max(set(x[1] for x in run), key=[x[1] for x in run].count)
                dom_rows = in_run[in_run["tag"] == dominant]
                before = stats[(stats["tag"] == value) & ((stats["block"] < s_min) | (stats["block"] >= e_min))]
                dom_rate = dom_rows["hits"].sum() / max(1, dom_rows["n"].sum())
                exemplars = []
                if raw is not None:
                    r = _in_run(frames, raw[raw["_v"].astype(str) == str(cache)], s_min, e_min)
                    misses = [t for t, a in zip(r["trace_id"], r["attrs"]) if a.get(key) == value
                              and cache_hit_value(a.get("cache.hit")) is False]
                    exemplars = misses
                s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
                out.append(finding("cache_penetration", "warning",
                                   Subject(cache=str(cache), attribute=Attribute(key, value)), s_ns, e_ns, {
                    "hit_rate": round(mine["hits"].sum() / max(1, mine["n"].sum()), 4),
                    "dominant_hit_rate": round(dom_rate, 4),
                    "baseline_hit_rate": round(before["hits"].sum() / before["n"].sum(), 4)
                    if before["n"].sum() else None,
                    "threshold_hit_rate": round((1 - th.cache_drop) * dom_rate, 4),
                    "dominant_share": round(dom_rows["n"].sum() / max(1, in_run["n"].sum()), 4),
                    "sample_count": int(mine["n"].sum()), "dominant_count": int(dom_rows["n"].sum()),
                }, HINTS["cache_penetration"].format(key=key, value=value, dominant=f"{key}={dominant}"), exemplars))
    return out


def _load_by_block(frames: Frames, th: Thresholds) -> pd.Series:
    if frames.traces.empty:
        return pd.Series(dtype=float)
    d = frames.traces.assign(block=_block_of(frames.traces["minute"].to_numpy(), th))
    return d.groupby("block")["count"].sum().astype(float)


def _batch_frame(frames: Frames) -> pd.DataFrame:
    """Spans with a numeric ``batch.size`` per (service, minute): count, size-1 count, sum
    of sizes (the ``batch`` rollups, or the same from raw spans)."""
    if frames.batch is not None:
        return frames.batch
    rows = [(k[1], m, 1, e, v) for k, m, v, e in _convention_rows(frames, "batch")]
    if not rows:
        return empty_frame(BATCH_COLUMNS)
    return pd.DataFrame(rows, columns=list(BATCH_COLUMNS)).groupby(["service", "minute"], as_index=False).sum()


def detect_batching_failure(frames: Frames, th: Thresholds) -> list[Finding]:
    """``batching_failure``: per service, the share of its spans with ``batch.size`` = 1
    reaches ``batch_stuck_share`` in blocks whose load (requests, from the ``trace``
    rollups) is at least ``batch_load_ratio`` x the median block's, while over the whole
    data that share stays under one half. A block needs ``min_samples`` batched spans.
    """
    df = _batch_frame(frames)
    if df.empty:
        return []
    df = df.assign(block=_block_of(df["minute"].to_numpy(), th))
    load = _load_by_block(frames, th)
    med = float(load.median()) if len(load) else 0.0
    b = max(1, th.block_minutes)
    raw = _attr_spans(frames, "batch.size") if frames.batch is None and not frames.spans.empty else None
    out = []
    for service, g in df.groupby("service"):
        stats = g.groupby("block")[["count", "ones", "sum"]].sum()
        stats = stats.assign(mean=stats["ones"] / stats["count"])
        full = stats["count"] >= th.min_samples
        base = float(stats.loc[full, "mean"].median()) if full.any() else float("nan")
        if not base < 0.5:
            continue
        lo = load.reindex(stats.index).fillna(0.0)
        fl = (full & (stats["mean"] >= th.batch_stuck_share) & (lo >= th.batch_load_ratio * med)).to_numpy()
        blocks = stats.index.to_numpy()
        for k, j, s_min, e_min in _flagged_runs(blocks, fl, b):
            if _reportable(frames, s_min, e_min):
                inside = stats.iloc[k:j + 1]
                n = int(inside["count"].sum())
                load_in = float(lo.iloc[k:j + 1].mean())
                exemplars = []
                if raw is not None:
                    r = _in_run(frames, raw[raw["service"] == service], s_min, e_min)
                    r = r[pd.to_numeric(r["_v"], errors="coerce").notna()]
                    exemplars = r.sort_values("duration_ns", ascending=False)["trace_id"].tolist()
                s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
                out.append(finding("batching_failure", "warning",
                                   Subject(service=str(service), attribute=Attribute("batch.size", 1)), s_ns, e_ns, {
                    "batch_one_share": round(float(inside["ones"].sum()) / n, 4), "baseline_batch_one_share": round(base, 4),
                    "threshold_share": th.batch_stuck_share,
                    "load_ratio": round(load_in / med, 3) if med else None, "threshold_load_ratio": th.batch_load_ratio,
                    "mean_batch_size": round(float(inside["sum"].sum()) / n, 3),
                    "sample_count": n,
                }, HINTS["batching_failure"], exemplars))
    return out


def _cuda_frame(frames: Frames) -> pd.DataFrame:
    """Spans with ``gpu.cuda_graph`` per (service, span name, fallback or not, minute), with
    their latency sketches (the ``cuda`` rollups, or the same from raw spans)."""
    if frames.cuda is not None:
        return frames.cuda
    rows = [(k[1], k[2], k[6] == "fallback", m, v) for k, m, v, e in _convention_rows(frames, "cuda")]
    if not rows:
        return empty_frame(CUDA_COLUMNS)
    df = pd.DataFrame(rows, columns=["service", "name", "fallback", "minute", "v"])
    out = []
    for key, g in df.groupby(["service", "name", "fallback", "minute"], sort=True):
        k, c = np.unique(sketch.keys_of(g["v"].to_numpy(dtype=float)), return_counts=True)
        out.append((*key, len(g), k, c))
    return pd.DataFrame(out, columns=list(CUDA_COLUMNS))


def detect_cuda_graph_fallback(frames: Frames, th: Thresholds) -> list[Finding]:
    """``cuda_graph_fallback``: per service, blocks where at least ``fallback_share`` of the
    spans carrying ``gpu.cuda_graph`` say ``fallback`` (and at least ``min_events`` of them);
    the evidence adds their extra latency against captured spans of the same operation.
    """
    df = _cuda_frame(frames)
    if df.empty:
        return []
    df = df.assign(block=_block_of(df["minute"].to_numpy(), th),
                   fb=df["count"].where(df["fallback"].astype(bool), 0))
    # Raw spans are the source only without the rollups: beside them, frames.spans holds only
    # the SERVER spans read around new instances (no attributes), which once turned every
    # fallback's extra latency into None on a day with a cold-start candidate.
    raw = _attr_spans(frames, "gpu.cuda_graph") if frames.cuda is None and not frames.spans.empty else None
    b = max(1, th.block_minutes)
    out = []
    for service, g in df.groupby("service"):
        stats = g.groupby("block")[["count", "fb"]].sum()
        mean = stats["fb"] / stats["count"]
        fl = ((stats["count"] >= th.min_samples) & (mean >= th.fallback_share)
              & (stats["fb"] >= th.min_events)).to_numpy()
        blocks = stats.index.to_numpy()
        for k, j, s_min, e_min in _flagged_runs(blocks, fl, b):
            if not _reportable(frames, s_min, e_min):
                continue
            inside = g[(g["block"] >= s_min) & (g["block"] < e_min)]
            outside = stats[(stats.index < s_min) | (stats.index >= e_min)]
            n, n_fb = int(inside["count"].sum()), int(inside["fb"].sum())
            hint = HINTS["cuda_graph_fallback"]
            exemplars: list = []
            ratios = []
            if raw is not None:  # raw spans: exact medians, the instance and exemplars
                r = _in_run(frames, raw[raw["service"] == service], s_min, e_min)
                fb = r[r["_v"] == "fallback"]
                cap = r[r["_v"] != "fallback"]
                for name, f in fb.groupby("name"):
                    c = cap[cap["name"] == name]
                    if len(c):
                        ratios.append(f["duration_ns"].median() / max(1.0, c["duration_ns"].median()))
                hint = cuda_hint(fb["instance"])
                exemplars = fb.sort_values("duration_ns", ascending=False)["trace_id"].tolist()
            else:
                for name, ng in inside.groupby("name"):
                    f, c = ng[ng["fallback"].astype(bool)], ng[~ng["fallback"].astype(bool)]
                    if len(f) and len(c):
                        mf = histogram_of(f["keys"], f["counts"]).quantile(0.5)
                        mc = histogram_of(c["keys"], c["counts"]).quantile(0.5)
                        if mf is not None and mc is not None:
                            ratios.append(mf / max(1.0, mc))
            extra = float(np.median(ratios)) - 1 if ratios else None
            s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
            out.append(finding("cuda_graph_fallback", "warning",
                               Subject(service=str(service), attribute=Attribute("gpu.cuda_graph", "fallback")),
                               s_ns, e_ns, {
                "fallback_share": round(n_fb / n, 4),
                "baseline_fallback_share": round(float(outside["fb"].sum() / outside["count"].sum()), 4)
                if outside["count"].sum() else None,
                "threshold_share": th.fallback_share,
                "extra_latency_ratio": round(extra, 4) if extra is not None else None,
                "fallback_count": n_fb, "sample_count": n,
            }, hint, exemplars))
    return out


def cuda_hint(instances: pd.Series) -> str:
    """The fallback hint, naming the instance most fallbacks ran on (from raw spans)."""
    hint = HINTS["cuda_graph_fallback"]
    instances = instances.dropna()
    top = instances.mode().iloc[0] if len(instances) else None
    if top:
        hint += f" Most fallbacks are on instance {top} ({(instances == top).mean():.0%})."
    return hint
