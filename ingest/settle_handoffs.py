"""Hand-offs between traces whose two ends settle apart.

A CONSUMER span linked to a PRODUCER span in another trace makes a call only once both are
stored. When the consumer's trace settles first, it leaves a ``link_waits`` row for each
link it could not resolve; settling the trace that holds the linked PRODUCER span later
re-opens the consumer's trace, which settles again with the call.

Two settlers may run at once (one per receiver): the consumer's may have read the store
just before the producer arrived, while the producer's settles before the consumer's writes
its wait. So the consumer's write checks again, inside its transaction, whether a span it
waits for is stored now, and stays pending if so. On PostgreSQL that check and the
producer's look-up of waits are serialised by a transaction-level advisory lock per
producer trace; SQLite serialises every write transaction anyway.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, and_, delete, or_, select, text, update

from ..core.spans import KIND_PRODUCER
from ..models import LinkWait, Span, Trace
from ..models.dialect import supports_skip_locked, upsert

CHUNK = 200


def _lock_key(trace_id: str) -> int:
    """A signed 64-bit advisory lock key for a trace id."""
    return int.from_bytes(hashlib.blake2b(trace_id.encode(), digest_size=8).digest(), "big", signed=True)


def lock_producer_traces(conn: Connection, summary, keep: set[str]) -> None:
    """PostgreSQL: take the advisory locks of every trace this batch waits on or produces in,
    in one sorted order (so two settlers never wait on each other's locks in a cycle), before
    the batch writes anything."""
    if not supports_skip_locked(conn):
        return
    ids = {summary.trace_ids[t] for t in summary.producer_trace.tolist()} & keep
    ids |= {tid for t, (tid, _) in zip(summary.wait_trace.tolist(), summary.wait_target)
            if summary.trace_ids[t] in keep}
    if not ids:
        return
    keys = sorted({_lock_key(t) for t in ids})
    conn.execute(text("SELECT count(pg_advisory_xact_lock(k)) FROM "
                      "(SELECT unnest(CAST(:keys AS bigint[])) AS k ORDER BY k) AS sorted_keys"), {"keys": keys})


def arrived_since(conn: Connection, summary, keep: set[str]) -> set[str]:
    """The kept traces with a link to a PRODUCER span that is stored now although the batch
    did not see it: they must not settle on what the batch computed."""
    targets: dict[tuple[str, str], set[str]] = {}
    for t, target in zip(summary.wait_trace.tolist(), summary.wait_target):
        tid = summary.trace_ids[t]
        if tid in keep:
            targets.setdefault(target, set()).add(tid)
    stale: set[str] = set()
    keys = sorted(targets)
    for i in range(0, len(keys), CHUNK):
        chunk = keys[i : i + CHUNK]
        stmt = select(Span.trace_id, Span.span_id).where(
            Span.kind == KIND_PRODUCER, or_(*[and_(Span.trace_id == t, Span.span_id == s) for t, s in chunk]))
        for tid, sid in conn.execute(stmt):
            stale |= targets.get((tid, sid), set())
    return stale


def record_waits(conn: Connection, summary, keep: set[str]) -> None:
    """A ``link_waits`` row for each unresolved link of the kept traces."""
    rows = {}
    for t, (tid, sid), start in zip(summary.wait_trace.tolist(), summary.wait_target, summary.wait_start.tolist()):
        consumer = summary.trace_ids[t]
        if consumer in keep:
            key = (consumer, tid, sid)
            rows[key] = min(start, rows.get(key, start))
    if rows:
        conn.execute(upsert(conn, LinkWait.__table__, ["consumer_trace_id", "target_trace_id", "target_span_id"],
                            ["since_ns"]),
                     [{"consumer_trace_id": c, "target_trace_id": t, "target_span_id": s, "since_ns": st}
                      for (c, t, s), st in sorted(rows.items())])


def reopen_waiting(conn: Connection, summary, keep: set[str], now_ns: int) -> int:
    """Re-open the traces that wait for a PRODUCER span of the kept traces (their waits are
    used up); returns how many were re-opened. A consumer trace settled in this batch saw
    the producer already and is left as it is."""
    produced: dict[str, set[str]] = {}
    for t, sid in zip(summary.producer_trace.tolist(), summary.producer_sid):
        tid = summary.trace_ids[t]
        if tid in keep:
            produced.setdefault(tid, set()).add(sid)
    if not produced:
        return 0
    found: list[tuple[str, str, str]] = []
    ids = sorted(produced)
    for i in range(0, len(ids), CHUNK):
        stmt = select(LinkWait.consumer_trace_id, LinkWait.target_trace_id, LinkWait.target_span_id).where(
            LinkWait.target_trace_id.in_(ids[i : i + CHUNK]))
        found.extend((c, t, s) for c, t, s in conn.execute(stmt) if s in produced[t])
    if not found:
        return 0
    for i in range(0, len(found), CHUNK):
        conn.execute(delete(LinkWait).where(or_(*[
            and_(LinkWait.consumer_trace_id == c, LinkWait.target_trace_id == t, LinkWait.target_span_id == s)
            for c, t, s in found[i : i + CHUNK]])))
    consumers = sorted({c for c, _, _ in found} - keep)
    reopened = 0
    for i in range(0, len(consumers), CHUNK):
        chunk = consumers[i : i + CHUNK]
        if supports_skip_locked(conn):
            # A consumer trace locked by another settler is being settled now: that settler
            # waits for this batch's advisory lock and then sees the producer.
            chunk = list(conn.execute(select(Trace.trace_id).where(Trace.trace_id.in_(chunk))
                                      .with_for_update(skip_locked=True)).scalars())
        if chunk:
            reopened += conn.execute(update(Trace).where(Trace.trace_id.in_(chunk)).values(
                pending=True, version=Trace.version + 1, last_seen_ns=now_ns)).rowcount
    return reopened
