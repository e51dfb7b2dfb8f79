"""Each caller -> callee pair's rows of ``frames.pairs``, cut once and shared by the two pair
detectors (``hot_spot``, ``band_break``): the pairs' groups, flat sketches, merged
histograms, and (minutes or blocks) x coarse latency-bin matrices. Each result is kept on the
``Frames`` (``Frames.derived``) for the frame it was computed from."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...models import sketch
from .frames import Frames, Thresholds, histogram_of
from .sketches import COARSE, _block_of, _coarse_matrix, _coarse_rows, _flat_sketches


def _pair_groups(frames: Frames) -> tuple[dict, dict]:
    """``(series, positions)``: each pair's rows of ``frames.pairs`` as a frame, and their
    row positions; from one group-by a frame, shared by the pair detectors."""
    df = frames.pairs
    if df.empty:
        return {}, {}
    return frames.derived("pair_groups", df, lambda: _group_pairs(df))


def _group_pairs(df: pd.DataFrame) -> tuple[dict, dict]:
    # Each pair's rows from its runs of consecutive equal (caller, callee) rows: the reader's
    # frame holds a series' minutes as one run (a pair has 3-4 series), so this is a few
    # dozen runs; a group-by spent most of its time hashing every row's two string columns.
    # The same groups as ``groupby(["caller", "callee"], sort=True)``: keys in sorted order,
    # each pair's positions ascending, rows without a caller or callee left out.
    callers, callees = df["caller"].to_numpy(dtype=object), df["callee"].to_numpy(dtype=object)
    cuts = np.flatnonzero((callers[1:] != callers[:-1]) | (callees[1:] != callees[:-1])) + 1
    runs: dict[tuple, list[tuple[int, int]]] = {}
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(df)].tolist()):
        runs.setdefault((callers[a], callees[a]), []).append((a, b))
    indices = {key: np.concatenate([np.arange(a, b) for a, b in spans])
               for key, spans in sorted((k, v) for k, v in runs.items() if not (pd.isna(k[0]) or pd.isna(k[1])))}
    return {key: df.iloc[pos] for key, pos in indices.items()}, indices


def _pair_series(frames: Frames) -> dict[tuple[str, str], pd.DataFrame]:
    return _pair_groups(frames)[0]


def _pair_rows_histogram(frames: Frames, df: pd.DataFrame, sel: np.ndarray) -> sketch.Histogram:
    """The merged sketches of the rows ``sel`` (a mask) of ``df``, one pair's rows of
    ``frames.pairs``: from its ``keys``/``counts`` columns, or when it has none from
    ``frames.pair_sketches``, by the rows' positions."""
    if "keys" in df.columns:
        return histogram_of(df["keys"].to_numpy()[sel], df["counts"].to_numpy()[sel])
    lens, keys, counts = frames.pair_sketches
    starts = frames.derived("pair_sketch_starts", lens, lambda: np.cumsum(lens) - lens)
    rows = df.index.to_numpy()[sel]
    own = lens[rows]
    take = np.repeat(starts[rows] - (np.cumsum(own) - own), own) + np.arange(int(own.sum()))
    h = sketch.Histogram()
    np.add.at(h.counts, keys[take], counts[take].astype(np.int64))
    return h


def _pair_flats(frames: Frames) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each pair's ``_flat_sketches`` (row lengths, keys, counts), all cut from the whole
    frame's entries (``frames.pair_sketches``, or one concatenation of its rows) and shared
    by the hot-spot and band-break detectors: concatenating each pair's rows again in each
    detector cost them much of their time (all of a day's pair entries copied once more)."""
    return frames.derived("pair_flats", frames.pairs, lambda: _cut_pair_flats(frames))


def _cut_pair_flats(frames: Frames) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    df = frames.pairs
    out = {}
    if not df.empty:
        flat = frames.pair_sketches
        if flat is None or len(flat[0]) != len(df):
            flat = _flat_sketches(df["keys"], df["counts"])
        lens, keys, counts = flat
        starts = np.cumsum(lens) - lens
        for key, pos in _pair_groups(frames)[1].items():
            own = lens[pos]
            if pos[-1] - pos[0] + 1 == len(pos):
                # (consecutive rows, as the reader gives one series: their entries are a slice)
                a = int(starts[pos[0]])
                out[key] = (own, keys[a:a + int(own.sum())], counts[a:a + int(own.sum())])
                continue
            breaks = np.flatnonzero(np.diff(pos) != 1) + 1
            if len(breaks) < len(pos) // 8:
                # (a few runs of consecutive rows, one a series of the pair: each run's entries
                # copied as a slice, far cheaper than picking them one by one)
                firsts, lasts = np.concatenate([[0], breaks]), np.concatenate([breaks, [len(pos)]]) - 1
                cuts = list(zip(starts[pos[firsts]].tolist(), (starts[pos[lasts]] + lens[pos[lasts]]).tolist()))
                out[key] = (own, np.concatenate([keys[a:b] for a, b in cuts]),
                            np.concatenate([counts[a:b] for a, b in cuts]))
                continue
            # each row's entries: its start in the frame's arrays, then consecutive
            take = np.repeat(starts[pos] - (np.cumsum(own) - own), own) + np.arange(int(own.sum()))
            out[key] = (own, keys[take], counts[take])
    return out


#: Bytes of per-pair minute matrices both pair detectors share (``_pair_minute_matrices``): a
#: day of ten pairs is ~15 MB; past it (a week of minutes, many pairs) each detector builds one
#: pair's at a time.
SHARED_MATRICES_BYTES = 24 * 2**20


def _pair_minute_matrices(frames: Frames) -> dict[tuple[str, str], np.ndarray] | None:
    """Every pair's ``_pair_minute_matrix``, built once for the hot-spot and band-break
    detectors (each spent much of its time building them from a day's sketch entries), or
    None when they would exceed ``SHARED_MATRICES_BYTES`` or the
    frame holds minutes outside the data's (hand-made frames)."""
    return frames.derived("pair_minute_matrices", frames.pairs, lambda: _stack_pair_matrices(frames))


def _stack_pair_matrices(frames: Frames) -> dict[tuple[str, str], np.ndarray] | None:
    df = frames.pairs
    out = None
    n = frames.end_minute - frames.first_minute
    series = _pair_series(frames)
    if series and n > 0 and len(series) * n * (sketch.NUM_KEYS // COARSE) * 4 <= SHARED_MATRICES_BYTES:
        minutes = df["minute"].to_numpy()
        if minutes.min() >= frames.first_minute and minutes.max() < frames.end_minute:
            # All pairs' matrices stacked, from the whole frame's entries in one pass: each
            # row goes to its pair's block of minutes (rows of no pair nowhere). Cutting each
            # pair's entries out first (``_pair_flats``) copied all of a day's entries again.
            flat = frames.pair_sketches
            if flat is None or len(flat[0]) != len(df):
                flat = _flat_sketches(df["keys"], df["counts"])
            pair_of_row = np.full(len(df), -n, dtype=np.int64)  # (below row 0 with any minute)
            for i, pos in enumerate(_pair_groups(frames)[1].values()):
                pair_of_row[pos] = i * n
            stacked = _coarse_rows(df, pair_of_row + (minutes - frames.first_minute), len(series) * n, flat)
            out = {key: stacked[i * n:(i + 1) * n] for i, key in enumerate(series)}
    return out


def _pair_block_matrix(frames: Frames, key: tuple[str, str], blocks: np.ndarray, th: Thresholds) -> np.ndarray:
    """Blocks (``blocks``, from ``_blocks``) x coarse bins of one pair: its shared minute
    matrix summed a block at a time, or built from its rows."""
    b, nblk = max(1, th.block_minutes), len(blocks)
    minute_mats = _pair_minute_matrices(frames)
    if minute_mats is None:
        df = _pair_series(frames)[key]
        return _coarse_rows(df, (_block_of(df["minute"].to_numpy(), th) - blocks[0]) // b, nblk,
                            _pair_flats(frames)[key])
    # The minute matrix placed in whole blocks (its first minute that far into the first).
    minute_mat = minute_mats[key]
    lead = frames.first_minute - int(blocks[0])
    padded = np.zeros((nblk * b, minute_mat.shape[1]), dtype=np.int32)
    padded[lead:lead + len(minute_mat)] = minute_mat
    return padded.reshape(nblk, b, -1).sum(axis=1, dtype=np.int32)


def _pair_minute_matrix(frames: Frames, df: pd.DataFrame, flat=None) -> np.ndarray:
    """Minutes (from ``frames.first_minute``) x coarse bins of one pair (``df``: its rows;
    ``flat``: their ``_flat_sketches``). Built per pair and dropped after it: a week of
    minutes is ~10 MB a pair, and keeping every pair's (a shared cache) held too much of a
    worker's memory."""
    return _coarse_matrix(df, frames.first_minute, frames.end_minute - frames.first_minute, flat)
