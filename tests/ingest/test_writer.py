"""The writer is idempotent and settling is order-independent, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import random
import time

import pytest
from sqlalchemy import func, select

from modalscope.ingest.settle import settle
from modalscope.ingest.writer import BatchWriter, SettleLag, WriterFull, write_spans
from modalscope.models import Rollup, Series, Span, Trace
from modalscope.models.sketch import decode
from tests.factories import multimodal_trace

MIN = 60_000_000_000


def snapshot(engine) -> dict:
    """Everything derived state holds, in comparable form."""
    with engine.connect() as conn:
        spans = conn.execute(select(func.count()).select_from(Span)).scalar_one()
        traces = {
            row.trace_id: (row.root_service, row.root_name, row.start_ns, row.duration_ns, row.span_count,
                           bool(row.error), row.input_type, bool(row.pending))
            for row in conn.execute(select(Trace.__table__))
        }
        rollups = {}
        q = select(Series.kind, Series.service, Series.name, Series.stage, Series.input_type, Series.caller,
                   Series.callee, Rollup.minute, Rollup.count, Rollup.error_count, Rollup.sum_ns,
                   Rollup.sketch).join(Series, Series.id == Rollup.series_id)
        for row in conn.execute(q):
            keys, counts = decode(row.sketch)
            rollups[tuple(row[:8])] = (row.count, row.error_count, row.sum_ns,
                                       tuple(zip(keys.tolist(), counts.tolist())))
    return {"spans": spans, "traces": traces, "rollups": rollups}


def _traces(n=6, seed=7):
    rng = random.Random(seed)
    base = (time.time_ns() // MIN - 30) * MIN
    return [multimodal_trace(rng, base + i * 7_000_000_000, images=1 + i % 3, error=(i == 2)) for i in range(n)]


def test_resending_changes_nothing(engine):
    traces = _traces()
    spans = [s for t in traces for s in t]
    assert write_spans(engine, spans).inserted == len(spans)
    settle(engine, force=True)
    before = snapshot(engine)
    assert before["spans"] == len(spans)
    assert len(before["traces"]) == len(traces)
    # Resend everything, in another order, twice; then settle again.
    for _ in range(2):
        assert write_spans(engine, list(reversed(spans))).inserted == 0
    settle(engine, force=True)
    assert snapshot(engine) == before
    pair_counts = [v[0] for k, v in before["rollups"].items() if k[0] == "pair"]
    assert sum(pair_counts) == len(traces)  # one gateway->vision-encoder call a trace


def test_a_write_mixing_new_and_resent_spans_counts_the_new_ones_and_their_traces_exactly(engine):
    """New spans and their traces are counted exactly whatever else the write holds: spans
    stored before, the same span twice, and (PostgreSQL's copy table is emptied only at
    commit) a second write in the same transaction."""
    from modalscope.ingest.writer import SPAN_COLUMNS, span_rows
    from modalscope.models.dialect import insert_spans

    traces = _traces(n=12, seed=11)
    old = [s for t in traces[:5] for s in t]
    new = [s for t in traces[5:9] for s in t]
    later = [s for t in traces[9:] for s in t]
    assert write_spans(engine, old).inserted == len(old)
    mixed = old[::2] + new + new[:3] + old[1::2]  # resent spans around the new ones, three twice
    assert write_spans(engine, mixed).inserted == len(new)
    with engine.begin() as conn:
        first = insert_spans(conn, SPAN_COLUMNS, span_rows(later[:4] + old[:2]))
        second = insert_spans(conn, SPAN_COLUMNS, span_rows(later))
    assert first[0] == 4 and second[0] == len(later) - 4
    assert {s.trace_id for s in later} >= second[1]
    with engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(Span)).scalar_one()
        pending = set(conn.execute(select(Trace.trace_id).where(Trace.pending.is_(True))).scalars())
    assert stored == len(old) + len(new) + len(later)
    assert {s.trace_id for s in new} <= pending


def test_span_text_with_copy_and_sql_metacharacters_is_stored_as_sent(engine):
    """Tabs, newlines, backslashes, COPY's end-of-data and NULL markers, quotes and a NUL
    (in a text column stored as U+FFFD) round-trip through the write, COPY included."""
    nasty = "a\tb\nc\\.\n\\.\r\\N\\x'\";--\x00 é 🙂"
    (trace,) = _traces(n=1, seed=5)
    trace[0] = dataclasses.replace(trace[0], name=nasty, status_message=nasty,
                                   attributes={"prompt": nasty, nasty: 1})
    assert write_spans(engine, trace).inserted == len(trace)
    with engine.connect() as conn:
        row = conn.execute(select(Span.name, Span.status_message, Span.attributes, Span.parent_span_id)
                           .where(Span.span_id == trace[0].span_id)).one()
    stored = nasty.replace("\x00", "\ufffd")
    assert row.name == stored and row.status_message == stored and row.parent_span_id is None
    # Inside the attributes' JSON a NUL is an escape, not a character: it comes back as sent.
    assert json.loads(row.attributes) == {"prompt": nasty, nasty: 1}


def test_split_in_reverse_order_equals_one_request(engine, tmp_path):
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade

    traces = _traces()
    spans = [s for t in traces for s in t]
    # Reference: everything in one request into a second, fresh database of the same kind.
    if engine.dialect.name == "sqlite":
        ref_url = f"sqlite:///{tmp_path / 'ref.db'}"
        upgrade(ref_url)
        ref = make_engine(ref_url, write=True)
    else:
        ref = engine  # compared after a truncate below
    write_spans(ref, spans)
    settle(ref, force=True)
    expected = snapshot(ref)
    if ref is engine:
        with engine.begin() as conn:
            for table in (Rollup, Trace, Span):
                conn.execute(table.__table__.delete())
    else:
        ref.dispose()

    # Now: three requests in reverse order, each settled before the next arrives (late spans).
    thirds = [spans[i::3] for i in range(3)]
    for part in reversed(thirds):
        write_spans(engine, part)
        settle(engine, force=True)
    got = snapshot(engine)
    assert got["spans"] == expected["spans"]
    assert got["traces"] == expected["traces"]
    assert got["rollups"] == expected["rollups"]


def test_settle_waits_for_idle_traces(engine):
    spans = _traces(1)[0]
    now = time.time_ns()
    write_spans(engine, spans, now_ns=now)
    assert settle(engine, settle_seconds=5, now_ns=now + 1_000_000_000) == 0
    assert settle(engine, settle_seconds=5, now_ns=now + 6_000_000_000) == 1
    assert snapshot(engine)["traces"][spans[0].trace_id][-1] is False


def test_late_span_moves_trace_to_its_input_type(engine):
    """A trace first settled as unknown is corrected when its root arrives late."""
    spans = _traces(1)[0]
    root = [s for s in spans if s.parent_span_id is None]
    rest = [s for s in spans if s.parent_span_id is not None]
    write_spans(engine, rest)
    settle(engine, force=True)
    snap = snapshot(engine)
    assert {k[4] for k in snap["rollups"] if k[0] == "trace"} == {"unknown"}
    write_spans(engine, root)
    settle(engine, force=True)
    snap = snapshot(engine)
    # (the detectors' convention rollups carry no input type)
    assert {k[4] for k in snap["rollups"] if k[0] in ("op", "pair", "trace", "tstage")} == {"image"}
    assert sum(v[0] for k, v in snap["rollups"].items() if k[0] == "trace") == 1


def test_batch_writer_acknowledges_after_commit_and_refuses_when_full(engine):
    writer = BatchWriter(engine, max_queue_spans=10)
    traces = _traces(3)
    # Not started: the queue fills and the next request is refused with a retry delay.
    fut = writer.submit(traces[0])
    with pytest.raises(WriterFull) as exc:
        writer.submit(traces[1])
    assert exc.value.retry_after >= 1
    writer.start()
    fut.result(10)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar_one() == len(traces[0])
    writer.write(traces[1], timeout=10)
    writer.close()
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar_one() == len(traces[0]) + len(traces[1])


def test_concurrent_writers_and_settlers_count_every_span_once(engine, db_url, tmp_path):
    """Two receivers' writers and settlers racing on one store end as one writer would."""
    import threading

    from modalscope.models.engine import make_engine

    traces = _traces(40, seed=21)
    spans = [s for t in traces for s in t]
    rng = random.Random(5)
    rng.shuffle(spans)
    halves = [spans[::2], spans[1::2]]
    # Overlap: each side also resends a slice of the other's spans.
    halves[0] += halves[1][:30]
    halves[1] += halves[0][:30]
    errors = []

    def worker(part):
        eng = make_engine(db_url, write=True)
        try:
            for i in range(0, len(part), 25):
                write_spans(eng, part[i : i + 25])
                settle(eng, force=True)
        except Exception as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
        finally:
            eng.dispose()

    threads = [threading.Thread(target=worker, args=(h,)) for h in halves]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    settle(engine, force=True)
    got = snapshot(engine)
    assert got["spans"] == len(spans)
    assert len(got["traces"]) == len(traces)
    assert sum(v[0] for k, v in got["rollups"].items() if k[0] == "op") == len(spans)
    assert sum(v[0] for k, v in got["rollups"].items() if k[0] == "trace") == len(traces)
    assert sum(v[0] for k, v in got["rollups"].items() if k[0] == "pair") == len(traces)
    assert all(not v[-1] for v in got["traces"].values())  # nothing left pending


def test_sqlite_settle_leaves_a_trace_that_changed_mid_settle_pending(tmp_path, monkeypatch):
    """SQLite settles outside the write lock; a span arriving meanwhile must not be lost.

    (SQLite only: PostgreSQL claims trace rows with FOR UPDATE SKIP LOCKED instead.)"""
    import modalscope.ingest.settle as settle_mod
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'mid.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)

    spans = _traces(1)[0]
    write_spans(engine, spans[:-1])
    real = settle_mod.summarize_rows
    fired = []

    def summarize_then_late_span(rows):
        if not fired:
            fired.append(True)
            write_spans(engine, spans[-1:])  # arrives between the read and the write
        return real(rows)

    monkeypatch.setattr(settle_mod, "summarize_rows", summarize_then_late_span)
    assert settle(engine, force=True, max_batches=1) == 0
    assert snapshot(engine)["traces"][spans[0].trace_id][-1] is True  # still pending
    assert settle(engine, force=True) == 1
    snap = snapshot(engine)
    assert sum(v[0] for k, v in snap["rollups"].items() if k[0] == "op") == len(spans)


def test_settle_lag_is_behind_only_while_old_traces_wait_and_the_settler_moves(engine, caplog):
    """Behind: a trace idle settle_seconds + max_lag_s still pending. Not behind once it is
    settled; and not behind, with a warning, when nothing has settled for stuck_after
    seconds (a stopped or failing settler must not stop ingest for good)."""
    lag = SettleLag(engine, max_lag_s=5, settle_seconds=1, every=0, stuck_after=1.0)
    now = time.time_ns()
    assert not lag.behind()  # nothing pending
    recent, old, older = (multimodal_trace(random.Random(i), now - 60_000_000_000) for i in (1, 2, 3))
    write_spans(engine, recent, now_ns=now - 3_000_000_000)  # idle 3 s < 1 + 5
    assert not lag.behind()
    write_spans(engine, old, now_ns=now - 7_000_000_000)  # idle 7 s
    assert lag.behind()
    settle(engine, trace_ids=[old[0].trace_id], force=True)
    assert not lag.behind()  # the oldest left is 3 s idle
    write_spans(engine, older, now_ns=now - 8_000_000_000)
    assert lag.behind()
    time.sleep(1.1)  # the oldest pending trace has not moved for stuck_after
    with caplog.at_level("WARNING", logger="modalscope.ingest.writer"):
        assert not lag.behind()
    assert "settled nothing" in caplog.text
    settle(engine, force=True)
    assert not lag.behind()


def test_traces_keep_their_earliest_span_start(engine):
    """first_start_ns: the earliest start of any span written for the trace, kept across
    writes (earlier or later spans), a resend, a settle and a re-open; a row whose first
    start is not known (from before migration 0008) stays unknown."""
    a, b = _traces(2)
    a = sorted(a, key=lambda s: s.start_ns)
    earliest = a[0].start_ns

    def first(tid):
        with engine.connect() as conn:
            return conn.execute(select(Trace.first_start_ns).where(Trace.trace_id == tid)).scalar_one()

    write_spans(engine, a[len(a) // 2:])
    assert first(a[0].trace_id) == min(s.start_ns for s in a[len(a) // 2:]) > earliest
    write_spans(engine, a[: len(a) // 2])  # the earlier half, late
    assert first(a[0].trace_id) == earliest
    write_spans(engine, a)  # a resend
    settle(engine, force=True)
    assert first(a[0].trace_id) == earliest
    write_spans(engine, [dataclasses.replace(a[-1], span_id="9" * 16)])  # re-opens the settled trace: a later span changes nothing
    assert first(a[0].trace_id) == earliest
    write_spans(engine, b[:1])
    with engine.begin() as conn:
        conn.execute(Trace.__table__.update().where(Trace.trace_id == b[0].trace_id).values(first_start_ns=None))
    write_spans(engine, b[1:])
    assert first(b[0].trace_id) is None
