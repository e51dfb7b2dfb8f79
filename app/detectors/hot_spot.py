"""``hot_spot``: a pair in the top quartile of both P99 and call volume, per block."""

from __future__ import annotations

import numpy as np

from ...core.findings import Finding, Subject
from .frames import NS_MIN, Frames, Thresholds, _clip_window, _ms, _reportable, finding
from .hints import HINTS
from .pairs import _pair_block_matrix, _pair_rows_histogram, _pair_series
from .sketches import _blocks, _coarse_quantile, _runs


VOLUME_TIE = 0.10  # call volumes this close (relative) rank as ties
HOT_CELLS_CHUNK = 4_000_000  # pairs x pairs x blocks compared at once (bytes of one bool array)


def _hot_cells(counts: np.ndarray, p99: np.ndarray, min_samples: int) -> np.ndarray:
    """Pairs x blocks: in the top quartile of both call volume and P99 among the block's
    pairs with ``min_samples`` calls (``detect_hot_spot``; blocks with fewer than 4 such
    pairs have none). All pairs against all pairs at once, some blocks at a time: a loop per
    block and pair was most of the detector's time over a week of blocks."""
    n_pairs, nblk = counts.shape
    hot = np.zeros((n_pairs, nblk), dtype=bool)
    step = max(1, HOT_CELLS_CHUNK // max(1, n_pairs * n_pairs))
    for lo in range(0, nblk, step):
        c, p = counts[:, lo:lo + step], p99[:, lo:lo + step]
        ok = c >= min_samples
        n = ok.sum(axis=0)
        q = np.ceil(n / 4)
        vols = np.where(ok, c, -np.inf)  # pairs without enough calls rank nowhere
        lats = np.where(ok, p, -np.inf)
        # [i, b]: how many ranked pairs have at least pair i's volume (less the tie) / P99
        at_vol = (vols[None, :, :] >= (c * (1 - VOLUME_TIE))[:, None, :]).sum(axis=1)
        at_lat = (lats[None, :, :] >= p[:, None, :]).sum(axis=1)
        hot[:, lo:lo + step] = ok & (n >= 4)[None, :] & (at_vol <= q) & (at_lat <= q)
    return hot


def detect_hot_spot(frames: Frames, th: Thresholds) -> list[Finding]:
    """``hot_spot``: a pair in the top quartile of both P99 and call volume, per block.

    Per block, pairs with at least ``min_samples`` calls are ranked; a pair is in the top
    quartile when the number of pairs at or above its value (ties count against it: many
    pairs are called once a request, so their volumes tie; volumes within
    ``VOLUME_TIE`` of each other are ties) is at most ``ceil(n / 4)``.
    Consecutive hot blocks make one finding. Needs at least 4 pairs.
    """
    series = _pair_series(frames)
    if len(series) < 4:
        return []
    blocks = _blocks(frames, th)
    nblk = len(blocks)
    b = max(1, th.block_minutes)
    names = list(series)
    counts = np.zeros((len(names), nblk))
    p99 = np.full((len(names), nblk), np.nan)
    for i, key in enumerate(names):
        mat = _pair_block_matrix(frames, key, blocks, th)
        counts[i] = mat.sum(axis=1)
        used = np.flatnonzero(mat.any(axis=0))  # (the bins the pair's calls fall in: the same quantiles)
        if len(used):
            p99[i] = _coarse_quantile(mat[:, used[0]:used[-1] + 1], 0.99, int(used[0]))
    hot = _hot_cells(counts, p99, th.min_samples)
    columns = [(key, series[key]["minute"].to_numpy(), series[key]["count"].to_numpy()) for key in names] \
        if hot.any() else []
    out = []
    for i, (caller, callee) in enumerate(names):
        for a, e in _runs(hot[i]):
            s_min, e_min = int(blocks[a]), int(blocks[e - 1]) + b
            if not _reportable(frames, s_min, e_min):
                continue
            _, m, _ = columns[i]
            h = _pair_rows_histogram(frames, series[(caller, callee)], (m >= s_min) & (m < e_min))
            all_p99 = []  # the other pairs' P99 over the same blocks (each pair's rows: no frame-wide mask)
            for key, m, count in columns:
                sel = (m >= s_min) & (m < e_min)
                if key != (caller, callee) and sel.any() and count[sel].sum() >= th.min_samples:
                    all_p99.append(_pair_rows_histogram(frames, series[key], sel).quantile(0.99))
            s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
            out.append(finding("hot_spot", "warning", Subject(caller=caller, callee=callee), s_ns, e_ns, {
                "p99_ms": _ms(h.quantile(0.99)), "p50_ms": _ms(h.quantile(0.5)),
                "calls": int(h.count), "calls_per_min": round(h.count / max(1, e_min - s_min), 2),
                "median_pair_p99_ms": _ms(float(np.median(all_p99))) if all_p99 else None,
                "pairs": len(names), "sample_count": int(h.count),
            }, HINTS["hot_spot"]))
    return out
