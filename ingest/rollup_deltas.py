"""Rollup deltas: a settled trace's contributions added to (or, on a re-settle, taken back
from) the minute, quarter-hour and hourly rollups in one transaction."""

from __future__ import annotations

import numpy as np
from sqlalchemy import Connection, delete

from ..models import HourlyRollup, QuarterRollup, Rollup, sketch
from ..models.dialect import keys_clause, rows_with_keys, supports_skip_locked, update_many, write_many

# A rollup row's values, as ``_apply_tier`` writes them after its key.
_VALUES = ["count", "error_count", "sum_ns", "sketch"]
# One record a contribution, as a trace row stores them (``traces.contributions``).
CONTRIB_DTYPE = np.dtype([("series", "<i4"), ("minute", "<i4"), ("value", "<i8"), ("err", "u1")])


def unpack_contributions(blob: bytes | None) -> np.ndarray:
    """A trace's stored ``contributions`` blob as records of ``CONTRIB_DTYPE``."""
    return np.frombuffer(blob, dtype=CONTRIB_DTYPE) if blob else np.zeros(0, CONTRIB_DTYPE)


def apply_contributions(conn: Connection, series: np.ndarray, minutes: np.ndarray,
                        values: np.ndarray, errs: np.ndarray, signs: np.ndarray) -> int:
    """Add (sign +1) or subtract (-1) histogram entries to the minute, quarter-hour and
    hourly rollups, in the caller's transaction; returns minute rows touched.

    Every tier takes the same deltas, so an hour (a quarter) is always exactly the sum of its minutes,
    a late span's re-settle included (minute rows past MODALSCOPE_MINUTE_ROLLUP_DAYS are
    gone by then, and a delta for a missing row with nothing to add creates nothing).
    """
    touched = _apply_tier(conn, Rollup, "minute", series, minutes, values, errs, signs)
    _apply_tier(conn, QuarterRollup, "quarter", series, minutes // 15, values, errs, signs)
    _apply_tier(conn, HourlyRollup, "hour", series, minutes // 60, values, errs, signs)
    return touched


def _apply_tier(conn: Connection, model, time_col: str, series: np.ndarray, minutes: np.ndarray,
                values: np.ndarray, errs: np.ndarray, signs: np.ndarray) -> int:
    """``apply_contributions`` for one table: ``minutes`` holds that table's time unit."""
    if len(series) == 0:
        return 0
    group = (series.astype(np.int64) << 32) | minutes.astype(np.int64)
    keys = sketch.keys_of(values)
    # Per (series, minute): count, errors and sum deltas.
    uniq, inv = np.unique(group, return_inverse=True)
    d_count = np.bincount(inv, weights=signs, minlength=len(uniq)).astype(np.int64)
    d_err = np.bincount(inv, weights=signs * errs, minlength=len(uniq)).astype(np.int64)
    d_sum = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(d_sum, inv, signs.astype(np.int64) * values.astype(np.int64))

    pairs = [(int(g & 0xFFFFFFFF), int(g >> 32)) for g in uniq]  # (minute or hour, series_id)
    existing: dict[tuple[int, int], dict] = {}
    lock = supports_skip_locked(conn)
    for i in range(0, len(pairs), 400):
        chunk = sorted(pairs[i : i + 400])
        for r in rows_with_keys(conn, model.__table__, time_col, chunk, lock=lock):
            existing[(r[time_col], r["series_id"])] = r
    # Each row's new sketch: its stored entries and the deltas, summed per key, in one pass
    # over every row of the batch (a dense 4,096-bucket array a row cost most of a settle).
    n = len(pairs)
    count = d_count.copy()
    err = d_err.copy()
    total = d_sum.copy()
    stored = np.zeros(n, dtype=bool)
    old_g: list[np.ndarray] = []
    old_k: list[np.ndarray] = []
    old_c: list[np.ndarray] = []
    for gi, key in enumerate(pairs):
        old = existing.get(key)
        if old is None:
            continue
        stored[gi] = True
        ok, oc = sketch.decode(old["sketch"])
        old_g.append(np.full(len(ok), gi, dtype=np.int64))
        old_k.append(ok)
        old_c.append(oc)
        count[gi] += old["count"]
        err[gi] += old["error_count"]
        total[gi] += old["sum_ns"]
    # (the stored entries, then one +1 or -1 a contribution, each at its row and bucket key)
    entry = (np.concatenate(old_g + [inv.astype(np.int64)]) * sketch.NUM_KEYS
             + np.concatenate(old_k + [keys]).astype(np.int64))
    entries, entry_inv = np.unique(entry, return_inverse=True)  # by row, then key
    summed = np.zeros(len(entries), dtype=np.int64)
    np.add.at(summed, entry_inv, np.concatenate(old_c + [signs.astype(np.int64)]).astype(np.int64))
    kept = summed > 0  # (a count taken below zero is clipped to none)
    pairs_of_rows = np.empty((int(kept.sum()), 2), dtype="<i4")
    pairs_of_rows[:, 0] = entries[kept] % sketch.NUM_KEYS
    pairs_of_rows[:, 1] = summed[kept]
    blob = pairs_of_rows.tobytes()
    ends = np.searchsorted(entries[kept] // sketch.NUM_KEYS, np.arange(n + 1)) * 8  # 8 bytes an entry
    inserts: list[tuple] = []
    updates: list[tuple] = []
    deletes = []
    for gi, (minute, sid) in enumerate(pairs):
        c = int(count[gi])
        values = (max(c, 0), max(int(err[gi]), 0), max(int(total[gi]), 0), blob[ends[gi] : ends[gi + 1]])
        if not stored[gi]:
            if c > 0:
                inserts.append((minute, sid, *values))
        elif c <= 0:
            deletes.append((minute, sid))
        else:
            updates.append((*values, minute, sid))
    write_many(conn, model.__table__, [time_col, "series_id", *_VALUES], inserts)
    update_many(conn, model.__table__, _VALUES, [time_col, "series_id"], updates)
    for i in range(0, len(deletes), 400):
        conn.execute(delete(model).where(keys_clause(conn, model.__table__, time_col, deletes[i : i + 400])))
    return len(pairs)
