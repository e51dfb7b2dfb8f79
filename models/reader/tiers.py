"""Rollup tiers: which minute, quarter-hour and hourly rows answer a window (``tier_plan``,
``plan_tiers``), the ``UNION ALL`` statement that reads them, the reads of a set of series'
rows from the tiers (``series_rows``, ``series_and_kept_from``, ``rows_of_series``: plain
functions over a connection, shared by the rollup and span readers), and the merge of rows
into ``RollupGroup``s."""

from __future__ import annotations

from dataclasses import dataclass

import functools

from sqlalchemy import bindparam, null, select, union_all

from .. import MINUTE_BOUNDARY_CURSOR, Cursor, HourlyRollup, QuarterRollup, Rollup, Series
from ..sketch import Histogram, merge_blobs
from .base import NS_PER_MINUTE, plain_rows, minutes_kept_from


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
#: The minutes retention boundary (``base.minutes_kept_from``) as a subquery.
_KEPT_FROM = select(Cursor.position).where(Cursor.name == MINUTE_BOUNDARY_CURSOR).scalar_subquery()
#: Rollup tier ranges read by one ``UNION ALL`` (a window has at most five: two ragged
#: minute edges, two quarter-hour runs and its hours; the detectors' minute rows between
#: packed hours can have more).
TIERS_PER_STATEMENT = 8


@functools.cache
def _tier_statement(models: tuple[type, ...], sketches: bool):
    """``(minute, count, error_count, sum_ns, sketch or NULL, series_id)`` of the series
    ``ids`` over ``[t0_i, t1_i)`` of each rollup table ``models[i]``, one ``UNION ALL``
    built once a shape: building and compiling a select each time cost more than SQLite's
    own read of a short window (an hour's cache rates), and on PostgreSQL each tier was a
    round trip of its own."""
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


def series_rows(conn, where, cols: list, tiers, sketches: bool = True) -> list[tuple]:
    """``(minute, count, error_count, sum_ns, sketch, *cols)`` rows of the series matching
    ``where`` from each ``(model, t0, t1)`` tier (``plan_tiers``): the series
    first, then their rows through the ``(series_id, time)`` index. A join lets SQLite walk
    the time range of every series of every kind instead (a day: 331k rows read for 33k
    wanted). ``sketches`` False: ``sketch`` is None (the blobs are most of what is read)."""
    series = conn.execute(select(Series.id, *cols).where(where)).fetchall()
    return rows_of_series(conn, {r[0]: tuple(r[1:]) for r in series}, tiers, sketches)


def series_and_kept_from(conn, where, cols: list) -> tuple[dict[int, tuple], int | None]:
    """The series matching ``where`` (``{id: cols}``) and, from the same statement,
    the retention boundary ``minutes_kept_from`` reads (a round trip less a tiered read
    on PostgreSQL; an uncorrelated subquery, evaluated once). With no series the
    boundary is read by itself."""
    rows = conn.execute(select(Series.id, *cols, _KEPT_FROM.label("kept_from")).where(where)).fetchall()
    if not rows:
        return {}, minutes_kept_from(conn)
    return {r[0]: tuple(r[1:-1]) for r in rows}, rows[0][-1]


def rows_of_series(conn, dims: dict[int, tuple], tiers, sketches: bool = True) -> list[tuple]:
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
            rows.extend(r[:5] + dims[r[5]] for r in plain_rows(conn, stmt, {"ids": ids[i : i + 500], **bounds}))
    return rows
