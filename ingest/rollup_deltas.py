"""Rollup deltas: a settled trace's contributions added to (or, on a re-settle, taken back
from) the minute and hourly rollups in one transaction."""

from __future__ import annotations

import numpy as np
from sqlalchemy import Connection, bindparam, delete

from ..models import HourlyRollup, Rollup, sketch
from ..models.dialect import keys_clause, rows_with_keys, supports_skip_locked

# One record a contribution, as a trace row stores them (``traces.contributions``).
CONTRIB_DTYPE = np.dtype([("series", "<i4"), ("minute", "<i4"), ("value", "<i8"), ("err", "u1")])


def unpack_contributions(blob: bytes | None) -> np.ndarray:
    """A trace's stored ``contributions`` blob as records of ``CONTRIB_DTYPE``."""
    return np.frombuffer(blob, dtype=CONTRIB_DTYPE) if blob else np.zeros(0, CONTRIB_DTYPE)


def apply_contributions(conn: Connection, series: np.ndarray, minutes: np.ndarray,
                        values: np.ndarray, errs: np.ndarray, signs: np.ndarray) -> int:
    """Add (sign +1) or subtract (-1) histogram entries to the minute and hourly
    rollups, in the caller's transaction; returns minute rows touched.

    Every tier takes the same deltas, so an hour is always exactly the sum of its minutes,
    a late span's re-settle included (minute rows past MODALSCOPE_MINUTE_ROLLUP_DAYS are
    gone by then, and a delta for a missing row with nothing to add creates nothing).
    """
    touched = _apply_tier(conn, Rollup, "minute", series, minutes, values, errs, signs)
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
    # Per (series, minute, bucket): count deltas.
    cell = inv.astype(np.int64) * sketch.NUM_KEYS + keys
    cells, cell_inv = np.unique(cell, return_inverse=True)
    cell_counts = np.bincount(cell_inv, weights=signs, minlength=len(cells)).astype(np.int64)
    cell_group = cells // sketch.NUM_KEYS
    cell_key = cells % sketch.NUM_KEYS
    bounds = np.searchsorted(cell_group, np.arange(len(uniq) + 1))

    pairs = [(int(g & 0xFFFFFFFF), int(g >> 32)) for g in uniq]  # (minute or hour, series_id)
    existing: dict[tuple[int, int], dict] = {}
    lock = supports_skip_locked(conn)
    for i in range(0, len(pairs), 400):
        chunk = sorted(pairs[i : i + 400])
        for r in rows_with_keys(conn, model.__table__, time_col, chunk, lock=lock):
            existing[(r[time_col], r["series_id"])] = r
    inserts = []
    updates = []
    deletes = []
    for gi, (minute, sid) in enumerate(pairs):
        ks = cell_key[bounds[gi] : bounds[gi + 1]]
        cs = cell_counts[bounds[gi] : bounds[gi + 1]]
        old = existing.get((minute, sid))
        if old is None:
            dense = np.zeros(sketch.NUM_KEYS, dtype=np.int64)
            count, err, total = 0, 0, 0
        else:
            dense = np.zeros(sketch.NUM_KEYS, dtype=np.int64)
            ok, oc = sketch.decode(old["sketch"])
            dense[ok] = oc
            count, err, total = old["count"], old["error_count"], old["sum_ns"]
        np.add.at(dense, ks, cs)
        np.clip(dense, 0, None, out=dense)
        count += int(d_count[gi])
        err += int(d_err[gi])
        total += int(d_sum[gi])
        row = {time_col: minute, "series_id": sid, "count": max(count, 0), "error_count": max(err, 0),
               "sum_ns": max(total, 0), "sketch": sketch.encode_dense(dense)}
        if old is None:
            if count > 0:
                inserts.append(row)
        elif count <= 0:
            deletes.append((minute, sid))
        else:
            updates.append(row)
    if inserts:
        conn.execute(model.__table__.insert(), inserts)
    if updates:
        t = model.__table__

        conn.execute(
            t.update()
            .where(t.c[time_col] == bindparam("b_time"), t.c.series_id == bindparam("b_series_id"))
            .values(count=bindparam("count"), error_count=bindparam("error_count"),
                    sum_ns=bindparam("sum_ns"), sketch=bindparam("sketch")),
            [{"b_time": u[time_col], "b_series_id": u["series_id"], "count": u["count"],
              "error_count": u["error_count"], "sum_ns": u["sum_ns"], "sketch": u["sketch"]} for u in updates],
        )
    for i in range(0, len(deletes), 400):
        conn.execute(delete(model).where(keys_clause(conn, model.__table__, time_col, deletes[i : i + 400])))
    return len(pairs)
