"""The span rows a settling pass reads: their layout, as the loader's SQL hands them in, and
the factorizing of their columns that settling does."""

from __future__ import annotations

from typing import Iterable, Sized

import numpy as np

from ..durations import MINUTE_NS as NS_PER_MINUTE  # noqa: F401  (the rows' minute)

# Row layout handed in by the loader. BATCH and GRAPH are ``batch.size`` and
# ``gpu.cuda_graph`` as the database extracts them (``settle_conventions.convention_columns``
# says what they hold), so spans that carry only those never have their attributes parsed
# in Python.
# RESOURCE is the resource JSON of cache lookups (spans mentioning ``"cache.name"``), ''
# for the others. ROW (optional) is the span's ``spans.id``, for the ``pair_calls`` rows;
# LAYER (optional) its ``mm.layer`` when that is a string (the ``layer`` series).
# SIGNALS (optional) is ``spans.signals`` (JSON text or None), LINKS (optional) the links
# JSON of CONSUMER spans (None for the others: only hand-offs read them).
TID, SID, PARENT, SERVICE, NAME, KIND, STAGE, START, DUR, STATUS, ATTRS, INSTANCE, BATCH, GRAPH, RESOURCE, ROW, \
    LAYER, SIGNALS, LINKS = range(19)


# Settling does without pandas: importing it costs a settler process memory for good,
# and a dict does its factorizing of a batch's columns as fast.
def factorize(values: Iterable, count: int | None = None) -> tuple[np.ndarray, list]:
    """Codes (int64) of ``values`` (hashable; None is a value like any other) and their
    distinct values, in order of first appearance: ``pd.factorize(values,
    use_na_sentinel=False)``."""
    seen: dict = {}
    n = count if count is not None else len(values) if isinstance(values, Sized) else -1
    codes = np.fromiter((seen.setdefault(v, len(seen)) for v in values), dtype=np.int64, count=n)
    return codes, list(seen)


def factorize_ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``factorize`` of an integer array, vectorized: codes and distinct values in order of
    first appearance."""
    uniq, first, inv = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank[inv.reshape(-1)], uniq[order]


def first_of_each(keys: np.ndarray) -> np.ndarray:
    """A mask of the first occurrence of each distinct value in ``keys``."""
    out = np.zeros(len(keys), dtype=bool)
    if len(keys):
        out[np.unique(keys, return_index=True)[1]] = True
    return out
