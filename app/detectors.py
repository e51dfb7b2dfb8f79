"""The anomaly catalog (docs/design.md): one pure, documented function per kind.

Every detector takes :class:`Frames` (pandas frames read from the store by
``app/findings.py``, or built by hand in tests) and :class:`Thresholds`, and returns a list
of finding dicts shaped as ``/api/v1/anomalies`` answers them::

    {"kind", "severity", "subject", "start", "end", "evidence", "exemplar_trace_ids", "hint"}

Nothing here reads the database or the clock. Detectors know no service or span names:
they use stages, span kinds, the trace's input type and the conventions of docs/design.md
(``cache.name``/``cache.hit``, ``gpu.cuda_graph``, ``batch.size``,
``service.instance.id``). They are deliberately not trigger-happy:

* a block, series or group with fewer than ``min_samples`` samples fires nothing;
* a rate or share must hold over a whole block (``block_minutes``), so one outlier does
  not fire; the band break needs ``band_min_outliers`` calls past its threshold;
* nothing compares raw volume across time, so the daily curve is not an anomaly (load
  enters only as "high", relative to the median block);
* the band break compares against a trailing baseline of ``baseline_minutes`` (at least
  30) holding at least 30 minutes of the pair's own calls, frozen while the break lasts;
  it ends when the P99 stays under a lower exit threshold for two blocks.

Frames (one row each; ``minute`` is unix minutes; ``keys``/``counts`` a rollup's sparse
sketch, see ``models/sketch.py``):

* ``pairs``: caller, callee, minute, count, errors, keys, counts (``pair`` rollups)
* ``traces``: input_type, minute, count, errors, sum_ns, keys, counts (``trace`` rollups)
* ``tstage``: input_type, stage, minute, count, sum_ns (``tstage`` rollups)
* ``long_traces``: trace_id, root_service, input_type, start_ns, duration_ns, error
* ``cache``: service, cache, key, value, minute, count, misses (``cache`` rollups: lookups
  per tag value)
* ``batch``: service, minute, count, ones, sum (``batch`` rollups: spans with a numeric
  ``batch.size``, those of size 1, the sizes' sum)
* ``cuda``: service, name, fallback, minute, count, keys, counts (``cuda`` rollups)
* ``sync``: service, minute, count, keys, counts (``sync`` rollups: encoder spread a trace)
* ``spans``: trace_id, service, name, kind, stage, start_ns, duration_ns, status,
  instance, attrs (dict). Read from the store only around new instances (``cold_start``);
  hand-made frames may carry every span instead of the convention frames, which are then
  computed from them exactly as the settler does (``ingest/settle_fast.py``), and the
  detectors take exemplars and exact medians from them. From rollups alone, the
  attribute findings get their exemplars later (``describe_from_spans``, a bounded read).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from ..ingest.settle_fast import cache_hit_value
from ..models import sketch
from ..settings import DetectorThresholds, SettingsError, declared, read_settings

from ..durations import MINUTE_NS as NS_MIN
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
MAX_EXEMPLARS = 5
KIND_SERVER_CODES = (2, 5)  # SERVER, CONSUMER
STATUS_ERROR_CODE = 2

# The reference latency table (P50, P95 in ms per input type) lives with the overview's queries.
from .queries import SEED_BASELINE  # noqa: E402


# -- thresholds: every one a documented setting ------------------------------------------
@dataclass(frozen=True)
class Thresholds(DetectorThresholds):
    """Detector thresholds: each field is one setting, declared (variable, default, meaning)
    in ``modalscope/settings.py``."""

    @classmethod
    def kept_in(cls, store: dict) -> "Thresholds":
        """The thresholds from the environment, read once and kept in ``store`` (an app's
        ``extensions["modalscope"]``: the API, the pages and the embeds share them)."""
        if "thresholds" not in store:
            store["thresholds"] = cls.from_env()
        return store["thresholds"]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Thresholds":
        th = read_settings(cls, env)
        try:
            th.baseline_table()
        except ValueError as exc:
            raise SettingsError(f"MODALSCOPE_DETECT_BASELINE: {exc}") from None
        return th

    def baseline_table(self) -> dict[str, tuple[float, float]]:
        from .queries import parse_baseline

        return parse_baseline(self.baseline) if self.baseline else dict(SEED_BASELINE)


#: The environment variable of each threshold.
SETTINGS = {name: d.env for name, d in declared(Thresholds)}


# -- frames --------------------------------------------------------------------------------
PAIR_COLUMNS = ("caller", "callee", "minute", "count", "errors", "keys", "counts")
TRACE_COLUMNS = ("input_type", "minute", "count", "errors", "sum_ns", "keys", "counts")
TSTAGE_COLUMNS = ("input_type", "stage", "minute", "count", "sum_ns")
SPAN_COLUMNS = ("trace_id", "service", "name", "kind", "stage", "start_ns", "duration_ns", "status", "instance",
                "attrs")
LONG_TRACE_COLUMNS = ("trace_id", "root_service", "input_type", "start_ns", "duration_ns", "error")


def empty_frame(columns) -> pd.DataFrame:
    """A frame of no rows with these (object) columns: a copy of one built once (building
    one took 0.5 ms, and every ``Frames`` starts with five: 2.5 ms an exemplar look-up)."""
    return _empty_frame(tuple(columns)).copy()


@functools.lru_cache(maxsize=64)
def _empty_frame(columns: tuple) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


@dataclass
class Frames:
    """What the detectors read. ``start_ns``/``end_ns``: the window findings are reported
    for; ``data_start_ns``: where the data begins (a trailing look-back before ``start_ns``
    serves as baseline only). ``sampled``: raw spans cover only part of the window."""

    start_ns: int
    end_ns: int
    data_start_ns: int
    pairs: pd.DataFrame = field(default_factory=lambda: empty_frame(PAIR_COLUMNS))
    traces: pd.DataFrame = field(default_factory=lambda: empty_frame(TRACE_COLUMNS))
    tstage: pd.DataFrame = field(default_factory=lambda: empty_frame(TSTAGE_COLUMNS))
    spans: pd.DataFrame = field(default_factory=lambda: empty_frame(SPAN_COLUMNS))
    long_traces: pd.DataFrame = field(default_factory=lambda: empty_frame(LONG_TRACE_COLUMNS))
    sampled: bool = False
    spans_start_ns: int | None = None  # where raw spans begin (default: data_start_ns)
    # Convention rollups (``cache``/``batch``/``cuda``/``sync`` series, see CACHE_COLUMNS
    # etc.); None: computed from ``spans`` (hand-made frames carry raw spans only).
    cache: pd.DataFrame | None = None
    batch: pd.DataFrame | None = None
    cuda: pd.DataFrame | None = None
    sync: pd.DataFrame | None = None
    # (service, instance) pairs the ``inst`` rollups show as new; None: every instance
    # first seen after the raw spans begin. With it, ``spans`` may hold only the spans
    # around those births.
    new_instances: set | None = None
    # ``cold_start`` findings an earlier evaluation made from the same, unchanged raw spans
    # around births it checked (``findings._new_instances``): reported as found, when they
    # fall in this window, instead of reading those spans again.
    cold_starts_known: list | None = None
    # ``(lengths, keys, counts)`` of ``pairs``' sketches, every row's entries in row order,
    # as the reader decoded them (``findings._columns_frame``); None: concatenated from the
    # frame's ``keys``/``counts`` when needed. With it, ``pairs`` may leave out its ``keys``
    # and ``counts`` columns (a view a row: ~100,000 of them a day, built for a few findings);
    # its rows are then found by position (a default index).
    pair_sketches: tuple | None = None

    @property
    def first_minute(self) -> int:
        return -(-self.data_start_ns // NS_MIN)

    @property
    def end_minute(self) -> int:  # exclusive
        return -(-self.end_ns // NS_MIN)

    @property
    def report_minute(self) -> int:
        return -(-self.start_ns // NS_MIN)


# -- small helpers -------------------------------------------------------------------------
def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def finding(kind: str, severity: str, subject: dict, start_ns: int, end_ns: int, evidence: dict,
            hint: str, exemplars=()) -> dict:
    """A finding as the API answers it. Each ``evidence`` key names its value's unit, as
    ``units.evidence_unit`` reads it (``*_ms``, ``*_s``, ``*_minutes``, ``*_share``/``*_rate`` a
    fraction, ``*_ratio`` a multiple, ``*_count`` a count, or a key it lists): the pages and the
    CLI show it in that unit, and a test fails on a key it cannot place."""
    ev = {k: (round(float(v), 4) if isinstance(v, (float, np.floating)) else int(v) if isinstance(v, (np.integer,)) else v)
          for k, v in evidence.items()}
    ids = []
    for t in exemplars:
        t = str(t).lower()
        if t not in ids:
            ids.append(t)
        if len(ids) >= MAX_EXEMPLARS:
            break
    return {"kind": kind, "severity": severity, "subject": subject, "start": rfc3339(start_ns),
            "end": rfc3339(end_ns), "evidence": ev, "exemplar_trace_ids": ids, "hint": hint}


def histogram_of(keys_list, counts_list) -> sketch.Histogram:
    """Merge sparse sketches (a frame's ``keys``/``counts`` columns) into one histogram."""
    h = sketch.Histogram()
    ks = [np.asarray(k) for k in keys_list if len(k)]
    if ks:
        np.add.at(h.counts, np.concatenate(ks), np.concatenate([np.asarray(c) for c, k in zip(counts_list, keys_list)
                                                                if len(k)]).astype(np.int64))
    return h


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


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
    # bincount copies every count to float64 and fills a float matrix to cast back, and on
    # fresh memory that cost 39 -> 24 ms for a day of pairs (2.7 million entries). int32: a
    # cell is one pair's calls in one minute or block and one ~17 % latency bin.
    out = np.zeros(n_rows * nb, dtype=np.int32)
    # (no casting, and numpy's own int32 descriptor: an equal one from elsewhere, unpickled
    # arrays' say, takes ufunc.at's slow path, 20x)
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

def _reportable(frames: Frames, start_minute: int, end_minute: int) -> bool:
    return end_minute > frames.report_minute and start_minute < frames.end_minute


def _clip_window(frames: Frames, start_ns: int, end_ns: int) -> tuple[int, int]:
    return max(start_ns, frames.data_start_ns), min(end_ns, max(frames.end_ns, start_ns + NS_MIN))


def _wilson_lower(k: float, n: float, z: float = 3.0) -> float:
    if n <= 0:
        return 0.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return centre - half


def _pair_groups(frames: Frames) -> tuple[dict, dict]:
    """``(series, positions)``: each pair's rows of ``frames.pairs`` as a frame, and their
    row positions; from one group-by a frame (~10 ms over a day of pairs), shared by the
    pair detectors."""
    df = frames.pairs
    if df.empty:
        return {}, {}
    cached = frames.__dict__.get("_pair_series_cache")
    if cached is not None and cached[0] is df:
        return cached[1]
    # Each pair's rows from its runs of consecutive equal (caller, callee) rows: the reader's
    # frame holds a series' minutes as one run (a pair has 3-4 series), so this is a few
    # dozen runs; a group-by hashing 50,000 rows of two string columns cost 7.5 of its 10 ms.
    # The same groups as ``groupby(["caller", "callee"], sort=True)``: keys in sorted order,
    # each pair's positions ascending, rows without a caller or callee left out.
    callers, callees = df["caller"].to_numpy(dtype=object), df["callee"].to_numpy(dtype=object)
    cuts = np.flatnonzero((callers[1:] != callers[:-1]) | (callees[1:] != callees[:-1])) + 1
    runs: dict[tuple, list[tuple[int, int]]] = {}
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(df)].tolist()):
        runs.setdefault((callers[a], callees[a]), []).append((a, b))
    indices = {key: np.concatenate([np.arange(a, b) for a, b in spans])
               for key, spans in sorted((k, v) for k, v in runs.items() if not (pd.isna(k[0]) or pd.isna(k[1])))}
    found = ({key: df.iloc[pos] for key, pos in indices.items()}, indices)
    frames.__dict__["_pair_series_cache"] = (df, found)
    return found


def _pair_series(frames: Frames) -> dict[tuple[str, str], pd.DataFrame]:
    return _pair_groups(frames)[0]


def _pair_rows_histogram(frames: Frames, df: pd.DataFrame, sel: np.ndarray) -> sketch.Histogram:
    """The merged sketches of the rows ``sel`` (a mask) of ``df``, one pair's rows of
    ``frames.pairs``: from its ``keys``/``counts`` columns, or when it has none from
    ``frames.pair_sketches``, by the rows' positions."""
    if "keys" in df.columns:
        return histogram_of(df["keys"].to_numpy()[sel], df["counts"].to_numpy()[sel])
    lens, keys, counts = frames.pair_sketches
    cached = frames.__dict__.get("_pair_starts_cache")
    if cached is None or cached[0] is not lens:
        cached = (lens, np.cumsum(lens) - lens)
        frames.__dict__["_pair_starts_cache"] = cached
    rows = df.index.to_numpy()[sel]
    own = lens[rows]
    take = np.repeat(cached[1][rows] - (np.cumsum(own) - own), own) + np.arange(int(own.sum()))
    h = sketch.Histogram()
    np.add.at(h.counts, keys[take], counts[take].astype(np.int64))
    return h


def _pair_flats(frames: Frames) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each pair's ``_flat_sketches`` (row lengths, keys, counts), all cut from the whole
    frame's entries (``frames.pair_sketches``, or one concatenation of its rows) and shared
    by the hot-spot and band-break detectors: concatenating each pair's rows again in each
    detector was a quarter of their time over a day (the ~22 MB a day of pairs holds, once
    more)."""
    df = frames.pairs
    cached = frames.__dict__.get("_pair_flats_cache")
    if cached is not None and cached[0] is df:
        return cached[1]
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
                # copied as a slice, 12 -> 3 ms a day, not picked one by one)
                firsts, lasts = np.concatenate([[0], breaks]), np.concatenate([breaks, [len(pos)]]) - 1
                cuts = list(zip(starts[pos[firsts]].tolist(), (starts[pos[lasts]] + lens[pos[lasts]]).tolist()))
                out[key] = (own, np.concatenate([keys[a:b] for a, b in cuts]),
                            np.concatenate([counts[a:b] for a, b in cuts]))
                continue
            # each row's entries: its start in the frame's arrays, then consecutive
            take = np.repeat(starts[pos] - (np.cumsum(own) - own), own) + np.arange(int(own.sum()))
            out[key] = (own, keys[take], counts[take])
    frames.__dict__["_pair_flats_cache"] = (df, out)
    return out


#: Bytes of per-pair minute matrices both pair detectors share (``_pair_minute_matrices``): a
#: day of ten pairs is ~15 MB; past it (a week of minutes, many pairs) each detector builds one
#: pair's at a time.
SHARED_MATRICES_BYTES = 24 * 2**20


def _pair_minute_matrices(frames: Frames) -> dict[tuple[str, str], np.ndarray] | None:
    """Every pair's ``_pair_minute_matrix``, built once for the hot-spot and band-break
    detectors (each spent a third of its time building them from the ~2.7 million sketch
    entries of a day), or None when they would exceed ``SHARED_MATRICES_BYTES`` or the
    frame holds minutes outside the data's (hand-made frames)."""
    df = frames.pairs
    cached = frames.__dict__.get("_pair_matrices_cache")
    if cached is not None and cached[0] is df:
        return cached[1]
    out = None
    n = frames.end_minute - frames.first_minute
    series = _pair_series(frames)
    if series and n > 0 and len(series) * n * (sketch.NUM_KEYS // COARSE) * 4 <= SHARED_MATRICES_BYTES:
        minutes = df["minute"].to_numpy()
        if minutes.min() >= frames.first_minute and minutes.max() < frames.end_minute:
            # All pairs' matrices stacked, from the whole frame's entries in one pass: each
            # row goes to its pair's block of minutes (rows of no pair nowhere). Cutting each
            # pair's entries out first (``_pair_flats``) copied all ~22 MB of a day again.
            flat = frames.pair_sketches
            if flat is None or len(flat[0]) != len(df):
                flat = _flat_sketches(df["keys"], df["counts"])
            pair_of_row = np.full(len(df), -n, dtype=np.int64)  # (below row 0 with any minute)
            for i, pos in enumerate(_pair_groups(frames)[1].values()):
                pair_of_row[pos] = i * n
            stacked = _coarse_rows(df, pair_of_row + (minutes - frames.first_minute), len(series) * n, flat)
            out = {key: stacked[i * n:(i + 1) * n] for i, key in enumerate(series)}
    frames.__dict__["_pair_matrices_cache"] = (df, out)
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
    minutes is ~10 MB a pair, and keeping every pair's (a shared cache) took a worker past
    500 MB."""
    return _coarse_matrix(df, frames.first_minute, frames.end_minute - frames.first_minute, flat)


# ==========================================================================================
# Detectors
# ==========================================================================================
HINTS = {
    "hot_spot": "High latency on a high-volume pair (the heatmap's dark upper-right block): a slow query "
                "or an uncached path. Look at the callee's slowest calls in the exemplars; add or fix the "
                "cache in front of it, or index / rewrite the query.",
    "p99_band_break": "P99 jumped against its own trailing baseline while P50 held: a minority of calls stall "
                      "— resource contention or GC pauses in the callee. Check GC logs, CPU/GPU throttling and "
                      "noisy neighbours on the instances of the exemplar traces; isolate or resize them.",
    "cache_penetration": "The hit rate of {key}={value} collapsed while {dominant} dominates the volume: the "
                         "cache key ignores {key}, so {dominant} entries evict the others. Put {key} into the "
                         "cache key, or partition the cache by it.",
    "fusion_sync_wait": "Encoders finish out of step (the multimodal inference latency study measured "
                        "~12 ms apart for 2 modalities, ~29 ms for 3), so fusion blocks on the slowest one. "
                        "Launch the faster encoders just in time (or give them less parallel hardware), or let "
                        "fusion start on partial inputs.",
    "preprocessing_bound": "Preprocessing's share of end-to-end latency grew: CPU-bound work (image decode, "
                           "resize) is not asynchronous. Move it off the request path (async workers, a decode "
                           "pool, GPU decoding) and check CPU saturation on the instances of the exemplars.",
    "batching_failure": "batch.size is stuck at 1 while load is high: mixed input sizes defeat dynamic "
                        "batching. Bucket or pad inputs to a few fixed sizes so requests can share a batch.",
    "cuda_graph_fallback": "CUDA Graph capture failed and kernels launch one by one (~5.7 µs a launch instead "
                           "of ~0.8 µs). Check the capture error on the instance (dynamic shapes, allocations "
                           "during capture), pin shapes, and restart it.",
    "lb_timeout_truncation": "Requests pile up just under {ceiling_s:g} s and end in errors: a load-balancer "
                             "timeout (defaults are 30 s / 60 s) below the request time cuts long multimodal "
                             "requests. Raise the backend timeout for this route, or stream / split long requests.",
    "cold_start": "A new instance's first requests are far slower than its steady state: pulling image layers, "
                  "loading weights or capturing graphs while serving. Warm it up before it takes traffic "
                  "(readiness after a warm-up request), pre-pull images, keep warm instances.",
    "baseline_regression": "P95 of {input_type} requests is over its baseline by more than {margin:g} %: see "
                           "the stage breakdown for this input type and the window's other findings for the "
                           "cause.",
}


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


def detect_hot_spot(frames: Frames, th: Thresholds) -> list[dict]:
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
            out.append(finding("hot_spot", "warning", {"caller": caller, "callee": callee}, s_ns, e_ns, {
                "p99_ms": _ms(h.quantile(0.99)), "p50_ms": _ms(h.quantile(0.5)),
                "calls": int(h.count), "calls_per_min": round(h.count / max(1, e_min - s_min), 2),
                "median_pair_p99_ms": _ms(float(np.median(all_p99))) if all_p99 else None,
                "pairs": len(names), "sample_count": int(h.count),
            }, HINTS["hot_spot"]))
    return out


#: Minutes of trailing baselines and blocks compared at once: a week's ~10,000 at once held
#: ~140 MB of (minutes x bins) arrays a pair.
BAND_CHUNK_MINUTES = 1440
#: Minutes of the pair's own data (minutes with at least one call of the pair) its trailing
#: baseline must hold before a break can start (docs/design.md: at least 30), whatever the window
#: asked: the look-back before a window, or before the data began, holds no data, and a
#: baseline of two minutes made a heavy tail look like a break.
BAND_BASELINE_DATA_MINUTES = 30
#: A break ends before this many consecutive calm blocks (``block_minutes`` each: 10
#: minutes by default) with the P99 back under the exit threshold; its end is the last
#: minute with a call past that threshold before them.
BAND_CALM_BLOCKS = 2
#: Calls past a threshold count only when they are more than the frozen baseline's own
#: share of them explains (``_excess_p`` at most this): to start a break (strict: every
#: minute starts a new comparison, and a heavy tail puts a few calls past twice its P99 in
#: any block) and to keep one going (lenient: a weak break's blocks carry a few calls each;
#: over a heavy tail, a block of a hundred calls has its P99 past 1.4 x the baseline's one
#: time in four by chance alone).
BAND_ENTRY_P = 1e-4
BAND_HOT_P = 0.05


def _band_stats(prefix: np.ndarray, ts: np.ndarray, B: int, W: int, first_bin: int = 0, tolerance: float = 0.25):
    """For each minute in ``ts``: calls and coarse P50/P99 of its trailing ``B`` minutes and of
    its next ``W``, and whether the next ``W``'s median moved past ``tolerance`` of the
    trailing one (``_median_moved``), a day of minutes at a time. ``prefix``: the minutes x
    bins matrix summed over both axes (row m, column j: the calls of minutes before m in bins
    up to j; its first column coarse bin ``first_bin``), so a span of minutes' running sums
    over the bins are one subtraction (a cumulative sum per quantile was half the detector's
    time)."""
    parts = []
    for lo in range(0, len(ts), BAND_CHUNK_MINUTES):
        t = ts[lo:lo + BAND_CHUNK_MINUTES]
        base = prefix[t] - prefix[t - B]
        win = prefix[t + W] - prefix[t]
        b50 = _cumulative_quantile(base, 0.5, first_bin)
        # The block's calls at or under (1 + tolerance) x the baseline median, and at or over
        # (1 - tolerance) x it (coarse bins).
        ref = np.where(np.isfinite(b50), b50, 1.0)
        rows, last = np.arange(len(t)), win.shape[1] - 1
        hi_col = sketch.keys_of(ref * (1 + tolerance)) // COARSE - first_bin
        lo_col = sketch.keys_of(ref * (1 - tolerance)) // COARSE - first_bin
        under = np.where(hi_col < 0, 0, win[rows, np.clip(hi_col, 0, last)])
        over = win[:, -1] - np.where(lo_col <= 0, 0, win[rows, np.clip(lo_col - 1, 0, last)])
        parts.append((base[:, -1], win[:, -1], b50, _cumulative_quantile(base, 0.99, first_bin),
                      _cumulative_quantile(win, 0.99, first_bin), _median_moved(win[:, -1], under, over)))
    return tuple(np.concatenate(col) for col in zip(*parts))


#: Standard errors a median's move must clear (``_median_moved``).
BAND_MEDIAN_Z = 3.0


def _median_moved(calls, under, over):
    """Whether a median moved past a tolerance around a reference, beyond sampling noise:
    fewer than half of ``calls`` at or under the upper bound (``under``), or at or over the
    lower one (``over``), by ``BAND_MEDIAN_Z`` standard errors. Over a heavy tail a few
    hundred calls' median wanders by more than the tolerance (sigma 1.6, 400 calls: 10 %
    one standard error); only a move the calls show for sure is a shift."""
    calls = np.asarray(calls, dtype=float)
    floor = calls / 2 - BAND_MEDIAN_Z * np.sqrt(calls) / 2
    return (np.asarray(under) < floor) | (np.asarray(over) < floor)


def _histogram_median_moved(h: sketch.Histogram, ref: float, tolerance: float) -> bool:
    """``_median_moved`` of a histogram's calls against ``ref`` (ns) +- ``tolerance``."""
    cum = np.cumsum(h.counts)
    under = cum[sketch.key_of(ref * (1 + tolerance))]
    k_lo = sketch.key_of(ref * (1 - tolerance))
    over = cum[-1] - (cum[k_lo - 1] if k_lo > 0 else 0)
    return bool(_median_moved(cum[-1], under, over))


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq, lg = math.log(p), math.log1p(-p), math.lgamma(n + 1)

    def term(i: int) -> float:
        return math.exp(lg - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)

    if k <= n * p:  # (a large tail: one minus the head)
        return max(0.0, 1.0 - sum(term(i) for i in range(k)))
    total = 0.0
    for i in range(k, n + 1):  # (terms fall past the mode: stop once they no longer count)
        t = term(i)
        total += t
        if t < 1e-15 * total:
            break
    return min(1.0, total)


def _excess_p(k: int, n: int, k0: int, n0: int) -> float:
    """How likely ``k`` or more of a block's ``n`` calls lie past a threshold when ``k0`` of
    its baseline's ``n0`` did, both at one rate: the conditional test of two Poisson counts
    (given the ``k + k0`` calls past it, each is the block's with chance ``n / (n + n0)``).
    The baseline's count is itself a sample: over a heavy tail it is a handful, and taking
    it for the rate made ordinary blocks look like breaks."""
    if n <= 0:
        return 1.0
    return _binomial_tail(k, k + k0, n / (n + n0))


def _p99_past(calls: int, past: int) -> bool:
    """Whether the P99 of ``calls`` calls reaches a threshold ``past`` of them exceed: at
    least 1 % of them past it."""
    return calls > 0 and past >= 0.01 * calls


def detect_p99_band_break(frames: Frames, th: Thresholds) -> list[dict]:
    """``p99_band_break``: a pair's P99 jumps against its own trailing baseline while P50 holds.

    For every minute t whose trailing baseline ``[t - baseline_minutes, t)`` holds at least
    ``BAND_BASELINE_DATA_MINUTES`` minutes with calls of the pair (so the first 30 minutes
    of a pair's data never hold a break, whatever window was asked), the next
    ``block_minutes`` are compared with it: it fires when the block's P99 is at least
    ``band_ratio`` x the baseline P99, its P50 has not moved past ``band_p50_tolerance``
    of the baseline P50 (beyond sampling noise, ``_median_moved``), both have
    ``min_samples`` calls, and at least ``band_min_outliers`` calls lie past
    ``band_ratio`` x baseline P99 — more than the baseline's own share of such calls
    explains (``_excess_p`` at most ``BAND_ENTRY_P``).

    The baseline is then frozen, and the break is followed block by block from t. The exit
    threshold is lower than the entry one, sqrt(``band_ratio``) x the baseline P99 (a
    hysteresis: a heavy tail's noisy P99 neither ends a break at once nor holds it open): a
    block is hot while at least 1 % of its calls lie past it (its P99 reaches it) and more
    than the baseline's share explains (``BAND_HOT_P``). The break ends before the first
    ``BAND_CALM_BLOCKS`` calm blocks in a row (or the data's end); the hot blocks just
    before t belong to it too. Its window runs from its first call past a threshold to its
    last call past the exit threshold before the calm blocks, and over that whole window the
    P50 must still hold.
    """
    out = []
    B, W = max(30, th.baseline_minutes), max(1, th.block_minutes)
    first, n = frames.first_minute, frames.end_minute - frames.first_minute
    if n < B + W:
        return []
    exit_ratio = math.sqrt(max(th.band_ratio, 1.0))
    minute_mats = _pair_minute_matrices(frames)
    for (caller, callee), df in _pair_series(frames).items():
        mat = (minute_mats[(caller, callee)] if minute_mats is not None
               else _pair_minute_matrix(frames, df, _pair_flats(frames)[(caller, callee)]))
        minutes = df["minute"].to_numpy()
        # Only the bins the pair's calls fall in (a pair's latencies span a few dozen of the
        # 256): the sums and quantiles below are the same, over a fraction of the columns.
        used = np.flatnonzero(mat.any(axis=0))
        ts = np.arange(B, n - W + 1)
        if not len(ts) or not len(used):
            continue
        lo_bin, hi_bin = int(used[0]), int(used[-1]) + 1
        prefix = np.zeros((n + 1, hi_bin - lo_bin), dtype=np.int64)
        np.cumsum(mat[:, lo_bin:hi_bin], axis=0, dtype=np.int64, out=prefix[1:])
        np.cumsum(prefix, axis=1, out=prefix)
        calls = np.diff(prefix[:, -1])  # calls a minute
        data_minutes = np.concatenate([[0], np.cumsum(calls > 0)])  # minutes with calls, before each
        earliest = int(np.searchsorted(data_minutes, BAND_BASELINE_DATA_MINUTES))  # no break before
        nb, nw, b50, b99, w99, moved = _band_stats(prefix, ts, B, W, lo_bin, th.band_p50_tolerance)
        with np.errstate(invalid="ignore", divide="ignore"):
            cand = ((nb >= th.min_samples) & (nw >= th.min_samples) & (w99 >= th.band_ratio * b99)
                    & ~moved
                    & (data_minutes[ts] - data_minutes[ts - B] >= BAND_BASELINE_DATA_MINUTES))
        i = done = 0
        idx = np.flatnonzero(cand)
        while i < len(idx):
            k = idx[i]
            t = int(ts[k])
            thr_ns = th.band_ratio * b99[k]
            thr_bin = _coarse_bin_of(thr_ns)
            ex = mat[:, thr_bin + 1:].sum(axis=1)
            n_ex = int(ex[t:t + W].sum())
            if n_ex < th.band_min_outliers or \
                    _excess_p(n_ex, int(nw[k]), int(ex[t - B:t].sum()), int(nb[k])) > BAND_ENTRY_P:
                i += 1
                continue
            exit_bin = _coarse_bin_of(exit_ratio * b99[k])
            past = mat[:, exit_bin + 1:].sum(axis=1)
            k0 = int(past[t - B:t].sum())

            def hot(a: int, b: int) -> bool:  # minutes [a, b) still show the break
                c, p = int(calls[a:b].sum()), int(past[a:b].sum())
                return _p99_past(c, p) and _excess_p(p, c, k0, int(nb[k])) <= BAND_HOT_P

            # The evidence comes a block after a weak break began: the blocks just before
            # that still show it belong to it (not before the previous break's end, nor
            # inside the pair's first BAND_BASELINE_DATA_MINUTES).
            begin = t
            while begin - W >= max(done, t - B, earliest) and hot(begin - W, begin):
                begin -= W
            start = min(t + int(np.flatnonzero(ex[t:t + W])[0]),
                        begin + int(np.flatnonzero(past[begin:t + W])[0]))
            # Follow the break a block at a time: it ends before the first BAND_CALM_BLOCKS
            # calm blocks in a row, at its last slow call before them.
            stop, calm = n, 0
            for j in range(t + W, n, W):
                if hot(j, j + W):
                    stop, calm = n, 0
                else:
                    stop, calm = (j if not calm else stop), calm + 1
                    if calm >= BAND_CALM_BLOCKS:
                        break
            slow = np.flatnonzero(past[start:stop])
            last = start + int(slow[-1]) if len(slow) else start
            done = last + 1
            s_min, e_min = first + start, first + last + 1
            ratio = None
            if _reportable(frames, s_min, e_min):
                inside = (minutes >= s_min) & (minutes < e_min)
                before = (minutes >= first + t - B) & (minutes < first + t)
                hi = _pair_rows_histogram(frames, df, inside)
                hb = _pair_rows_histogram(frames, df, before)
                o99, o50, r99, r50 = hi.quantile(0.99), hi.quantile(0.5), hb.quantile(0.99), hb.quantile(0.5)
                ratio = (o99 / r99) if (o99 and r99) else None
                if not (o50 and r50) or _histogram_median_moved(hi, r50, th.band_p50_tolerance):
                    ratio = None  # over the whole break the P50 moved too: a shift, not a band
            if _reportable(frames, s_min, e_min) and ratio is not None:
                sev = "critical" if ratio is not None and ratio >= 2 * th.band_ratio else "warning"
                s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
                out.append(finding("p99_band_break", sev, {"caller": caller, "callee": callee}, s_ns, e_ns, {
                    "p99_ms": _ms(o99), "baseline_p99_ms": _ms(r99), "p50_ms": _ms(o50), "baseline_p50_ms": _ms(r50),
                    "ratio": round(ratio, 3) if ratio else None, "threshold_ratio": th.band_ratio,
                    "threshold_ms": _ms(thr_ns), "exit_threshold_ms": _ms(exit_ratio * b99[k]),
                    "outliers": int(ex[start:last + 1].sum()),
                    "baseline_minutes": B, "baseline_data_minutes": int(data_minutes[t] - data_minutes[t - B]),
                    "sample_count": int(hi.count), "baseline_count": int(hb.count),
                }, HINTS["p99_band_break"]))
            nxt = last + 1
            while i < len(idx) and ts[idx[i]] < nxt:
                i += 1
    return out


def _with_attrs(frames: Frames) -> pd.DataFrame:
    """The spans that carry attributes (most raw spans are SERVER spans without any), found
    once per ``frames.spans`` and shared by the attribute detectors."""
    df = frames.spans
    cached = frames.__dict__.get("_with_attrs_cache")
    if cached is not None and cached[0] is df:
        return cached[1]
    mask = np.fromiter((isinstance(a, dict) and bool(a) for a in df["attrs"]), dtype=bool, count=len(df))
    sub = df[mask]
    frames.__dict__["_with_attrs_cache"] = (df, sub)
    return sub


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
    from ..ingest.settle_fast import convention_contributions

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


def detect_cache_penetration(frames: Frames, th: Thresholds) -> list[dict]:
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
                                   {"cache": str(cache), "attribute": {"key": key, "value": value}}, s_ns, e_ns, {
                    "hit_rate": round(mine["hits"].sum() / max(1, mine["n"].sum()), 4),
                    "dominant_hit_rate": round(dom_rate, 4),
                    "baseline_hit_rate": round(before["hits"].sum() / before["n"].sum(), 4)
                    if before["n"].sum() else None,
                    "threshold_hit_rate": round((1 - th.cache_drop) * dom_rate, 4),
                    "dominant_share": round(dom_rows["n"].sum() / max(1, in_run["n"].sum()), 4),
                    "sample_count": int(mine["n"].sum()), "dominant_count": int(dom_rows["n"].sum()),
                }, HINTS["cache_penetration"].format(key=key, value=value, dominant=f"{key}={dominant}"), exemplars))
    return out


def _encoder_ends(enc: pd.DataFrame) -> pd.DataFrame:
    """Per trace (index ``trace_id``, sorted) of encoder spans ``enc``: ``n`` encoder services,
    the ``first`` and ``last`` of their ends (each service's last end) and the earliest
    ``start``. Sorted reductions over codes: two pandas named aggregations cost ~6 ms a call,
    and an exemplar look-up of a fusion finding makes up to three."""
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


def detect_fusion_sync_wait(frames: Frames, th: Thresholds) -> list[dict]:
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
            out.append(finding("fusion_sync_wait", "warning", {"service": str(fusion_service), "stage": "fusion"},
                               s_ns, e_ns, {
                "median_spread_ms": round(float(med_in), 3),
                "baseline_spread_ms": round(float(med_out), 3) if n_out and med_out is not None else None,
                "threshold_ms": th.sync_spread_ms, "sample_count": int(n_in),
            }, HINTS["fusion_sync_wait"], exemplars))
    return out


def _block_table(df: pd.DataFrame, th: Thresholds, by: list[str], value_cols: list[str]) -> pd.DataFrame:
    d = df.assign(block=_block_of(df["minute"].to_numpy(), th))
    return d.groupby(by + ["block"])[value_cols].sum().reset_index()


def detect_preprocessing_bound(frames: Frames, th: Thresholds) -> list[dict]:
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
                out.append(finding("preprocessing_bound", "warning", {"input_type": str(it), "stage": "preprocessing"},
                                   s_ns, e_ns, {
                    "share": round(share, 4), "baseline_share": round(base, 4),
                    "threshold_share": round(max(th.preprocess_min_share, th.preprocess_ratio * base), 4),
                    "sample_count": int(inside["count"].sum()),
                }, HINTS["preprocessing_bound"]))
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


def detect_batching_failure(frames: Frames, th: Thresholds) -> list[dict]:
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
                                   {"service": str(service), "attribute": {"key": "batch.size", "value": 1}}, s_ns, e_ns, {
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


def detect_cuda_graph_fallback(frames: Frames, th: Thresholds) -> list[dict]:
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
                               {"service": str(service), "attribute": {"key": "gpu.cuda_graph", "value": "fallback"}},
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


def detect_lb_timeout_truncation(frames: Frames, th: Thresholds) -> list[dict]:
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
        subject: dict[str, Any] = {"service": str(root)}
        if len(types) and types.iloc[0] / len(band) >= 0.8:
            subject["input_type"] = str(types.index[0])
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


def detect_cold_start(frames: Frames, th: Thresholds) -> list[dict]:
    """``cold_start``: a ``service.instance.id`` first seen after the data began (a new
    instance) whose requests (SERVER/CONSUMER spans) in its first ``cold_warmup_s`` are,
    at the median, ``cold_factor`` x slower than the same operations' steady state (the
    service's other spans in the half hour after that instance's warm-up, all instances).
    Needs ``min_events`` first requests and ``min_samples`` steady ones.
    """
    known = []
    for f in frames.cold_starts_known or ():
        s_ns = datetime.fromisoformat(f["start"].replace("Z", "+00:00")).timestamp()
        e_ns = datetime.fromisoformat(f["end"].replace("Z", "+00:00")).timestamp()
        if _reportable(frames, int(s_ns) // 60, -(-int(e_ns) // 60)):
            known.append(f)
    return known + _cold_starts_from_spans(frames, th)


def _cold_starts_from_spans(frames: Frames, th: Thresholds) -> list[dict]:
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
                           {"service": str(service), "attribute": {"key": "service.instance.id", "value": str(inst)}},
                           s_ns, e_ns, {
            "first_median_ms": _ms(float(np.median(f["duration_ns"]))),
            "steady_median_ms": _ms(float(np.median(steady.reindex(f["name"]).to_numpy()))),
            "ratio": round(float(np.median(ratio)), 3), "threshold_ratio": th.cold_factor,
            "warmup_s": th.cold_warmup_s, "sample_count": int(len(f)), "steady_count": int(counts.sum()),
        }, HINTS["cold_start"], f.sort_values("duration_ns", ascending=False)["trace_id"].tolist()))
    return out


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
    # same cumulative counts over a fifth of the columns (fusion's blocks over 24 h at ten
    # million spans 14 -> 3 ms), and no sort when every row fits in one pass.
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
        # (counts as the matrix's dtype: ufunc.at's fast path takes no casting, ~8x)
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


def detect_baseline_regression(frames: Frames, th: Thresholds) -> list[dict]:
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
            out.append(finding("baseline_regression", sev, {"input_type": str(it)}, s_ns, e_ns, {
                "p95_ms": _ms(p95), "baseline_p95_ms": _ms(base95), "threshold_ms": _ms(limit),
                "change": round(change, 4), "margin": th.baseline_margin,
                "over_threshold": n_above, "sample_count": int(h.count),
            }, HINTS["baseline_regression"].format(input_type=it, margin=th.baseline_margin * 100)))
    return out


DETECTORS: dict[str, Callable[[Frames, Thresholds], list[dict]]] = {
    "hot_spot": detect_hot_spot,
    "p99_band_break": detect_p99_band_break,
    "cache_penetration": detect_cache_penetration,
    "fusion_sync_wait": detect_fusion_sync_wait,
    "preprocessing_bound": detect_preprocessing_bound,
    "batching_failure": detect_batching_failure,
    "cuda_graph_fallback": detect_cuda_graph_fallback,
    "lb_timeout_truncation": detect_lb_timeout_truncation,
    "cold_start": detect_cold_start,
    "baseline_regression": detect_baseline_regression,
}


def sort_findings(findings: list[dict]) -> list[dict]:
    """Most severe first, then latest first, then by kind."""
    return sorted(findings, key=lambda f: (SEVERITY_ORDER.get(f["severity"], 9), _neg_time(f["start"]), f["kind"]))


def _neg_time(text: str) -> float:
    return -datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def run_all(frames: Frames, th: Thresholds | None = None, kinds=None) -> list[dict]:
    """Every detector (or those named in ``kinds``) over ``frames``, most severe first."""
    th = th or Thresholds()
    out: list[dict] = []
    for kind, fn in DETECTORS.items():
        if kinds and kind not in kinds:
            continue
        out.extend(fn(frames, th))
    return sort_findings(out)


# -- exemplars for rollup-based attribute findings -----------------------------------------
ATTRIBUTE_KINDS = ("cache_penetration", "batching_failure", "cuda_graph_fallback", "fusion_sync_wait")


def describe_from_spans(f: dict, spans: pd.DataFrame) -> None:
    """Fill a finding of :data:`ATTRIBUTE_KINDS` found from rollups with exemplar traces
    (and, for a CUDA Graph fallback, the instance in its hint) from raw spans of (part of)
    its window, as the detectors do when they have raw spans. ``spans`` as ``Frames.spans``."""
    if spans.empty:
        return
    frames = Frames(0, 1, 0, spans=spans)
    s = f["subject"]
    ids: list = []
    if f["kind"] == "cache_penetration":
        df = _attr_spans(frames, "cache.name")
        key, value = s["attribute"]["key"], s["attribute"]["value"]
        df = df[df["_v"].astype(str) == s["cache"]]
        ids = [t for t, a in zip(df["trace_id"], df["attrs"]) if a.get(key) == value
               and cache_hit_value(a.get("cache.hit")) is False]
    elif f["kind"] == "batching_failure":
        df = _attr_spans(frames, "batch.size")
        df = df[(df["service"] == s["service"]) & pd.to_numeric(df["_v"], errors="coerce").notna()]
        ids = df.sort_values("duration_ns", ascending=False)["trace_id"].tolist()
    elif f["kind"] == "cuda_graph_fallback":
        df = _attr_spans(frames, "gpu.cuda_graph")
        fb = df[(df["service"] == s["service"]) & (df["_v"] == "fallback")]
        ids = fb.sort_values("duration_ns", ascending=False)["trace_id"].tolist()
        if len(fb):
            f["hint"] = cuda_hint(fb["instance"])
    elif f["kind"] == "fusion_sync_wait":
        got = _sync_blocks(frames, Thresholds())
        if got is not None:
            ids = got[1](lambda blk: blk == blk)[2]
    f["exemplar_trace_ids"] = finding("", "", {}, 0, 0, {}, "", ids)["exemplar_trace_ids"]
