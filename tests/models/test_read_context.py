"""``ReadContext.pinned``: the reads of one block (an evaluation's) share one connection."""

from __future__ import annotations

import random
import threading

from modalscope.ingest.writer import write_spans
from modalscope.models import Span
from modalscope.models.reader import StoreReader
from tests.factories import multimodal_trace

HOUR = 3600 * 10**9
BASE = 1_764_000_000 * 10**9


def test_a_pinned_block_reads_through_one_connection_on_its_own_thread_only(engine):
    ctx = StoreReader(engine).context
    with ctx.pinned():
        with ctx.connect() as first, ctx.connect() as second:
            assert first is second
        with ctx.pinned(), ctx.connect() as nested:  # a nested block keeps the outer connection
            assert nested is first
        seen = []

        def other_thread():
            with ctx.connect() as conn:
                seen.append(conn)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=60)
        assert seen and seen[0] is not first
    with ctx.connect() as after:  # the block is over: each read checks out its own again
        assert after is not first


def test_a_pinned_block_looks_the_time_range_up_once(engine):
    """Inside one block the time range is the one its first look-up saw (a read's plan
    choice, made once an evaluation); outside, each look-up reads the table again."""
    rng = random.Random(3)
    write_spans(engine, multimodal_trace(rng, BASE))
    ctx = StoreReader(engine).context
    first = ctx.time_range(Span)
    assert BASE <= first[0] <= first[1] < BASE + HOUR
    with ctx.pinned():
        assert ctx.time_range(Span) == first
        write_spans(engine, multimodal_trace(rng, BASE + HOUR))
        assert ctx.time_range(Span) == first
    later = ctx.time_range(Span)
    assert later[0] == first[0] and later[1] >= BASE + HOUR


def test_a_pinned_block_reads_one_snapshot_on_sqlite(engine):
    """On SQLite the block is one read transaction: spans written after its first read
    are not seen by its later ones (on PostgreSQL each read sees what has committed)."""
    rng = random.Random(4)
    write_spans(engine, multimodal_trace(rng, BASE))
    reader = StoreReader(engine)
    stats = reader.spans.counts
    with reader.context.pinned():
        before = stats()["spans"]
        write_spans(engine, multimodal_trace(rng, BASE + HOUR))
        during = stats()["spans"]
    after = stats()["spans"]
    assert after > before
    assert during == (before if engine.dialect.name == "sqlite" else after)


def test_a_pinned_block_looks_the_pair_calls_boundary_up_once(engine):
    """Where ``pair_calls`` becomes complete is read once a block (every pair exemplar
    look-up asks it), and again after the block."""
    from sqlalchemy import delete, insert

    from modalscope.models import PAIR_CALLS_CURSOR, Cursor

    def set_boundary(position: int) -> None:
        with engine.begin() as conn:
            conn.execute(delete(Cursor).where(Cursor.name == PAIR_CALLS_CURSOR))
            conn.execute(insert(Cursor).values(name=PAIR_CALLS_CURSOR, position=position))

    reader = StoreReader(engine)
    set_boundary(BASE)
    with reader.context.pinned():
        assert reader.calls.complete_from() == BASE
        set_boundary(BASE + HOUR)
        assert reader.calls.complete_from() == BASE
    assert reader.calls.complete_from() == BASE + HOUR


def test_a_helper_threads_block_shares_the_memo_it_is_handed(engine):
    """An evaluation's helper threads (exemplar look-ups) pin their own connections but
    take the facts the evaluation already looked up; a block not handed the memo reads again."""
    rng = random.Random(5)
    write_spans(engine, multimodal_trace(rng, BASE))
    reader = StoreReader(engine)
    ctx = reader.context
    seen: dict[str, tuple] = {}

    def helper(name, memo):
        with ctx.pinned(memo):
            seen[name] = (ctx.time_range(Span), reader.calls.complete_from())

    with ctx.pinned():
        first = ctx.time_range(Span)
        ctx.memo()["pair_calls_complete_from"] = 7  # (as if looked up: the helper must take it)
        write_spans(engine, multimodal_trace(rng, BASE + HOUR))
        for name, memo in (("shared", ctx.memo()), ("own", None)):
            thread = threading.Thread(target=helper, args=(name, memo))
            thread.start()
            thread.join(timeout=60)
    assert seen["shared"] == (first, 7)
    assert seen["own"][0][1] >= BASE + HOUR and seen["own"][1] != 7


def test_a_pinned_block_looks_a_services_duration_buckets_up_once(engine):
    """The buckets a walk of a service's spans visits are read once a block: a slower span
    written during the block widens them only for the next block."""
    from modalscope.core.spans import SpanRecord
    from modalscope.models.reader.walks import walk_bucket_list

    rng = random.Random(6)
    write_spans(engine, multimodal_trace(rng, BASE))
    ctx = StoreReader(engine).context
    with ctx.pinned():
        with ctx.connect() as conn:
            before = walk_bucket_list(ctx, conn, "gateway", None, None)
        write_spans(engine, [SpanRecord("f" * 32, "e" * 16, None, "gateway", "slow", 2, BASE, BASE + 3600 * 10**9)])
        with ctx.connect() as conn:
            assert walk_bucket_list(ctx, conn, "gateway", None, None) == before
    with ctx.connect() as conn:
        after = walk_bucket_list(ctx, conn, "gateway", None, None)
    assert before and after[0] == before[0] and after[-1] > before[-1]
