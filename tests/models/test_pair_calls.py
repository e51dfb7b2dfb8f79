"""``pair_calls``: the settler writes one row per call of a service pair, and a pair's
exemplar search walks them — with exactly the answers of the raw-span search it replaces."""

from __future__ import annotations

import random
import time

import pytest
from sqlalchemy import delete, func, insert, select

from modalscope.app import queries
from modalscope.app.params import Window
from modalscope.ingest import demo
from modalscope.ingest.records import KIND_CLIENT, KIND_SERVER, SpanRecord
from modalscope.ingest.retention import RetentionPolicy, prune
from modalscope.ingest.settle import settle
from modalscope.ingest.traces import input_type_of, service_pairs
from modalscope.ingest.writer import write_spans
from modalscope.models import PAIR_CALLS_CURSOR, Cursor, PairCall, Series, Span, Trace
from modalscope.models.reader import Filters, StoreReader
from tests.app.conftest import MIN, MS, side_calls_trace
from tests.factories import multimodal_trace

DAY_NS = 86_400_000_000_000


def _stored_calls(engine) -> dict[int, tuple]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(PairCall.span_row, Series.caller, Series.callee, Series.input_type, PairCall.start_ns,
                   PairCall.duration_ns).join(Series, Series.id == PairCall.series_id)).all()
    return {r[0]: tuple(r[1:]) for r in rows}


def _expected_calls(engine, traces: list[list[SpanRecord]]) -> dict[int, tuple]:
    """What settling must have written: every CLIENT span with a pair, from the raw spans."""
    with engine.connect() as conn:
        row_of = {(t, s): i for i, t, s in conn.execute(select(Span.id, Span.trace_id, Span.span_id))}
    out = {}
    for spans in traces:
        it = input_type_of(spans)
        for span_id, (caller, callee) in service_pairs(spans).items():
            s = next(x for x in spans if x.span_id == span_id)
            out[row_of[(s.trace_id, span_id)]] = (caller, callee, it, s.start_ns, s.end_ns - s.start_ns)
    return out


def test_settling_writes_one_row_per_call(engine):
    rng = random.Random(5)
    base = (time.time_ns() // MIN - 30) * MIN
    traces = [multimodal_trace(rng, base + i * 3_000_000_000, images=1 + i % 3) for i in range(12)]
    traces += [side_calls_trace(rng, base + i * 2_000_000_000, db_ms=3 + i, llm_ms=100 + i) for i in range(8)]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    expected = _expected_calls(engine, traces)
    assert len(expected) == 12 + 2 * 8  # a call a multimodal trace, two a side-calls trace
    assert _stored_calls(engine) == expected
    # Settling again (a retag, a resent trace) changes nothing and duplicates nothing.
    with engine.begin() as conn:
        conn.execute(Trace.__table__.update().values(pending=True))
    settle(engine, force=True)
    assert _stored_calls(engine) == expected


def test_a_late_child_moves_the_call_to_its_service(engine):
    """A CLIENT span named its callee by peer.service; the callee's SERVER span arrives after
    the trace settled: the re-settle moves the call to the real callee, one row still."""
    base = (time.time_ns() // MIN - 10) * MIN
    tid, root, call = "ab" * 16, "1" * 16, "2" * 16
    first = [SpanRecord(tid, root, None, "gateway", "POST /chat", KIND_SERVER, base, base + 300 * MS, 0),
             SpanRecord(tid, call, root, "gateway", "Encode", KIND_CLIENT, base + MS, base + 250 * MS, 0,
                        attributes={"peer.service": "encoder-lb"})]
    write_spans(engine, first)
    settle(engine, force=True)
    assert [v[:2] for v in _stored_calls(engine).values()] == [("gateway", "encoder-lb")]
    write_spans(engine, [SpanRecord(tid, "3" * 16, call, "vision-encoder", "Encode", KIND_SERVER, base + 2 * MS,
                                    base + 240 * MS, 0)])
    settle(engine, force=True)
    calls = list(_stored_calls(engine).values())
    assert [c[:2] for c in calls] == [("gateway", "vision-encoder")] and calls[0][4] == 249 * MS
    rows = queries.exemplar_traces(StoreReader(engine), Window(base - MIN, base + MIN),
                                   Filters(caller="gateway", callee="vision-encoder"))
    assert [r["span_id"] for r in rows] == [call]
    assert queries.exemplar_traces(StoreReader(engine), Window(base - MIN, base + MIN),
                                   Filters(caller="gateway", callee="encoder-lb")) == []


@pytest.fixture
def demo_store(engine):
    config = demo.DemoConfig(now_ns=(time.time_ns() // MIN - 5) * MIN, seed=3, hours=0.25, rate=1.2)
    demo.fill(engine, config)
    settle(engine, force=True)
    return config


def _raw_span_search(engine):
    """Make every window start before pair_calls is complete: the raw-span search answers."""
    with engine.begin() as conn:
        conn.execute(delete(Cursor).where(Cursor.name == PAIR_CALLS_CURSOR))
        conn.execute(insert(Cursor).values(name=PAIR_CALLS_CURSOR, position=time.time_ns() + DAY_NS, holder=None,
                                           lease_expires_ns=0, updated_ns=0))


def test_pair_exemplars_equal_the_raw_span_search(engine, demo_store):
    reader = StoreReader(engine)
    full = Window(demo_store.start_ns - MIN, demo_store.end_ns + 10 * MIN)
    mid = (demo_store.start_ns + demo_store.end_ns) // 2
    windows = (full, Window(mid, mid + 4 * MIN))
    pairs = queries.pairs(reader, full, Filters())
    assert len(pairs) >= 5
    cases = []
    for p in pairs:
        cases.append((Filters(caller=p["caller"], callee=p["callee"]), None, None))
        cases.append((Filters(caller=p["caller"], callee=p["callee"]), p["p50_ms"], p["p99_ms"]))
    cases += [(Filters(callee=pairs[0]["callee"]), None, None), (Filters(caller=pairs[0]["caller"]), None, None),
              (Filters(caller=pairs[0]["caller"], callee=pairs[0]["callee"], input_type="image"), None, None),
              (Filters(caller=pairs[1]["caller"], service=pairs[1]["callee"]), None, None)]
    assert reader.pair_calls_complete_from() == 0

    def answers():
        return [queries.exemplar_traces(reader, w, f, min_ms=lo, max_ms=hi, limit=7)
                for w in windows for f, lo, hi in cases]

    walked = answers()
    _raw_span_search(engine)
    assert reader.pair_calls_complete_from() > full.end_ns
    searched = answers()
    assert walked == searched
    assert sum(len(a) for a in walked) > 100  # the cases found something to compare


def test_pending_traces_calls_are_exemplars_too(engine, demo_store):
    """A call of a trace not settled yet is found (from its raw spans) before any settled one."""
    reader = StoreReader(engine)
    window = Window(demo_store.start_ns - MIN, demo_store.end_ns + 10 * MIN)
    late = side_calls_trace(random.Random(4), demo_store.end_ns - 2 * MIN, db_ms=60_000, llm_ms=100)
    write_spans(engine, late)
    rows = queries.exemplar_traces(reader, window, Filters(caller="gateway", callee="userdb"), limit=3)
    assert rows[0]["trace_id"] == late[0].trace_id and rows[0]["span_ms"] == pytest.approx(60_000, abs=0.01)
    # Settled now: the same calls, from pair_calls alone.
    settle(engine, force=True)
    again = queries.exemplar_traces(reader, window, Filters(caller="gateway", callee="userdb"), limit=3)

    def calls(rs):
        return [(r["trace_id"], r["span_id"], r["span_ms"]) for r in rs]

    assert calls(again) == calls(rows)


def test_a_backlog_of_pending_traces_gives_the_raw_span_search_answers(engine, demo_store):
    """Traces still waiting to settle (a second stream of traffic written over the same
    quarter hour, not settled): their calls are read only when at least as slow as the
    settled ones read, and the answers stay exactly the raw-span search's."""
    reader = StoreReader(engine)
    late = demo.DemoConfig(now_ns=demo_store.now_ns, seed=11, hours=0.25, rate=1.2)
    demo.fill(engine, late)
    with engine.connect() as conn:
        pending = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
        settled = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(False))).scalar_one()
    assert pending > 100 and settled > 100
    full = Window(demo_store.start_ns - MIN, demo_store.end_ns + 10 * MIN)
    mid = (demo_store.start_ns + demo_store.end_ns) // 2
    pairs = queries.pairs(reader, full, Filters())
    cases = [(Filters(caller=p["caller"], callee=p["callee"]), lo, hi)
             for p in pairs for lo, hi in ((None, None), (p["p50_ms"], p["p99_ms"]), (None, p["p50_ms"]))]
    cases.append((Filters(caller=pairs[0]["caller"]), None, None))

    def answers():
        return [queries.exemplar_traces(reader, w, f, min_ms=lo, max_ms=hi, limit=limit)
                for w in (full, Window(mid, mid + 4 * MIN)) for f, lo, hi in cases for limit in (3, 7)]

    read = []
    real = reader.pending_calls
    reader.pending_calls = lambda *a, **k: read.append(k["min_ns"]) or real(*a, **k)
    walked = answers()
    del reader.pending_calls
    assert any(m is not None for m in read)  # pending calls were read above a floor
    _raw_span_search(engine)
    searched = answers()
    assert walked == searched
    assert sum(len(a) for a in walked) > 200
    with engine.connect() as conn:
        pending_ids = set(conn.execute(select(Trace.trace_id).where(Trace.pending.is_(True))).scalars())
    assert any(r["trace_id"] in pending_ids for a in walked for r in a)  # pending calls were found


def test_pending_calls_read_each_pending_trace_through_its_index(engine, demo_store):
    """SQLite must look up each pending trace's spans by trace id, not walk the window's or a
    service's spans (which took 69 s over 24 h at 10 M spans)."""
    if engine.dialect.name != "sqlite":
        return  # the query plan checked here is SQLite's; PostgreSQL plans by its statistics
    from sqlalchemy import event

    with engine.begin() as conn:
        conn.execute(Trace.__table__.update().values(pending=True))
    seen: list[tuple[str, tuple]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "FROM spans" in statement and "trace_id IN" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        got = StoreReader(engine).pending_calls(demo_store.start_ns, demo_store.end_ns, ["gateway"], min_ns=MS,
                                                max_ns=DAY_NS)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert got and seen
    with engine.connect() as conn:
        for statement, parameters in seen:
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters))
            assert "sqlite_autoindex_spans_1 (trace_id=?)" in plan, plan


def test_retention_deletes_a_spans_call_with_it(engine, demo_store):
    before = _stored_calls(engine)
    assert before
    cutoff = (demo_store.start_ns + demo_store.end_ns) // 2
    now = cutoff + DAY_NS
    prune(engine, RetentionPolicy(span_days=1.0, minute_rollup_days=30.0, hourly_rollup_days=90.0), now_ns=now)
    after = _stored_calls(engine)
    with engine.connect() as conn:
        kept = set(conn.execute(select(Span.id)).scalars())
        oldest = conn.execute(select(func.min(Span.start_ns))).scalar()
    assert oldest >= cutoff
    assert set(after) == set(before) & kept and len(after) < len(before)
