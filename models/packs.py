"""Hour packs (table ``rollup_packs``): one closed hour of a series kind's minute rollups,
every series, column by column in one blob.

The anomaly detectors read every ``pair``, ``trace`` and convention (``cache``, ``batch``,
``cuda``, ``sync``) minute rollup of their window and its baseline look-back: ~80,000 rows a
day at ten million spans, the largest read of an absolute window's first request
(``app/findings.py``). Read as 24 blobs a kind instead, the rows cost a few ``frombuffer``
calls. Packs are a cache of the rollups, never the only copy:

- ``PackSchedule`` (the settler's loop) packs each closed hour of ``PACK_KINDS`` within
  ``HORIZON_S`` a few minutes after it ends, and marks a pack ``verified`` once no write that
  was in flight while it was built touched its hour (``verify``);
- every write to the rollups deletes the packs of the hours it touches, in its own
  transaction (``changes.record``): a late span, a retention pass, a retag;
- readers use verified packs only, and minute rows for every other minute of the window.

Layout (little-endian): ``MAGIC``, then ``n`` rows and ``e`` sketch entries (int64 each), the
rows' series id, minute, count, error count, sum (int64 columns), their sketch lengths in
entries (int64), and the entries as (key, count) int32 pairs: the minute rows' own sketch
encoding (``models/sketch.py``), concatenated.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection, Engine, delete, func, select, update

from ..core.every import Every
from ..core.series import SeriesKind
from ..durations import NS
from . import RollupPack, Rollup, Series
from .dialect import upsert
from .changes import CHANGE_MARGIN_S, READ_AT_MOST, changed_since, changes_since
from .engine import BINARY_RESULTS

log = logging.getLogger(__name__)

#: The series kinds packed: the ones the detectors read whole.
PACK_KINDS = (SeriesKind.PAIR, SeriesKind.TRACE, SeriesKind.CACHE, SeriesKind.BATCH, SeriesKind.CUDA,
              SeriesKind.SYNC)
#: Kinds packed without their sketches: their detectors use only counts and sums (sketch
#: entries are nearly all of a ``cache`` pack's bytes). ``reader.rollups.columns`` reads them
#: from packs only when asked for no sketches.
SKETCHLESS_KINDS = frozenset({SeriesKind.CACHE, SeriesKind.BATCH})
MAGIC = b"MSPACK01"
#: Hours packed back from now: what the detectors judge at most (7 days) and their look-back.
HORIZON_S = 7 * 86400 + 2 * 3600
#: An hour is packed this long after it ends (spans still settling into it cost a rebuild).
LAG_S = 300
#: A pack is read once this long has passed since it was built with no write to its hour
#: logged from then on (a settle batch in flight while it was built commits within it).
VERIFY_AFTER_S = 120
#: Packs (a kind's hour each) built at most per schedule tick (a week of six kinds is ~1,000;
#: a day's at once held a tick far too long on a large store).
PACKS_PER_TICK = 48
#: How often the receivers' settler packs (``ingest/pipeline.py``).
EVERY_S = 60.0


@dataclass
class Columns:
    """Minute rollup rows column by column: row i is series ``series_id[i]`` at ``minute[i]``,
    its ``lengths[i]`` sketch entries in ``keys``/``counts`` after those of the rows before it."""

    series_id: np.ndarray
    minute: np.ndarray
    count: np.ndarray
    errors: np.ndarray
    sum_ns: np.ndarray
    lengths: np.ndarray
    keys: np.ndarray
    counts: np.ndarray

    def __len__(self) -> int:
        return len(self.series_id)


def empty_columns() -> Columns:
    z = np.zeros(0, dtype=np.int64)
    return Columns(z, z, z, z, z, z, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32))


def columns_of_rows(rows: list[tuple]) -> Columns:
    """``(series_id, minute, count, errors, sum_ns, sketch blob)`` rows as columns."""
    if not rows:
        return empty_columns()
    sid, minute, count, errors, sum_ns, blobs = zip(*rows)
    blobs = [b if isinstance(b, bytes) else bytes(b) if b else b"" for b in blobs]
    lengths = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs)) // 8
    entries = np.frombuffer(b"".join(blobs), dtype="<i4").reshape(-1, 2)
    return Columns(np.asarray(sid, dtype=np.int64), np.asarray(minute, dtype=np.int64),
                   np.asarray(count, dtype=np.int64), np.asarray(errors, dtype=np.int64),
                   np.asarray([s or 0 for s in sum_ns], dtype=np.int64), lengths, entries[:, 0], entries[:, 1])


def encode(cols: Columns) -> bytes:
    n, e = len(cols), len(cols.keys)
    entries = np.empty((e, 2), dtype="<i4")
    entries[:, 0], entries[:, 1] = cols.keys, cols.counts
    head = np.asarray([n, e], dtype="<i8").tobytes()
    body = b"".join(np.ascontiguousarray(a, dtype="<i8").tobytes() for a in (
        cols.series_id, cols.minute, cols.count, cols.errors, cols.sum_ns, cols.lengths))
    return MAGIC + head + body + entries.tobytes()


def decode(blob: bytes) -> Columns:
    if bytes(blob[:len(MAGIC)]) != MAGIC:
        raise ValueError("not a rollup pack")
    n, e = np.frombuffer(blob, dtype="<i8", count=2, offset=len(MAGIC)).tolist()
    at = len(MAGIC) + 16
    six = np.frombuffer(blob, dtype="<i8", count=6 * n, offset=at).reshape(6, n)
    entries = np.frombuffer(blob, dtype="<i4", count=2 * e, offset=at + 48 * n).reshape(e, 2)
    return Columns(*six, entries[:, 0], entries[:, 1])


def without_sketches(cols: Columns) -> Columns:
    """The same rows with no sketch entries."""
    if not len(cols.keys):
        return cols
    return Columns(cols.series_id, cols.minute, cols.count, cols.errors, cols.sum_ns,
                   np.zeros(len(cols), dtype=np.int64), cols.keys[:0], cols.counts[:0])


def concat(parts: list[Columns]) -> Columns:
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty_columns()
    if len(parts) == 1:
        return parts[0]
    return Columns(*(np.concatenate([getattr(p, f) for p in parts]) for f in Columns.__dataclass_fields__))


def select_rows(cols: Columns, keep: np.ndarray) -> Columns:
    """The rows where the boolean ``keep`` is true (their entries with them)."""
    if keep.all():
        return cols
    return take(cols, np.flatnonzero(keep))


def take(cols: Columns, order: np.ndarray) -> Columns:
    """Rows ``order`` (positions) with their sketch entries, in that order."""
    lengths = cols.lengths[order]
    starts = (np.cumsum(cols.lengths) - cols.lengths)[order]
    total = int(lengths.sum())
    breaks = np.flatnonzero(np.diff(order) != 1) + 1
    if len(breaks) < len(order) // 8:
        # Few runs of consecutive rows (hour packs put together by series: a series' hour is
        # one run): their entries copied a run at a time, far cheaper than picked one by one.
        firsts = np.concatenate([[0], breaks])
        lasts = np.concatenate([breaks, [len(order)]]) - 1
        spans = list(zip(starts[firsts].tolist(), (starts[lasts] + lengths[lasts]).tolist()))
        return Columns(cols.series_id[order], cols.minute[order], cols.count[order], cols.errors[order],
                       cols.sum_ns[order], lengths, _cut(cols.keys, spans, total), _cut(cols.counts, spans, total))
    # Entry j of the result: its row's start plus its place within the row.
    out_starts = np.cumsum(lengths) - lengths
    idx = np.repeat(starts - out_starts, lengths) + np.arange(total, dtype=np.int64)
    return Columns(cols.series_id[order], cols.minute[order], cols.count[order], cols.errors[order],
                   cols.sum_ns[order], lengths, cols.keys[idx], cols.counts[idx])


def _cut(values: np.ndarray, spans: list[tuple[int, int]], total: int) -> np.ndarray:
    """``values[a:b]`` of each span, one after another."""
    out = np.empty(total, dtype=values.dtype)
    at = 0
    for a, b in spans:
        out[at:at + b - a] = values[a:b]
        at += b - a
    return out


def merge(parts: list[Columns], keep_series: np.ndarray | None = None) -> Columns:
    """``sort_rows(concat(parts))`` (only the rows of ``keep_series`` ids, when given), with
    each row's sketch entries copied once, straight from its part: concatenating a day of
    pair packs' entries and copying them again in sorted order was most of their read. Rows
    of one series next to each other in a part and in the result (an hour of a series in its
    pack) are copied a run at a time."""
    parts = [p for p in parts if len(p)]
    if keep_series is not None:
        parts = [select_rows(p, np.isin(p.series_id, keep_series)) for p in parts]
        parts = [p for p in parts if len(p)]
    if not parts:
        return empty_columns()
    if len(parts) == 1:
        return sort_rows(parts[0])
    series_id = np.concatenate([p.series_id for p in parts])
    minute = np.concatenate([p.minute for p in parts])
    order = np.lexsort((minute, series_id))
    lengths_all = np.concatenate([p.lengths for p in parts])
    lengths = lengths_all[order]
    # Each row's part and its entries' start within that part.
    part_of = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    starts_all = np.concatenate([np.cumsum(p.lengths) - p.lengths for p in parts])
    part_o, start_o = part_of[order], starts_all[order]
    # Runs: consecutive result rows that are consecutive rows of one part.
    breaks = np.flatnonzero((np.diff(order) != 1) | (np.diff(part_o) != 0)) + 1
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks, [len(order)]]) - 1
    ends = (start_o[lasts] + lengths[lasts]).tolist()
    total = int(lengths.sum())
    keys = np.empty(total, dtype=parts[0].keys.dtype)
    counts = np.empty(total, dtype=parts[0].counts.dtype)
    at = 0
    if total:  # (parts without sketches: no entries to copy)
        for k, a, b in zip(part_o[firsts].tolist(), start_o[firsts].tolist(), ends):
            src = parts[k]
            keys[at:at + b - a] = src.keys[a:b]
            counts[at:at + b - a] = src.counts[a:b]
            at += b - a
    rest = [np.concatenate([getattr(p, f) for p in parts])[order] for f in ("count", "errors", "sum_ns")]
    return Columns(series_id[order], minute[order], *rest, lengths, keys, counts)


def sort_rows(cols: Columns) -> Columns:
    """Rows ordered by series, then minute (as the minute rows come through their index)."""
    if len(cols) < 2:
        return cols
    order = np.lexsort((cols.minute, cols.series_id))
    if (np.diff(order) == 1).all():
        return cols
    return take(cols, order)


def hour_rows(conn: Connection, kind: str, hour: int) -> Columns:
    """Every minute rollup of ``kind`` series in ``hour``, ordered by series and minute
    (``SKETCHLESS_KINDS`` without their sketches)."""
    ids = list(conn.execute(select(Series.id).where(Series.kind == kind).order_by(Series.id)).scalars())
    rows: list[tuple] = []
    for i in range(0, len(ids), 500):
        stmt = (select(Rollup.series_id, Rollup.minute, Rollup.count, Rollup.error_count, Rollup.sum_ns, Rollup.sketch)
                .where(Rollup.series_id.in_(ids[i:i + 500]), Rollup.minute >= hour * 60,
                       Rollup.minute < hour * 60 + 60))
        rows.extend(tuple(r) for r in conn.execute(stmt))
    cols = sort_rows(columns_of_rows(rows))
    return without_sketches(cols) if kind in SKETCHLESS_KINDS else cols


def build(engine: Engine, kind: str, hour: int, now_ns: int | None = None) -> None:
    """Pack ``kind``'s rollups of ``hour`` (unverified; a pack of it already there is replaced)."""
    built_ns = time.time_ns() if now_ns is None else now_ns
    with engine.begin() as conn:
        data = encode(hour_rows(conn, kind, hour))
        # (an upsert: several receivers' settlers may pack the same hour at once)
        conn.execute(upsert(conn, RollupPack.__table__, ["hour", "kind"], ["built_ns", "verified", "data"]),
                     {"hour": hour, "kind": kind, "built_ns": built_ns, "verified": False, "data": data})


def verify(engine: Engine, now_ns: int | None = None, after_s: float = VERIFY_AFTER_S) -> tuple[int, int]:
    """Mark the packs built at least ``after_s`` ago verified, or delete those whose hour a
    write logged since their build (less ``CHANGE_MARGIN_S``) touched. Returns (verified, dropped)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    ok = dropped = 0
    with engine.begin() as conn:
        due = conn.execute(select(RollupPack.hour, RollupPack.kind, RollupPack.built_ns).where(
            RollupPack.verified.is_(False), RollupPack.built_ns <= now_ns - int(after_s * NS))).all()
        for hour, kind, built_ns in due:
            key = (RollupPack.hour == hour, RollupPack.kind == kind, RollupPack.built_ns == built_ns)
            if changed_since(conn, built_ns - CHANGE_MARGIN_S * NS, hour * 60, hour * 60 + 59):
                conn.execute(delete(RollupPack).where(*key))
                dropped += 1
            else:
                conn.execute(update(RollupPack).where(*key).values(verified=True))
                ok += 1
    return ok, dropped


#: Bytes of decoded packs a reader keeps (``PackCache``): a day of every packed kind at ten
#: million spans is ~31 MB; a longer window reads its older hours each time.
CACHE_BYTES = 64 * 2**20


class PackCache:
    """Decoded packs a reader (one a dashboard worker) keeps between reads, least recently
    used first out past ``max_bytes``.

    A closed hour's pack changes only by being deleted (a write to its hour) and built again,
    which stamps a new ``built_ns``: each entry is kept with its ``built_ns`` and size, and
    ``read`` lists the window's verified packs without their data (a few index rows) and
    fetches only those it does not hold in that version. At ten million spans a day, a day
    of pair packs is 23 MB that PostgreSQL detoasts and sends on every first request
    of a window. Thread-safe: the app's reader serves concurrent requests."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, int], tuple[tuple[int, int], Columns, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, kind: str, hour: int, version: tuple[int, int]) -> Columns | None:
        with self._lock:
            hit = self._entries.get((kind, hour))
            if hit is None or hit[0] != version:
                return None
            self._entries.move_to_end((kind, hour))
            return hit[1]

    def put(self, kind: str, hour: int, version: tuple[int, int], cols: Columns, size: int) -> None:
        with self._lock:
            old = self._entries.pop((kind, hour), None)
            if old is not None:
                self.bytes -= old[2]
            if size > self.max_bytes:
                return
            self._entries[(kind, hour)] = (version, cols, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, _, freed) = self._entries.popitem(last=False)
                self.bytes -= freed


def read(conn: Connection, kind: str, first_hour: int, end_hour: int,
         cache: PackCache | None = None) -> dict[int, Columns]:
    """The verified packs of ``kind`` for hours ``[first_hour, end_hour)``, by hour; with
    ``cache``, those it holds in their stored version are not fetched again."""
    if end_hour <= first_hour:
        return {}
    window = [RollupPack.kind == kind, RollupPack.hour >= first_hour, RollupPack.hour < end_hour,
              RollupPack.verified.is_(True)]
    out: dict[int, Columns] = {}
    if cache is not None:
        # (length() of a blob comes from its header or TOAST pointer: no data is read)
        listed = conn.execute(select(RollupPack.hour, RollupPack.built_ns, func.length(RollupPack.data))
                              .where(*window)).all()
        wanted = []
        for hour, built_ns, size in listed:
            hit = cache.get(kind, hour, (built_ns, size))
            if hit is None:
                wanted.append(hour)
            else:
                out[hour] = hit
        if not wanted:
            return out
        window.append(RollupPack.hour.in_(wanted))
    stmt = select(RollupPack.hour, RollupPack.built_ns, RollupPack.data).where(*window)
    # bytea in the binary format on PostgreSQL: the text format's hex doubles what crosses the
    # wire and is decoded again here, a large share of reading a day of pair packs
    fetched = conn.execute(stmt, execution_options={BINARY_RESULTS: True}).all()
    for hour, built_ns, data in fetched:
        # (bytes, not a driver's buffer: decoded columns are read-only views into it)
        data = data if isinstance(data, bytes) else bytes(data)
        out[hour] = cols = decode(data)
        if cache is not None:
            cache.put(kind, hour, (built_ns, len(data)), cols, len(data))
    return out


def missing_hours(engine: Engine, now_ns: int, horizon_s: float = HORIZON_S, lag_s: float = LAG_S) -> list[tuple[str, int]]:
    """``(kind, hour)`` of the closed hours within the horizon that hold rollups and have no
    pack, newest first."""
    last_closed = (now_ns - int(lag_s * NS)) // (3600 * NS)  # hours before this one are closed
    first = max(0, (now_ns - int(horizon_s * NS)) // (3600 * NS))
    with engine.connect() as conn:
        oldest, newest = conn.execute(select(func.min(Rollup.minute), func.max(Rollup.minute)).where(
            Rollup.minute >= first * 60, Rollup.minute < last_closed * 60)).one()
        if oldest is None:
            return []
        have = set(conn.execute(select(RollupPack.kind, RollupPack.hour).where(
            RollupPack.hour >= oldest // 60, RollupPack.hour < last_closed)).all())
    return [(kind, hour) for hour in range(newest // 60, oldest // 60 - 1, -1) for kind in PACK_KINDS
            if (kind, hour) not in have]


def refresh(engine: Engine, now_ns: int | None = None, limit: int | None = None,
            verify_after_s: float = VERIFY_AFTER_S, progress=None, wait_for_writes: bool = True) -> int:
    """Verify the packs due, delete those past the horizon, then pack missing closed hours (at
    most ``limit``, newest first). Returns how many were built. ``progress``: called with
    (done, total) after each. ``wait_for_writes``: skip hours written less than
    ``CHANGE_MARGIN_S`` ago (verification would drop their packs; a bulk fill or import
    writes every hour at once): a later tick packs them."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    verify(engine, now_ns, verify_after_s)
    with engine.begin() as conn:  # hours past the horizon are no longer read: not kept either
        conn.execute(delete(RollupPack).where(RollupPack.hour < (now_ns - int(HORIZON_S * NS)) // (3600 * NS)))
    todo = missing_hours(engine, now_ns)
    if wait_for_writes and todo:
        with engine.connect() as conn:
            recent = changes_since(conn, time.time_ns() - CHANGE_MARGIN_S * NS, READ_AT_MOST)
        if recent is None:  # (more writes in the last minute than that: wait for them all)
            return 0
        todo = [(kind, hour) for kind, hour in todo
                if not any(a <= hour * 60 + 59 and b >= hour * 60 for a, b in recent)]
    todo = todo[:limit]
    for i, (kind, hour) in enumerate(todo):
        build(engine, kind, hour)
        if progress is not None:
            progress(i + 1, len(todo))
    return len(todo)


def pack_everything(engine: Engine, progress=None) -> int:
    """Pack every hour that holds rollups, verified at once: for a store nothing else writes
    to (the benchmarks' stores, filled and settled in one go). Returns how many were built."""
    with engine.connect() as conn:
        newest = conn.execute(select(func.max(Rollup.minute))).scalar()
    if newest is None:
        return 0
    # "now" as if every hour of the data had closed; the horizon back from the data's end.
    built = refresh(engine, now_ns=(newest // 60 + 1) * 3600 * NS + int(LAG_S * NS), progress=progress,
                    wait_for_writes=False)
    with engine.begin() as conn:  # (nothing else writes: no write can have raced a build)
        conn.execute(update(RollupPack).values(verified=True))
    return built


class PackSchedule:
    """Called from the settler's loop: every ``every_s`` seconds, ``refresh`` (at most
    ``PACKS_PER_TICK`` packs a tick). ``every_s`` 0 turns it off."""

    def __init__(self, engine: Engine, every_s: float = EVERY_S) -> None:
        self.engine, self.every_s = engine, every_s
        self._every = Every(every_s)

    def maybe_run(self, now: float | None = None, now_ns: int | None = None) -> int:
        """Pack what is due; returns how many hours were packed. ``now``: monotonic seconds,
        ``now_ns``: the wall clock that decides which hours are closed (default: the time)."""
        if not self._every.due(now):
            return 0
        try:
            return refresh(self.engine, now_ns=now_ns, limit=PACKS_PER_TICK)
        except Exception:  # noqa: BLE001 - a cache: settling goes on without it
            log.exception("packing rollups failed")
            return 0


__all__ = ["Columns", "PACK_KINDS", "PackCache", "PackSchedule", "build", "columns_of_rows", "concat", "decode", "encode",
           "merge", "pack_everything", "read", "refresh", "select_rows", "sort_rows", "take", "verify"]
