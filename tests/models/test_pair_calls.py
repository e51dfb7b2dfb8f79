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
