"""``RollupReader``: merged histograms over a window (``merged``, ``steps``), the tiers' rows
unmerged (``rows_of_plan``, ``rows_of_kinds``, ``rows``, ``columns``, ``rows_by_service``)
and what the series table knows (``series_values``, ``series_ids``, ``services_of``,
``first_minutes``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from sqlalchemy import exists, func, or_, select, tuple_

from .. import Rollup, Series
from .. import packs
from ..engine import BINARY_RESULTS
from .base import Filters, ReadContext, plain_rows, minutes_kept_from, series_filter, services_in
from .tiers import (_TIER_TIME, RollupGroup, TierPlan, _merge, minute_range, plan_tiers, rows_of_series,
                    series_and_kept_from, series_rows, tier_plan)


def merged_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[a, b)`` ranges with overlapping or touching ones joined, in order."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


@dataclass(frozen=True)
class RollupQuery:
    kind: str  # op | pair | trace | tstage
    start_ns: int
    end_ns: int
    filters: Filters = field(default_factory=Filters)
    group_by: tuple[str, ...] = ()  # series dimensions to keep apart
    by_minute: bool = False


class RollupReader:
    """Reads of the rollup tables, through the series they belong to (``StoreReader.rollups``)."""

    def __init__(self, context: ReadContext) -> None:
        self._ctx = context

    def _minute_rows(self, q: RollupQuery) -> tuple[int, list[tuple]]:
        """(first minute, minute rows of the query's series) for its window."""
        first, last = minute_range(q.start_ns, q.end_ns)
        with self._ctx.connect() as conn:
            return first, series_rows(conn, series_filter(q.kind, q.filters),
                                      [getattr(Series, d) for d in q.group_by],
                                      [(Rollup, first, last)])

    def _quarter_rows(self, q: RollupQuery) -> list[tuple] | None:
        """``(minute, ...)`` rows covering the window: quarter-hour rows (minute = the
        quarter's first) for its whole quarters, minute rows at its edges; None when the
        window reaches before the minutes retention keeps (quarters go with them)."""
        first, _ = minute_range(q.start_ns, q.end_ns)
        with self._ctx.connect() as conn:
            series, kept = series_and_kept_from(conn, series_filter(q.kind, q.filters),
                                                [getattr(Series, d) for d in q.group_by])
            if kept is not None and first < kept:
                return None
            plan = tier_plan(q.start_ns, q.end_ns, hours=False)
            return rows_of_series(conn, series, plan_tiers(plan))

    def minutes_kept_from(self) -> int | None:
        """The oldest minute whose minute (and quarter-hour) rollups retention keeps; None
        when nothing was ever pruned."""
        with self._ctx.connect() as conn:
            return minutes_kept_from(conn)

    def rows_of_plan(self, kind: str, plan: TierPlan, dims: tuple[str, ...], filters: Filters | None = None,
                     sketches: bool = True) -> list[tuple]:
        """``(minute, count, error_count, sum_ns, sketch, *dims)`` rows of a ``tier_plan``:
        minute, quarter-hour and hourly rows, each row's minute the first of its minute,
        quarter or hour (``sketches`` False: None for the blob)."""
        with self._ctx.connect() as conn:
            return series_rows(conn, series_filter(kind, filters or Filters()),
                               [getattr(Series, d) for d in dims], plan_tiers(plan), sketches=sketches)

    def rows_of_kinds(self, kinds: dict[str, tuple[str, ...]], plan_for, sketches: bool = True
                      ) -> tuple[TierPlan | None, dict[str, list[tuple]]]:
        """``rows_of_plan`` of several series kinds (``{kind: dims}``) over one connection, with
        the plan ``plan_for(minutes_kept_from)`` chooses (None: no rows read): the series of
        every kind with the retention boundary, then all their rows: two statements. On
        PostgreSQL each connection checked out costs a ping and a rollback, and each
        statement a round trip: the cache view's two kinds read apart took ~11 round trips,
        most of an hour's answer."""
        cols = sorted({d for dims in kinds.values() for d in dims})
        at = {d: i for i, d in enumerate(cols)}
        with self._ctx.connect() as conn:
            series, kept = series_and_kept_from(conn, Series.kind.in_(list(kinds)),
                                                [Series.kind, *[getattr(Series, d) for d in cols]])
            plan = plan_for(kept)
            if plan is None:
                return None, {}
            # Each row keeps its kind first, then that kind's own dims.
            dims = {sid: (r[0], *(r[1 + at[d]] for d in kinds[r[0]])) for sid, r in series.items()}
            out: dict[str, list[tuple]] = {kind: [] for kind in kinds}
            for r in rows_of_series(conn, dims, plan_tiers(plan), sketches):
                out[r[5]].append(r[:5] + r[6:])
            return plan, out

    def _tiered_rows(self, kind: str, filters: Filters, start_ns: int, end_ns: int, cols: list) -> list[tuple]:
        """``(minute, count, error_count, sum_ns, sketch, *cols)`` rows covering the window:
        minute and quarter-hour rows at the edges, hourly rows (minute = the hour's first) in
        between."""
        with self._ctx.connect() as conn:
            series, kept = series_and_kept_from(conn, series_filter(kind, filters), cols)
            plan = tier_plan(start_ns, end_ns, kept)
            return rows_of_series(conn, series, plan_tiers(plan))

    def merged(self, q: RollupQuery) -> list[RollupGroup]:
        """Merge rollup rows per group (and minute, with by_minute).

        Without ``by_minute`` the window's whole hours come from the hourly tier: a day
        merges 24 rows a series instead of 1,440.
        """
        if q.by_minute:
            _, rows = self._minute_rows(q)
            return _merge((tuple(r[5:]) + (r[0],), r[1], r[2], r[3], r[4]) for r in rows)
        rows = self._tiered_rows(q.kind, q.filters, q.start_ns, q.end_ns, [getattr(Series, d) for d in q.group_by])
        return _merge((tuple(r[5:]), r[1], r[2], r[3], r[4]) for r in rows)

    # -- dashboard readers ---------------------------------------------------
    def steps(self, q: RollupQuery, step_minutes: int) -> list[RollupGroup]:
        """Like ``merged`` of a ``by_minute`` query but merged per ``step_minutes``: key = group_by +
        (step start minute,).

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
        with self._ctx.connect() as conn:
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
        wanted = sorted(set(ops))
        out: dict[tuple[str, str], RollupGroup] = {}
        if not wanted:
            return out
        rows: list[tuple] = []
        with self._ctx.connect() as conn:
            plan = tier_plan(start_ns, end_ns, minutes_kept_from(conn))
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

    def services_of(self, kind: str, filters: Filters) -> list[str]:
        """Services that have ``kind`` series matching ``filters`` (for a pair: the callers):
        the candidates an exemplar search walks when no service is named; looked up once per
        pinned block."""
        return list(self._ctx.once_per_block(("services_of", kind, filters), lambda c: services_in(c, kind, filters)))

    # -- findings readers ----------------------------------------------------
    def rows(self, kind: str, start_ns: int, end_ns: int, dims: tuple[str, ...],
             filters: Filters | None = None, sketches: bool = True) -> list[tuple]:
        """Rollup rows of one series kind, unmerged: ``(minute, count, error_count, sum_ns,
        sketch blob, *dims)`` for every (series, minute) whose minute starts in the window
        (``sketches`` False: None instead of the blob, for callers that use only the sums).

        Detectors keep minutes apart (trailing baselines, blocks), so nothing is merged here.
        """
        first, last = minute_range(start_ns, end_ns)
        with self._ctx.connect() as conn:
            return series_rows(conn, series_filter(kind, filters or Filters()),
                               [getattr(Series, d) for d in dims],
                               [(Rollup, first, last)], sketches=sketches)

    def columns(self, kind: str, start_ns: int, end_ns: int, dims: tuple[str, ...],
                filters: Filters | None = None, sketches: bool = True) -> tuple[packs.Columns, dict[int, tuple]]:
        """``rows`` column by column, ordered by series then minute, with each series'
        ``dims`` values by id: the verified hour packs of the window's whole hours
        (``models/packs.py``), minute rows for the rest; ``sketches`` False: without sketch
        entries (and then ``packs.SKETCHLESS_KINDS`` are read from packs too)."""
        first, last = minute_range(start_ns, end_ns)
        where = series_filter(kind, filters or Filters())
        with self._ctx.connect() as conn:
            dims_of = {r[0]: tuple(r[1:]) for r in conn.execute(
                select(Series.id, *[getattr(Series, d) for d in dims]).where(where))}
            if not dims_of:
                return packs.empty_columns(), dims_of
            packed = kind in packs.PACK_KINDS and not (sketches and kind in packs.SKETCHLESS_KINDS)
            hours = packs.read(conn, kind, -(-first // 60), last // 60, self._ctx.pack_cache) if packed else {}
            ranges, at = [], first
            for hour in sorted(hours):
                if hour * 60 > at:
                    ranges.append((at, hour * 60))
                at = hour * 60 + 60
            if at < last:
                ranges.append((at, last))
            rows = series_rows(conn, where, [Series.id],
                               [(Rollup, a, b) for a, b in ranges],
                               sketches=sketches) if ranges else []
        # Only the series named above: on PostgreSQL the minute rows' own series read may see
        # one created since (each statement sees what was committed before it).
        ids = np.fromiter(dims_of, dtype=np.int64, count=len(dims_of))
        parts = [packs.columns_of_rows([(r[5], r[0], r[1], r[2], r[3], r[4]) for r in rows]), *hours.values()]
        if not sketches:
            parts = [packs.without_sketches(cols) for cols in parts]
        return packs.merge(parts, keep_series=ids), dims_of

    def series_in_window(self, kind: str, start_ns: int, end_ns: int, dims: tuple[str, ...]) -> set[tuple]:
        """The ``dims`` values of every ``kind`` series with a rollup row in the window: an
        index seek a series and tier (``(series_id, time)``), not a read of the window's rows."""
        return self.kinds_in_window({kind: dims}, start_ns, end_ns)[kind]

    def kinds_in_window(self, dims_of: dict[str, tuple[str, ...]], start_ns: int, end_ns: int) -> dict[str, set[tuple]]:
        """``series_in_window`` of several kinds (kind -> its dims) in one statement."""
        out: dict[str, set[tuple]] = {kind: set() for kind in dims_of}
        columns = sorted({d for dims in dims_of.values() for d in dims})
        with self._ctx.connect() as conn:
            tiers = plan_tiers(tier_plan(start_ns, end_ns, minutes_kept_from(conn)))
            if not tiers:
                return out
            has_rows = []
            for table, t0, t1 in tiers:
                time_col = _TIER_TIME[table][0]
                has_rows.append(exists().where(table.series_id == Series.id, time_col >= t0, time_col < t1))
            stmt = select(Series.kind, *[getattr(Series, d) for d in columns]).where(
                Series.kind.in_(list(dims_of)), or_(*has_rows))
            for kind, *values in conn.execute(stmt):
                row = dict(zip(columns, values))
                out[kind].add(tuple(row[d] for d in dims_of[kind]))
        return out

    def first_minutes(self, kind: str, start_ns: int, end_ns: int) -> list[tuple[str, str, int]]:
        """``(service, name, first minute)`` of every ``kind`` series with a rollup row in the
        window (for ``inst``: when each instance was first seen). One index seek a series
        (``(series_id, minute)``), not a scan of the window's rollups."""
        first, last = minute_range(start_ns, end_ns)
        r = Rollup.__table__.alias("r")
        earliest = (select(func.min(r.c.minute)).where(r.c.series_id == Series.id, r.c.minute >= first,
                                                      r.c.minute < last).scalar_subquery())
        stmt = select(Series.service, Series.name, earliest).where(Series.kind == kind)
        with self._ctx.connect() as conn:
            return [(svc, name, m) for svc, name, m in conn.execute(stmt) if m is not None]

    def series_ids(self, kind: str) -> dict[str, list[int]]:
        """service -> ids of its ``kind`` series (one query for callers that read many services)."""
        out: dict[str, list[int]] = {}
        with self._ctx.connect() as conn:
            for sid, service in conn.execute(select(Series.id, Series.service).where(Series.kind == kind)):
                out.setdefault(service, []).append(sid)
        return out

    def rows_by_service(self, kind: str, ranges: dict[str, Iterable[tuple[int, int]]], dims: tuple[str, ...],
                        series_ids: dict[str, list[int]] | None = None) -> dict[str, list[tuple]]:
        """Like ``rows`` for each service's ``kind`` series over the minutes ``[m0, m1)``
        of each of its ranges, read through the ``(series_id, minute)`` index (short
        stretches of a few series: a statement for all of them, not one a stretch), in minute
        order, by service; ``series_ids``: the services' ids when the caller has them
        (``series_ids``). One connection for all (on PostgreSQL a connection's check-out and
        return cost more than a short read)."""
        with self._ctx.connect() as conn:
            return {service: self._service_rollup_rows(conn, kind, service, r, dims,
                                                       None if series_ids is None else series_ids.get(service, []))
                    for service, r in ranges.items()}

    def _service_rollup_rows(self, conn, kind: str, service: str, minute_ranges: Iterable[tuple[int, int]],
                             dims: tuple[str, ...], series_ids: list[int] | None) -> list[tuple]:
        ranges = merged_ranges(minute_ranges)  # (a row is read once)
        ids = series_ids if series_ids is not None else list(
            conn.execute(select(Series.id).where(Series.kind == kind, Series.service == service)).scalars())
        if not ids or not ranges:
            return []
        # One branch a range, joined by UNION ALL, not an OR of ranges (SQLite walked each
        # series' whole index for the OR and kept a quarter of it), written as SQL text with
        # the integers inline: building and compiling a hundred-branch Core statement cost
        # more than reading its rows.
        id_list = ",".join(str(int(i)) for i in ids)
        cols = ", ".join(["r.minute", "r.count", "r.error_count", "r.sum_ns", "r.sketch"]
                         + [f"s.{getattr(Series, d).name}" for d in dims])
        head = (f"SELECT {cols} FROM {Rollup.__tablename__} r JOIN {Series.__tablename__} s ON s.id = r.series_id "
                f"WHERE r.series_id IN ({id_list}) AND r.minute >= ")
        arms = [f"{head}{int(m0)} AND r.minute < {int(m1)}" for m0, m1 in ranges]
        rows: list[tuple] = []
        for i in range(0, len(arms), 100):
            result = conn.exec_driver_sql(" UNION ALL ".join(arms[i:i + 100]),
                                          execution_options={BINARY_RESULTS: True})
            rows.extend(tuple(r) for r in result.cursor.fetchall())
        rows.sort(key=lambda r: r[0])
        return rows
