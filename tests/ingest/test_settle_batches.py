"""Settle batches hold about ``BATCH_SPANS`` spans whatever the size of the traces, and a
pass cut short by its batch cap says that more is due, on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import modalscope.ingest.settle as settle_mod
from modalscope.core.spans import KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.ingest.settle import BATCH_SPANS, settle, settle_pass
from modalscope.ingest.writer import write_spans

MIN = 60_000_000_000
MS = 1_000_000


def _trace(n: int, spans: int, base: int) -> list[SpanRecord]:
    tid = f"{n + 1:032x}"
    root = SpanRecord(tid, f"{1:016x}", None, "gateway", "POST /v1/chat", KIND_SERVER, base, base + 500 * MS)
    return [root] + [SpanRecord(tid, f"{k + 2:016x}", root.span_id, "worker", "step", KIND_INTERNAL,
                                base + k * 1000, base + k * 1000 + MS) for k in range(spans - 1)]


def test_batches_stay_near_their_span_budget(engine, monkeypatch):
    base = (time.time_ns() // MIN - 20) * MIN
    big = BATCH_SPANS // 2 + 500  # two of them are over the budget
    traces = [_trace(i, big, base + i * MS) for i in range(4)] + \
        [_trace(10 + i, 12, base + i * MS) for i in range(300)]
    write_spans(engine, [s for t in traces for s in t])
    loaded: list[int] = []
    real = settle_mod.load_trace_rows

    def counting(conn, ids):
        rows = real(conn, ids)
        loaded.append(len(rows))
        return rows

    monkeypatch.setattr(settle_mod, "load_trace_rows", counting)
    assert settle(engine, force=True) == len(traces)
    assert sum(loaded) == sum(len(t) for t in traces)  # every span read once
    assert max(loaded) <= BATCH_SPANS


def test_a_pass_cut_short_says_more_is_due(engine):
    base = (time.time_ns() // MIN - 20) * MIN
    traces = [_trace(i, BATCH_SPANS // 2, base + i * MS) for i in range(4)]
    write_spans(engine, [s for t in traces for s in t])
    first = settle_pass(engine, force=True, max_batches=1)
    assert first.settled < len(traces) and first.more
    rest = settle_pass(engine, force=True)
    assert first.settled + rest.settled == len(traces) and not rest.more


def test_named_traces_all_settle_whatever_their_size(engine):
    """An importer settles the traces it wrote by id: each is settled, none left pending."""
    base = (time.time_ns() // MIN - 20) * MIN
    traces = [_trace(i, BATCH_SPANS // 2 + 10, base + i * MS) for i in range(3)]
    write_spans(engine, [s for t in traces for s in t])
    assert settle(engine, trace_ids=[t[0].trace_id for t in traces], force=True) == len(traces)
    assert settle_pass(engine, force=True).settled == 0  # nothing left pending
