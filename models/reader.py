"""The read side of the store, behind one small interface (Jaeger's SpanReader idea).

Readers take typed query objects and return plain rows; all statistics are computed from
those rows by pure functions in ``modalscope.app.queries``. Percentiles never come from
raw spans here: ``rollups`` returns merged histograms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import functools
import json as _json
import logging
import re
import time

import orjson

import numpy as np

from sqlalchemy import BigInteger, Connection, Engine, String, and_, bindparam, func, literal, null, or_, select, union_all
from sqlalchemy.orm import aliased

from . import (MINUTE_BOUNDARY_CURSOR, PAIR_CALLS_CURSOR, Cursor, HourlyRollup, PairCall, QuarterRollup, Rollup,
               Series, Span, Trace)
from . import packs
from .buckets import MAX_BUCKET, duration_bucket
from .dialect import contains_text_in, index_by_bitmap, one_of, plan_for_parameters
from .engine import BINARY_RESULTS
from .sketch import Histogram, merge_blobs

log = logging.getLogger(__name__)

NS_PER_MINUTE = 60_000_000_000


@dataclass(frozen=True)
class Filters:
    """Filters that narrow any query; None means "any"."""

    service: str | None = None
    caller: str | None = None
    callee: str | None = None
    stage: str | None = None
    input_type: str | None = None
    # A pair's model (the series' ``name``: a model call's requested model, '' otherwise).
    model: str | None = None


# Pair series written before they carried the calling span's stage have '' there: every
# call was a CLIENT span then, counted as network.
PAIR_STAGE_BEFORE = ""


@dataclass(frozen=True)
class RollupQuery:
    kind: str  # op | pair | trace | tstage
    start_ns: int
    end_ns: int
    filters: Filters = field(default_factory=Filters)
    group_by: tuple[str, ...] = ()  # series dimensions to keep apart
    by_minute: bool = False


@dataclass
class RollupGroup:
    key: tuple[str, ...]  # values of group_by (plus the minute when by_minute)
    count: int
    error_count: int
    sum_ns: int
    histogram: Histogram


def minute_range(start_ns: int, end_ns: int) -> tuple[int, int]:
    """Minutes whose start lies in [start, end): a span belongs to a window by its start."""
    first = -(-start_ns // NS_PER_MINUTE)
    last = -(-end_ns // NS_PER_MINUTE)  # exclusive
    return first, last


@dataclass(frozen=True)
class TierPlan:
    """Which rollup rows answer a window: minute rows for the ragged edges, quarter-hour
    rows for the whole quarters of those edges, hourly rows for the whole hours between
    (minute ranges ``[m0, m1)``, quarter ranges ``[q0, q1)``, hours ``[h0, h1)``)."""

    minute_ranges: tuple[tuple[int, int], ...]
    hours: tuple[int, int]
    quarter_ranges: tuple[tuple[int, int], ...] = ()


def _split_quarters(first: int, last: int) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """Minutes ``[first, last)`` as (edge minute ranges, whole quarters ``[q0, q1)`` or None)."""
    q0, q1 = -(-first // 15), last // 15
    if q1 <= q0:
        return [(first, last)], None
    edges = []
    if first < q0 * 15:
        edges.append((first, q0 * 15))
    if q1 * 15 < last:
        edges.append((q1 * 15, last))
    return edges, (q0, q1)


def tier_plan(start_ns: int, end_ns: int, minutes_kept_from: int | None = None, *, hours: bool = True) -> TierPlan:
    """Pure: split the window's minutes ``minute_range(start, end)`` into whole hours, whole
    quarter hours at the edges and edge minutes: a day ending at 13:07 reads 23 hours, at
    most 6 quarters and 28 minutes a series instead of up to 118 minutes. ``hours=False``
    stops at quarters (15- and 30-minute chart steps). ``minutes_kept_from`` is the oldest
    minute whose minute rows are still kept (MODALSCOPE_MINUTE_ROLLUP_DAYS; quarter rows go
    with them); an edge older than that is answered by its whole hour instead, so old
    windows are rounded outwards to hours."""
    first, last = minute_range(start_ns, end_ns)
    if last <= first:
        return TierPlan((), (0, 0))
    h0 = -(-first // 60)  # first whole hour
    h1 = last // 60  # hours [h0, h1) lie wholly inside
    edges: list[tuple[int, int]] = []
    if not hours or h1 <= h0:
        if hours and minutes_kept_from is not None and first < minutes_kept_from:
            return TierPlan((), (first // 60, (last - 1) // 60 + 1))
        edges.append((first, last))
        h0 = h1 = 0
    else:
        if first < h0 * 60:
            if minutes_kept_from is not None and first < minutes_kept_from:
                h0 -= 1
            else:
                edges.append((first, h0 * 60))
        if h1 * 60 < last:
            if minutes_kept_from is not None and h1 * 60 < minutes_kept_from:
                h1 += 1
            else:
                edges.append((h1 * 60, last))
    minutes: list[tuple[int, int]] = []
    quarters: list[tuple[int, int]] = []
    for a, b in edges:
        m, q = _split_quarters(a, b)
        minutes.extend(m)
        if q is not None:
            quarters.append(q)
    return TierPlan(tuple(minutes), (h0, h1), tuple(quarters))


def plan_tiers(plan: TierPlan) -> list[tuple[type, int, int]]:
    """``(model, t0, t1)`` per rollup table range of a plan, in that table's time unit
    (minutes, quarter hours, hours)."""
    tiers: list[tuple[type, int, int]] = [(Rollup, m0, m1) for m0, m1 in plan.minute_ranges]
    tiers += [(QuarterRollup, q0, q1) for q0, q1 in plan.quarter_ranges]
    h0, h1 = plan.hours
    if h1 > h0:
        tiers.append((HourlyRollup, h0, h1))
    return tiers


#: Each rollup table's time column, and the expression that gives a row's first minute.
#: (Statements are shared between threads and engines: SQLAlchemy compiles them per dialect.)
_TIER_TIME = {Rollup: (Rollup.minute, Rollup.minute),
              QuarterRollup: (QuarterRollup.quarter, QuarterRollup.quarter * 15),
              HourlyRollup: (HourlyRollup.hour, HourlyRollup.hour * 60)}
#: The minutes retention boundary (``StoreReader._minutes_kept_from``) as a subquery.
_KEPT_FROM = select(Cursor.position).where(Cursor.name == MINUTE_BOUNDARY_CURSOR).scalar_subquery()
#: Rollup tier ranges read by one ``UNION ALL`` (a window has at most five: two ragged
#: minute edges, two quarter-hour runs and its hours; the detectors' minute rows between
#: packed hours can have more).
TIERS_PER_STATEMENT = 8
#: Evenly spaced stretches a sampled ``subject_spans`` read takes from its window.
SUBJECT_CLUSTERS = 12
#: Services a stage's spans may come from for ``subject_spans`` to walk their span indexes
#: (more: the window is scanned through start_ns).
STAGE_WALK_SERVICES = 8
#: Traces whose root spans one statement looks up (two bound values each: a statement's
#: values stay well under SQLite's 32,766).
ROOTS_PER_STATEMENT = 2_000


@functools.cache
def _tier_statement(models: tuple[type, ...], sketches: bool):
    """``(minute, count, error_count, sum_ns, sketch or NULL, series_id)`` of the series
    ``ids`` over ``[t0_i, t1_i)`` of each rollup table ``models[i]``, one ``UNION ALL``
    built once a shape: building and compiling a select each time cost more than SQLite's
    own read of a short window (an hour's cache rates: ~0.4 of 2.8 ms was SQLite's), and on
    PostgreSQL each tier was a round trip of its own."""
    ids = bindparam("ids", expanding=True)
    parts = []
    for i, model in enumerate(models):
        time_col, minute_expr = _TIER_TIME[model]
        parts.append(select(minute_expr.label("minute"), model.count, model.error_count, model.sum_ns,
                            (model.sketch if sketches else null()).label("sketch"), model.series_id)
                     .where(model.series_id.in_(ids), time_col >= bindparam(f"t0_{i}"),
                            time_col < bindparam(f"t1_{i}")))
    return parts[0] if len(parts) == 1 else union_all(*parts)


def _merge(rows) -> list[RollupGroup]:
    """Group (key, count, errors, sum, sketch blob) rows; one vectorised histogram merge a group."""
    acc: dict[tuple, list] = {}
    for key, count, errs, total, blob in rows:
        a = acc.get(key)
        if a is None:
            a = acc[key] = [0, 0, 0, []]
        a[0] += count
        a[1] += errs
        a[2] += total
        a[3].append(blob)
    return [RollupGroup(k, c, e, t, merge_blobs(b)) for k, (c, e, t, b) in acc.items()]


class StoreReader:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Reads on PostgreSQL run in autocommit: under READ COMMITTED each statement takes its
        # own snapshot anyway, and a transaction costs two more round trips a checkout (its
        # BEGIN and the pool's ROLLBACK; an hour's /api/v1/cache at 1 M: 7.6 -> 3.6 ms).
        # The same pool; ``engine`` itself is untouched for the callers that write through it.
        self._reads = (engine.execution_options(isolation_level="AUTOCOMMIT")
                       if engine.dialect.name == "postgresql" else engine)
        self._remembered: dict[Any, tuple[float, Any]] = {}
        self.pack_cache = packs.PackCache()  # decoded hour packs kept between reads

    def _recent(self, key: Any, read) -> Any:
        """``read()``, or its value from at most ``REMEMBER_S`` ago: for facts about the whole
        store that only choose a plan or are conservative when stale (an exemplar search
        asked each a statement and a connection a look-up: 28 of 64 ms for nine findings'
        look-ups on PostgreSQL). The app shares one reader between requests and threads; a
        race reads twice, no more."""
        now = time.monotonic()
        hit = self._remembered.get(key)
        if hit is not None and now - hit[0] < REMEMBER_S:
            return hit[1]
        value = read()
        self._remembered[key] = (now, value)
        return value

    @staticmethod
    def _minutes_kept_from(conn) -> int | None:
        """The oldest minute whose minute rollups retention keeps (it records the boundary
        when it prunes; MODALSCOPE_MINUTE_ROLLUP_DAYS): windows before it are answered
        from hourly rows. One primary-key lookup; None when nothing was ever pruned."""
        return conn.execute(select(Cursor.position).where(Cursor.name == MINUTE_BOUNDARY_CURSOR)).scalar()

    # -- rollups ----------------------------------------------------------------------
    def _series_filter(self, kind: str, f: Filters):
        conds = [Series.kind == kind]
        if kind == "pair":
            if f.service:
                conds.append(or_(Series.caller == f.service, Series.callee == f.service))
        elif f.service:
            conds.append(Series.service == f.service)
        if f.caller and kind == "pair":
            conds.append(Series.caller == f.caller)
        if f.callee and kind == "pair":
            conds.append(Series.callee == f.callee)
        if f.stage and kind in ("op", "tstage"):
            conds.append(Series.stage == f.stage)
        if f.stage and kind == "pair":
            # the calling span's stage
            conds.append(Series.stage.in_((f.stage, PAIR_STAGE_BEFORE)) if f.stage == "network"
                         else Series.stage == f.stage)
        if f.model and kind == "pair":
            conds.append(Series.name == f.model)
        if f.input_type:
            conds.append(Series.input_type == f.input_type)
        return and_(*conds)

    def _series_rows(self, conn, where, cols: list, tiers, sketches: bool = True) -> list[tuple]:
        """``(minute, count, error_count, sum_ns, sketch, *cols)`` rows of the series matching
        ``where`` from each ``(model, t0, t1)`` tier (``plan_tiers``): the series
        first, then their rows through the ``(series_id, time)`` index. A join lets SQLite walk
        the time range of every series of every kind instead (a day: 331k rows read for 33k
        wanted). ``sketches`` False: ``sketch`` is None (the blobs are most of what is read)."""
        series = conn.execute(select(Series.id, *cols).where(where)).fetchall()
        return self._rows_of_series(conn, {r[0]: tuple(r[1:]) for r in series}, tiers, sketches)

    @staticmethod
    def _series_and_kept_from(conn, where, cols: list) -> tuple[dict[int, tuple], int | None]:
        """The series matching ``where`` (``{id: cols}``) and, from the same statement,
        the retention boundary ``_minutes_kept_from`` reads (a round trip less a tiered read
        on PostgreSQL; an uncorrelated subquery, evaluated once). With no series the
        boundary is read by itself."""
        rows = conn.execute(select(Series.id, *cols, _KEPT_FROM.label("kept_from")).where(where)).fetchall()
        if not rows:
            return {}, StoreReader._minutes_kept_from(conn)
        return {r[0]: tuple(r[1:-1]) for r in rows}, rows[0][-1]

    @staticmethod
    def _rows_of_series(conn, dims: dict[int, tuple], tiers, sketches: bool = True) -> list[tuple]:
        """``(minute, count, error_count, sum_ns, sketch, *dims[id])`` rows of the series
        ``dims`` names, from each ``(model, t0, t1)`` tier."""
        if not dims:
            return []
        ids = list(dims)
        rows: list[tuple] = []
        # A few tiers a statement: each repeats the ids, and a week's ragged minute ranges
        # between packed hours can be dozens (SQLite binds at most 32,766 values a statement).
        for j in range(0, len(tiers), TIERS_PER_STATEMENT):
            part = tiers[j : j + TIERS_PER_STATEMENT]
            stmt = _tier_statement(tuple(model for model, _, _ in part), sketches)
            bounds = {}
            for k, (_, t0, t1) in enumerate(part):
                bounds[f"t0_{k}"], bounds[f"t1_{k}"] = t0, t1
            for i in range(0, len(ids), 500):
                rows.extend(r[:5] + dims[r[5]] for r in _raw_rows(conn, stmt, {"ids": ids[i : i + 500], **bounds}))
        return rows

    def _minute_rows(self, q: RollupQuery) -> tuple[int, list[tuple]]:
        """(first minute, minute rows of the query's series) for its window."""
        first, last = minute_range(q.start_ns, q.end_ns)
        with self._reads.connect() as conn:
            return first, self._series_rows(conn, self._series_filter(q.kind, q.filters),
                                            [getattr(Series, d) for d in q.group_by],
                                            [(Rollup, first, last)])

    def _quarter_rows(self, q: RollupQuery) -> list[tuple] | None:
        """``(minute, ...)`` rows covering the window: quarter-hour rows (minute = the
        quarter's first) for its whole quarters, minute rows at its edges; None when the
        window reaches before the minutes retention keeps (quarters go with them)."""
        first, _ = minute_range(q.start_ns, q.end_ns)
        with self._reads.connect() as conn:
            series, kept = self._series_and_kept_from(conn, self._series_filter(q.kind, q.filters),
                                                      [getattr(Series, d) for d in q.group_by])
            if kept is not None and first < kept:
                return None
            plan = tier_plan(q.start_ns, q.end_ns, hours=False)
            return self._rows_of_series(conn, series, plan_tiers(plan))

    def minutes_kept_from(self) -> int | None:
        """The oldest minute whose minute (and quarter-hour) rollups retention keeps; None
        when nothing was ever pruned."""
        with self._reads.connect() as conn:
            return self._minutes_kept_from(conn)

    def tier_rows(self, kind: str, plan: TierPlan, dims: tuple[str, ...], filters: Filters | None = None,
                  sketches: bool = True) -> list[tuple]:
        """``(minute, count, error_count, sum_ns, sketch, *dims)`` rows of a ``tier_plan``:
        minute, quarter-hour and hourly rows, each row's minute the first of its minute,
        quarter or hour (``sketches`` False: None for the blob)."""
        with self._reads.connect() as conn:
            return self._series_rows(conn, self._series_filter(kind, filters or Filters()),
                                     [getattr(Series, d) for d in dims], plan_tiers(plan), sketches=sketches)

    def tier_rows_of_kinds(self, kinds: dict[str, tuple[str, ...]], plan_for, sketches: bool = True
                           ) -> tuple[TierPlan | None, dict[str, list[tuple]]]:
        """``tier_rows`` of several series kinds (``{kind: dims}``) over one connection, with
        the plan ``plan_for(minutes_kept_from)`` chooses (None: no rows read): the series of
        every kind with the retention boundary, then all their rows: two statements. On
        PostgreSQL each connection checked out costs a ping and a rollback, and each
        statement a round trip: the cache view's two kinds read apart took ~11 round trips,
        most of an hour's answer."""
        cols = sorted({d for dims in kinds.values() for d in dims})
        at = {d: i for i, d in enumerate(cols)}
        with self._reads.connect() as conn:
            series, kept = self._series_and_kept_from(conn, Series.kind.in_(list(kinds)),
                                                      [Series.kind, *[getattr(Series, d) for d in cols]])
            plan = plan_for(kept)
            if plan is None:
                return None, {}
            # Each row keeps its kind first, then that kind's own dims.
            dims = {sid: (r[0], *(r[1 + at[d]] for d in kinds[r[0]])) for sid, r in series.items()}
            out: dict[str, list[tuple]] = {kind: [] for kind in kinds}
            for r in self._rows_of_series(conn, dims, plan_tiers(plan), sketches):
                out[r[5]].append(r[:5] + r[6:])
            return plan, out

    def _tiered_rows(self, kind: str, filters: Filters, start_ns: int, end_ns: int, cols: list) -> list[tuple]:
        """``(minute, count, error_count, sum_ns, sketch, *cols)`` rows covering the window:
        minute and quarter-hour rows at the edges, hourly rows (minute = the hour's first) in
        between."""
        with self._reads.connect() as conn:
            series, kept = self._series_and_kept_from(conn, self._series_filter(kind, filters), cols)
            plan = tier_plan(start_ns, end_ns, kept)
            return self._rows_of_series(conn, series, plan_tiers(plan))

    def rollups(self, q: RollupQuery) -> list[RollupGroup]:
        """Merge rollup rows per group (and minute, with by_minute).

        Without ``by_minute`` the window's whole hours come from the hourly tier: a day
        merges 24 rows a series instead of 1,440.
        """
        if q.by_minute:
            _, rows = self._minute_rows(q)
            return _merge((tuple(r[5:]) + (r[0],), r[1], r[2], r[3], r[4]) for r in rows)
        rows = self._tiered_rows(q.kind, q.filters, q.start_ns, q.end_ns, [getattr(Series, d) for d in q.group_by])
        return _merge((tuple(r[5:]), r[1], r[2], r[3], r[4]) for r in rows)

    # -- raw spans --------------------------------------------------------------------
    def trace_spans(self, trace_id: str) -> list[dict]:
        stmt = select(Span.__table__).where(Span.trace_id == trace_id).order_by(Span.start_ns, Span.id)
        with self._reads.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def trace_row(self, trace_id: str) -> dict | None:
        with self._reads.connect() as conn:
            cols = [Trace.__table__.c[c] for c in _TRACE_COLUMNS]
            row = conn.execute(select(*cols).where(Trace.trace_id == trace_id)).mappings().first()
            return None if row is None else dict(row)

    def counts(self) -> dict[str, int]:
        from sqlalchemy import func

        with self._reads.connect() as conn:
            return {
                "spans": conn.execute(select(func.count()).select_from(Span)).scalar_one(),
                "traces": conn.execute(select(func.count()).select_from(Trace)).scalar_one(),
                "pending_traces": conn.execute(
                    select(func.count()).select_from(Trace).where(Trace.pending.is_(True))
                ).scalar_one(),
            }

    # -- dashboard readers ---------------------------------------------------
    def rollup_steps(self, q: RollupQuery, step_minutes: int) -> list[RollupGroup]:
        """Like ``rollups(by_minute=True)`` but merged per ``step_minutes``: key = group_by + (step start minute,).

        A week at one-minute resolution would be 10,080 dense histograms per group; a step
        keeps a time chart at ~100 points whatever the window.
        """
        step = max(1, int(step_minutes))
        if step % 60 == 0:
            # Whole-hour steps on an hour-aligned grid: whole hours come from the hourly tier.
            rows = self._tiered_rows(q.kind, q.filters, q.start_ns, q.end_ns, [getattr(Series, d) for d in q.group_by])
            return _merge((tuple(r[5:]) + (r[0] - r[0] % step,), r[1], r[2], r[3], r[4]) for r in rows)
        if step % 15 == 0:
            # Steps of whole quarter hours on a quarter-aligned grid: whole quarters from the
            # quarter-hour tier, the window's ragged edges from minutes.
            rows = self._quarter_rows(q)
            if rows is not None:
                return _merge((tuple(r[5:]) + (r[0] - r[0] % step,), r[1], r[2], r[3], r[4]) for r in rows)
        first, rows = self._minute_rows(q)
        return _merge((tuple(r[5:]) + (r[0] - (r[0] - first) % step,), r[1], r[2], r[3], r[4]) for r in rows)

    def series_values(self) -> dict[str, list]:
        """Known dimension values for filter pickers: services, (caller, callee) pairs, stages, input types."""
        stmt = select(Series.kind, Series.service, Series.stage, Series.input_type, Series.caller,
                      Series.callee).distinct()
        services: set[str] = set()
        pairs: set[tuple[str, str]] = set()
        stages: set[str] = set()
        input_types: set[str] = set()
        with self._reads.connect() as conn:
            for kind, service, stage, input_type, caller, callee in conn.execute(stmt):
                if kind == "pair":
                    pairs.add((caller, callee))
                    services.update((caller, callee))
                elif service:
                    services.add(service)
                if stage:
                    stages.add(stage)
                if input_type:
                    input_types.add(input_type)
        return {"services": sorted(services), "pairs": sorted(pairs), "stages": sorted(stages),
                "input_types": sorted(input_types)}

    def op_histograms(self, start_ns: int, end_ns: int, ops: Iterable[tuple[str, str]],
                      input_type: str | None = None) -> dict[tuple[str, str], RollupGroup]:
        """Merged ``op`` histograms per (service, span name), over every stage and input type
        (or one ``input_type``): "P97 for vit.forward" ranks a span against these."""
        from sqlalchemy import tuple_

        wanted = sorted(set(ops))
        out: dict[tuple[str, str], RollupGroup] = {}
        if not wanted:
            return out
        rows: list[tuple] = []
        with self._reads.connect() as conn:
            plan = tier_plan(start_ns, end_ns, self._minutes_kept_from(conn))
            for table, t0, t1 in plan_tiers(plan):
                time_col = _TIER_TIME[table][0]
                for i in range(0, len(wanted), 200):
                    chunk = wanted[i : i + 200]
                    conds = [Series.kind == "op", tuple_(Series.service, Series.name).in_(chunk),
                             time_col >= t0, time_col < t1]
                    if input_type:
                        conds.append(Series.input_type == input_type)
                    stmt = (
                        select(Series.service, Series.name, table.count, table.error_count, table.sum_ns, table.sketch)
                        .join(Series, Series.id == table.series_id)
                        .where(*conds)
                    )
                    rows.extend(((service, name), count, errs, total, blob)
                                for service, name, count, errs, total, blob in conn.execute(stmt))
        return {g.key: g for g in _merge(rows)}

    def slow_spans(self, q: SpanQuery) -> list[dict]:
        """Spans matching ``q``, slowest first (then earliest), ``limit`` from ``offset``.

        A short window is read through the ``start_ns`` index and sorted. A long one would
        sort millions of spans, so when the service is known (``service``, or the candidate
        ``services``) each service's duration buckets are walked downwards through the
        ``(service, duration_bucket, start_ns, duration_ns)`` index, each bucket's spans in
        the window sorted, stopping at ``offset + limit``. With ``input_type`` the trace row
        is joined.
        """
        services = [q.service] if q.service else list(q.services)
        if not services or not self._long_window(Span, q.start_ns, q.end_ns, SPAN_WALK_SHARE):
            return self._slow_spans_in_window(q)
        wanted = q.offset + q.limit
        rows: list[dict] = []
        for service in services:
            rows.extend(self._walk_buckets(q, service, wanted))
        rows.sort(key=lambda r: (-r["duration_ns"], r["start_ns"], r["_id"]))
        out = rows[q.offset : q.offset + q.limit]
        for r in out:
            del r["_id"]
        return out

    def _walk_buckets(self, q: SpanQuery, service: str, wanted: int) -> list[dict]:
        """``service``'s ``wanted`` slowest spans matching ``q``: bucket by bucket downwards
        (every span of a bucket is slower than every span below it, so the rows come out in
        order), each step one look-up for the next bucket holding any of its spans."""
        floor = duration_bucket(q.min_ns) if q.min_ns is not None else 0
        below = duration_bucket(q.max_ns) + 1 if q.max_ns is not None else MAX_BUCKET + 1
        rows: list[dict] = []
        with self._reads.connect() as conn:
            while len(rows) < wanted:
                bucket = conn.execute(select(func.max(Span.duration_bucket)).where(
                    Span.service == service, Span.duration_bucket < below)).scalar()
                if bucket is None or bucket < floor:
                    break
                rows.extend(self._slow_spans_in_window(q, by_duration_of=service, bucket=bucket,
                                                       limit=wanted - len(rows), conn=conn))
                below = bucket
        return rows

    def _slow_spans_in_window(self, q: SpanQuery, by_duration_of: str | None = None, bucket: int | None = None,
                              limit: int | None = None, conn: Connection | None = None) -> list[dict]:
        cols = [Span.__table__.c[c] for c in _CANDIDATE_COLUMNS]
        if by_duration_of is not None:
            # One duration bucket of the service, its window read through the walk index.
            conds = [Span.service == by_duration_of, Span.duration_bucket == bucket,
                     Span.start_ns >= q.start_ns, Span.start_ns < q.end_ns]
            cols.append(Span.id.label("_id"))
        else:
            conds = [Span.start_ns >= q.start_ns, Span.start_ns < q.end_ns]
        if q.kind is not None:
            conds.append(Span.kind == q.kind)
        if q.service and by_duration_of is None:
            # "|| ''" keeps the planner on the start_ns index for a short window: walking a
            # busy service's duration index would visit days of spans to fill one hour.
            conds.append(Span.service.concat("") == q.service)
        if q.stage:
            conds.append(_stage_is(q.stage))
        if q.may_call is not None:
            child = aliased(Span)
            # The callee's SERVER/CONSUMER spans starting around the window, read once (not
            # one look-up per walked span): their parent ids, matched by span id only (64
            # random bits; the caller checks each row exactly). A short window reads them
            # through start_ns ("|| ''" keeps the planner off the service index, which would
            # visit every span the callee ever had), a long one through the service index.
            lo = q.start_ns - CALLEE_SKEW_NS
            hi = q.end_ns + (q.max_ns if q.max_ns is not None else CALLEE_LATE_NS) + CALLEE_SKEW_NS
            callee = child.service if by_duration_of is not None else child.service.concat("")
            if q.min_ns is None:
                calls = Span.span_id.in_(select(child.parent_span_id).where(
                    callee == q.may_call, child.kind.in_(CALLEE_KIND_CODES), child.start_ns >= lo,
                    child.start_ns < hi))
            else:
                # A latency band already bounds the walk to the calls above it: one look-up a
                # walked span, through its trace, costs less than reading all of the callee's.
                calls = select(child.id).where(
                    child.trace_id == Span.trace_id, child.parent_span_id == Span.span_id,
                    child.service.concat("") == q.may_call, child.kind.in_(CALLEE_KIND_CODES)).exists()
            conds.append(or_(self._named_in_attributes(q.may_call), calls))
        if q.model:
            conds.append(self._of_model(q.model))
        if q.min_ns is not None:
            conds.append(Span.duration_ns >= q.min_ns)
        if q.max_ns is not None:
            conds.append(Span.duration_ns <= q.max_ns)
        stmt = select(*cols)
        if q.input_type:
            stmt = stmt.join(Trace, Trace.trace_id == Span.trace_id)
            conds.append(Trace.input_type == q.input_type)
        stmt = stmt.where(*conds).order_by(Span.duration_ns.desc(), Span.start_ns, Span.id)
        stmt = stmt.limit(q.limit).offset(q.offset) if limit is None else stmt.limit(limit)
        if conn is not None:
            return [dict(r) for r in conn.execute(stmt).mappings()]
        with self._reads.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def _long_window(self, model, start_ns: int, end_ns: int, share: int) -> bool:
        """Is the window long enough, against what the table holds, that walking a duration
        index slowest first beats sorting the window? Yes when it covers at least 1/``share``
        of the stored time range (two index lookups, remembered ``REMEMBER_S``: either answer
        is exact, only the plan differs): the walk then visits about ``share`` index entries
        per row it keeps."""
        lo, hi = self._recent(("time range", model.__tablename__), lambda: self._time_range(model))
        if lo is None:
            return False
        return (end_ns - start_ns) * share >= (hi - lo)

    def _time_range(self, model) -> tuple[int | None, int | None]:
        with self._reads.connect() as conn:
            # Two scalar subqueries: SQLite answers a lone min() or max() from the index's ends,
            # but min() and max() in one SELECT scan the whole index (0.5 s at 10M spans).
            # A trace row written before its trace settles starts at 0: not part of the range
            # (with ingest running, every day-long window looked short and was sorted: 315 ms).
            return tuple(conn.execute(select(select(func.min(model.start_ns)).where(model.start_ns > 0).scalar_subquery(),
                                             select(func.max(model.start_ns)).scalar_subquery())).one())

    def services_of(self, kind: str, filters: Filters) -> list[str]:
        """Services that have ``kind`` series matching ``filters`` (for a pair: the callers):
        the candidates an exemplar search walks when no service is named."""
        with self._reads.connect() as conn:
            return self._services_in(conn, kind, filters)

    def _services_in(self, conn: Connection, kind: str, filters: Filters) -> list[str]:
        """``services_of`` over a connection the caller already holds."""
        col = Series.caller if kind == "pair" else Series.service
        stmt = select(col).where(self._series_filter(kind, filters)).distinct()
        return sorted(v for v in conn.execute(stmt).scalars() if v)

    def callee_children(self, parents: Iterable[tuple[str, str]]) -> list[dict]:
        """SERVER/CONSUMER children of the given (trace_id, span_id) spans (found through the
        ``(trace_id, span_id)`` unique index's trace_id prefix)."""
        parents = list(parents)
        out: list[dict] = []
        if not parents:
            return out
        by_trace: dict[str, set[str]] = {}
        for tid, sid in parents:
            by_trace.setdefault(tid, set()).add(sid)
        tids = sorted(by_trace)
        cols = [Span.__table__.c[c] for c in _CANDIDATE_COLUMNS]
        with self._reads.connect() as conn:
            for i in range(0, len(tids), 300):
                chunk = tids[i : i + 300]
                stmt = select(*cols).where(Span.trace_id.in_(chunk), Span.kind.in_(CALLEE_KIND_CODES),
                                           Span.parent_span_id.is_not(None))
                for r in conn.execute(stmt).mappings():
                    if r["parent_span_id"] in by_trace.get(r["trace_id"], ()):
                        out.append(dict(r))
        return out

    def spans_by_id(self, keys: Iterable[tuple[str, str]]) -> list[dict]:
        """The spans with the given (trace_id, span_id) (candidate columns), through the
        ``(trace_id, span_id)`` unique index: the parents a pair check needs."""
        by_trace: dict[str, set[str]] = {}
        for tid, sid in keys:
            by_trace.setdefault(tid, set()).add(sid)
        out: list[dict] = []
        if not by_trace:
            return out
        cols = [Span.__table__.c[c] for c in _CANDIDATE_COLUMNS]
        tids = sorted(by_trace)
        with self._reads.connect() as conn:
            for i in range(0, len(tids), 300):
                chunk = tids[i : i + 300]
                sids = sorted({sid for tid in chunk for sid in by_trace[tid]})
                stmt = select(*cols).where(Span.trace_id.in_(chunk), Span.span_id.in_(sids))
                out.extend(dict(r) for r in conn.execute(stmt).mappings() if r["span_id"] in by_trace[r["trace_id"]])
        return out

    # -- a pair's calls (pair_calls, written by the settler) ----------------------------
    def pair_calls_complete_from(self) -> int:
        """The span start (ns) from which ``pair_calls`` holds every settled call: 0 for a
        store created with it, later for one upgraded to it (see migration 0005). Remembered
        ``REMEMBER_S``: it only moves back (to 0 when ``retag`` rebuilds the table), so a stale
        answer sends a search to the raw spans, never to an incomplete table."""
        def read() -> int:
            with self._reads.connect() as conn:
                return int(conn.execute(select(Cursor.position).where(Cursor.name == PAIR_CALLS_CURSOR)).scalar() or 0)
        return self._recent("pair calls from", read)

    def slow_calls(self, filters: Filters, start_ns: int, end_ns: int, *, min_ns: int | None = None,
                   max_ns: int | None = None, limit: int = 20) -> tuple[list[dict], bool]:
        """Settled calls of the pair series matching ``filters`` (caller, callee, service,
        input type) starting in the window, slowest first (then earliest): the span rows
        (candidate columns and ``_id``), at most ``limit``. Each series walks the
        ``(series_id, duration_ns, start_ns)`` index slowest first; the walks are merged.
        The flag says whether more rows may exist beyond ``limit``."""
        with self._reads.connect() as conn:
            series_ids = conn.execute(select(Series.id).where(self._series_filter("pair", filters))).scalars().all()
            picked: list[tuple[int, int, int]] = []
            more = False
            for sid in series_ids:
                conds = [PairCall.series_id == sid, PairCall.start_ns >= start_ns, PairCall.start_ns < end_ns]
                if min_ns is not None:
                    conds.append(PairCall.duration_ns >= min_ns)
                if max_ns is not None:
                    conds.append(PairCall.duration_ns <= max_ns)
                got = conn.execute(
                    select(PairCall.duration_ns, PairCall.start_ns, PairCall.span_row).where(*conds)
                    .order_by(PairCall.duration_ns.desc(), PairCall.start_ns, PairCall.span_row).limit(limit)
                ).all()
                more = more or len(got) == limit  # that series may have more
                picked.extend(tuple(r) for r in got)
            # The slowest `limit` of all are among each series' slowest `limit`: exact.
            picked.sort(key=lambda r: (-r[0], r[1], r[2]))
            more = more or len(picked) > limit
            picked = picked[:limit]
            cols = [Span.__table__.c[c] for c in _CANDIDATE_COLUMNS] + [Span.id.label("_id")]
            by_id: dict[int, dict] = {}
            ids = [r[2] for r in picked]
            for i in range(0, len(ids), 500):
                for r in conn.execute(select(*cols).where(Span.id.in_(ids[i : i + 500]))).mappings():
                    by_id[r["_id"]] = dict(r)
        # A row retention deleted between the two reads has no span: skipped.
        return [by_id[r[2]] for r in picked if r[2] in by_id], more

    def pending_calls(self, start_ns: int, end_ns: int, services: Iterable[str] = (), *,
                      input_type: str | None = None, min_ns: int | None = None, max_ns: int | None = None,
                      may_call: str | None = None, stage: str | None = None, model: str | None = None,
                      max_traces: int = 20_000) -> list[dict] | None:
        """CLIENT spans starting in the window of traces not settled yet (their calls are
        not in ``pair_calls``), of ``services`` when given, of traces whose row has
        ``input_type`` when given, narrowed to the spans that may call ``may_call`` as the
        raw-span search narrows them (a child span of that service, or the name in the
        attributes; the caller checks each row exactly), of ``stage`` and of calls that may be
        of ``model`` when given; None when more than ``max_traces``
        traces would be read one by one (a backlog: search the raw spans instead).

        Pending traces that begin after the window are skipped (``first_start_ns``). The
        rest are read through the span index of ``services`` from the earliest of them on
        (a walk over duration buckets: its cost follows the callers' spans that slow since
        then, not every span of every pending trace), when that reads few index entries a
        trace; the earliest-starting few (stragglers whose spans would widen the walk) and
        traces whose first start is not known are read one by one."""
        services = list(services)
        with self._reads.connect() as conn:
            rows = conn.execute(select(Trace.trace_id, Trace.first_start_ns).where(
                Trace.pending.is_(True), or_(Trace.first_start_ns.is_(None), Trace.first_start_ns < end_ns))).all()
            known = sorted((first, tid) for tid, first in rows if first is not None)
            one_by_one = [tid for tid, first in rows if first is None]
            walk_from = None
            if services and len(known) > PENDING_WALK_AFTER:
                cut = int(len(known) * PENDING_STRAGGLER_SHARE)
                walk_from = known[cut][0]
                budget = (len(known) - cut) * PENDING_WALK_ENTRIES_PER_TRACE
                # each caller's buckets between the bounds, looked up once for the count and the walk
                buckets = {s: self._walk_bucket_list(conn, s, min_ns, max_ns) for s in services}
                if self._walk_entries(conn, buckets, max(start_ns, walk_from), end_ns, min_ns, max_ns,
                                      budget) > budget:
                    walk_from, cut = None, len(known)  # pending traces sparse among the window's: one by one
                one_by_one.extend(tid for _, tid in known[:cut])
            else:
                one_by_one.extend(tid for _, tid in known)
            if len(one_by_one) > max_traces:
                return None
            extra = ([_stage_is(stage)] if stage else []) + ([self._of_model(model)] if model else [])
            out = self._pending_calls_one_by_one(conn, sorted(one_by_one), start_ns, end_ns, services,
                                                 input_type=input_type, min_ns=min_ns, max_ns=max_ns, may_call=may_call,
                                                 extra=extra)
            if walk_from is not None:
                seen = {r["_id"] for r in out}
                walked = {tid for first, tid in known if first >= walk_from}
                out.extend(r for r in self._pending_calls_walk(conn, buckets, walk_from, start_ns, end_ns,
                                                               input_type=input_type, min_ns=min_ns, max_ns=max_ns,
                                                               may_call=may_call, extra=extra)
                           if r["trace_id"] in walked and r["_id"] not in seen)
        return out

    def _walk_bucket_list(self, conn: Connection, service: str, min_ns: int | None, max_ns: int | None) -> list[int]:
        """The duration buckets a walk of ``service``'s spans between the bounds visits: from
        its fastest stored span's bucket to its slowest's (two index look-ups). Each bucket
        is a seek of the walk, and a service's spans fill a few dozen of the ~260 (below its
        fastest, a walk without ``min_ns`` sought every empty bucket down to 0)."""
        mine = Span.service == service
        low, top = conn.execute(select(select(func.min(Span.duration_bucket)).where(mine).scalar_subquery(),
                                       select(func.max(Span.duration_bucket)).where(mine).scalar_subquery())).one()
        if top is None:
            return []
        if min_ns is not None:
            low = max(low, duration_bucket(min_ns))
        high = min(top, duration_bucket(max_ns)) if max_ns is not None else top
        return list(range(low, high + 1))

    @staticmethod
    def _walk_conds(service: str, buckets: list[int], lo: int, end_ns: int, min_ns: int | None,
                    max_ns: int | None) -> list:
        """``service``'s spans starting in [lo, end) between the bounds, as the walk index's key
        reads them (service, each bucket, the start range; the duration from the entry)."""
        conds = [Span.service == service, Span.duration_bucket.in_(buckets), Span.start_ns >= lo,
                 Span.start_ns < end_ns]
        if min_ns is not None:
            conds.append(Span.duration_ns >= min_ns)
        if max_ns is not None:
            conds.append(Span.duration_ns <= max_ns)
        return conds

    def _walk_entries(self, conn: Connection, buckets: dict[str, list[int]], lo: int, end_ns: int,
                      min_ns: int | None, max_ns: int | None, budget: int) -> int:
        """How many index entries a walk of the services' spans (service -> its buckets)
        starting in [lo, end) between the bounds reads, counted in the index alone and only up
        to ``budget`` + 1."""
        total = 0
        for service, theirs in buckets.items():
            if not theirs:
                continue
            conds = self._walk_conds(service, theirs, lo, end_ns, min_ns, max_ns)
            inner = select(literal(1).label("one")).where(*conds).limit(budget + 1 - total).subquery()
            total += conn.execute(select(func.count()).select_from(inner)).scalar_one()
            if total > budget:
                break
        return total

    def _named_in_attributes(self, may_call: str):
        """Spans whose text may name ``may_call`` as settling names an uninstrumented callee
        (``traces.trace_calls``): plain substring tests on the attributes and signals JSON,
        true for a superset (the caller checks each row exactly):

        * the name itself (``peer.service``, ``server.address``, a URL's ``host:port``);
        * for ``host:port``, the host alone (the port is a separate attribute; an IPv6
          literal is bracketed only in the name);
        * a URL's host, lower-cased by the settler: case-folded, in spans with a URL key;
        * a model call's provider, as the signals store it (lower-cased), and in spans
          stored before signals were (their provider is read from the attributes).

        Always true when JSON would write a needle differently (then no narrowing by text)."""
        dialect = self.engine.dialect.name
        hosts = [may_call]
        port = _PORT_SUFFIX.match(may_call)
        if port:
            host = port.group(1)
            hosts.append(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        conds = []
        for needle in dict.fromkeys(hosts):
            if not needle or _json.dumps(needle, ensure_ascii=False)[1:-1] != needle:
                return literal(True)
            conds.append(contains_text_in(dialect, Span.attributes, needle))
        lower = hosts[-1]
        if lower == lower.lower():
            urls = or_(*(contains_text_in(dialect, Span.attributes, f'"{k}"') for k in _URL_KEYS))
            conds.append(and_(urls, contains_text_in(dialect, func.lower(Span.attributes, type_=String()), lower)))
            conds.append(contains_text_in(dialect, Span.signals, '"provider":' + orjson.dumps(may_call).decode()))
            conds.append(and_(Span.signals.is_(None), or_(*(contains_text_in(dialect, Span.attributes, f'"{k}')
                                                           for k in _PROVIDER_KEY_PREFIXES))))
        return or_(*conds)

    def _of_model(self, model: str):
        """Spans that may be calls of ``model``: the signals name it (``"model":...``), or a
        span stored before signals were names it in its attributes (the caller checks
        each row exactly)."""
        dialect = self.engine.dialect.name
        in_signals = contains_text_in(dialect, Span.signals, '"model":' + orjson.dumps(model).decode())
        named = _json.dumps(model, ensure_ascii=False)[1:-1]
        legacy = contains_text_in(dialect, Span.attributes, named) if named == model else literal(True)
        return or_(in_signals, and_(Span.signals.is_(None), legacy))

    @staticmethod
    def _candidate_calls(conn: Connection, conds: list, input_type: str | None) -> list[dict]:
        """Candidate CLIENT span rows (with ``_id``) matching ``conds``, of traces whose row has
        ``input_type`` when given."""
        stmt = select(*[Span.__table__.c[c] for c in _CANDIDATE_COLUMNS], Span.id.label("_id"))
        if input_type:
            stmt = stmt.join(Trace, Trace.trace_id == Span.trace_id)
            conds = [*conds, Trace.input_type == input_type]
        return [dict(r) for r in conn.execute(stmt.where(*conds)).mappings()]

    def _pending_calls_walk(self, conn: Connection, buckets: dict[str, list[int]], walk_from: int, start_ns: int,
                            end_ns: int, *, input_type: str | None, min_ns: int | None, max_ns: int | None,
                            may_call: str | None, extra: list = ()) -> list[dict]:
        """CLIENT spans of the services (service -> its buckets) starting in
        [max(start, walk_from), end) between the bounds, through the walk index bucket by
        bucket (settled traces' ones too: the caller keeps the pending traces')."""
        lo = max(start_ns, walk_from)
        out: list[dict] = []
        narrowed = None
        if may_call is not None:
            # The callee's SERVER/CONSUMER spans since walk_from (every span of a walked trace
            # starts no earlier), read once through its index bucket by bucket: their parent
            # ids (by span id only; the caller checks each row exactly). Or the name in the
            # attributes.
            child = aliased(Span)
            calls = Span.span_id.in_(select(child.parent_span_id).where(
                child.service == may_call, child.duration_bucket.in_(self._walk_bucket_list(conn, may_call, None, None)),
                child.start_ns >= walk_from, child.kind.in_(CALLEE_KIND_CODES)))
            narrowed = or_(self._named_in_attributes(may_call), calls)
        for service, theirs in buckets.items():
            if not theirs:
                continue
            conds = self._walk_conds(service, theirs, lo, end_ns, min_ns, max_ns) + [Span.kind == KIND_CLIENT_CODE,
                                                                                      *extra]
            if narrowed is not None:
                conds.append(narrowed)
            out.extend(self._candidate_calls(conn, conds, input_type))
        return out

    def _pending_calls_one_by_one(self, conn: Connection, tids: list[str], start_ns: int, end_ns: int,
                                  services: list[str], *, input_type: str | None, min_ns: int | None,
                                  max_ns: int | None, may_call: str | None, extra: list = ()) -> list[dict]:
        """``pending_calls`` for the given traces, each trace's spans through the
        ``(trace_id, span_id)`` index."""
        child = aliased(Span)

        def narrowed(chunk: list[str]):
            # The callee's SERVER/CONSUMER spans of these traces, read once: their parent ids
            # (matched by span id only; the caller checks each row exactly). Or the name in
            # the attributes.
            calls = Span.span_id.in_(select(child.parent_span_id).where(
                child.trace_id.in_(chunk), child.service.concat("") == may_call, child.kind.in_(CALLEE_KIND_CODES)))
            return or_(self._named_in_attributes(may_call), calls)
        out: list[dict] = []
        # The other conditions are written so no other index qualifies ("+ 0", "|| ''"):
        # given the choice, SQLite walked a service's or the window's spans instead (2,000
        # pending traces over 24 h at 10 M spans: 69 s).
        start, duration, service = Span.start_ns + 0, Span.duration_ns + 0, Span.service.concat("")
        for i in range(0, len(tids), PENDING_CHUNK):
            chunk = tids[i : i + PENDING_CHUNK]
            conds = [Span.trace_id.in_(chunk), Span.kind == KIND_CLIENT_CODE, start >= start_ns, start < end_ns,
                     *extra]
            if services:
                conds.append(service.in_(services))
            if min_ns is not None:
                conds.append(duration >= min_ns)
            if max_ns is not None:
                conds.append(duration <= max_ns)
            if may_call is not None:
                conds.append(narrowed(chunk))
            out.extend(self._candidate_calls(conn, conds, input_type))
        return out

    def slow_traces(self, start_ns: int, end_ns: int, *, input_type: str | None = None,
                    root_service: str | None = None, min_ns: int | None = None, max_ns: int | None = None,
                    limit: int = 20) -> list[dict]:
        """Settled traces starting in the window, slowest first (the ``traces.start_ns`` index)."""
        cols = [Trace.__table__.c[c] for c in _TRACE_SUMMARY_COLUMNS]
        long_window = self._long_window(Trace, start_ns, end_ns, TRACE_WALK_SHARE)
        if long_window:
            # A long window: walk the duration index slowest first ("+ 0": not the start index).
            # The duration bound (always true) is what makes SQLite's planner take that index.
            conds = [Trace.start_ns + 0 >= start_ns, Trace.start_ns + 0 < end_ns, Trace.settled_ns.is_not(None),
                     Trace.duration_ns >= 0]
        else:
            conds = [Trace.start_ns >= start_ns, Trace.start_ns < end_ns, Trace.settled_ns.is_not(None)]
        if input_type:
            conds.append(Trace.input_type == input_type)
        if root_service:
            conds.append(Trace.root_service == root_service)
        # A short window stays on the start index: "+ 0" keeps a band off the duration index.
        duration = Trace.duration_ns if long_window else Trace.duration_ns + 0
        if min_ns is not None:
            conds.append(duration >= min_ns)
        if max_ns is not None:
            conds.append(duration <= max_ns)
        stmt = select(*cols).where(*conds).order_by(Trace.duration_ns.desc(), Trace.start_ns, Trace.trace_id).limit(limit)
        with self._reads.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def trace_rows(self, trace_ids: Iterable[str]) -> dict[str, dict]:
        """Trace rows (summary columns) by id."""
        ids = sorted(set(trace_ids))
        out: dict[str, dict] = {}
        cols = [Trace.__table__.c[c] for c in _TRACE_SUMMARY_COLUMNS]
        with self._reads.connect() as conn:
            for i in range(0, len(ids), 500):
                for r in conn.execute(select(*cols).where(Trace.trace_id.in_(ids[i : i + 500]))).mappings():
                    out[r["trace_id"]] = dict(r)
        return out

    def attribute_ops(self, key: str, start_ns: int, end_ns: int,
                      sample: int = 50_000) -> list[tuple[str, str, object]]:
        """(service, span name, value) of spans carrying attribute ``key``, among the newest
        ``sample`` spans of the window (a bounded scan: cost independent of the window's size).

        Used to find which operations are ViT layers (``mm.layer``); their numbers then come
        from the ``op`` rollups for the whole window.
        """
        inner = (
            select(Span.service, Span.name, Span.attributes)
            .where(Span.start_ns >= start_ns, Span.start_ns < end_ns)
            .order_by(Span.start_ns.desc())
            .limit(sample)
            .subquery()
        )
        needle = _json.dumps(key)
        stmt = select(inner.c.service, inner.c.name, inner.c.attributes).where(
            inner.c.attributes.contains(needle, autoescape=True))
        found: dict[tuple[str, str], object] = {}
        with self._reads.connect() as conn:
            for service, name, attrs in conn.execute(stmt):
                if (service, name) in found:
                    continue
                try:
                    value = _json.loads(attrs).get(key)
                except (ValueError, AttributeError):
                    continue
                if value is not None:
                    found[(service, name)] = value
        return [(s, n, v) for (s, n), v in sorted(found.items())]

    # -- cache analytics and triage compare ---------------------------
    def cache_spans(self, start_ns: int, end_ns: int, limit: int = 500_000) -> list[tuple]:
        """``(start_ns, attributes JSON, resource JSON)`` of spans starting in the window whose
        attributes carry ``cache.name`` (the window on the ``start_ns`` index, the key as a
        portable substring test; at most ``limit`` rows, newest first)."""
        stmt = (
            select(Span.start_ns, Span.attributes, Span.resource)
            .where(Span.start_ns >= start_ns, Span.start_ns < end_ns,
                   Span.attributes.contains(_json.dumps("cache.name"), autoescape=True))
            .order_by(Span.start_ns.desc())
            .limit(limit)
        )
        with self._reads.connect() as conn:
            return [tuple(r) for r in conn.execute(stmt)]

    def subject_spans(self, start_ns: int, end_ns: int, *, kind: int | None = None, service: str | None = None,
                      stage: str | None = None, input_type: str | None = None, root_only: bool = False,
                      min_ns: int | None = None, limit: int = 100_000, expected: int | None = None,
                      clusters: int = SUBJECT_CLUSTERS) -> list[dict]:
        """Spans starting in the window with their attributes, resource, instance and the
        trace's input type (``trace_id``, ``start_ns``, ``duration_ns``, ``attributes``,
        ``resource``, ``instance``, ``input_type``): the population a Compare ranks attribute
        values over. ``min_ns``: only spans at least that long. Newest first, at most
        ``limit`` rows.

        ``expected``: about how many spans match (from the rollups). When that is more than
        ``limit`` the rows are a sample spread over the window: ``clusters`` evenly spaced
        stretches of it, together about ``limit`` spans long, each read whole — not the
        window's newest minutes only, and a read bounded by ``limit`` rather than by the
        window (a day of one service's spans at ten million a day took 6-17 s to read).
        A service's spans are read through its span index (``ix_spans_duration_walk``),
        whole traces (``root_only``: each trace's root span, the earliest where it has
        several) through the traces table: at most ``limit`` traces."""
        parts = [(start_ns, end_ns)]
        per_part = limit
        if expected is not None and expected > limit and end_ns - start_ns > clusters:
            step = (end_ns - start_ns) / clusters
            width = max(1, int(step * limit / expected))
            parts = [(start_ns + int(i * step), min(end_ns, start_ns + int(i * step) + width))
                     for i in range(clusters - 1, -1, -1)]
            per_part = -(-limit // clusters)
        stmt = (select(Span.trace_id, Span.start_ns, Span.duration_ns, Span.attributes, Span.resource, Span.instance,
                       Trace.input_type)
                .select_from(Span).outerjoin(Trace, Trace.trace_id == Span.trace_id).order_by(Span.start_ns.desc()))
        narrowing = [cond for cond in (Span.duration_ns >= min_ns if min_ns is not None else None,
                                       Span.kind == kind if kind is not None else None,
                                       Span.stage == stage if stage else None,
                                       Trace.input_type == input_type if input_type else None) if cond is not None]
        out: list[dict] = []
        with self.engine.connect() as conn:  # (a transaction: plan_for_parameters' SET LOCAL)
            plan_for_parameters(conn)
            if service:
                walks = {service: self._walk_bucket_list(conn, service, min_ns, None)}
            elif stage and not root_only:
                # A stage's spans come from a few services (the services of its ``op`` series,
                # as the rollups Compare counts from know them): their span indexes, not every
                # service's spans of the window through start_ns (an hour's inference Compare at
                # ten million spans read ~10x the spans it kept). Past a few services the walks'
                # seeks (one a duration bucket a service) cost more than the scan they replace.
                names = self._services_in(conn, "op", Filters(stage=stage))
                walks = ({name: self._walk_bucket_list(conn, name, min_ns, None) for name in names}
                         if len(names) <= STAGE_WALK_SERVICES else None)
            else:
                walks = None
            if walks is not None:
                walks = {name: buckets for name, buckets in walks.items() if buckets}
                if not walks:
                    return []
            if root_only:  # every stretch's traces, then all their root spans in one statement
                traces: list = []
                for lo, hi in parts:
                    wanted = min(per_part, limit - len(traces))
                    if wanted <= 0:
                        break
                    traces.extend(self._slow_traces_in(conn, lo, hi, min_ns, input_type, wanted))
                return self._root_spans(conn, traces, min_ns)[:limit]
            for lo, hi in parts:
                wanted = min(per_part, limit - len(out))
                if wanted <= 0:
                    break
                if walks is None:
                    out.extend(dict(r) for r in conn.execute(
                        stmt.where(Span.start_ns >= lo, Span.start_ns < hi, *narrowing).limit(wanted)).mappings())
                    continue
                # (several services' walks OR-ed in one statement: a statement each cost
                # PostgreSQL its planning and a round trip, 72 for an hour's encoder Compare)
                span_range = or_(*(and_(*self._walk_conds(name, buckets, lo, hi, None, None))
                                   for name, buckets in walks.items()))
                out.extend(dict(r) for r in conn.execute(stmt.where(span_range, *narrowing).limit(wanted)).mappings())
        return out[:limit]

    @staticmethod
    def _slow_traces_in(conn: Connection, lo: int, hi: int, min_ns: int | None, input_type: str | None,
                        limit: int) -> list:
        """``(trace_id, input_type, start_ns)`` of the traces starting in [lo, hi) at least
        ``min_ns`` long, newest first. Settled traces only, as in the rollups Compare's counts
        and threshold come from: a pending trace's row has no start yet."""
        conds = [Trace.start_ns >= lo, Trace.start_ns < hi]
        if min_ns is not None:  # (a root span is at most as long as its trace)
            conds.append(Trace.duration_ns >= min_ns)
        if input_type:
            conds.append(Trace.input_type == input_type)
        return conn.execute(select(Trace.trace_id, Trace.input_type, Trace.start_ns).where(*conds)
                            .order_by(Trace.start_ns.desc()).limit(limit)).all()

    @staticmethod
    def _root_spans(conn: Connection, traces: list, min_ns: int | None) -> list[dict]:
        """``subject_spans`` rows of the root spans of ``traces`` (``_slow_traces_in``'s rows),
        in their order. (The traces first, then their roots: as one join PostgreSQL's planner
        took a parallel scan of the whole traces table for an hour's slow traces: 210 ms.)"""
        if not traces:
            return []
        # A settled trace starts where its root span does (the earliest root: the settler's
        # ``find_root``), so its root is found through the start_ns index, a look-up a trace.
        # By trace id every span of the trace was read to test its parent (~27 a trace at ten
        # million spans: an hour's whole-trace Compare spent 125 of 300 ms there on SQLite).
        # "|| ''" keeps the planner off the trace id index; the ids only confirm each match.
        starts = {(t, s) for t, _, s in traces}
        roots: dict[str, list] = {}
        for i in range(0, len(traces), ROOTS_PER_STATEMENT):
            chunk = traces[i : i + ROOTS_PER_STATEMENT]
            span_conds = [one_of(conn, Span.start_ns, sorted({s for _, _, s in chunk}), BigInteger),
                          Span.parent_span_id.is_(None),
                          one_of(conn, Span.trace_id.concat(""), [t for t, _, _ in chunk], String)]
            if min_ns is not None:
                span_conds.append(Span.duration_ns >= min_ns)
            for r in conn.execute(select(Span.trace_id, Span.start_ns, Span.duration_ns, Span.attributes,
                                         Span.resource, Span.instance).where(*span_conds)).mappings():
                if (r["trace_id"], r["start_ns"]) in starts:
                    roots.setdefault(r["trace_id"], []).append(r)
        return [{**r, "input_type": it} for t, it, _ in traces for r in roots.get(t, ())]

    # -- findings readers ----------------------------------------------------
    def rollup_rows(self, kind: str, start_ns: int, end_ns: int, dims: tuple[str, ...],
                    filters: Filters | None = None, sketches: bool = True) -> list[tuple]:
        """Rollup rows of one series kind, unmerged: ``(minute, count, error_count, sum_ns,
        sketch blob, *dims)`` for every (series, minute) whose minute starts in the window
        (``sketches`` False: None instead of the blob, for callers that use only the sums).

        Detectors keep minutes apart (trailing baselines, blocks), so nothing is merged here.
        """
        first, last = minute_range(start_ns, end_ns)
        with self._reads.connect() as conn:
            return self._series_rows(conn, self._series_filter(kind, filters or Filters()),
                                     [getattr(Series, d) for d in dims],
                                     [(Rollup, first, last)], sketches=sketches)

    def rollup_columns(self, kind: str, start_ns: int, end_ns: int, dims: tuple[str, ...],
                       filters: Filters | None = None, sketches: bool = True) -> tuple[packs.Columns, dict[int, tuple]]:
        """``rollup_rows`` column by column, ordered by series then minute, with each series'
        ``dims`` values by id: the verified hour packs of the window's whole hours
        (``models/packs.py``), minute rows for the rest; ``sketches`` False: without sketch
        entries (and then ``packs.SKETCHLESS_KINDS`` are read from packs too)."""
        first, last = minute_range(start_ns, end_ns)
        where = self._series_filter(kind, filters or Filters())
        with self._reads.connect() as conn:
            dims_of = {r[0]: tuple(r[1:]) for r in conn.execute(
                select(Series.id, *[getattr(Series, d) for d in dims]).where(where))}
            if not dims_of:
                return packs.empty_columns(), dims_of
            packed = kind in packs.PACK_KINDS and not (sketches and kind in packs.SKETCHLESS_KINDS)
            hours = packs.read(conn, kind, -(-first // 60), last // 60, self.pack_cache) if packed else {}
            ranges, at = [], first
            for hour in sorted(hours):
                if hour * 60 > at:
                    ranges.append((at, hour * 60))
                at = hour * 60 + 60
            if at < last:
                ranges.append((at, last))
            rows = self._series_rows(conn, where, [Series.id],
                                     [(Rollup, a, b) for a, b in ranges],
                                     sketches=sketches) if ranges else []
        # Only the series named above: on PostgreSQL the minute rows' own series read may see
        # one created since (each statement sees what was committed before it).
        ids = np.fromiter(dims_of, dtype=np.int64, count=len(dims_of))
        parts = [packs.columns_of_rows([(r[5], r[0], r[1], r[2], r[3], r[4]) for r in rows]), *hours.values()]
        if not sketches:
            parts = [packs.without_sketches(cols) for cols in parts]
        return packs.merge(parts, keep_series=ids), dims_of

    def first_minutes(self, kind: str, start_ns: int, end_ns: int) -> list[tuple[str, str, int]]:
        """``(service, name, first minute)`` of every ``kind`` series with a rollup row in the
        window (for ``inst``: when each instance was first seen). One index seek a series
        (``(series_id, minute)``), not a scan of the window's rollups."""
        from sqlalchemy import func

        first, last = minute_range(start_ns, end_ns)
        r = Rollup.__table__.alias("r")
        earliest = (select(func.min(r.c.minute)).where(r.c.series_id == Series.id, r.c.minute >= first,
                                                      r.c.minute < last).scalar_subquery())
        stmt = select(Series.service, Series.name, earliest).where(Series.kind == kind)
        with self._reads.connect() as conn:
            return [(svc, name, m) for svc, name, m in conn.execute(stmt) if m is not None]

    def series_ids(self, kind: str) -> dict[str, list[int]]:
        """service -> ids of its ``kind`` series (one query for callers that read many services)."""
        out: dict[str, list[int]] = {}
        with self._reads.connect() as conn:
            for sid, service in conn.execute(select(Series.id, Series.service).where(Series.kind == kind)):
                out.setdefault(service, []).append(sid)
        return out

    def services_rollup_rows(self, kind: str, ranges: dict[str, Iterable[tuple[int, int]]], dims: tuple[str, ...],
                             series_ids: dict[str, list[int]] | None = None) -> dict[str, list[tuple]]:
        """Like ``rollup_rows`` for each service's ``kind`` series over the minutes ``[m0, m1)``
        of each of its ranges, read through the ``(series_id, minute)`` index (short
        stretches of a few series: a statement for all of them, not one a stretch), in minute
        order, by service; ``series_ids``: the services' ids when the caller has them
        (``series_ids``). One connection for all (on PostgreSQL a connection's check-out and
        return cost more than a short read)."""
        with self._reads.connect() as conn:
            return {service: self._service_rollup_rows(conn, kind, service, r, dims,
                                                       None if series_ids is None else series_ids.get(service, []))
                    for service, r in ranges.items()}

    def _service_rollup_rows(self, conn, kind: str, service: str, minute_ranges: Iterable[tuple[int, int]],
                             dims: tuple[str, ...], series_ids: list[int] | None) -> list[tuple]:
        ranges = sorted(minute_ranges)
        ids = series_ids if series_ids is not None else list(
            conn.execute(select(Series.id).where(Series.kind == kind, Series.service == service)).scalars())
        if not ids or not ranges:
            return []
        rows: list[tuple] = []
        for i in range(0, len(ranges), 100):
            stmt = (select(Rollup.minute, Rollup.count, Rollup.error_count, Rollup.sum_ns, Rollup.sketch,
                           *[getattr(Series, d) for d in dims])
                    .join(Series, Series.id == Rollup.series_id)
                    .where(Rollup.series_id.in_(ids),
                           or_(*(and_(Rollup.minute >= m0, Rollup.minute < m1) for m0, m1 in ranges[i:i + 100]))))
            rows.extend(_raw_rows(conn, stmt))
        rows.sort(key=lambda r: r[0])
        return rows

    def attribute_spans(self, start_ns: int, end_ns: int, keys: Iterable[str],
                        kinds: Iterable[int] = (), service: str | None = None,
                        limit: int | None = None, stages: Iterable[str] = ()) -> list[tuple]:
        """Spans starting in the window that carry one of the attribute ``keys`` or have one of
        the span ``kinds``: ``(trace_id, service, name, kind, stage, start_ns, duration_ns,
        status, instance, attributes JSON or '')``; attributes only where a key occurs;
        ``service`` narrows it to one service, ``stages`` to those pipeline stages; ``limit``
        keeps the first rows.

        Rows come in start-time order (ties by row id). A bounded read for the
        attribute-based detectors: callers keep the window bounded. The attribute test is a
        substring match (``instr`` on SQLite, ``LIKE`` elsewhere). Spans are stored roughly
        in time order, so when the window's row ids (from the ``start_ns`` index) form a
        tight range the rows are read by that primary-key range — sequential pages instead
        of one table seek per row through the index. One ``service``'s spans, when they are
        at most a quarter of the window's, are read through that service's span index.
        """
        from sqlalchemy import case, func, literal

        if self.engine.dialect.name == "sqlite":  # instr: a plain substring test, cheaper than LIKE
            needles = [func.instr(Span.attributes, _json.dumps(k)) > 0 for k in keys]
        else:
            needles = [Span.attributes.contains(_json.dumps(k), autoescape=True) for k in keys]
        kinds = tuple(kinds)
        wanted = or_(*needles) if needles else literal(False)
        window = [Span.start_ns >= start_ns, Span.start_ns < end_ns]
        attrs = case((wanted, Span.attributes), else_=literal(""))
        with self.engine.connect() as conn:  # (a transaction: index_by_bitmap's SET LOCAL)
            by_service = decided = None
            if service is not None:
                # The service's spans of the window through its (service, duration_bucket,
                # start_ns, ...) index, bucket by bucket, when they are at most a quarter of
                # the window's (both counted in the indexes alone; the window only that far
                # while the service's are few: counting all of a half hour's spans cost more
                # than reading the service's, 21 ms on SQLite and 47 ms on PostgreSQL at ten
                # million a day). A scan reads every service's rows.
                buckets = self._walk_bucket_list(conn, service, None, None)
                walk = self._walk_entries(conn, {service: buckets}, start_ns, end_ns, None, None,
                                          ATTRIBUTE_WALK_COUNTED)
                if walk <= ATTRIBUTE_WALK_COUNTED:
                    enough = ATTRIBUTE_SERVICE_SHARE * max(walk, 1)
                    seen = conn.execute(select(func.count()).select_from(
                        select(literal(1).label("one")).where(*window).limit(enough).subquery())).scalar_one()
                    if not seen:
                        return []
                    decided = True
                    if seen >= enough:
                        by_service = self._walk_conds(service, buckets, start_ns, end_ns, None, None)
            if by_service is None:
                lo, hi, n = conn.execute(select(func.min(Span.id), func.max(Span.id), func.count())
                                         .where(*window)).one()
                if not n:
                    return []
                share = n // ATTRIBUTE_SERVICE_SHARE
                if service is not None and not decided and \
                        self._walk_entries(conn, {service: buckets}, start_ns, end_ns, None, None, share) <= share:
                    by_service = self._walk_conds(service, buckets, start_ns, end_ns, None, None)
            if by_service is not None:
                conds = list(by_service)
                index_by_bitmap(conn)
            elif hi - lo + 1 <= ATTRIBUTE_SCAN_SLACK * n:
                # "+ 0" keeps the planner off the start_ns index: the id range drives the scan.
                conds = [Span.id >= lo, Span.id <= hi, Span.start_ns + 0 >= start_ns, Span.start_ns + 0 < end_ns]
            else:
                conds = list(window)
            conds.append(or_(Span.kind.in_(kinds), wanted) if kinds else wanted)
            if stages:
                conds.append(Span.stage.in_(tuple(stages)))
            if service is not None and by_service is None:
                # "|| ''" keeps the planner on the window: with a plain equality it took the
                # service's duration index and read every span the service ever sent.
                conds.append(Span.service.concat("") == service)
            stmt = (select(Span.trace_id, Span.service, Span.name, Span.kind, Span.stage, Span.start_ns,
                           Span.duration_ns, Span.status, Span.instance, attrs)
                    .where(*conds).order_by(Span.start_ns, Span.id))
            if limit is not None:
                stmt = stmt.limit(limit)
            return _raw_rows(conn, stmt)

    def long_traces(self, start_ns: int, end_ns: int, min_duration_ns: int) -> list[dict]:
        """Settled traces starting in the window lasting at least ``min_duration_ns``."""
        cols = [Trace.__table__.c[c] for c in _TRACE_SUMMARY_COLUMNS]
        # Long traces are rare: "+ 0" sends the planner to the duration index (from the bound
        # up) instead of reading every trace of the window through start_ns.
        stmt = select(*cols).where(Trace.start_ns + 0 >= start_ns, Trace.start_ns + 0 < end_ns,
                                   Trace.duration_ns >= min_duration_ns, Trace.settled_ns.is_not(None))
        with self._reads.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]


def _raw_rows(conn, stmt, params: dict | None = None) -> list[tuple]:
    """All rows of ``stmt`` as plain tuples, straight from the DB-API cursor: the
    detectors read a few hundred thousand rows, where per-row ``Row`` objects cost more
    than the query (only columns that need no result processing: ints, strings and bytes,
    which PostgreSQL sends in its binary format: ``engine.BINARY_RESULTS``)."""
    result = conn.execute(stmt, params, execution_options={BINARY_RESULTS: True})
    try:
        return [tuple(r) for r in result.cursor.fetchall()] if result.cursor is not None else []
    finally:
        result.close()


_SPAN_COLUMNS = [c.key for c in Span.__table__.columns]
#: How long a reader keeps the store's time range and the pair-call cursor (``StoreReader._recent``).
REMEMBER_S = 10.0
ATTRIBUTE_SCAN_SLACK = 2  # attribute_spans reads by id range when it spans at most 2x the window's rows
# attribute_spans reads one service's spans through its index when they are at most a quarter
# of the window's rows (an index entry and a row look-up each, against a scan of every row).
ATTRIBUTE_SERVICE_SHARE = 4
# attribute_spans counts a service's spans of the window in its walk index up to this many
# before it decides (a larger share reads the window's rows by id or start instead).
ATTRIBUTE_WALK_COUNTED = 50_000
_TRACE_COLUMNS = [c.key for c in Trace.__table__.columns if c.key != "contributions"]


# --------------------------------------------------------------------------------------
# Dashboard readers. Appended: the methods above keep their signatures.
# --------------------------------------------------------------------------------------

KIND_CLIENT_CODE = 3
CALLEE_KIND_CODES = (2, 5)  # SERVER, CONSUMER
# A callee's span starts after its caller's CLIENT span, up to that span's duration later
# (CALLEE_LATE_NS when no band bounds it), give or take clock skew between hosts.
CALLEE_SKEW_NS = 60_000_000_000
CALLEE_LATE_NS = 3_600_000_000_000


@dataclass(frozen=True)
class SpanQuery:
    """Raw spans in a window, slowest first: the exemplars behind a drilldown band.

    ``kind`` is the OTLP span-kind number (3: CLIENT) or None for any; ``min_ns`` /
    ``max_ns`` bound the span's duration (both inclusive); ``input_type`` narrows by the
    (settled) trace's input type.
    """

    start_ns: int
    end_ns: int
    kind: int | None = None
    service: str | None = None
    stage: str | None = None
    input_type: str | None = None
    min_ns: int | None = None
    max_ns: int | None = None
    limit: int = 200
    offset: int = 0
    # Without ``service``: the services whose spans can match (lets a long window use the
    # per-service duration index); empty means unknown.
    services: tuple[str, ...] = ()
    # Only spans that may call this service: a SERVER/CONSUMER child in it, or its name in
    # the span's attributes (peer.service, server.address, ...). A superset of the pair's
    # CLIENT spans, narrowed in SQL so a busy caller's other calls are never paged through;
    # the caller checks each row exactly as settling pairs them.
    may_call: str | None = None
    # Only spans that may be calls of this model (their signals name it; the caller checks).
    model: str | None = None


# Windows covering at least 1/N of the stored time range find their slowest spans and traces
# through the duration indexes instead of sorting the window. The spans index holds start_ns,
# so its walk skips out-of-window spans in the index itself (cheap: ten minutes of a day
# already beat reading the window); the traces index does not (an hour of a day).
SPAN_WALK_SHARE = 200
# A pair's exemplar search and the traces still pending (pending_calls): trace ids a query
# when read one by one; how many pending traces make a walk worth its look-ups; the share
# of them, earliest first, always read one by one (so one trace with old spans does not
# stretch the walk over hours); and the index entries a walked trace may cost before
# reading them one by one is cheaper (measured under live demo traffic at 10 M spans: one
# by one 60-85 µs a trace of ~27 spans, the walk ~1.7 µs an entry; the demo's gateway has
# ~10 spans a trace).
PENDING_CHUNK = 300
PENDING_WALK_AFTER = 300
PENDING_STRAGGLER_SHARE = 0.02
PENDING_WALK_ENTRIES_PER_TRACE = 25
TRACE_WALK_SHARE = 24


_CANDIDATE_COLUMNS = ("trace_id", "span_id", "parent_span_id", "service", "name", "kind", "stage",
                      "start_ns", "duration_ns", "status", "attributes", "signals")

def _stage_is(stage: str):
    """Spans of ``stage``; a span without one counts as ``other``, as settling counts it."""
    if stage == "other":
        return or_(Span.stage == stage, Span.stage.is_(None), Span.stage == "")
    return Span.stage == stage


# A callee named ``host:port`` (traces.address_callee); URL keys, whose host the settler
# lower-cases; attribute key prefixes a model call's provider is read from.
_PORT_SUFFIX = re.compile(r"^(.+):([0-9]{1,5})$")
_URL_KEYS = ("url.full", "http.url")
_PROVIDER_KEY_PREFIXES = ("gen_ai.", "llm.")


_TRACE_SUMMARY_COLUMNS = ("trace_id", "root_service", "root_name", "start_ns", "duration_ns", "span_count",
                          "error", "input_type", "pending", "settled_ns")
