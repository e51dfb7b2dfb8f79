"""Retention: raw spans for ``MODALSCOPE_RETENTION_DAYS``, minute rollups for
``MODALSCOPE_MINUTE_ROLLUP_DAYS``, hourly rollups for ``MODALSCOPE_ROLLUP_RETENTION_DAYS``;
then the series no rollup row is left for.

Deletes run in bounded batches, each its own short transaction with a pause after it, so
receivers and the dashboard keep going while a week of spans is pruned: on SQLite a batch
holds the write lock for milliseconds, on PostgreSQL it locks only the rows it deletes.
The settler runs ``prune`` every ``PRUNE_INTERVAL_SECONDS``; ``modalscope db prune`` runs it
on demand (cron, or after lowering a retention setting).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Engine, delete, exists, func, select

from ..core.every import Every
from ..models import changes
from ..models.dialect import keys_clause, upsert
from ..models import (MINUTE_BOUNDARY_CURSOR, Cursor, HourlyRollup, LinkWait, PairCall, QuarterRollup, Rollup,
                      Series, Span, Trace)
from ..durations import DAY_NS as NS_PER_DAY, HOUR_NS, MINUTE_NS

log = logging.getLogger(__name__)

PRUNE_INTERVAL_SECONDS = 600.0
BATCH_ROWS = 5_000
PAUSE_SECONDS = 0.02
TICK_BUDGET_SECONDS = 5.0  # longest a scheduled pass holds the settler's loop


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each kind of row lives, in days; 0 keeps that kind forever."""

    span_days: float = 7.0
    minute_rollup_days: float = 2.0
    hourly_rollup_days: float = 90.0

    @classmethod
    def from_settings(cls, settings) -> "RetentionPolicy":
        return cls(settings.retention_days, settings.minute_rollup_days, settings.rollup_retention_days)


@dataclass
class PruneResult:
    spans: int = 0
    traces: int = 0
    minute_rollups: int = 0
    quarter_rollups: int = 0
    hourly_rollups: int = 0
    series: int = 0

    def total(self) -> int:
        return (self.spans + self.traces + self.minute_rollups + self.quarter_rollups + self.hourly_rollups
                + self.series)


def cutoffs(policy: RetentionPolicy, now_ns: int) -> dict[str, int | None]:
    """Pure: the oldest value kept per table (span/trace start ns, minute, hour); None = keep all."""
    def before(days: float) -> int | None:
        return None if days <= 0 else now_ns - int(days * NS_PER_DAY)

    span_ns = before(policy.span_days)
    minute_ns = before(policy.minute_rollup_days)
    hour_ns = before(policy.hourly_rollup_days)
    return {
        "span_start_ns": span_ns,
        "minute": None if minute_ns is None else minute_ns // MINUTE_NS,
        "hour": None if hour_ns is None else hour_ns // HOUR_NS,
    }


def _batched(engine: Engine, select_keys, delete_keys, batch: int, pause: float,
             should_stop: Callable[[], bool], progress: Callable[[int], None] | None) -> int:
    """Repeat "select up to ``batch`` keys, delete them" in short transactions until none is
    left; ``delete_keys(conn, keys)`` gives the statements that delete them."""
    done = 0
    while True:  # one batch at least, then as long as nobody asks to stop
        with engine.begin() as conn:
            keys = [tuple(r) if len(r) > 1 else r[0] for r in conn.execute(select_keys.limit(batch))]
            if not keys:
                break
            for stmt in delete_keys(conn, keys):
                conn.execute(stmt)
        done += len(keys)
        if progress is not None:
            progress(len(keys))
        if len(keys) < batch or should_stop():
            break
        time.sleep(pause)  # let receivers' commits and readers in between batches
    return done


def _delete_keyed(conn, model, time_col: str, keys: list[tuple[int, int]]) -> list:
    """Statements deleting rollup rows by (time, series) key, 400 keys each
    (``dialect.keys_clause``: on SQLite a row-value IN scans the whole table per batch)."""
    return [delete(model).where(keys_clause(conn, model.__table__, time_col, keys[i : i + 400]))
            for i in range(0, len(keys), 400)]


def prune(engine: Engine, policy: RetentionPolicy, *, now_ns: int | None = None, batch: int = BATCH_ROWS,
          pause: float = PAUSE_SECONDS, should_stop: Callable[[], bool] = lambda: False,
          progress: Callable[[int], None] | None = None) -> PruneResult:
    """Delete what ``policy`` no longer keeps, oldest first, ``batch`` rows a transaction."""
    cut = cutoffs(policy, time.time_ns() if now_ns is None else now_ns)
    out = PruneResult()
    if cut["span_start_ns"] is not None:
        c = cut["span_start_ns"]
        # Trace rows first (settled ones only: a pending trace is still being folded in),
        # so a late span of a pruned trace starts a new trace instead of re-settling a
        # trace whose other spans are gone.
        out.traces = _batched(
            engine,
            select(Trace.trace_id).where(Trace.start_ns < c, Trace.pending.is_(False)).order_by(Trace.start_ns),
            lambda conn, ids: [delete(Trace).where(Trace.trace_id.in_(ids))],
            batch, pause, should_stop, progress)
        out.spans = _batched(
            engine,
            select(Span.id).where(Span.start_ns < c).order_by(Span.start_ns),
            # a span's pair_calls row shares its id (the primary key of both)
            lambda conn, ids: [delete(PairCall).where(PairCall.span_row.in_(ids)), delete(Span).where(Span.id.in_(ids))],
            batch, pause, should_stop, progress)
        # Consumers still waiting for a linked span: their own spans are gone now.
        _batched(
            engine,
            select(LinkWait.consumer_trace_id).where(LinkWait.since_ns < c).order_by(LinkWait.since_ns),
            lambda conn, ids: [delete(LinkWait).where(LinkWait.consumer_trace_id.in_(ids))],
            batch, pause, should_stop, None)
    if cut["minute"] is not None:
        # Record the boundary first: readers answer windows before it from hourly rows
        # (a window that started there would otherwise see half-deleted minutes).
        _record_minute_boundary(engine, cut["minute"])
        out.minute_rollups = _batched(
            engine,
            select(Rollup.minute, Rollup.series_id).where(Rollup.minute < cut["minute"]).order_by(Rollup.minute),
            lambda conn, keys: _delete_keyed(conn, Rollup, "minute", keys),
            batch, pause, should_stop, progress)
        # Quarter hours live as long as minutes (a chart reads them only where minutes are kept).
        out.quarter_rollups = _batched(
            engine,
            select(QuarterRollup.quarter, QuarterRollup.series_id).where(QuarterRollup.quarter < cut["minute"] // 15)
            .order_by(QuarterRollup.quarter),
            lambda conn, keys: _delete_keyed(conn, QuarterRollup, "quarter", keys),
            batch, pause, should_stop, progress)
    if cut["hour"] is not None:
        out.hourly_rollups = _batched(
            engine,
            select(HourlyRollup.hour, HourlyRollup.series_id).where(HourlyRollup.hour < cut["hour"])
            .order_by(HourlyRollup.hour),
            lambda conn, keys: _delete_keyed(conn, HourlyRollup, "hour", keys),
            batch, pause, should_stop, progress)
    if any(c is not None for c in cut.values()):
        out.series = _prune_series(engine, batch, pause, should_stop, progress)
    if out.spans or out.traces or out.minute_rollups:
        # Findings cached for a window that old lost their raw spans or minute rollups.
        # (Hourly rollups: the detectors do not read them.)
        span_minute = cut["span_start_ns"] // MINUTE_NS if cut["span_start_ns"] is not None else 0
        last = max(span_minute, cut["minute"] or 0)
        with engine.begin() as conn:
            changes.record(conn, 0, last)
    if out.total():
        log.info("retention: deleted %d spans, %d traces, %d minute and %d hourly rollup rows, %d series",
                 out.spans, out.traces, out.minute_rollups, out.hourly_rollups, out.series)
    return out


def _unused_series(below_id: int):
    """Series with no rollup row in any tier and no call: their data is past retention (or
    never was). Checked again by the DELETE itself, so a series a settler wrote to since
    the select survives."""
    return (Series.id < below_id,
            ~exists().where(HourlyRollup.series_id == Series.id),
            ~exists().where(Rollup.series_id == Series.id),
            ~exists().where(QuarterRollup.series_id == Series.id),
            ~exists().where(PairCall.series_id == Series.id))


def _prune_series(engine: Engine, batch: int, pause: float, should_stop: Callable[[], bool],
                  progress: Callable[[int], None] | None) -> int:
    """Delete series no rollups hang off any more, so names seen once (a typo, a hostile
    client) do not outlive retention as filter options and cap slots. The newest series is
    kept: SQLite would hand its id out again, and a trace's stored contributions or a
    rollup pack may still name it. A settler holding a pruned id in its cache fails its
    batch on the foreign key, forgets the cache and retries (``settle.settle``)."""
    with engine.connect() as conn:
        top = conn.execute(select(func.max(Series.id))).scalar()
    if top is None:
        return 0
    cond = _unused_series(top)
    return _batched(engine, select(Series.id).where(*cond).order_by(Series.id),
                    lambda conn, ids: [delete(Series).where(Series.id.in_(ids), *cond)],
                    batch, pause, should_stop, progress)


def _record_minute_boundary(engine: Engine, minute: int) -> None:
    with engine.begin() as conn:
        current = conn.execute(select(Cursor.position).where(Cursor.name == MINUTE_BOUNDARY_CURSOR)).scalar()
        if current is not None and current >= minute:
            return
        conn.execute(upsert(conn, Cursor.__table__, ["name"], ["position", "updated_ns"]),
                     {"name": MINUTE_BOUNDARY_CURSOR, "position": minute, "holder": None, "lease_expires_ns": 0,
                      "updated_ns": time.time_ns(), "info": None})


class PruneSchedule:
    """Runs ``prune`` at most every ``interval`` seconds from a loop that ticks often (the settler's)."""

    def __init__(self, engine: Engine, policy: RetentionPolicy | None, interval: float = PRUNE_INTERVAL_SECONDS,
                 first_after: float = 60.0, budget: float = TICK_BUDGET_SECONDS, batch: int = BATCH_ROWS,
                 backlog_pause: float = 1.0) -> None:
        """``backlog_pause``: seconds between two ticks' batches while a backlog lasts."""
        self.engine = engine
        self.backlog_pause = backlog_pause
        self.batch = batch
        self.policy = policy
        self.interval = interval
        self.budget = budget
        self._every = Every(interval, first_after)

    def tick(self, should_stop: Callable[[], bool] = lambda: False) -> PruneResult | None:
        """Prune for at most ``budget`` seconds when due; a backlog (a week of spans after
        retention is first turned on) continues at the next tick, so settling, which runs
        in the same loop, is never held up for long."""
        if self.policy is None or not self._every.due():
            return None
        deadline = time.monotonic() + self.budget
        stopped = False

        def stop() -> bool:
            # Asked only after a full batch: a table stopped here may hold more past retention.
            nonlocal stopped
            stopped = stopped or should_stop() or time.monotonic() > deadline
            return stopped

        try:
            result = prune(self.engine, self.policy, batch=self.batch, should_stop=stop)
        except Exception:  # noqa: BLE001 - retention retries at the next interval; ingest goes on
            log.exception("retention pass failed")
            self._every.again_in(self.interval)
            return None
        # A backlog only when a table was stopped with a full batch behind it (a pass that
        # finished every table just past its budget is done: an interval until the next).
        self._every.again_in(self.backlog_pause if stopped else self.interval)
        return result


__all__ = ["PruneResult", "PruneSchedule", "RetentionPolicy", "cutoffs", "prune"]
