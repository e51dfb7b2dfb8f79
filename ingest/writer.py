"""The writer: idempotent span inserts with group commit, and the queue receivers wait on.

Receivers hand decoded, tagged ``SpanRecord`` lists to ``BatchWriter.submit``; one writer
thread drains the queue, writes several requests in one transaction (group commit) and
resolves each request's future only after the commit, so an acknowledgement always means
"stored". ``(trace_id, span_id)`` is unique and inserts skip duplicates, so a resent or
doubly-sourced span changes nothing. Each new span marks its trace ``pending``; settling
(``ingest/settle.py``) folds pending traces into the rollups once they go idle.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Sequence

import orjson
from sqlalchemy import Engine, select

from ..models import Trace
from ..models.buckets import duration_bucket
from ..models.dialect import insert_spans, mark_traces_pending
from .errors import storage_unavailable
from ..core.spans import SpanRecord

log = logging.getLogger(__name__)


QUEUE_FULL = "the writer queue is full"


class WriterFull(Exception):
    """No room for more now (the queue is at capacity, or the settler is too far behind):
    callers answer 429 (HTTP) or UNAVAILABLE (gRPC) with ``reason``."""

    def __init__(self, retry_after: float, reason: str = QUEUE_FULL) -> None:
        super().__init__(f"{reason}, retry after {retry_after:.0f}s")
        self.retry_after = retry_after
        self.reason = reason


class SettleLag:
    """Has the settler fallen more than ``max_lag_s`` behind: is a trace idle
    ``settle_seconds + max_lag_s`` still pending? Looked up at most every ``every`` seconds
    (the oldest pending trace, first in the ``(pending, last_seen_ns)`` index), by whichever
    request thread asks first.

    Receivers refuse new spans (429 / UNAVAILABLE, clients retry) while it has: spans arriving
    faster than they are settled, for minutes, would otherwise leave the rollups ever further
    behind (and a pair's exemplar search reads every pending trace). A lag rather than a count
    of traces, so a burst the settler catches up with passes whatever the rate. A settler that
    settles nothing at all for ``stuck_after`` seconds (stopped, or failing on some trace) is
    not a flood: spans are taken again, with a warning, rather than refused forever.
    """

    def __init__(self, engine: Engine, max_lag_s: float, settle_seconds: float, every: float = 0.5,
                 stuck_after: float = 60.0) -> None:
        self.engine = engine
        self.max_lag_s = max_lag_s
        self.settle_seconds = settle_seconds
        self.every = every
        self.stuck_after = stuck_after
        self._behind = False
        self._checked = -math.inf
        self._oldest: int | None = None  # the oldest pending trace's last_seen_ns ...
        self._oldest_since = time.monotonic()  # ... unchanged since then
        self._warned = False
        self._lock = threading.Lock()

    @property
    def reason(self) -> str:
        return f"the settler is more than {self.max_lag_s:g} s behind"

    def behind(self) -> bool:
        now = time.monotonic()
        if now - self._checked >= self.every and self._lock.acquire(blocking=False):
            try:
                self._behind = self._lagging()
            except Exception as exc:  # noqa: BLE001 - the writer reports an unavailable store itself
                log.debug("settle lag not read: %s", _one_line(exc))
                self._behind = False
            finally:
                self._checked = time.monotonic()
                self._lock.release()
        return self._behind

    def _lagging(self) -> bool:
        stmt = select(Trace.last_seen_ns).where(Trace.pending.is_(True)).order_by(Trace.last_seen_ns).limit(1)
        with self.engine.connect() as conn:
            # a read: never wait for SQLite's write lock (a write engine begins IMMEDIATE)
            conn = conn.execution_options(modalscope_deferred=True)
            oldest = conn.execute(stmt).scalar()
        if oldest != self._oldest:  # settled (or nothing pending): progress
            self._oldest, self._oldest_since, self._warned = oldest, time.monotonic(), False
        if oldest is None or time.time_ns() - oldest <= (self.settle_seconds + self.max_lag_s) * 1e9:
            return False
        if time.monotonic() - self._oldest_since >= self.stuck_after:
            if not self._warned:
                log.warning("the settler has settled nothing for %.0f s (is it running? its log says why); "
                            "taking spans anyway", time.monotonic() - self._oldest_since)
                self._warned = True
            return False
        return True


class WriterClosed(Exception):
    """The writer is shutting down and takes nothing more."""


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clean(text: str) -> str:
    # PostgreSQL text cannot hold NUL; everything else is stored as sent (and escaped on output).
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _json(value) -> str:
    # orjson: far faster than json.dumps on this hot path. JSON has no NaN/Infinity, so
    # such doubles (legal in OTLP) are stored as null.
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # e.g. a non-string key or an unexpected type from a custom decoder
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


SPAN_COLUMNS = ("trace_id", "span_id", "parent_span_id", "service", "name", "kind", "stage", "start_ns",
                "duration_ns", "duration_bucket", "status", "status_message", "source", "instance", "scope",
                "attributes", "resource", "events", "links", "signals")
_TRACE_ID, _START = SPAN_COLUMNS.index("trace_id"), SPAN_COLUMNS.index("start_ns")


def span_rows(records: Sequence[SpanRecord]) -> list[tuple]:
    """Rows in SPAN_COLUMNS order. Spans of one resource share its dict, so its JSON is made once."""
    rows = []
    resource_json: dict[int, tuple[str, str | None]] = {}
    for r in records:
        duration = r.end_ns - r.start_ns if r.end_ns > r.start_ns else 0
        res = resource_json.get(id(r.resource))
        if res is None:
            inst = r.resource.get("service.instance.id")
            res = resource_json[id(r.resource)] = (
                _clean(_json(r.resource)) if r.resource else "{}",
                None if inst is None else _clean(str(inst)),
            )
        rows.append((
            r.trace_id, r.span_id, r.parent_span_id, _clean(r.service), _clean(r.name), r.kind,
            r.stage or "other", r.start_ns, duration, duration_bucket(duration), r.status,
            _clean(r.status_message) if r.status_message else "", r.source, res[1],
            _clean(r.scope) if r.scope else "",
            _clean(_json(r.attributes)) if r.attributes else "{}",
            res[0],
            _clean(_json(r.events)) if r.events else None,
            _clean(_json(r.links)) if r.links else None,
            _json(r.signals) if r.signals else None,
        ))
    return rows


@dataclass
class WriteResult:
    received: int
    inserted: int  # new spans; resent ones are not counted


def write_spans(engine: Engine, records: Sequence[SpanRecord], now_ns: int | None = None) -> WriteResult:
    """Insert spans (skipping ones already stored) and mark their traces pending, atomically."""
    if not records:
        return WriteResult(0, 0)
    now_ns = time.time_ns() if now_ns is None else now_ns
    rows = span_rows(records)
    with engine.begin() as conn:
        inserted, touched = insert_spans(conn, SPAN_COLUMNS, rows)
        if inserted:
            first: dict[str, int] = {}
            for row in rows:  # each trace's earliest span start in this write
                tid, start = row[_TRACE_ID], row[_START]
                if tid in touched and start < first.get(tid, start + 1):
                    first[tid] = start
            # Sorted ids: concurrent writers lock trace rows in one order (no deadlocks).
            mark_traces_pending(conn, sorted(first.items()), now_ns)
    return WriteResult(len(rows), inserted)


class _Pending(Future):
    """A queued request's acknowledgement, with the bytes it holds in the queue."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes = nbytes


class BatchWriter:
    """A thread that writes queued requests in batches and acknowledges after commit."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_queue_spans: int = 50_000,
        max_queue_bytes: int = 64 * 1024 * 1024,
        max_batch_spans: int = 20_000,
        max_wait: float = 0.02,
        on_written=None,
        unavailable_retry_seconds: float = 10.0,
        lag: SettleLag | None = None,
        isolate_failures: bool = True,
    ) -> None:
        """``isolate_failures``: after a batch fails (not an outage), write its requests one by
        one so that one poisoned request does not sink the others (a server's choice); without
        it the batch's requests all get its error and nothing is logged (an import that stops
        at the first failure, as its one-line error)."""
        self.engine = engine
        self.isolate_failures = isolate_failures
        self.lag = lag
        self.max_queue_spans = max_queue_spans
        self.max_queue_bytes = max_queue_bytes
        self.max_batch_spans = max_batch_spans
        self.max_wait = max_wait
        self.on_written = on_written
        # A batch the store refused as unavailable (PostgreSQL restarting, SQLite locked,
        # full or read-only) is retried for this long before its requests are answered
        # 503/UNAVAILABLE: a short outage stays invisible to clients. 0: no retry, and the
        # error goes to the caller like any other (an import's one-line error).
        self.unavailable_retry_seconds = unavailable_retry_seconds
        self._unavailable_since: float | None = None
        self._queue: queue.Queue = queue.Queue()
        self._queued_spans = 0
        self._queued_bytes = 0
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="modalscope-writer", daemon=True)
        self.spans_written = 0
        self.spans_received = 0
        self.batches = 0
        self._recent_rate = 0.0

    def start(self) -> "BatchWriter":
        self._thread.start()
        return self

    # -- producer side ----------------------------------------------------------------
    def retry_after(self) -> float:
        """Seconds a refused client should wait: time to drain the queue at the recent rate,
        at least 5 while the store is unavailable."""
        rate = max(self._recent_rate, 1000.0)
        wait = math.ceil(self._queued_spans / rate)
        if self._unavailable_since is not None:
            wait = max(wait, 5)
        return float(min(30, max(1, wait)))

    def busy(self) -> str | None:
        """Why another request would be refused now (receivers refuse before reading a
        body), or None."""
        if self._queued_spans >= self.max_queue_spans or self._queued_bytes >= self.max_queue_bytes:
            return QUEUE_FULL
        if self.lag is not None and self.lag.behind():
            return self.lag.reason
        return None

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, records: list[SpanRecord], nbytes: int = 0) -> Future:
        """Queue ``records``; ``nbytes``: the size of the request they came in, counted
        against ``max_queue_bytes`` until they are written."""
        fut = _Pending(nbytes)
        if not records:
            fut.set_result(WriteResult(0, 0))
            return fut
        if self.lag is not None and not self._closed and self.lag.behind():  # looked up outside the lock
            raise WriterFull(self.retry_after(), self.lag.reason)
        with self._lock:
            if self._closed:
                raise WriterClosed("writer is shutting down")
            # One oversized request may always enter an empty queue; otherwise respect the cap.
            if self._queued_spans and (self._queued_spans + len(records) > self.max_queue_spans
                                       or self._queued_bytes + nbytes > self.max_queue_bytes):
                raise WriterFull(self.retry_after())
            self._queued_spans += len(records)
            self._queued_bytes += nbytes
        self._queue.put((records, fut))
        return fut

    def write(self, records: list[SpanRecord], timeout: float | None = None) -> WriteResult:
        return self.submit(records).result(timeout)

    @property
    def queued_spans(self) -> int:
        return self._queued_spans

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking work, write what is queued, and stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        else:  # never started: write what was queued here
            self._run()

    # -- writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is None:
                break
            batch = [item]
            n = len(item[0])
            deadline = time.monotonic() + self.max_wait
            while n < self.max_batch_spans:
                timeout = deadline - time.monotonic()
                try:
                    nxt = self._queue.get(timeout=max(0.0, timeout)) if timeout > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
                n += len(nxt[0])
            self._write_batch(batch, n)
        # Drain anything that raced the close.
        rest = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                rest.append(item)
        if rest:
            self._write_batch(rest, sum(len(r) for r, _ in rest))

    def _write_batch(self, batch: list, n: int) -> None:
        t0 = time.monotonic()
        records = [r for recs, _ in batch for r in recs]
        outcomes: list[tuple[Future, WriteResult | BaseException]] = []
        delay = 0.05
        while True:
            try:
                result = write_spans(self.engine, records)
            except Exception as exc:  # a failed commit acknowledges nothing
                if storage_unavailable(exc) and self.unavailable_retry_seconds > 0:
                    if self._unavailable_since is None:
                        self._unavailable_since = t0
                        log.warning("span store unavailable, retrying: %s", _one_line(exc))
                    if time.monotonic() - t0 + delay <= self.unavailable_retry_seconds:
                        time.sleep(delay)
                        delay = min(delay * 2, 1.0)
                        continue
                    log.warning("span store still unavailable after %.0f s; %d spans refused (clients retry): %s",
                                time.monotonic() - t0, n, _one_line(exc))
                    outcomes = [(fut, exc) for _, fut in batch]
                    break
                if not self.isolate_failures:
                    outcomes = [(fut, exc) for _, fut in batch]
                    break
                log.exception("writing %d spans failed; retrying request by request", n)
                # One poisoned request must not sink the others batched with it.
                for recs, fut in batch:
                    try:
                        res = write_spans(self.engine, recs)
                        self.spans_written += res.inserted
                        outcomes.append((fut, res))
                    except Exception as exc:  # noqa: BLE001 - reported to the caller
                        outcomes.append((fut, exc))
                break
            else:
                if self._unavailable_since is not None:
                    log.warning("span store available again after %.1f s",
                                time.monotonic() - self._unavailable_since)
                    self._unavailable_since = None
                self.spans_written += result.inserted
                outcomes = [(fut, WriteResult(len(recs), -1)) for recs, fut in batch]
                break
        # Free the queue space before acknowledging, so a client that resends at once
        # is not refused for space its own finished request still held.
        with self._lock:
            self._queued_spans -= n
            self._queued_bytes -= sum(fut.nbytes for _, fut in batch)
        self.spans_received += n
        self.batches += 1
        elapsed = max(time.monotonic() - t0, 1e-6)
        self._recent_rate = 0.8 * self._recent_rate + 0.2 * (n / elapsed) if self._recent_rate else n / elapsed
        for fut, outcome in outcomes:
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
        if self.on_written is not None:
            try:
                self.on_written(n)
            except Exception:  # noqa: BLE001
                log.exception("on_written hook failed")
