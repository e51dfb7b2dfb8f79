"""Sparse latency sketches in bulk, and blocks of minutes: (minutes or blocks) x coarse
latency-bin matrices and their quantiles, per-row quantiles and counts of a frame's sketch
columns, and the runs of flagged blocks the detectors turn into findings."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...models import sketch
from .frames import Frames, Thresholds


# -- (minutes or blocks) x coarse latency bins ---------------------------------------------
COARSE = 16  # sketch keys per coarse bin (~17 % wide): enough to see a P99 double


def _coarse_matrix(df: pd.DataFrame, first_minute: int, n_minutes: int, flat=None) -> np.ndarray:
    """Minutes x coarse latency bins of the sparse sketches in ``df`` (rows of one series)."""
    return _coarse_rows(df, df["minute"].to_numpy(dtype=np.int64) - first_minute, n_minutes, flat)


def _coarse_rows(df: pd.DataFrame, rows: np.ndarray, n_rows: int, flat=None) -> np.ndarray:
    """Rows x coarse latency bins (int32) of the sparse sketches in ``df``: each of its rows
    added to row ``rows[i]`` (those outside ``[0, n_rows)`` dropped). One concatenate and one
    indexed add over all entries: a conversion per row was most of the hot-spot detector's
    time over a day of minutes. ``flat``: ``df``'s ``_flat_sketches`` when the caller has them."""
    nb = sketch.NUM_KEYS // COARSE
    if df.empty or not n_rows:
        return np.zeros((n_rows, nb), dtype=np.int32)
    lens, keys, counts = flat if flat is not None else _flat_sketches(df["keys"], df["counts"])
    if not len(keys):
        return np.zeros((n_rows, nb), dtype=np.int32)
    rows = np.asarray(rows, dtype=np.int64)
    inside = (rows >= 0) & (rows < n_rows)
    # Cells as row * bins + key // COARSE, computed per sketch row before the repeat (one
    # multiply a row, not an entry), the keys added in place (no second array of entries);
    # int32 where the matrix allows (a day of pairs is 3.8 million cells): half the fresh
    # memory, whose first touch (page faults) is much of the cost.
    cell_type = np.int32 if n_rows * nb < 2**31 else np.int64
    cells = np.repeat((np.where(inside, rows, -1) * nb).astype(cell_type), lens)
    cells += (keys // COARSE).astype(cell_type, copy=False)
    if not inside.all():  # (rows outside [0, n_rows) dropped)
        ok = np.repeat(inside, lens)
        cells, counts = cells[ok], counts[ok]
    # Integer counts added in place (ufunc.at's indexed fast path, numpy >= 1.25): a weighted
    # bincount copies every count to float64 and fills a float matrix to cast back, slower on
    # fresh memory. int32: a cell is one pair's calls in one minute or block and one ~17 %
    # latency bin.
    out = np.zeros(n_rows * nb, dtype=np.int32)
    # (no casting, and numpy's own int32 descriptor: an equal one from elsewhere, unpickled
    # arrays' say, takes ufunc.at's far slower path)
    np.add.at(out, cells, counts.astype(np.int32, copy=False).view(np.int32))
    return out.reshape(n_rows, nb)


def _flat_sketches(keys_col, counts_col) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lengths, keys, counts)`` of sparse sketch columns (a frame's ``keys``/``counts``):
    each row's length and all rows' entries concatenated once, in row order."""
    # (map and a plain list: a generator and np.asarray a row cost twice as much)
    lens = np.fromiter(map(len, keys_col), dtype=np.int64, count=len(keys_col))
    if not lens.sum():
        return lens, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
    return lens, np.concatenate(list(keys_col)), np.concatenate(list(counts_col))


def _coarse_value(bin_index: np.ndarray) -> np.ndarray:
    """Representative ns of coarse bins (the middle key's)."""
    return sketch.representative(np.clip(bin_index * COARSE + COARSE // 2, 0, sketch.NUM_KEYS - 1))


def _coarse_quantile(mat: np.ndarray, q: float, first_bin: int = 0) -> np.ndarray:
    """Per row of a (n, bins) count matrix, the ``q`` quantile (ns; nan for empty rows);
    ``first_bin``: the coarse bin of the matrix's first column (a slice of the used bins)."""
    return _cumulative_quantile(np.cumsum(mat, axis=1), q, first_bin)


def _cumulative_quantile(c: np.ndarray, q: float, first_bin: int = 0) -> np.ndarray:
    """``_coarse_quantile`` of the matrix whose rows' running sums over the bins are ``c``."""
    tot = c[:, -1]
    target = np.floor(q * np.maximum(tot - 1, 0))
    idx = np.argmax(c > target[:, None], axis=1) + first_bin
    out = _coarse_value(idx).astype(float)
    out[tot <= 0] = np.nan
    return out


def _coarse_bin_of(value_ns: float) -> int:
    return sketch.key_of(value_ns) // COARSE


# -- runs of flagged minutes and blocks ----------------------------------------------------
def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) index runs where ``flags`` is true."""
    out = []
    i, n = 0, len(flags)
    while i < n:
        if flags[i]:
            j = i
            while j < n and flags[j]:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def _blocks(frames: Frames, th: Thresholds) -> np.ndarray:
    """Start minutes of the blocks covering the data (aligned to multiples of the block)."""
    b = max(1, th.block_minutes)
    first = frames.first_minute // b * b
    return np.arange(first, frames.end_minute, b, dtype=np.int64)


def _block_of(minutes: np.ndarray, th: Thresholds) -> np.ndarray:
    b = max(1, th.block_minutes)
    return np.asarray(minutes, dtype=np.int64) // b * b


def _flagged_runs(blocks, flags, block_minutes: int):
    """Runs of consecutive flagged blocks: (first index, last index, start minute, end minute)."""
    k = 0
    while k < len(blocks):
        if not flags[k]:
            k += 1
            continue
        j = k
        while j + 1 < len(blocks) and flags[j + 1] and blocks[j + 1] == blocks[j] + block_minutes:
            j += 1
        yield k, j, int(blocks[k]), int(blocks[j]) + block_minutes
        k = j + 1


# -- each row's quantile or count of a frame's sketch columns ------------------------------
#: Rows x sketch keys counted at once by ``_row_quantiles`` (8 bytes a cell).
ROW_QUANTILE_CELLS = 1 << 20


def _row_quantiles(row_of: np.ndarray, keys_col, counts_col, n_rows: int, q: float) -> np.ndarray:
    """The ``q`` quantile (ns, nan when empty) of each of ``n_rows`` histograms, row
    ``row_of[i]`` merging the sparse sketch ``keys_col[i]``/``counts_col[i]``: what
    ``histogram_of(...).quantile(q)`` gives each row's sketches (numpy's linear definition
    over representative values), some rows at a time instead of a histogram a row."""
    out = np.full(n_rows, np.nan)
    lens, keys, counts = _flat_sketches(keys_col, counts_col)
    if not n_rows or not len(keys):
        return out
    entry_row = np.repeat(np.asarray(row_of, dtype=np.int64), lens)
    # Only the keys the entries use (a day of encoder spreads spans ~800 of the 4,096): the
    # same cumulative counts over a fifth of the columns, and no sort when every row fits
    # in one pass.
    k_lo = int(keys.min())
    width = int(keys.max()) - k_lo + 1
    step = max(1, ROW_QUANTILE_CELLS // width)
    if n_rows > step:
        order = np.argsort(entry_row, kind="stable")
        entry_row, keys, counts = entry_row[order], keys[order], counts[order]
    for lo in range(0, n_rows, step):
        a, b = np.searchsorted(entry_row, [lo, lo + step]) if n_rows > step else (0, len(keys))
        m = min(step, n_rows - lo)
        dense = np.zeros(m * width, dtype=np.int64)
        # (counts as the matrix's dtype: ufunc.at's fast path, far faster, takes no casting)
        np.add.at(dense, (entry_row[a:b] - lo) * width + (keys[a:b] - k_lo), counts[a:b].astype(np.int64))
        cum = np.cumsum(dense.reshape(m, width), axis=1)
        n = cum[:, -1]
        h = min(max(q, 0.0), 1.0) * (n - 1)
        first = np.floor(h)
        second = np.minimum(first + 1, n - 1)
        v_lo = sketch.representative(np.argmax(cum > first[:, None], axis=1) + k_lo)
        v_hi = sketch.representative(np.argmax(cum > second[:, None], axis=1) + k_lo)
        out[lo:lo + m] = np.where(n > 0, v_lo + (h - first) * (v_hi - v_lo), np.nan)
    return out


def _counts_above(keys_col, counts_col, key: int) -> np.ndarray:
    """Per row of sparse sketches (a frame's ``keys``/``counts`` columns), its count in keys
    past ``key``: one concatenate and one bincount, not a mask per row."""
    n = len(keys_col)
    lens, keys, counts = _flat_sketches(keys_col, counts_col)
    if not len(keys):
        return np.zeros(n, dtype=np.int64)
    past = keys > key
    rows = np.repeat(np.arange(n), lens)[past]
    return np.rint(np.bincount(rows, weights=counts[past].astype(np.float64), minlength=n)).astype(np.int64)
