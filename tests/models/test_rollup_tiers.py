"""Hourly rollups: always the exact sum of their minutes, and long windows read them."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
import time

import numpy as np
from sqlalchemy import func, select, text

from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models import HourlyRollup, QuarterRollup, Rollup
from modalscope.models.reader import Filters, RollupQuery, StoreReader, TierPlan, minute_range, tier_plan
from modalscope.models.sketch import decode, merge_blobs
from tests.factories import multimodal_trace

MIN = 60_000_000_000
HOUR = 60 * MIN


# -- the pure plan ----------------------------------------------------------------------
def _covered(plan: TierPlan) -> list[int]:
    """Every minute a plan reads, once per row that covers it."""
    covered = []
    for m0, m1 in plan.minute_ranges:
        covered += range(m0, m1)
    for q0, q1 in plan.quarter_ranges:
        covered += range(q0 * 15, q1 * 15)
    covered += range(plan.hours[0] * 60, plan.hours[1] * 60)
    return sorted(covered)


def test_plan_splits_a_window_into_edge_minutes_quarters_and_whole_hours():
    start = 10 * HOUR + 17 * MIN  # 10:17 .. 13:05
    end = 13 * HOUR + 5 * MIN
    plan = tier_plan(start, end)
    assert plan.hours == (11, 13)
    assert plan.quarter_ranges == ((42, 44),)  # 10:30 .. 11:00
    assert plan.minute_ranges == ((617, 630), (780, 785))
    first, last = minute_range(start, end)
    assert _covered(plan) == list(range(first, last))  # every minute once, nothing outside


def test_plan_covers_every_window_exactly_once():
    rng = random.Random(11)
    for _ in range(2000):
        start = rng.randrange(0, 3 * 24 * HOUR)
        end = start + rng.choice([0, 1, MIN, 14 * MIN, rng.randrange(0, 2 * HOUR), rng.randrange(0, 30 * HOUR)])
        first, last = minute_range(start, end)
        for hours in (True, False):
            plan = tier_plan(start, end, hours=hours)
            assert _covered(plan) == list(range(first, max(first, last)))
            # A whole quarter is never read as minutes.
            assert all(-(-m0 // 15) * 15 + 15 > m1 for m0, m1 in plan.minute_ranges)
            if not hours:
                assert plan.hours == (0, 0)


def test_plan_for_a_window_inside_one_hour_reads_minutes_and_quarters():
    assert tier_plan(10 * HOUR + 5 * MIN, 10 * HOUR + 50 * MIN) == TierPlan(((605, 615), (645, 650)), (0, 0),
                                                                            ((41, 43),))
    assert tier_plan(10 * HOUR + 5 * MIN, 10 * HOUR + 14 * MIN) == TierPlan(((605, 614),), (0, 0))
    assert tier_plan(10 * HOUR, 11 * HOUR) == TierPlan((), (10, 11))
    assert tier_plan(10 * HOUR, 11 * HOUR, hours=False) == TierPlan((), (0, 0), ((40, 44),))
    assert tier_plan(5 * HOUR, 5 * HOUR) == TierPlan((), (0, 0))


def test_plan_rounds_edges_past_minute_retention_out_to_their_hours():
    start, end = 10 * HOUR + 17 * MIN, 13 * HOUR + 5 * MIN
    # Minutes (and quarters) kept from 12:00: the early edge (10:17) becomes the whole 10:00 hour.
    plan = tier_plan(start, end, minutes_kept_from=12 * 60)
    assert plan.hours == (10, 13)
    assert plan.minute_ranges == ((780, 785),) and plan.quarter_ranges == ()
    # Nothing kept at minute resolution any more: both edges round out.
    assert tier_plan(start, end, minutes_kept_from=14 * 60) == TierPlan((), (10, 14))
    assert tier_plan(10 * HOUR + 5 * MIN, 10 * HOUR + 9 * MIN, minutes_kept_from=11 * 60) == TierPlan((), (10, 11))


# -- the store ----------------------------------------------------------------------------
def _fill(engine, hours: float = 3.0, n: int = 120, seed: int = 3):
    rng = random.Random(seed)
    base = (time.time_ns() // HOUR - 5) * HOUR + 13 * MIN
    traces = [multimodal_trace(rng, base + int(i * hours * HOUR / n), images=1 + i % 3, error=(i % 17 == 0))
              for i in range(n)]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    return base, base + int(hours * HOUR), traces


def _hours_from_minutes(engine, per: int = 60) -> dict:
    out: dict = {}
    with engine.connect() as conn:
        for minute, sid, count, errs, total, blob in conn.execute(select(
                Rollup.minute, Rollup.series_id, Rollup.count, Rollup.error_count, Rollup.sum_ns, Rollup.sketch)):
            a = out.setdefault((minute // per, sid), [0, 0, 0, []])
            a[0] += count
            a[1] += errs
            a[2] += total
            a[3].append(blob)
    return {k: (c, e, t, merge_blobs(b).counts.tolist()) for k, (c, e, t, b) in out.items()}


def _hours(engine) -> dict:
    with engine.connect() as conn:
        return {(h, sid): (c, e, t, merge_blobs([b]).counts.tolist()) for h, sid, c, e, t, b in conn.execute(select(
            HourlyRollup.hour, HourlyRollup.series_id, HourlyRollup.count, HourlyRollup.error_count,
            HourlyRollup.sum_ns, HourlyRollup.sketch))}


def _quarters(engine) -> dict:
    with engine.connect() as conn:
        return {(q, sid): (c, e, t, merge_blobs([b]).counts.tolist()) for q, sid, c, e, t, b in conn.execute(select(
            QuarterRollup.quarter, QuarterRollup.series_id, QuarterRollup.count, QuarterRollup.error_count,
            QuarterRollup.sum_ns, QuarterRollup.sketch))}


def test_each_hour_is_the_exact_sum_of_its_minutes_even_after_a_late_span(engine):
    _, _, traces = _fill(engine)
    assert _hours(engine) == _hours_from_minutes(engine)
    assert _quarters(engine) == _hours_from_minutes(engine, per=15)
    assert len(_hours(engine)) > 0 and len(_quarters(engine)) > len(_hours(engine))
    # A late span of a settled trace: the trace re-settles, every tier takes the correction.
    late = traces[5][-1]
    moved = dataclasses.replace(late, span_id="00000000000000ff", name="late.step")
    write_spans(engine, [moved])
    settle(engine, force=True)
    assert _hours(engine) == _hours_from_minutes(engine)
    assert _quarters(engine) == _hours_from_minutes(engine, per=15)


def test_quarter_hour_steps_read_quarter_rows_and_give_the_minute_answer(engine, monkeypatch):
    """15- and 30-minute steps: whole quarters from rollups_15m, the window's edges from
    minutes, on a quarter-aligned grid — the same groups the minute rows give."""
    start, end, _ = _fill(engine)
    reader = StoreReader(engine)
    for kind, group_by in (("op", ("service", "name")), ("tstage", ("stage",)), ("pair", ("caller", "callee"))):
        q = RollupQuery(kind, start - 7 * MIN, end + 11 * MIN, Filters(), group_by=group_by)
        by_minute = reader.rollups.merged(RollupQuery(kind, q.start_ns, q.end_ns, q.filters, group_by, by_minute=True))
        for step in (15, 30):
            want: dict = {}
            for g in by_minute:
                key = g.key[:-1] + (g.key[-1] - g.key[-1] % step,)
                a = want.setdefault(key, [0, 0, 0, np.zeros_like(g.histogram.counts)])
                a[0] += g.count
                a[1] += g.error_count
                a[2] += g.sum_ns
                a[3] = a[3] + g.histogram.counts
            got = {g.key: (g.count, g.error_count, g.sum_ns, g.histogram.counts.tolist())
                   for g in reader.rollups.steps(q, step)}
            assert got == {k: (c, e, t, h.tolist()) for k, (c, e, t, h) in want.items()}
            assert all(k[-1] % step == 0 for k in got) and len(got) > 4
    # The quarter rows are what is read: without them the whole quarters are missing.
    from modalscope.models.reader import rollups as rollups_module

    seen = []
    real = rollups_module.rows_of_series
    monkeypatch.setattr(rollups_module, "rows_of_series", lambda conn, dims, tiers, sketches=True:
                        seen.extend(t[0] for t in tiers) or real(conn, dims, tiers, sketches))
    reader.rollups.steps(RollupQuery("op", start, end, Filters(), ("service",)), 15)
    assert QuarterRollup in seen


def test_long_windows_read_hourly_rows_and_give_the_minute_answer(engine):
    start, end, _ = _fill(engine)
    reader = StoreReader(engine)
    q = RollupQuery("op", start - 7 * MIN, end + 11 * MIN, Filters(), group_by=("service", "name"))
    tiered = {g.key: (g.count, g.error_count, g.sum_ns, g.histogram.counts.tolist()) for g in reader.rollups.merged(q)}
    # The same window merged from minute rows alone (by_minute, then summed).
    by_minute: dict = {}
    for g in reader.rollups.merged(RollupQuery(q.kind, q.start_ns, q.end_ns, q.filters, q.group_by, by_minute=True)):
        a = by_minute.setdefault(g.key[:-1], [0, 0, 0, np.zeros_like(g.histogram.counts)])
        a[0] += g.count
        a[1] += g.error_count
        a[2] += g.sum_ns
        a[3] = a[3] + g.histogram.counts
    assert tiered == {k: (c, e, t, h.tolist()) for k, (c, e, t, h) in by_minute.items()}
    # Hour-sized steps come from the same rows, on an hour-aligned grid.
    steps = reader.rollups.steps(q, 60)
    assert all(g.key[-1] % 60 == 0 for g in steps)
    assert sum(g.count for g in steps) == sum(v[0] for v in tiered.values())


def test_windows_past_minute_retention_are_answered_from_hours(engine):
    start, end, _ = _fill(engine)
    reader_all = StoreReader(engine)
    q = RollupQuery("trace", start, end, Filters(), group_by=("input_type",))
    expected = {g.key: g.count for g in reader_all.rollups.merged(q)}
    # What the pruner does to minute rows past their retention: record the boundary, delete.
    from modalscope.ingest.retention import _record_minute_boundary

    _record_minute_boundary(engine, end // MIN + 60)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM rollups"))
    # No minute rows left: every edge rounds out to its whole hour, so the traces of the
    # window's partial first hour still count (the hour starts at :00, the window at :13).
    got = {g.key: g.count for g in reader_all.rollups.merged(q)}
    assert got == expected
    assert sum(got.values()) == 120
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Rollup)).scalar_one() == 0


def test_settled_sketch_counts_match_rollup_counts(engine):
    _fill(engine, n=30)
    with engine.connect() as conn:
        for count, blob in conn.execute(select(HourlyRollup.count, HourlyRollup.sketch)):
            assert int(decode(blob)[1].sum()) == count


def test_many_tier_ranges_read_as_one_range_at_a_time(engine, monkeypatch):
    """Tiers go a few to a ``UNION ALL``: forty one-minute ranges (as the detectors' minute
    rows between packed hours can be) give the rows of forty separate reads, and no
    statement binds more than a few tiers' worth of series ids."""
    from modalscope.models.reader import tiers as reader_module
    from modalscope.models.reader import Series

    start, end, _ = _fill(engine)
    first = minute_range(start, end)[0]
    tiers = [(Rollup, m, m + 1) for m in range(first, first + 80, 2)] + [(QuarterRollup, first // 15, first // 15 + 4)]
    where = Series.kind == "op"
    with engine.connect() as conn:
        one_by_one = sorted(r for t in tiers for r in reader_module.series_rows(conn, where, [Series.service], [t]))
    binds = []
    real = reader_module.plain_rows
    monkeypatch.setattr(reader_module, "plain_rows",
                        lambda conn, stmt, params=None: binds.append(params) or real(conn, stmt, params))
    with engine.connect() as conn:
        together = reader_module.series_rows(conn, where, [Series.service], tiers)
    assert one_by_one and sorted(together) == one_by_one
    assert len(binds) == -(-len(tiers) // reader_module.TIERS_PER_STATEMENT)
    assert all(len(p) - 1 <= 2 * reader_module.TIERS_PER_STATEMENT and len(p["ids"]) <= 500 for p in binds)


def test_several_kinds_read_over_one_connection_give_each_kinds_own_rows(engine):
    """``rows_of_kinds`` (the cache view's two kinds): per kind, the rows and dims of a
    ``rows_of_plan`` read of that kind alone; the plan comes from the retention boundary read
    on the same connection, and one connection is checked out for all of it."""
    from sqlalchemy import event

    from modalscope.ingest.retention import _record_minute_boundary

    start, end, _ = _fill(engine)
    reader = StoreReader(engine)
    kinds = {"op": ("service", "name", "stage"), "pair": ("caller", "callee")}
    plan = tier_plan(start, end)
    alone = {kind: sorted(reader.rollups.rows_of_plan(kind, plan, dims, sketches=False))
             for kind, dims in kinds.items()}
    assert all(alone.values())
    checkouts, seen = [], []

    def count(*_):
        checkouts.append(1)

    event.listen(engine.pool, "checkout", count)
    try:
        got_plan, rows = reader.rollups.rows_of_kinds(
            kinds, lambda kept: seen.append(kept) or tier_plan(start, end, kept), sketches=False)
    finally:
        event.remove(engine.pool, "checkout", count)
    assert got_plan == plan and seen == [None] and len(checkouts) == 1
    assert {kind: sorted(r) for kind, r in rows.items()} == alone
    # Past the minutes retention keeps: the boundary reaches plan_for; None reads nothing.
    _record_minute_boundary(engine, end // MIN + 60)
    seen.clear()
    assert reader.rollups.rows_of_kinds(kinds, lambda kept: seen.append(kept)) == (None, {})
    # (the boundary comes with the series; a kind with none reads it by itself)
    assert reader.rollups.rows_of_kinds({"no-such-kind": ()}, lambda kept: seen.append(kept)) == (None, {})
    assert seen == [end // MIN + 60] * 2


def test_reads_open_no_transaction_on_postgresql_and_take_no_write_lock_on_sqlite(engine):
    """On PostgreSQL the reader's connections are in autocommit (a transaction costs a BEGIN
    and a ROLLBACK round trip a checkout; READ COMMITTED gives each statement its own
    snapshot either way), while the engine it was given still writes in transactions. On
    SQLite its reads through a write engine (the settler's evaluations) take no write lock."""
    reader = StoreReader(engine)
    with reader.context.reads.connect() as conn:
        if engine.dialect.name != "postgresql":
            # A write engine's reads begin deferred: a read in progress holds no write lock
            # (a connection that waits for none gets it at once).
            assert conn.exec_driver_sql("SELECT count(*) FROM spans").scalar() == 0
            other = sqlite3.connect(engine.url.database, timeout=0, isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
            finally:
                other.close()
            return
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        assert conn.connection.dbapi_connection.info.transaction_status.name == "IDLE"
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
        assert conn.connection.dbapi_connection.info.transaction_status.name == "INTRANS"


def test_series_in_a_window_are_those_with_rows_in_it(engine):
    """``series_in_window`` (an index seek a series) names exactly the series the window's
    rows belong to, for windows with series that start or stop inside them."""
    start, end, traces = _fill(engine)
    # A service seen only in the last hour: absent from earlier windows.
    late = [dataclasses.replace(s, service="late-svc", trace_id="ab" * 16, span_id=f"{i + 1:016x}",
                                parent_span_id=None) for i, s in enumerate(traces[-1][:2])]
    write_spans(engine, late)
    settle(engine, force=True)
    reader = StoreReader(engine)
    rng = random.Random(5)
    windows = [(start, end), (start, start + 20 * MIN), (end - 25 * MIN, end)]
    windows += [tuple(sorted((rng.randrange(start, end), rng.randrange(start, end)))) for _ in range(12)]
    seen_late = set()
    wanted = {"op": ("service", "name"), "trace": ("service", "input_type")}
    for a, b in windows:
        together = reader.rollups.kinds_in_window(wanted, a, b)  # several kinds in one statement
        for kind, dims in wanted.items():
            cols, dims_of = reader.rollups.columns(kind, a, b, dims, sketches=False)
            expected = {dims_of[int(i)] for i in set(cols.series_id.tolist())}
            got = reader.rollups.series_in_window(kind, a, b, dims)
            assert got == expected and together[kind] == expected, (a, b, kind)
            seen_late.add(any(d[0] == "late-svc" for d in got))
    assert seen_late == {True, False}  # some windows hold the late service, some do not
