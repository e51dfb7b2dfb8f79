"""A queue hand-off between traces (a CONSUMER span linked to the PRODUCER span of another
trace) is one call whichever of its two traces arrives and settles first, on SQLite and
PostgreSQL: receivers behind a load balancer see them in any order."""

from __future__ import annotations

import time

from sqlalchemy import func, select

import modalscope.ingest.settle as settle_mod
from modalscope.core.spans import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, SpanRecord
from modalscope.core.window import Window
from modalscope.ingest.retention import RetentionPolicy, prune
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models import LinkWait, Trace
from modalscope.models.reader import Filters, StoreReader

MIN = 60_000_000_000
MS = 1_000_000
PUB, SUB = "a1" * 16, "b2" * 16


def _handoff(base: int, target_sid: str = "2" * 16) -> tuple[list[SpanRecord], list[SpanRecord]]:
    """The producer's trace (a gateway request that publishes a usage event) and the
    consumer's (metering processing it, linked to the publish span)."""
    producer = [
        SpanRecord(PUB, "1" * 16, None, "gateway", "POST /v1/chat", KIND_SERVER, base, base + 900 * MS),
        SpanRecord(PUB, "2" * 16, "1" * 16, "gateway", "usage publish", KIND_PRODUCER, base + 800 * MS,
                   base + 810 * MS),
    ]
    consumer = [
        SpanRecord(SUB, "4" * 16, None, "metering", "usage process", KIND_CONSUMER, base + 875 * MS,
                   base + 950 * MS, links=[{"trace_id": PUB, "span_id": target_sid, "attributes": {}}]),
        SpanRecord(SUB, "5" * 16, "4" * 16, "metering", "INSERT usage", KIND_CLIENT, base + 880 * MS,
                   base + 940 * MS, attributes={"server.address": "usagedb", "server.port": 5432}),
    ]
    return producer, consumer


def _handoff_calls(engine, base: int) -> list[tuple[int, float]]:
    """(count, p50 ms) of the gateway → metering pair; [] when there is no such call."""
    rows = StoreReader(engine)
    from modalscope.app import queries

    pairs = queries.pairs(rows, Window(base - MIN, base + 3 * MIN), Filters())
    return [(p["count"], p["p50_ms"]) for p in pairs if (p["caller"], p["callee"]) == ("gateway", "metering")]


def _pending(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()


def _base() -> int:
    return (time.time_ns() // MIN - 10) * MIN


def test_a_consumer_settled_before_its_producer_arrived_gets_the_call(engine):
    base = _base()
    producer, consumer = _handoff(base)
    write_spans(engine, consumer)
    settle(engine, force=True)
    assert _handoff_calls(engine, base) == [] and _pending(engine) == 0
    write_spans(engine, producer)
    settle(engine, force=True)  # the producer's trace re-opens the consumer's, which settles again
    calls = _handoff_calls(engine, base)
    assert len(calls) == 1 and calls[0][0] == 1
    assert abs(calls[0][1] - 150) < 150 * 0.02  # from the publish to the end of the processing
    assert _pending(engine) == 0
    with engine.connect() as conn:  # the consumer no longer waits
        assert conn.execute(select(func.count()).select_from(LinkWait)).scalar_one() == 0
    settle(engine, force=True)  # and settling again changes nothing
    assert _handoff_calls(engine, base) == calls


def test_either_order_gives_the_same_answer(engine):
    base = _base()
    producer, consumer = _handoff(base)
    write_spans(engine, producer)
    settle(engine, force=True)
    write_spans(engine, consumer)
    settle(engine, force=True)
    calls = _handoff_calls(engine, base)
    assert len(calls) == 1 and calls[0][0] == 1


def test_a_producer_that_arrives_while_its_consumer_settles_is_not_missed(engine, monkeypatch):
    """The producer is written and its trace settled between the consumer's read and its
    write: the consumer's trace stays pending and the next pass makes the call."""
    base = _base()
    producer, consumer = _handoff(base)
    write_spans(engine, consumer)
    real = settle_mod.summarize_rows
    fired = []

    def summarize_then_producer(rows, *linked):
        if not fired:
            fired.append(True)
            write_spans(engine, producer)
            settle(engine, force=True, trace_ids=[PUB])
        return real(rows, *linked)

    monkeypatch.setattr(settle_mod, "summarize_rows", summarize_then_producer)
    settle(engine, force=True, trace_ids=[SUB])
    assert fired
    monkeypatch.setattr(settle_mod, "summarize_rows", real)
    with engine.connect() as conn:
        assert conn.execute(select(Trace.pending).where(Trace.trace_id == SUB)).scalar_one() is True
    settle(engine, force=True)
    calls = _handoff_calls(engine, base)
    assert len(calls) == 1 and calls[0][0] == 1
    assert _pending(engine) == 0


def test_a_link_to_a_span_never_stored_waits_until_retention(engine):
    base = _base()
    _, consumer = _handoff(base, target_sid="9" * 16)
    write_spans(engine, consumer)
    settle(engine, force=True)
    assert _pending(engine) == 0 and _handoff_calls(engine, base) == []
    with engine.connect() as conn:
        waits = conn.execute(select(LinkWait.consumer_trace_id, LinkWait.target_span_id)).all()
    assert [tuple(w) for w in waits] == [(SUB, "9" * 16)]
    # A producer in that trace, but not the linked span: no call, the wait stays.
    producer, _ = _handoff(base)
    write_spans(engine, producer)
    settle(engine, force=True)
    assert _handoff_calls(engine, base) == []
    prune(engine, RetentionPolicy(span_days=1), now_ns=base + 2 * 86_400 * 10**9)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LinkWait)).scalar_one() == 0
