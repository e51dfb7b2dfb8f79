"""Findings evaluated ahead of the request (app/evaluations.py), on SQLite and PostgreSQL.

A window ending now is answered from a stored evaluation of the same length and thresholds
at most FRESH_S old — exactly what the detectors found then, filtered on reading; an absolute
window's findings are computed once and reused while no logged write touches the minutes they
were read from; the settler's schedule evaluates each range once a period
(and not again when another process just did); old evaluations are deleted.
"""

from __future__ import annotations

import dataclasses
import random
import time

import pytest
from sqlalchemy import func, select, update

from modalscope.app import create_app, evaluations as ev
from modalscope.app import findings as fnd
from modalscope.app.detectors import Thresholds
from modalscope.app.params import Window, parse_time
from modalscope.core.findings import Finding, Subject
from modalscope.ingest import demo
from modalscope.ingest.settle import settle
from modalscope.ingest.settler import Settler, SettlerJobs, SettlerProcess
from modalscope.models import FindingEvaluation, RollupChange, changes
from modalscope.models.reader import Filters, StoreReader
from modalscope.settings import Settings

S = 1_000_000_000
HOUR = 3600 * S


@pytest.fixture
def filled(engine, db_url, filled_templates):
    """An hour of demo traffic (every pattern injected) ending a minute before the module's
    first test on this backend, settled; built once a backend and copied for each test. These
    tests judge windows that end now: the store moves against them by the minutes the module
    runs (a few), which its injected patterns, spread over the hour, outlast."""

    def build(eng):
        now = time.time_ns() // (60 * S) * (60 * S)
        # Since a share of text requests goes to the hosted model, 0.15/s left the scaled-up llm
        # pod 4 requests in its warm-up (min_events is 5): no cold start. 0.25/s gives it 8.
        demo.fill(eng, demo.DemoConfig(now_ns=now, hours=1.0, rate=0.25))
        settle(eng, force=True)

    filled_templates.fill_like(engine, db_url, "evaluations-demo", build)
    return engine


def _rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(FindingEvaluation)).scalar_one()


def test_a_window_ending_now_is_stored_then_answered_from_the_store(filled):
    reader, th = StoreReader(filled), Thresholds()
    end = time.time_ns()
    first = ev.find_for(reader, Window(end - HOUR, end), Filters(), th, relative=True)
    assert not first.stored and _rows(filled) == 1
    assert first.findings, "an hour of demo traffic with its patterns finds something"
    # Exactly what the detectors find over that window.
    assert first.findings == fnd.find(reader, Window(end - HOUR, end), Filters(), th)
    # 30 s later, the same range: the stored evaluation answers, saying which window it covers.
    later = end + 30 * S
    again = ev.find_for(reader, Window(later - HOUR, later), Filters(), th, relative=True)
    assert again.stored and (again.start_ns, again.end_ns) == (end - HOUR, end)
    assert again.evaluated_ns == first.evaluated_ns and again.findings == first.findings
    assert _rows(filled) == 1
    # Past FRESH_S the detectors run again.
    stale = end + (ev.FRESH_S + 5) * S
    third = ev.find_for(reader, Window(stale - HOUR, stale), Filters(), th, relative=True)
    assert not third.stored and third.end_ns == stale and _rows(filled) == 2
    # Another length is another evaluation.
    day = ev.find_for(reader, Window(later - 24 * HOUR, later), Filters(), th, relative=True)
    assert not day.stored and _rows(filled) == 3


def test_filters_apply_to_stored_findings_as_to_fresh_ones(filled):
    reader, th = StoreReader(filled), Thresholds()
    end = time.time_ns()
    window = Window(end - HOUR, end)
    ev.find_for(reader, window, Filters(), th, relative=True)  # stores the unfiltered findings
    everything = fnd.find(reader, window, Filters(), th)
    subjects = {(k, v) for f in everything for k, v in f.subject.to_json().items() if k in ("input_type", "callee")}
    assert subjects
    for key, value in sorted(subjects):
        filters = Filters(**{key: value})
        stored = ev.find_for(reader, window, filters, th, relative=True)
        assert stored.stored
        assert stored.findings == [f for f in everything if fnd.matches(f, filters)], value
        assert stored.findings, value


def test_frames_read_beside_each_other_find_what_reading_them_in_turn_finds(filled, monkeypatch):
    """Where reads run beside each other (PostgreSQL), the pairs and the raw spans around new
    instances are read in threads beside the other frames: the same frames and findings as
    reading them one after another (SQLite's way), cold starts included."""
    now = time.time_ns() // (60 * S) * (60 * S)
    window, th = Window(now - HOUR, now + 60 * S), Thresholds()
    beside = fnd.load_frames(StoreReader(filled), window, th)
    found = fnd.find(StoreReader(filled), window, Filters(), th)
    assert beside.new_instances and len(beside.spans) and any(f.kind == "cold_start" for f in found)
    monkeypatch.setattr(fnd, "THREADED_DIALECTS", frozenset())
    in_turn = fnd.load_frames(StoreReader(filled), window, th)
    for name in ("pairs", "traces", "tstage", "spans", "long_traces", "cache", "batch", "cuda", "sync"):
        assert getattr(in_turn, name).equals(getattr(beside, name)), name
    assert in_turn.new_instances == beside.new_instances
    assert fnd.find(StoreReader(filled), window, Filters(), th) == found


def _settled_long_ago(engine, seconds: int = 600) -> None:
    """As if the store's writes were logged ``seconds`` ago (the fixture settles just before
    the test; a write less than CHANGE_MARGIN_S before an evaluation makes it stale)."""
    with engine.begin() as conn:
        conn.execute(update(RollupChange).values(changed_ns=RollupChange.changed_ns - seconds * S))


def _absolute_rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(FindingEvaluation)
                            .where(FindingEvaluation.range_s == ev.ABSOLUTE_RANGE)).scalar_one()


def test_an_absolute_window_is_computed_once_and_answered_while_its_minutes_are_unchanged(filled):
    _settled_long_ago(filled)
    reader, th = StoreReader(filled), Thresholds()
    end = time.time_ns() // (60 * S) * (60 * S) - 60 * S
    window = Window(end - HOUR + 60 * S, end)
    ev.find_for(reader, window, Filters(), th, relative=True)  # a relative evaluation answers no absolute window
    first = ev.find_for(reader, window, Filters(), th, relative=False)
    assert not first.stored and _absolute_rows(filled) == 1
    assert first.findings and first.findings == fnd.find(reader, window, Filters(), th)
    again = ev.find_for(reader, window, Filters(), th, relative=False)
    assert again.stored and again.evaluated_ns == first.evaluated_ns and again.findings == first.findings
    assert (again.start_ns, again.end_ns) == (window.start_ns, window.end_ns)
    # Filtered on reading, as fresh ones.
    for f in first.findings:
        filters = Filters(caller=f.subject.caller) if f.subject.caller else Filters(
            service=f.subject.service, input_type=f.subject.input_type)
        got = ev.find_for(reader, window, filters, th, relative=False)
        assert got.stored and got.findings == [g for g in first.findings if fnd.matches(g, filters)]
    # Another window (a nanosecond apart) or other thresholds: computed, stored beside it.
    moved = ev.find_for(reader, Window(window.start_ns + 1, window.end_ns), Filters(), th, relative=False)
    strict = ev.find_for(reader, window, Filters(), dataclasses.replace(th, min_samples=10_000), relative=False)
    assert not moved.stored and not strict.stored and _absolute_rows(filled) == 3
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored


def _late_trace(engine, start_ns: int) -> None:
    """One more trace starting at ``start_ns``, written and settled now."""
    import random

    from modalscope.ingest.writer import write_spans
    from tests.app.conftest import side_calls_trace

    write_spans(engine, side_calls_trace(random.Random(start_ns), start_ns, db_ms=900, llm_ms=4000))
    settle(engine, force=True)


def test_a_late_trace_settled_into_the_minutes_read_makes_the_stored_findings_stale(filled, monkeypatch):
    monkeypatch.setattr(ev, "ABSOLUTE_FRESH_S", 0)  # the change log alone decides here
    _settled_long_ago(filled)
    reader, th = StoreReader(filled), Thresholds()
    end = time.time_ns() // (60 * S) * (60 * S) - 2 * 60 * S
    window = Window(end - 30 * 60 * S, end)
    first = ev.find_for(reader, window, Filters(), th, relative=False)
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored
    # A trace settled two hours before the baseline look-back: nothing the detectors read.
    _late_trace(filled, window.start_ns - 3 * HOUR)
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored
    # One settled inside the look-back before the window: stale, computed again exactly.
    _late_trace(filled, window.start_ns - 20 * 60 * S)
    fresh = ev.find_for(reader, window, Filters(), th, relative=False)
    assert not fresh.stored and fresh.evaluated_ns > first.evaluated_ns
    assert fresh.findings == fnd.find(reader, window, Filters(), th)
    # Stored again; a trace settled inside the window itself makes that one stale too.
    _settled_long_ago(filled)
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored
    _late_trace(filled, window.start_ns + 5 * 60 * S)
    assert not ev.find_for(reader, window, Filters(), th, relative=False).stored


def _mark_stored_exemplars(engine, trace_id: str) -> None:
    """Give every stored finding that has exemplars the exemplar ``trace_id`` alone."""
    import orjson

    with engine.begin() as conn:
        for row_id, found in conn.execute(select(FindingEvaluation.id, FindingEvaluation.findings)).all():
            marked = [dict(f, exemplar_trace_ids=[trace_id] if f["exemplar_trace_ids"] else []) for f in orjson.loads(found)]
            conn.execute(update(FindingEvaluation).where(FindingEvaluation.id == row_id)
                         .values(findings=orjson.dumps(marked).decode()))


def test_a_new_window_takes_the_exemplars_of_identical_stored_findings_while_their_minutes_are_unchanged(
        filled, monkeypatch):
    """The exemplar look-ups (raw reads) of findings a stored evaluation already has are not
    made again: an absolute window pinned from the relative one shares most of its findings.
    A finding whose minutes a logged write touched since is looked up again, exactly."""
    _settled_long_ago(filled)
    reader, th = StoreReader(filled), Thresholds()
    end = time.time_ns() // (60 * S) * (60 * S) - 60 * S
    window = Window(end - HOUR + 60 * S, end)
    # A window a few seconds later: where the demo's patterns fall against the clock, a finding
    # at its first minute may differ from the stored window's; the shared ones are expected.
    moved = Window(window.start_ns + 5 * S, window.end_ns)
    ev.find_for(reader, window, Filters(), th, relative=True)
    stored_ids = {fnd.finding_identity(f) for f in fnd.find(reader, window, Filters(), th, exemplars=False)
                  if not f.exemplar_trace_ids}
    plain = fnd.find(reader, moved, Filters(), th)
    looked_up = [f for f in fnd.find(reader, moved, Filters(), th, exemplars=False) if not f.exemplar_trace_ids]
    shared = [f for f in looked_up if fnd.finding_identity(f) in stored_ids]
    assert len(shared) >= 3, "the demo hour has findings whose exemplars are looked up"
    # Marked, so a taken exemplar shows where it came from.
    marker = "ab" * 16
    _mark_stored_exemplars(filled, marker)
    lookups = []
    real_look_up = fnd._with_exemplars
    monkeypatch.setattr(fnd, "_with_exemplars",
                        lambda r, f: lookups.append(fnd.finding_identity(f)) or real_look_up(r, f))
    got = ev.find_for(reader, moved, Filters(), th, relative=False)
    assert not got.stored
    assert set(lookups) == {fnd.finding_identity(f) for f in looked_up} - stored_ids
    ids = {fnd.finding_identity(f) for f in shared}
    taken = [f for f in got.findings if fnd.finding_identity(f) in ids]
    assert len(taken) == len(shared) and all(f.exemplar_trace_ids == (marker,) for f in taken)
    # The others carried their own exemplars from the raw spans, as before; a cold start's
    # check (a raw read) was taken whole from the stored evaluation.
    others = [f for f in got.findings if fnd.finding_identity(f) not in ids]
    assert [f.replace(exemplar_trace_ids=()) for f in others] == [
        f.replace(exemplar_trace_ids=()) for f in plain if fnd.finding_identity(f) not in ids]
    assert [f.exemplar_trace_ids == (marker,) for f in others] == [f.kind == "cold_start" for f in others]
    assert any(f.kind == "cold_start" for f in others), "the demo hour's cold start is among them"

    # A write logged over the first minute of the shared finding that starts last: the findings
    # over that minute are looked up again (exactly as before), those that ended before it are
    # taken.
    minute = max(fnd.finding_window(f).start_ns for f in shared) // (60 * S)
    with filled.begin() as conn:
        changes.record(conn, minute, minute)
    touched = {fnd.finding_identity(f) for f in looked_up
               if fnd.finding_window(f).start_ns // (60 * S) <= minute < -(-fnd.finding_window(f).end_ns // (60 * S))}
    lookups.clear()
    again = ev.find_for(reader, Window(window.start_ns + 10 * S, window.end_ns), Filters(), th, relative=False)
    by_id = {fnd.finding_identity(f): f for f in again.findings}
    exact = {fnd.finding_identity(f): f.exemplar_trace_ids for f in plain}
    # Every finding over the written minute is looked up again; one whose baseline look-back
    # (not its own window) holds the minute may be too, depending on where the hour falls.
    far = {fnd.finding_identity(f) for f in looked_up if fnd.finding_window(f).end_ns <= minute * 60 * S}
    assert touched <= set(lookups) <= {fnd.finding_identity(f) for f in looked_up}
    assert far and far.isdisjoint(lookups), "findings that ended before the written minute keep theirs"
    for i in ids:
        assert by_id[i].exemplar_trace_ids in ([exact[i]] if i in touched else [(marker,), exact[i]])

    # Other thresholds: nothing is taken from an evaluation made with different settings.
    lookups.clear()
    ev.find_for(reader, moved, Filters(), dataclasses.replace(th, cold_factor=3.01), relative=False)
    assert len(set(lookups)) >= len(shared)


def test_an_absolute_window_still_receiving_spans_is_evaluated_once_per_fresh_period(filled):
    """Spans written into a window after its evaluation wait at most ABSOLUTE_FRESH_S, as a
    relative window's do: a team opening an ongoing incident's window together runs the
    detectors once, not once a request; past that period the change log decides again."""
    _settled_long_ago(filled)
    reader, th = StoreReader(filled), Thresholds()
    end = time.time_ns() // (60 * S) * (60 * S) - 2 * 60 * S
    window = Window(end - 30 * 60 * S, end)
    first = ev.find_for(reader, window, Filters(), th, relative=False)
    _late_trace(filled, window.start_ns + 5 * 60 * S)
    again = ev.find_for(reader, window, Filters(), th, relative=False)
    assert again.stored and again.evaluated_ns == first.evaluated_ns and again.findings == first.findings
    # The same evaluation ABSOLUTE_FRESH_S + 1 s old: the late trace makes it stale.
    with filled.begin() as conn:
        conn.execute(update(FindingEvaluation).where(FindingEvaluation.range_s == ev.ABSOLUTE_RANGE)
                     .values(evaluated_ns=FindingEvaluation.evaluated_ns - (ev.ABSOLUTE_FRESH_S + 1) * S))
    assert ev.cached_absolute(filled, window, th) is None
    fresh = ev.find_for(reader, window, Filters(), th, relative=False)
    assert not fresh.stored and fresh.findings == fnd.find(reader, window, Filters(), th)
    # Without a change since, an old evaluation still answers (the change log says so).
    with filled.begin() as conn:
        conn.execute(update(FindingEvaluation).where(FindingEvaluation.range_s == ev.ABSOLUTE_RANGE)
                     .values(evaluated_ns=FindingEvaluation.evaluated_ns - 10 * 60 * S))
    _settled_long_ago(filled, 20 * 60)
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored


def test_minutes_after_a_closed_window_matter_only_after_a_birth_near_its_end(engine, monkeypatch):
    """Past its end a window's findings read only a cold start's steady half hour after an
    instance born in its last minutes: without such a birth a trace settled after the window
    leaves its findings stored; once an instance is born three minutes before its end, the
    same makes them stale."""
    import random

    monkeypatch.setattr(ev, "ABSOLUTE_FRESH_S", 0)  # the change log alone decides here

    from modalscope.core.spans import KIND_SERVER, SpanRecord
    from modalscope.ingest.writer import write_spans
    from tests.app.conftest import side_calls_trace

    now_min = time.time_ns() // (60 * S)
    rng = random.Random(5)
    write_spans(engine, [s for i in range(180) for s in side_calls_trace(
        rng, (now_min - 90) * 60 * S + i * 30 * S, db_ms=5 + i % 7, llm_ms=80)])  # no instance ids
    settle(engine, force=True)
    _settled_long_ago(engine)
    reader, th = StoreReader(engine), Thresholds()
    window = Window((now_min - 60) * 60 * S, (now_min - 45) * 60 * S)
    assert fnd.read_minutes(reader, window, th)[1] == now_min - 45
    assert not ev.find_for(reader, window, Filters(), th, relative=False).stored
    _late_trace(engine, window.end_ns + 2 * 60 * S)  # after the window, no birth near its end
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored
    # an instance born three minutes before the window's end: its steady half hour is read
    born = window.end_ns - 3 * 60 * S
    write_spans(engine, [SpanRecord(f"{now_min:032x}", "9" * 16, None, "gateway", "POST /chat", KIND_SERVER,
                                    born, born + 40_000_000, 0,
                                    resource={"service.name": "gateway", "service.instance.id": "gw-new"})])
    settle(engine, force=True)
    assert fnd.read_minutes(reader, window, th)[1] > now_min - 45 + 30
    _settled_long_ago(engine)
    ev.find_for(reader, window, Filters(), th, relative=False)
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored
    _late_trace(engine, window.end_ns + 4 * 60 * S)  # (another trace: the first is stored already)
    assert not ev.find_for(reader, window, Filters(), th, relative=False).stored


def test_retention_and_retag_make_stored_absolute_findings_stale(filled, monkeypatch):
    from modalscope.ingest.retag import retag
    from modalscope.ingest.retention import RetentionPolicy, prune
    from modalscope.ingest.rules_file import default_rules

    monkeypatch.setattr(ev, "ABSOLUTE_FRESH_S", 0)  # the change log alone decides here
    _settled_long_ago(filled)
    reader, th = StoreReader(filled), Thresholds()
    end = time.time_ns() // (60 * S) * (60 * S) - 2 * 60 * S
    window = Window(end - 30 * 60 * S, end)
    ev.find_for(reader, window, Filters(), th, relative=False)
    # Retention that deletes spans of the minutes read: stale.
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored
    pruned = prune(filled, RetentionPolicy(span_days=(time.time_ns() - window.start_ns) / 86400 / S,
                                           minute_rollup_days=0, hourly_rollup_days=0))
    assert pruned.spans > 0
    assert not ev.find_for(reader, window, Filters(), th, relative=False).stored
    _settled_long_ago(filled)
    assert ev.find_for(reader, window, Filters(), th, relative=False).stored
    retag(filled, default_rules())
    assert not ev.find_for(reader, window, Filters(), th, relative=False).stored


def _a_finding(kind: str) -> Finding:
    return Finding(kind, "info", Subject(), "2025-11-30T10:00:00Z", "2025-11-30T10:01:00Z")


def test_absolute_findings_kept_are_bounded(engine, monkeypatch):
    monkeypatch.setattr(ev, "ABSOLUTE_MAX_KEPT", 3)
    th, now = Thresholds(), time.time_ns()
    ev.store_absolute(engine, Window(now - 9 * HOUR, now), th, [], now - 2 * changes.KEEP_S * S)
    assert ev.cached_absolute(engine, Window(now - 9 * HOUR, now), th) is None  # past KEEP_S: never answers
    for i in range(5):
        ev.store_absolute(engine, Window(now - HOUR + i * S, now), th, [_a_finding(str(i))], now + i)
    ev.store_absolute(engine, Window(now - HOUR + 4 * S, now), th, [], now + 9)  # replaces its older copy
    with engine.connect() as conn:
        kept = conn.execute(select(FindingEvaluation.evaluated_ns).order_by(FindingEvaluation.evaluated_ns)).scalars()
        kept = kept.all()
    assert kept == [now + 2, now + 3, now + 9]  # the newest three; the one past KEEP_S went first


def test_other_thresholds_do_not_share_an_evaluation(filled):
    reader = StoreReader(filled)
    end = time.time_ns()
    window = Window(end - HOUR, end)
    ev.find_for(reader, window, Filters(), Thresholds(), relative=True)
    strict = dataclasses.replace(Thresholds(), min_samples=10_000)
    assert ev.thresholds_key(strict) != ev.thresholds_key(Thresholds())
    other = ev.find_for(reader, window, Filters(), strict, relative=True)
    assert not other.stored and _rows(filled) == 2


def test_old_evaluations_are_deleted_when_a_new_one_is_stored(engine):
    key = ev.thresholds_key(Thresholds())
    end = time.time_ns()
    ev.store(engine, Window(end - (ev.RELATIVE_KEEP_S + 60) * S - HOUR, end - (ev.RELATIVE_KEEP_S + 60) * S), key, [], 1)
    ev.store(engine, Window(end - 60 * S - HOUR, end - 60 * S), key, [], 2)
    assert _rows(engine) == 2
    ev.store(engine, Window(end - HOUR, end), key, [_a_finding("x")], 3)
    with engine.connect() as conn:
        kept = conn.execute(select(FindingEvaluation.evaluated_ns).order_by(FindingEvaluation.end_ns)).scalars().all()
    assert kept == [2, 3]


def test_the_schedule_evaluates_each_range_once_a_period(filled):
    schedule = ev.EvaluationSchedule(filled, (3600, 86400), every_s=60, thresholds=Thresholds())
    assert schedule.maybe_run(now=1000.0) == 2 and _rows(filled) == 2
    assert schedule.maybe_run(now=1030.0) == 0  # not due
    # Another process's schedule finds fresh evaluations and leaves them.
    assert ev.EvaluationSchedule(filled, (3600, 86400), every_s=60, thresholds=Thresholds()).maybe_run() == 0
    assert _rows(filled) == 2
    # Off: never evaluates.
    assert ev.EvaluationSchedule(filled, (3600,), every_s=0).maybe_run() == 0


def test_the_schedule_keeps_the_packs_it_decoded_between_ticks(filled, monkeypatch):
    """The settler's schedule reads with one reader across ticks: the next minute's evaluation
    of the last 24 h fetches no hour pack it already holds (``packs.PackCache``)."""
    from modalscope.models import packs

    assert packs.pack_everything(filled) >= 1
    decoded: list[int] = []
    real = packs.decode
    monkeypatch.setattr(packs, "decode", lambda blob: decoded.append(len(blob)) or real(blob))
    schedule = ev.EvaluationSchedule(filled, (86400,), every_s=60, thresholds=Thresholds())
    assert schedule.maybe_run(now=1000.0) == 1 and decoded
    fetched = len(decoded)
    with filled.begin() as conn:  # (as if a minute passed: nothing fresh stored)
        conn.execute(FindingEvaluation.__table__.delete())
    assert schedule.maybe_run(now=1061.0) == 1 and _rows(filled) == 1
    assert len(decoded) == fetched


def test_past_days_reach_as_far_back_as_the_minute_rollups_and_raw_spans():
    assert ev.past_days(7, 2) == 1  # the defaults: the day before the last 24 h
    assert ev.past_days(7, 7) == 6 and ev.past_days(3.5, 0) == 2 and ev.past_days(0, 2.9) == 1
    assert ev.past_days(1, 2) == 0 and ev.past_days(0.5, 0) == 0
    assert ev.past_days(0, 0) == ev.past_days(400, 400) == ev.PAST_DAYS_MAX
    now = time.time_ns()
    windows = ev.past_windows(now, 3)
    hour = now // HOUR * HOUR
    assert [(w.start_ns, w.end_ns) for w in windows] == [(hour - (k + 1) * 24 * HOUR, hour - k * 24 * HOUR)
                                                         for k in (1, 2, 3)]


def test_the_schedule_keeps_the_day_before_the_last_24_h_evaluated(filled, monkeypatch):
    """A past window is evaluated on a tick when its stored findings are missing or stale,
    once, and a window opened inside it later starts from them."""
    _settled_long_ago(filled)
    reader, th = StoreReader(filled), Thresholds()
    now = time.time_ns()
    later = now + 25 * HOUR  # a day on: the filled hour is in the day before the last 24 h
    (past,) = ev.past_windows(later, 1)
    assert past.start_ns < now - HOUR and now <= past.end_ns
    schedule = ev.EvaluationSchedule(filled, (), every_s=60, thresholds=th, past_days=1)
    assert schedule.maybe_run(now=1000.0, now_ns=later) == 1
    stored = ev.cached_absolute(filled, past, th)
    assert stored is not None and stored.findings, "the demo hour's patterns are found"
    assert stored.findings == fnd.find(reader, past, Filters(), th)
    assert schedule.maybe_run(now=1030.0, now_ns=later) == 0  # not due
    assert schedule.maybe_run(now=1061.0, now_ns=later) == 0  # due, and still valid: left
    assert _absolute_rows(filled) == 1
    # A window inside it (an incident's hour, opened the next day) takes its findings'
    # exemplars: no raw look-up for the findings it shares.
    lookups = []
    real_look_up = fnd._with_exemplars
    monkeypatch.setattr(fnd, "_with_exemplars",
                        lambda r, f: lookups.append(fnd.finding_identity(f)) or real_look_up(r, f))
    inside = Window(now - HOUR + 30 * S, now)
    got = ev.find_for(reader, inside, Filters(), th, relative=False)
    shared = {fnd.finding_identity(f): f for f in stored.findings}
    taken = [f for f in got.findings if fnd.finding_identity(f) in shared]
    assert len(taken) >= 3 and not set(lookups) & set(shared)
    assert all(f.exemplar_trace_ids == shared[fnd.finding_identity(f)].exemplar_trace_ids for f in taken)
    # Past its fresh period, a late trace settled into it makes it stale: evaluated again.
    with filled.begin() as conn:
        conn.execute(update(FindingEvaluation).values(evaluated_ns=FindingEvaluation.evaluated_ns - 600 * S))
    from modalscope.ingest.writer import write_spans
    from tests.app.conftest import side_calls_trace

    write_spans(filled, side_calls_trace(random.Random(1), now - 30 * 60 * S, db_ms=50, llm_ms=400))
    settle(filled, force=True)
    assert ev.cached_absolute(filled, past, th) is None
    assert schedule.maybe_run(now=1122.0, now_ns=later) == 1
    assert ev.cached_absolute(filled, past, th) is not None


# Every 4 s: the first evaluation waits a random part of a quarter period (at most 1 s here;
# at the default 60 s, up to 15 s of each test's time).
EVERY_S = 4.0


def test_the_settler_thread_evaluates_ahead(filled):
    # one range and no past days (raw spans kept for one day)
    plan = ev.settler_evaluations(Settings(findings_ranges_s=(3600,), findings_every_s=EVERY_S, retention_days=1))
    settler = Settler(filled, 5.0, interval=0.05, jobs=SettlerJobs(evaluations=plan)).start()
    try:
        deadline = time.monotonic() + 60
        while _rows(filled) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        settler.stop(final=False)
    assert _rows(filled) == 1
    with filled.connect() as conn:
        row = conn.execute(select(FindingEvaluation.range_s, FindingEvaluation.start_ns,
                                  FindingEvaluation.end_ns)).one()
    assert row.range_s == 3600 and row.end_ns - row.start_ns == HOUR
    assert abs(row.end_ns - time.time_ns()) < 120 * S


def test_the_settler_process_evaluates_ahead(filled, db_url):
    plan = ev.settler_evaluations(Settings(findings_ranges_s=(3600, 86400), findings_every_s=EVERY_S))
    assert plan.keywords["past_days"] == 1  # the defaults: the day before the last 24 h
    settler = SettlerProcess(db_url, 5.0, interval=0.05, jobs=SettlerJobs(evaluations=plan)).start()
    wanted = {3600, 86400, ev.ABSOLUTE_RANGE}

    def ranges() -> set[int]:
        with filled.connect() as conn:
            return set(conn.execute(select(FindingEvaluation.range_s).distinct()).scalars())

    try:
        deadline = time.monotonic() + 90
        while ranges() != wanted and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        settler.stop()
    # The two ranges ending now, and the day before the last 24 h (ending on a whole hour); a
    # slow machine may have evaluated a range ending now twice meanwhile (its period passed).
    assert ranges() == wanted
    with filled.connect() as conn:
        past = conn.execute(select(FindingEvaluation.start_ns, FindingEvaluation.end_ns)
                            .where(FindingEvaluation.range_s == ev.ABSOLUTE_RANGE)).one()
    assert past.end_ns - past.start_ns == 24 * HOUR and past.end_ns % HOUR == 0
    assert abs(past.end_ns - (time.time_ns() - 24 * HOUR)) < 2 * HOUR


def test_the_api_says_which_window_answered(filled, db_url):
    app = create_app(Settings(database_url=db_url))
    client = app.test_client()
    first = client.get("/api/v1/anomalies?range=1h")
    assert first.status_code == 200 and first.get_json()
    second = client.get("/api/v1/anomalies", query_string={"range": "1h", "input_type": "image"})
    assert second.status_code == 200
    # The second is the first's evaluation, filtered: same window, same evaluation time.
    assert second.headers["X-Modalscope-Window"] == first.headers["X-Modalscope-Window"]
    assert second.headers["X-Modalscope-Evaluated-At"] == first.headers["X-Modalscope-Evaluated-At"]
    assert second.get_json() == [f for f in first.get_json() if f["subject"].get("input_type") == "image"]
    start, end = first.headers["X-Modalscope-Window"].split("/")
    assert parse_time(end, "end") - parse_time(start, "start") == HOUR
    # An absolute window is that window, evaluated now (and stored for exactly that window).
    absolute = client.get("/api/v1/anomalies", query_string={"start": start, "end": end})
    assert absolute.headers["X-Modalscope-Window"] == first.headers["X-Modalscope-Window"]
    assert absolute.headers["X-Modalscope-Evaluated-At"] != first.headers["X-Modalscope-Evaluated-At"]
    assert _rows(filled) == 2 and _absolute_rows(filled) == 1


def test_the_page_note_says_which_window_and_when():
    from modalscope.app.components import evaluation_note

    start, end = parse_time("2026-11-30T10:00:00Z", "s"), parse_time("2026-11-30T11:00:00Z", "e")
    at = parse_time("2026-11-30T11:00:07Z", "at")
    stored = ev.Evaluation([], start, end, at, stored=True)
    assert evaluation_note(stored) == ("evaluated at 11:00:07 UTC (a stored evaluation) over "
                                       "2026-11-30 10:00 → 2026-11-30 11:00 UTC")
    assert "stored" not in evaluation_note(dataclasses.replace(stored, stored=False))
