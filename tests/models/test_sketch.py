"""Percentiles from merged rollup histograms are within 1% of numpy's exact percentiles."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modalscope.models.sketch import ALPHA, Histogram, decode, encode_dense

QS = [0.0, 0.01, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0]


def _check(values: np.ndarray, parts: int = 1) -> None:
    # Build per-"minute" histograms, store them as blobs, merge them back: the real path.
    chunks = np.array_split(values, parts)
    blobs = [encode_dense(Histogram.from_values(c).counts) for c in chunks]
    merged = Histogram.from_blobs(blobs)
    assert merged.count == len(values)
    est = merged.quantiles(QS)
    exact = np.percentile(values, [q * 100 for q in QS])
    for q, e, x in zip(QS, est, exact):
        if x == 0:
            assert e == 0
        else:
            assert abs(e - x) / x <= 0.01, (q, e, x)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 3000),
    dist=st.sampled_from(["lognormal", "pareto", "mixture", "constant", "tiny"]),
    parts=st.integers(1, 12),
)
def test_quantiles_within_one_percent_of_numpy(seed, n, dist, parts):
    rng = np.random.default_rng(seed)
    if dist == "lognormal":
        v = rng.lognormal(mean=18, sigma=1.5, size=n)
    elif dist == "pareto":  # heavy tail: a few values thousands of times the median
        v = (rng.pareto(1.1, size=n) + 1) * 1e6
    elif dist == "mixture":  # a fast mode and a slow timeout mode
        v = np.where(rng.random(n) < 0.97, rng.lognormal(19, 0.3, n), rng.uniform(29e9, 30e9, n))
    elif dist == "constant":
        v = np.full(n, 123_456_789.0)
    else:
        v = rng.integers(0, 50, size=n).astype(float)  # ns-scale values, zeros included
    _check(np.round(v).astype(np.int64), parts)


@given(st.lists(st.integers(0, 10**13), min_size=1, max_size=400))
@settings(max_examples=150, deadline=None)
def test_arbitrary_integer_samples(values):
    _check(np.array(values, dtype=np.int64))


def test_blob_round_trip_and_subtraction():
    h = Histogram.from_values(np.array([1, 10, 10, 1000, 5_000_000]))
    keys, counts = decode(h.to_blob())
    assert counts.sum() == 5 and len(keys) == 4
    h.add_blob(Histogram.from_values(np.array([10])).to_blob(), sign=-1)
    assert h.count == 4


def test_rank_of():
    h = Histogram.from_values(np.arange(1, 101) * 1_000_000)
    assert h.rank_of(50_000_000) == pytest.approx(0.5, abs=0.011)
    assert h.rank_of(1e12) == 1.0
    assert Histogram().rank_of(5) is None
    assert ALPHA < 0.01


@given(st.lists(st.lists(st.integers(0, 10**12), min_size=0, max_size=50), min_size=0, max_size=40))
@settings(max_examples=60, deadline=None)
def test_merge_blobs_equals_adding_one_by_one(parts):
    from modalscope.models.sketch import merge_blobs

    blobs = [Histogram.from_values(np.array(p, dtype=np.int64)).to_blob() for p in parts]
    assert (merge_blobs(blobs).counts == Histogram.from_blobs(blobs).counts).all()
