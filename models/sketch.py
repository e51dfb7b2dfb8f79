"""Log-bucketed latency histograms (DDSketch-style) with a relative-error guarantee.

A value v (nanoseconds, an integer >= 0) falls into bucket key ``ceil(log_gamma(v)) + 1``
(key 0 holds exact zeros), where ``gamma = (1 + ALPHA) / (1 - ALPHA)``. Reporting a
bucket by ``2 * gamma**(k-1) / (gamma + 1)`` is within ``ALPHA`` relative error of every
value in it, so any quantile read from merged buckets is within ``ALPHA`` of the exact
order statistic, and (being a convex combination of two such values) within ``ALPHA`` of
numpy's default linearly-interpolated percentile too.

Keys are small (about 3,500 covers 1 ns .. 11 days), so a merged histogram is a dense
vector of ``NUM_KEYS`` counts: merging is ``np.add.at``, percentiles a ``cumsum``. Stored
histograms are sparse little-endian int32 (key, count) pairs.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

ALPHA = 0.005  # relative accuracy: 0.5%, half the 1% the design allows
GAMMA = (1 + ALPHA) / (1 - ALPHA)
LN_GAMMA = math.log(GAMMA)
NUM_KEYS = 4096  # key 4095 ~ 1.3e17 ns; larger values clamp there
_REPR = np.concatenate(
    [[0.0], 2.0 * np.power(GAMMA, np.arange(NUM_KEYS - 1, dtype=np.float64)) / (GAMMA + 1.0)]
)
# Upper edge of each bucket (inclusive), for drawing histograms on a log axis.
_UPPER = np.concatenate([[0.0], np.power(GAMMA, np.arange(NUM_KEYS - 1, dtype=np.float64))])


def key_of(value_ns: float) -> int:
    """Bucket key of one value (scalar fast path for the writer)."""
    if value_ns <= 0:
        return 0
    k = math.ceil(math.log(value_ns) / LN_GAMMA) + 1
    return k if k < NUM_KEYS else NUM_KEYS - 1


def keys_of(values_ns: np.ndarray) -> np.ndarray:
    """Vectorised ``key_of``."""
    v = np.asarray(values_ns, dtype=np.float64)
    keys = np.zeros(v.shape, dtype=np.int64)
    pos = v > 0
    keys[pos] = np.ceil(np.log(v[pos]) / LN_GAMMA).astype(np.int64) + 1
    np.clip(keys, 0, NUM_KEYS - 1, out=keys)
    return keys


def representative(key: int | np.ndarray) -> float | np.ndarray:
    """Value reported for a bucket key, in nanoseconds."""
    return _REPR[key]


def bucket_upper(key: int | np.ndarray) -> float | np.ndarray:
    return _UPPER[key]


def encode(keys: np.ndarray, counts: np.ndarray) -> bytes:
    """Sparse (key, count) pairs as bytes; zero counts are dropped."""
    keys = np.asarray(keys)
    counts = np.asarray(counts)
    keep = counts != 0
    pairs = np.empty((int(keep.sum()), 2), dtype="<i4")
    pairs[:, 0] = keys[keep]
    pairs[:, 1] = counts[keep]
    return pairs.tobytes()


def decode(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    pairs = np.frombuffer(blob, dtype="<i4").reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def encode_dense(dense: np.ndarray) -> bytes:
    nz = np.flatnonzero(dense)
    return encode(nz, dense[nz])


class Histogram:
    """A merged, dense histogram: counts per bucket key."""

    __slots__ = ("counts",)

    def __init__(self, counts: np.ndarray | None = None) -> None:
        self.counts = np.zeros(NUM_KEYS, dtype=np.int64) if counts is None else counts

    # -- building -------------------------------------------------------------------
    @classmethod
    def from_values(cls, values_ns: Iterable[float]) -> "Histogram":
        h = cls()
        h.add_values(np.fromiter(values_ns, dtype=np.float64) if not isinstance(values_ns, np.ndarray) else values_ns)
        return h

    @classmethod
    def from_blobs(cls, blobs: Iterable[bytes]) -> "Histogram":
        h = cls()
        for blob in blobs:
            h.add_blob(blob)
        return h

    def add_values(self, values_ns: np.ndarray) -> None:
        if len(values_ns):
            self.counts += np.bincount(keys_of(values_ns), minlength=NUM_KEYS)

    def add_blob(self, blob: bytes, sign: int = 1) -> None:
        if blob:
            keys, counts = decode(blob)
            np.add.at(self.counts, keys, counts.astype(np.int64) * sign)

    def merge(self, other: "Histogram") -> None:
        self.counts += other.counts

    def to_blob(self) -> bytes:
        return encode_dense(self.counts)

    # -- reading --------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def quantiles(self, qs: Sequence[float]) -> list[float | None]:
        """Quantiles in nanoseconds, numpy's linear definition; None when empty."""
        n = int(self.counts.sum())
        if n <= 0:
            return [None for _ in qs]
        cum = np.cumsum(self.counts)
        out: list[float | None] = []
        for q in qs:
            h = min(max(q, 0.0), 1.0) * (n - 1)
            lo = math.floor(h)
            hi = min(lo + 1, n - 1)
            # The bucket holding order statistic i is the first whose cumulative count > i.
            k_lo = int(np.searchsorted(cum, lo, side="right"))
            k_hi = int(np.searchsorted(cum, hi, side="right"))
            v_lo = float(_REPR[k_lo])
            v_hi = float(_REPR[k_hi])
            out.append(v_lo + (h - lo) * (v_hi - v_lo))
        return out

    def quantile(self, q: float) -> float | None:
        return self.quantiles([q])[0]

    def rank_of(self, value_ns: float) -> float | None:
        """Share of values at or below ``value_ns`` (0..1), for "P97 for vit.forward"."""
        n = int(self.counts.sum())
        if n <= 0:
            return None
        return float(self.counts[: key_of(value_ns) + 1].sum()) / n

    def nonzero(self) -> tuple[np.ndarray, np.ndarray]:
        """(representative ns, count) of every non-empty bucket, ascending."""
        keys = np.flatnonzero(self.counts)
        return _REPR[keys], self.counts[keys]


def merge_blobs(blobs: list[bytes]) -> Histogram:
    """One histogram from many stored ones, in a single vectorised pass.

    Equivalent to ``add_blob`` on each, but with one ``bincount`` instead of one
    ``np.add.at`` a blob: merging a day of minute rows is dominated by per-row overhead.
    """
    if not blobs:
        return Histogram()
    pairs = np.frombuffer(b"".join(blobs), dtype="<i4").reshape(-1, 2)
    counts = np.bincount(pairs[:, 0], weights=pairs[:, 1], minlength=NUM_KEYS)
    return Histogram(np.rint(counts).astype(np.int64))
