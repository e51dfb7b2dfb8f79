"""Latency display bins made of whole sketch buckets: the columns of the pair heatmap and
the bars of a drilldown's histogram."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ...models import sketch

BINS_PER_DECADE = 10


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
