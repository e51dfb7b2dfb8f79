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
from modalscope.core.spans import KIND_CLIENT, KIND_SERVER, SpanRecord
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


@pytest.fixture(scope="module")
def _demo_config():
    return demo.DemoConfig(now_ns=(time.time_ns() // MIN - 5) * MIN, seed=3, hours=0.25, rate=1.2)


@pytest.fixture
def demo_store(engine, db_url, filled_templates, _demo_config):
    """A quarter hour of demo traffic, settled: filled once a backend, copied for each test."""
    def build(eng):
        demo.fill(eng, _demo_config)
        settle(eng, force=True)

    filled_templates.fill_like(engine, db_url, "pair-calls-demo", build)
    return _demo_config


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
    assert reader.calls.complete_from() == 0

    def answers():
        return [queries.exemplar_traces(reader, w, f, min_ms=lo, max_ms=hi, limit=7)
                for w in windows for f, lo, hi in cases]

    walked = answers()
    _raw_span_search(engine)
    reader = StoreReader(engine)
    assert reader.calls.complete_from() > full.end_ns
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
        # each case in one of two windows at one of two limits (alternating: every combination
        # is exercised, at a quarter of the calls)
        narrow = Window(mid, mid + 4 * MIN)
        return [queries.exemplar_traces(reader, (full, narrow)[i % 2], f, min_ms=lo, max_ms=hi,
                                        limit=(3, 7)[i // 2 % 2])
                for i, (f, lo, hi) in enumerate(cases)]

    read = []
    real = reader.calls.pending
    reader.calls.pending = lambda *a, **k: read.append(k["min_ns"]) or real(*a, **k)
    walked = answers()
    del reader.calls.pending
    assert any(m is not None for m in read)  # pending calls were read above a floor
    _raw_span_search(engine)
    searched = answers()
    assert walked == searched
    assert sum(len(a) for a in walked) > 100
    with engine.connect() as conn:
        pending_ids = set(conn.execute(select(Trace.trace_id).where(Trace.pending.is_(True))).scalars())
    assert any(r["trace_id"] in pending_ids for a in walked for r in a)  # pending calls were found


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


def _spy(monkeypatch, reader, name: str) -> list:
    """Record each call of ``reader.<name>`` (args and kwargs) and pass it through."""
    calls: list = []
    real = getattr(reader, name)

    def spy(*a, **k):
        calls.append((a, k))
        return real(*a, **k)
    monkeypatch.setattr(reader, name, spy)
    return calls


@pytest.mark.parametrize("entries_per_trace", [10, 0], ids=["walk", "walk-too-dear"])
def test_pending_calls_through_the_span_index_give_the_raw_span_search_answers(engine, demo_store, monkeypatch,
                                                                              entries_per_trace):
    """Pending traces are read through the callers' span index from the earliest of them on,
    except stragglers (the earliest 2 %), traces whose first start is unknown (rows from
    before 0008) and, when the walk would read too many index entries, all of them: every
    way gives exactly the raw-span search's answers. Among the pending: a re-opened settled
    trace, a straggler with an hour-old first span and a trace of unknown first start, each
    holding the slowest userdb call of the store; and traces that begin after a window."""
    from modalscope.models.reader import calls as reader_module

    monkeypatch.setattr(reader_module, "PENDING_WALK_AFTER", 7)  # so a few dozen pending traces walk
    # (chunks of 60 of the ~950 pending traces: many chunks and a partial last one; 7 a
    # chunk made this test's statements a third of the module's time)
    monkeypatch.setattr(reader_module, "PENDING_CHUNK", 60)
    monkeypatch.setattr(reader_module, "PENDING_WALK_ENTRIES_PER_TRACE", entries_per_trace)
    reader = StoreReader(engine)
    demo.fill(engine, demo.DemoConfig(now_ns=demo_store.now_ns, seed=11, hours=0.1, rate=1.2))
    rng = random.Random(8)
    mid = (demo_store.start_ns + demo_store.end_ns) // 2
    straggler = side_calls_trace(rng, mid, db_ms=70_000, llm_ms=100)
    straggler.append(SpanRecord(straggler[0].trace_id, "7" * 16, straggler[0].span_id, "gateway", "warm-up",
                                KIND_SERVER, demo_store.start_ns - 60 * MIN, demo_store.start_ns - 59 * MIN, 0))
    unknown = side_calls_trace(rng, mid + MIN, db_ms=65_000, llm_ms=100)
    write_spans(engine, straggler + unknown)
    with engine.begin() as conn:
        conn.execute(Trace.__table__.update().where(Trace.trace_id == unknown[0].trace_id).values(first_start_ns=None))
        # re-open a settled trace: a late, slow call of gateway to userdb
        old = conn.execute(select(Span.trace_id, Span.span_id, Span.start_ns).where(
            Span.service == "gateway", Span.parent_span_id.is_(None), Span.start_ns < mid).limit(1)).one()
    write_spans(engine, [SpanRecord(old[0], "8" * 16, old[1], "gateway", "SELECT late", KIND_CLIENT,
                                    old[2] + MS, old[2] + 68_000 * MS, 0, attributes={"server.address": "userdb"})])
    with engine.connect() as conn:
        firsts = dict(conn.execute(select(Trace.trace_id, Trace.first_start_ns).where(Trace.pending.is_(True))).all())
    assert len(firsts) > 100 and firsts[unknown[0].trace_id] is None
    assert firsts[straggler[0].trace_id] == demo_store.start_ns - 60 * MIN and firsts[old[0]] <= old[2]

    full = Window(demo_store.start_ns - MIN, demo_store.end_ns + 10 * MIN)
    pairs = queries.pairs(reader, full, Filters())
    cases = [(Filters(caller=p["caller"], callee=p["callee"]), lo, hi)
             for p in pairs for lo, hi in ((None, None), (p["p50_ms"], p["p99_ms"]))]
    cases += [(Filters(caller="gateway", callee="userdb", input_type="image"), None, None),
              (Filters(caller=pairs[0]["caller"]), None, None)]

    def answers():
        # each case in one of two windows at one of two limits (alternating: every combination
        # is exercised, at a quarter of the calls)
        narrow = Window(mid, mid + 4 * MIN)
        return [queries.exemplar_traces(reader, (full, narrow)[i % 2], f, min_ms=lo, max_ms=hi,
                                        limit=(3, 7)[i // 2 % 2])
                for i, (f, lo, hi) in enumerate(cases)]

    walks = _spy(monkeypatch, reader.calls, "_pending_walk")
    one_by_one = _spy(monkeypatch, reader.calls, "_pending_one_by_one")
    walked = answers()
    monkeypatch.undo()
    if entries_per_trace:
        assert walks  # the walk was taken, and read the pending traces but a few
        assert min(len(a[1]) for a, _ in one_by_one) < len(firsts) // 10
    else:
        assert not walks and max(len(a[1]) for a, _ in one_by_one) >= len(firsts) // 2
    top = queries.exemplar_traces(reader, full, Filters(caller="gateway", callee="userdb"), limit=3)
    assert [r["trace_id"] for r in top] == [straggler[0].trace_id, old[0], unknown[0].trace_id]
    _raw_span_search(engine)
    assert walked == answers()
    assert sum(len(a) for a in walked) > 100


def test_the_walk_finds_each_call_that_reading_every_pending_trace_finds(engine, demo_store, monkeypatch):
    """For every pair, with and without a floor: the calls the walk finds (no stragglers, so
    it starts at the earliest pending trace's first span, here a CLIENT call) are, once
    checked exactly, the calls read trace by trace."""
    from modalscope.models.reader import calls as reader_module

    monkeypatch.setattr(reader_module, "PENDING_WALK_AFTER", 0)
    monkeypatch.setattr(reader_module, "PENDING_STRAGGLER_SHARE", 0)
    late = demo.DemoConfig(now_ns=demo_store.now_ns, seed=12, hours=0.1, rate=1.2)
    t0 = late.start_ns - 30 * 1_000_000_000
    first = SpanRecord("cd" * 16, "4" * 16, None, "gateway", "SELECT users", KIND_CLIENT, t0, t0 + 80_000 * MS, 0,
                       attributes={"server.address": "userdb"})
    # calls named only by their child span (peer.service is wrong): found through the callee's index
    side = [s for i in range(3) for s in side_calls_trace(random.Random(i), t0 + (i + 1) * 1_000_000_000,
                                                           db_ms=5, llm_ms=400)]
    write_spans(engine, [first] + side)
    demo.fill(engine, late)
    reader = StoreReader(engine)
    full = Window(demo_store.start_ns - MIN, demo_store.end_ns + 10 * MIN)
    walks = _spy(monkeypatch, reader.calls, "_pending_walk")

    def exact(rows, f):
        return sorted(r["_id"] for r in queries._calls_of_pair(reader, rows, f))

    compared = 0
    for i, p in enumerate(queries.pairs(reader, full, Filters())):
        f = Filters(caller=p["caller"], callee=p["callee"])
        # with and without a floor, alternating pair by pair (both are exercised)
        for floor in ((None, int(p["p50_ms"] * MS))[i % 2],):
            args = (full.start_ns, full.end_ns, [p["caller"]])
            monkeypatch.setattr(reader_module, "PENDING_WALK_ENTRIES_PER_TRACE", 1_000)
            walked = reader.calls.pending(*args, min_ns=floor, may_call=p["callee"])
            monkeypatch.setattr(reader_module, "PENDING_WALK_ENTRIES_PER_TRACE", 0)
            one_by_one = reader.calls.pending(*args, min_ns=floor, may_call=p["callee"])
            found = exact(walked, f)
            assert found == exact(one_by_one, f), (p["caller"], p["callee"], floor)
            compared += len(found)
    assert walks and compared > 100
    gateway_db = exact(reader.calls.pending(full.start_ns, full.end_ns, ["gateway"], may_call="userdb"),
                       Filters(caller="gateway", callee="userdb"))
    gateway_llm = exact(reader.calls.pending(full.start_ns, full.end_ns, ["gateway"], may_call="llm"),
                        Filters(caller="gateway", callee="llm"))
    with engine.connect() as conn:
        assert conn.execute(select(Span.id).where(Span.trace_id == "cd" * 16)).scalar_one() in gateway_db
        llm_calls = conn.execute(select(Span.id).where(Span.trace_id.in_({s.trace_id for s in side}),
                                                       Span.name == "llm.Generate")).scalars().all()
    assert len(llm_calls) == 3 and set(llm_calls) <= set(gateway_llm)


def _named_calls_traces(base: int) -> list[list[SpanRecord]]:
    """Calls named by every rule settling has: an address with a port, a URL whose host is
    written in capitals, a model provider (with a transport span under the model call, which
    makes no call), a provider only the attributes name (a span stored before signals were)
    and a model served by an instrumented service; two models."""
    from modalscope.core.spans import KIND_INTERNAL
    from tests.factories import rules

    out = []
    for i in range(6):
        tid, t0 = f"{i + 1:032x}", base + i * 2_000_000_000
        sid = [f"{i * 16 + j + 1:016x}" for j in range(8)]
        res = {"service.name": "gateway"}
        model = ("gemini-2.0-flash", "gemini-1.5-pro")[i % 2]
        spans = [
            SpanRecord(tid, sid[0], None, "gateway", "POST /chat", KIND_SERVER, t0, t0 + 900 * MS, 0, resource=res),
            SpanRecord(tid, sid[1], sid[0], "gateway", "SELECT usage", KIND_CLIENT, t0 + MS, t0 + (3 + i) * MS, 0,
                       attributes={"db.system": "postgresql", "server.address": "usage-db", "server.port": 5432},
                       resource=res),
            SpanRecord(tid, sid[2], sid[0], "gateway", "GET", KIND_CLIENT, t0 + 5 * MS, t0 + (15 + i) * MS, 0,
                       attributes={"http.request.method": "GET",
                                   "url.full": "http://ObjStore.Internal:9000/a.jpg"}, resource=res),
            SpanRecord(tid, sid[3], sid[0], "gateway", f"generate_content {model}", KIND_CLIENT, t0 + 20 * MS,
                       t0 + (300 + 10 * i) * MS, 0,
                       attributes={"gen_ai.operation.name": "generate_content", "gen_ai.provider.name": "Gemini",
                                   "gen_ai.request.model": model,
                                   "server.address": "generativelanguage.googleapis.com"}, resource=res),
            SpanRecord(tid, sid[4], sid[3], "gateway", "POST", KIND_CLIENT, t0 + 21 * MS, t0 + (299 + 10 * i) * MS,
                       0, attributes={"http.request.method": "POST",
                                      "url.full": "https://generativelanguage.googleapis.com/v1/x"}, resource=res),
            SpanRecord(tid, sid[5], sid[0], "gateway", "chat mm-llm-7b", KIND_INTERNAL, t0 + 400 * MS,
                       t0 + (700 + i) * MS, 0,
                       attributes={"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
                                   "gen_ai.request.model": "mm-llm-7b"}, resource=res),
            SpanRecord(tid, sid[6], sid[5], "llm", "POST /v1/chat", KIND_SERVER, t0 + 401 * MS, t0 + 690 * MS, 0,
                       resource={"service.name": "llm"}),
        ]
        if i % 3 != 2:
            rules().tag(spans)  # the third of them as stored before signals: read from attributes
        out.append(spans)
    return out


def test_exemplars_of_every_naming_rule_equal_the_raw_span_search(engine):
    base = (time.time_ns() // MIN - 20) * MIN
    traces = _named_calls_traces(base)
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    reader = StoreReader(engine)
    window = Window(base - MIN, base + 5 * MIN)
    pairs = {(p["caller"], p["callee"]): p for p in queries.pairs(reader, window, Filters())}
    # (the HTTP request under a model call makes no call, but in spans stored before signals:
    # nothing marked it as a transport span then)
    assert {k: v["count"] for k, v in pairs.items()} == {
        ("gateway", "usage-db:5432"): 6, ("gateway", "objstore.internal:9000"): 6, ("gateway", "gemini"): 6,
        ("gateway", "llm"): 6, ("gateway", "generativelanguage.googleapis.com"): 2}
    assert pairs[("gateway", "gemini")]["models"] == ["gemini-1.5-pro", "gemini-2.0-flash"]
    assert pairs[("gateway", "llm")]["models"] == ["mm-llm-7b"]
    assert pairs[("gateway", "usage-db:5432")]["models"] == []
    by_model = queries.pairs(reader, window, Filters(model="gemini-1.5-pro"))
    assert [(p["callee"], p["count"], p["models"]) for p in by_model] == [("gemini", 3, ["gemini-1.5-pro"])]
    assert [(r["model"], r["count"]) for r in queries.pair_models(
        reader, window, Filters(caller="gateway", callee="gemini", model="gemini-1.5-pro"))] == [
        ("gemini-1.5-pro", 3), ("gemini-2.0-flash", 3)]
    cases = [Filters(caller="gateway", callee=c) for _, c in sorted(pairs)] + [
        Filters(caller="gateway"), Filters(callee="gemini", model="gemini-2.0-flash"),
        Filters(caller="gateway", model="gemini-1.5-pro")]

    def answers():
        return [[(r["trace_id"], r["span_id"], r["span_ms"]) for r in
                 queries.exemplar_traces(StoreReader(engine), window, f, limit=4)] for f in cases]

    walked = answers()
    _raw_span_search(engine)
    assert answers() == walked
    # every CLIENT pair has exemplars; the INTERNAL model call to llm has none (no pair_calls row)
    assert [len(a) for a in walked] == [4, 2, 0, 4, 4, 4, 3, 3]
    tagged = {t[4].span_id for i, t in enumerate(traces) if i % 3 != 2}
    assert not tagged & {sid for a in walked for _, sid, _ in a}  # the model call's own HTTP request


def test_the_raw_span_walk_finds_calls_known_by_their_child_or_only_by_name(engine):
    """Searching raw spans, a call is found whether its callee shows only as its child's
    service (a wrong peer.service) or has no spans at all (a database named by address)."""
    rng = random.Random(11)
    base = (time.time_ns() // MIN - 30) * MIN
    traces = [side_calls_trace(rng, base + i * 20_000 * MS, db_ms=5 + 7 * (i % 5) + i, llm_ms=200 + 13 * i)
              for i in range(30)]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    _raw_span_search(engine)
    window = Window(base - MIN, base + 15 * MIN)  # the whole store: the walk, not a sort
    for callee, name in (("llm", "llm.Generate"), ("userdb", "SELECT users")):
        calls = sorted((s for t in traces for s in t if s.name == name),
                       key=lambda s: (s.start_ns - s.end_ns, s.start_ns))[:5]
        rows = queries.exemplar_traces(StoreReader(engine), window, Filters(caller="gateway", callee=callee), limit=5)
        assert [(r["trace_id"], r["span_id"]) for r in rows] == [(s.trace_id, s.span_id) for s in calls], callee
        # A latency band's walk: only the calls at or above its floor.
        floor_ms = (calls[2].end_ns - calls[2].start_ns) / 1e6
        rows = queries.exemplar_traces(StoreReader(engine), window, Filters(caller="gateway", callee=callee),
                                       min_ms=floor_ms, limit=5)
        assert [(r["trace_id"], r["span_id"]) for r in rows] == [(s.trace_id, s.span_id) for s in calls[:3]], callee
