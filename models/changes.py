"""The rollup change log (table ``rollup_changes``): which minutes each write to the rollups
touched, and when. Writers (a settle batch, a retention pass, a retag) call ``record`` inside
their own transaction; ``changed_since`` tells a cached result computed from some minutes
whether any of them has been rewritten since.
"""

from __future__ import annotations

import time

from sqlalchemy import Connection, case, delete, exists, select, update

from ..durations import NS as _NS
from . import RollupChange, RollupPack

#: Change rows are kept this long (and a result cached from the rollups is trusted at most
#: this long after it was computed): the oldest are deleted as new ones are written.
KEEP_S = 86_400
_LAST_MINUTE = 2**62  # past any minute a span can start in
#: A write logged up to this long before a result was computed from the rollups may still have
#: been in flight (a settle batch stamps its change before it commits, and hosts' clocks
#: differ): the cached findings (``app/evaluations.py``) and hour packs (``models/packs.py``)
#: count it as newer.
CHANGE_MARGIN_S = 60
#: Change rows ``changes_since`` callers read at once (about an hour of settle batches).
READ_AT_MOST = 10_000


#: A write logged within this long of an earlier one over minutes near it is merged into that
#: row (its range widened to both, its stamp moved on) instead of adding one: a busy settler
#: commits a batch or two a second over the same live minutes, ~170,000 rows a day, and a
#: question about an evaluation an hour old scanned every row since (dozens of such questions
#: an evaluation). Merged, live traffic logs a row every ``MERGE_SPAN_MINUTES`` or so. A merged
#: row says "changed" for a little more than was (never less): a cached result is recomputed
#: a little more often, never kept wrongly.
MERGE_S = 10
#: The widest range (minutes) a merged row may reach: late spans of hours ago stay a row of
#: their own, and live minutes start a new row as time moves on.
MERGE_SPAN_MINUTES = 10


def record(conn: Connection, first_minute: int, last_minute: int, now_ns: int | None = None) -> None:
    """Log a write to the rollups of minutes ``[first_minute, last_minute]`` (call it in the
    transaction that writes them, after the write; merged into a recent row over nearby
    minutes, ``MERGE_S``), drop rows older than ``KEEP_S``, and delete the hour packs of those
    minutes."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    first_minute, last_minute = int(first_minute), int(last_minute)
    conn.execute(delete(RollupChange).where(RollupChange.changed_ns < now_ns - KEEP_S * _NS))
    if not _merge(conn, first_minute, last_minute, now_ns):
        conn.execute(RollupChange.__table__.insert().values(
            first_minute=first_minute, last_minute=last_minute, changed_ns=now_ns))
    # The hour packs of those minutes are stale now (models/packs.py: the settler rebuilds them).
    conn.execute(delete(RollupPack).where(RollupPack.hour >= first_minute // 60, RollupPack.hour <= last_minute // 60))


def record_everything(conn: Connection) -> None:
    """Log a write to every minute (a retag changed what every rollup means): every cached
    result is stale."""
    record(conn, 0, _LAST_MINUTE)


def _merge(conn: Connection, first_minute: int, last_minute: int, now_ns: int) -> bool:
    """Widen a row logged in the last ``MERGE_S`` whose range joined with this one spans at
    most ``MERGE_SPAN_MINUTES``, and stamp it now; False when there is none."""
    rc = RollupChange
    recent = rc.changed_ns >= now_ns - MERGE_S * _NS
    for row_id, a, b in conn.execute(select(rc.id, rc.first_minute, rc.last_minute).where(recent)
                                     .order_by(rc.id.desc()).limit(8)):
        if max(b, last_minute) - min(a, first_minute) > MERGE_SPAN_MINUTES:
            continue
        # (least/greatest in SQL: another settler may have widened the row since the read)
        done = conn.execute(update(rc).where(rc.id == row_id, recent).values(
            first_minute=case((rc.first_minute < first_minute, rc.first_minute), else_=first_minute),
            last_minute=case((rc.last_minute > last_minute, rc.last_minute), else_=last_minute),
            changed_ns=case((rc.changed_ns > now_ns, rc.changed_ns), else_=now_ns)))
        if done.rowcount:
            return True
    return False


#: Minutes a write touched that lie this far apart are logged as separate changes (a settle
#: batch holding one late trace from hours ago and the live ones would otherwise mark every
#: hour between them changed: the hour packs and cached findings of those hours with it).
RUN_GAP_MINUTES = 60


def record_minutes(conn: Connection, minutes, now_ns: int | None = None) -> None:
    """``record`` the runs of ``minutes`` (any order, repeats allowed) no more than
    ``RUN_GAP_MINUTES`` apart, each as one change."""
    ordered = sorted({int(m) for m in minutes})
    if not ordered:
        return
    first = last = ordered[0]
    for m in ordered[1:]:
        if m - last > RUN_GAP_MINUTES:
            record(conn, first, last, now_ns)
            first = m
        last = m
    record(conn, first, last, now_ns)


def changed_since(conn: Connection, since_ns: int, first_minute: int, last_minute: int) -> bool:
    """Whether a write logged at or after ``since_ns`` touched any minute of
    ``[first_minute, last_minute]`` (true as well when ``since_ns`` is older than the log)."""
    if since_ns < time.time_ns() - KEEP_S * _NS:
        return True
    rc = RollupChange
    return bool(conn.execute(select(exists().where(
        rc.changed_ns >= since_ns, rc.first_minute <= last_minute, rc.last_minute >= first_minute))).scalar())


def changes_since(conn: Connection, since_ns: int, at_most: int) -> list[tuple[int, int]] | None:
    """``(first_minute, last_minute)`` of every write logged at or after ``since_ns`` (one
    read for many ``changed_since`` questions); None when there are more than ``at_most`` or
    ``since_ns`` is older than the log (``changed_since`` then says every minute changed)."""
    if since_ns < time.time_ns() - KEEP_S * _NS:
        return None
    rc = RollupChange
    rows = conn.execute(select(rc.first_minute, rc.last_minute).where(rc.changed_ns >= since_ns)
                        .limit(at_most + 1)).all()
    return None if len(rows) > at_most else [(a, b) for a, b in rows]


__all__ = ["CHANGE_MARGIN_S", "KEEP_S", "MERGE_S", "MERGE_SPAN_MINUTES", "READ_AT_MOST", "RUN_GAP_MINUTES", "changed_since", "changes_since", "record", "record_everything", "record_minutes"]
