"""Retention deletes old spans, traces and rollups in small batches and keeps the rest."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

from sqlalchemy import func, select

from modalscope.app.params import Window
from modalscope.app import queries
from modalscope.ingest.retention import NS_PER_DAY, PruneSchedule, RetentionPolicy, cutoffs, prune
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models import HourlyRollup, QuarterRollup, Rollup, Span, Trace
from modalscope.models.reader import Filters, StoreReader
from tests.factories import multimodal_trace

HOUR = 3_600_000_000_000


def _count(engine, model) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(model)).scalar_one()


def _fill(engine, now_ns: int, ages_hours: list[float], seed: int = 5):
    rng = random.Random(seed)
    traces = [multimodal_trace(rng, now_ns - int(age * HOUR), images=1 + i % 2) for i, age in enumerate(ages_hours)]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    return traces


def test_cutoffs_are_pure_and_zero_keeps_forever():
    now = 1_800_000_000 * 10**9
    c = cutoffs(RetentionPolicy(7, 2, 90), now)
    assert c["span_start_ns"] == now - 7 * NS_PER_DAY
    assert c["minute"] == (now - 2 * NS_PER_DAY) // 60_000_000_000
    assert c["hour"] == (now - 90 * NS_PER_DAY) // HOUR
    assert cutoffs(RetentionPolicy(0, 0, 0), now) == {"span_start_ns": None, "minute": None, "hour": None}


def test_prune_deletes_only_what_is_past_retention_in_small_batches(engine):
    now = time.time_ns()
    # Ten traces 10 days old, six 3 days old, four fresh ones.
    old = _fill(engine, now, [240 + i for i in range(10)] + [72 + i for i in range(6)] + [1, 2, 3, 4])
    old_ids = {t[0].trace_id for t in old[:10]}
    spans_before = _count(engine, Span)
    old_spans = sum(len(t) for t in old[:10])
    hourly_before = _count(engine, HourlyRollup)
    batches = []
    result = prune(engine, RetentionPolicy(span_days=7, minute_rollup_days=2, hourly_rollup_days=90),
                   now_ns=now, batch=7, pause=0, progress=batches.append)
    assert result.spans == old_spans and result.traces == 10
    assert max(batches) <= 7 and len(batches) >= old_spans // 7  # bounded transactions
    assert _count(engine, Span) == spans_before - old_spans
    with engine.connect() as conn:
        left = set(conn.execute(select(Trace.trace_id)).scalars())
        assert not left & old_ids and len(left) == 10
        # Minute rollups past two days are gone; the hourly ones (90 days) all stay.
        oldest_minute = conn.execute(select(func.min(Rollup.minute))).scalar_one()
        oldest_quarter = conn.execute(select(func.min(QuarterRollup.quarter))).scalar_one()
    assert oldest_minute >= (now - 2 * NS_PER_DAY) // 60_000_000_000
    assert oldest_quarter >= (now - 2 * NS_PER_DAY) // 60_000_000_000 // 15  # quarters go with the minutes
    assert result.minute_rollups > 0 and result.quarter_rollups > 0 and result.hourly_rollups == 0
    assert _count(engine, HourlyRollup) == hourly_before
    # Pruning again finds nothing.
    assert prune(engine, RetentionPolicy(7, 2, 90), now_ns=now, batch=7, pause=0).total() == 0


def test_old_windows_still_answer_from_hourly_rollups_after_pruning(engine):
    now = time.time_ns()
    _fill(engine, now, [99 + i * 0.1 for i in range(12)])  # ~4 days old, all inside the window
    reader = StoreReader(engine)
    window = Window(now - 101 * HOUR, now - 98 * HOUR)
    exact = queries.input_types(reader, window, Filters())
    # Once minute rows are gone, the window's ragged edges round out to whole hours.
    rounded = Window(window.start_ns // HOUR * HOUR, -(-window.end_ns // HOUR) * HOUR)
    expected = queries.input_types(reader, rounded, Filters())
    prune(engine, RetentionPolicy(span_days=3, minute_rollup_days=2, hourly_rollup_days=90), now_ns=now, pause=0)
    assert _count(engine, Span) == 0 and _count(engine, Rollup) == 0
    after = queries.input_types(reader, window, Filters())
    assert after == expected
    assert sum(r["count"] for r in after) == 12 >= sum(r["count"] for r in exact) > 0


def test_prune_runs_beside_a_writer_without_losing_new_spans(engine):
    now = time.time_ns()
    _fill(engine, now, [200 + i * 0.05 for i in range(60)], seed=9)
    rng = random.Random(11)
    fresh = [multimodal_trace(rng, now - i * 1_000_000_000, images=1) for i in range(60)]
    errors: list[BaseException] = []

    def writer():
        try:
            for t in fresh:
                write_spans(engine, t)
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    th = threading.Thread(target=writer)
    th.start()
    result = prune(engine, RetentionPolicy(7, 2, 90), now_ns=now, batch=50, pause=0.001)
    th.join(60)
    assert not errors
    assert result.traces == 60
    with engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(Span)).scalar_one()
    assert stored == sum(len(t) for t in fresh)


def test_the_schedule_waits_its_interval(engine):
    now = time.time_ns()
    _fill(engine, now, [300, 301])
    sched = PruneSchedule(engine, RetentionPolicy(7, 2, 90), interval=3600, first_after=0)
    assert sched.tick() is not None and _count(engine, Trace) == 0
    assert sched.tick() is None  # not due again for an hour
    assert PruneSchedule(engine, None, first_after=0).tick() is None  # no policy: never


def test_a_backlog_is_pruned_a_budget_at_a_time(engine):
    now = time.time_ns()
    _fill(engine, now, [300 + i * 0.01 for i in range(30)], seed=13)
    pause = 30.0  # long enough to look before it ends, however busy the machine
    sched = PruneSchedule(engine, RetentionPolicy(7, 2, 90), interval=3600, first_after=0, budget=0.0, batch=10,
                          backlog_pause=pause)
    first = sched.tick()
    # A zero budget stops after one batch of each table; the rest is due a pause later, not
    # an interval later.
    assert first is not None and first.traces == 10 and _count(engine, Trace) == 20
    assert 0 < sched._every.seconds_left() <= pause
    assert sched.tick() is None  # not due before the pause is over
    sched.backlog_pause = 0.0  # the rest of the backlog without waiting
    sched._every.again_in(0.0)
    ticks = 0
    # Each tick due at once after the last until one finds every table done (short batches):
    # the next pass is then an interval away, however long that tick took.
    while sched._every.seconds_left() <= 0:
        assert sched.tick() is not None
        ticks += 1
        assert ticks < 500
    assert _count(engine, Span) == 0 and _count(engine, Trace) == 0
    assert ticks >= 2 and sched._every.seconds_left() > 60  # a batch of each table a tick
    assert sched.tick() is None


def test_db_prune_command_prints_one_line(tmp_path):
    from modalscope.models.engine import make_engine
    from modalscope.models.schema import ensure_schema

    url = f"sqlite:///{tmp_path / 'p.db'}"
    ensure_schema(url)
    engine = make_engine(url, write=True)
    _fill(engine, time.time_ns(), [24 * 30, 1])
    engine.dispose()
    out = subprocess.run([sys.executable, "-m", "modalscope", "db", "prune"], capture_output=True, text=True,
                         env={"MODALSCOPE_DATABASE_URL": url, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("deleted ") and "1 traces older than 7 days" in out.stdout
    assert "Traceback" not in out.stderr
