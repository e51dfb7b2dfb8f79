"""Settling: fold idle traces into the trace table and the rollups.

A trace settles once no new span has arrived for ``MODALSCOPE_SETTLE_SECONDS`` (Tempo's
``trace_idle_period``). Settling reads the trace's spans, computes what needs the whole
trace (root, duration, input type, self times, service pairs) and adds the trace's
contributions to the per-minute rollups. It stores exactly what it added, so when a late
span re-opens the trace the next settle subtracts the old contributions and adds the new:
every span counts once, however its trace arrived.

Contributions, each one histogram entry in one (series, minute):

* ``op``     (service, span name, stage, input type): the span's duration
* ``pair``   (caller, callee, input type): a CLIENT span's duration
* ``trace``  (root service, input type): the trace's duration
* ``tstage`` (stage, input type): the trace's total self time in that stage
* ``tokens`` (service, name = model, input type, caller = provider, callee = token key):
  a model call's token count for that key (``text``/``image``/``audio``/``video``/``total``
  input tokens, ``output``), stored where durations go; minute = the call's start minute.
  One entry per key the call's usage carries, for the model calls ``traces.model_call_spans``
  counts (a call wrapped by another instrumentation's span counts once)
* ``cache``, ``batch``, ``cuda``, ``sync``, ``inst``: the span conventions the anomaly
  detectors need (cache lookups per tag, batch sizes, CUDA Graph fallbacks, encoder spread
  before fusion, requests per instance), see ``settle_fast``; a cache tag key gets series
  for at most ``CACHE_TAG_VALUES`` values, later values share its overflow series (value ''),
  and every lookup also counts in its cache's TOTAL series (tag key and value '');
  ``cache_untagged`` marks lookups the cache page could group by a key no tag shows

Series names are capped (``models/names.py``: services 128 characters, other names 256,
keeping a prefix, ``…`` and a hash) and each kind holds at most
``MODALSCOPE_MAX_SERIES_PER_KIND`` series; a new key past that counts in its kind's
``(other)`` series (``SeriesRegistry``). Retention deletes series no rollup is left for.

Several settlers may run (one per ingest process): on PostgreSQL each claims trace rows
with ``FOR UPDATE SKIP LOCKED``; SQLite serialises them with ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple, Sequence

import numpy as np
import orjson
from sqlalchemy import Connection, Engine, and_, bindparam, case, delete, func, literal, or_, select
from sqlalchemy.exc import DBAPIError, IntegrityError

from ..models import PairCall, Series, Span, Trace, changes
from ..models.engine import plain_rows
from ..models.dialect import contains_text, json_member, supports_skip_locked, update_many, upsert
from ..core.series import SeriesKind
from ..core.spans import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, SpanRecord
from .series import SeriesRegistry, cap_key, registry_for
from . import settle_handoffs as handoffs
from .rollup_deltas import CONTRIB_DTYPE, apply_contributions, unpack_contributions
from .settle_fast import LAYER_KEY, LINKS, summarize_rows
from .traces import LEGACY_SIGNAL_NEEDLES, link_targets

log = logging.getLogger(__name__)


def load_trace_rows(conn: Connection, trace_ids: Sequence[str]) -> list[tuple]:
    """Span rows of these traces in ``settle_fast`` layout, ordered (trace, start, span id)."""
    # Attributes matter only on CLIENT spans and model calls (callee addresses), cache lookups
    # and spans without stored signals whose attributes may give some (stored before the
    # column existed); the database filters them so most rows never build a Python string
    # for them, and extracts batch.size and gpu.cuda_graph itself (no JSON parsing in Python).
    is_cache = contains_text(conn, Span.attributes, '"cache.name"')
    legacy = and_(Span.signals.is_(None),
                  or_(*[contains_text(conn, Span.attributes, needle) for needle in LEGACY_SIGNAL_NEEDLES]))
    wanted = or_(Span.kind == KIND_CLIENT, is_cache, contains_text(conn, Span.signals, '"call"'), legacy)
    attrs = case((wanted, Span.attributes), else_=literal(""))
    cols = (Span.trace_id, Span.span_id, Span.parent_span_id, Span.service, Span.name, Span.kind,
            Span.stage, Span.start_ns, Span.duration_ns, Span.status, attrs, Span.instance,
            json_member(conn, Span.attributes, "batch.size", scalar_types=True),
            json_member(conn, Span.attributes, "gpu.cuda_graph"),
            case((is_cache, Span.resource), else_=literal("")),  # cache lookups' groups (cache_untagged)
            Span.id,  # pair_calls rows
            json_member(conn, Span.attributes, LAYER_KEY, strings_only=True),  # layer series
            Span.signals,
            case((Span.kind == KIND_CONSUMER, Span.links), else_=literal(None)))  # hand-offs
    rows: list[tuple] = []
    for i in range(0, len(trace_ids), 500):
        chunk = trace_ids[i : i + 500]
        rows.extend(plain_rows(conn, select(*cols).where(Span.trace_id.in_(chunk))
                               .order_by(Span.trace_id, Span.start_ns, Span.span_id)))
    return rows


def load_link_targets(conn: Connection, rows: Sequence[tuple]) -> dict[tuple[str, str], SpanRecord]:
    """The PRODUCER spans outside ``rows`` that their CONSUMER spans' links point at (a
    message produced by another trace, settled or not), keyed (trace_id, span_id): one
    look-up of the (trace_id, span_id) index a target, a few hundred a statement."""
    targets: set[tuple[str, str]] = set()
    for r in rows:
        raw = r[LINKS] if len(r) > LINKS else None
        if raw:
            targets.update(link_targets(orjson.loads(raw)))
    if not targets:
        return {}
    targets.difference_update((r[0], r[1]) for r in rows)
    out: dict[tuple[str, str], SpanRecord] = {}
    keys = sorted(targets)
    for i in range(0, len(keys), 200):
        chunk = keys[i : i + 200]
        stmt = select(Span.trace_id, Span.span_id, Span.parent_span_id, Span.service, Span.name, Span.kind,
                      Span.start_ns, Span.duration_ns, Span.status, Span.stage).where(
            Span.kind == KIND_PRODUCER,
            or_(*[and_(Span.trace_id == t, Span.span_id == sp) for t, sp in chunk]))
        for tid, sid, parent, service, name, kind, start, dur, status, stage in conn.execute(stmt):
            out[(tid, sid)] = SpanRecord(tid, sid, parent, service, name, kind, start, start + max(dur, 0), status,
                                         stage=stage)
    return out


def _summarize(rows: list[tuple], linked: dict[tuple[str, str], SpanRecord]):
    # The one-argument call when no link leaves the batch (the common case).
    return summarize_rows(rows, linked) if linked else summarize_rows(rows)


def within_budget(conn: Connection, trace_ids: list[str]) -> list[str]:
    """The first of ``trace_ids`` whose spans add up to ``BATCH_SPANS`` (one at least): counted
    from the spans' (trace_id, span_id) index, so a batch of big traces cannot hold many times
    the spans it was sized for."""
    counts: dict[str, int] = {}
    for i in range(0, len(trace_ids), 500):
        chunk = trace_ids[i : i + 500]
        counts.update(conn.execute(select(Span.trace_id, func.count()).where(Span.trace_id.in_(chunk))
                                   .group_by(Span.trace_id)).all())
    out: list[str] = []
    total = 0
    for tid in trace_ids:
        total += counts.get(tid, 0)
        if out and total > BATCH_SPANS:
            break
        out.append(tid)
    return out


def _claim_query(trace_ids: Sequence[str] | None, due_before_ns: int | None, limit: int, lock: bool):
    q = select(Trace.trace_id, Trace.version, Trace.contributions).where(Trace.pending.is_(True))
    if trace_ids is not None:
        q = q.where(Trace.trace_id.in_(list(trace_ids)))
    if due_before_ns is not None:
        q = q.where(Trace.last_seen_ns <= due_before_ns)
    q = q.order_by(Trace.last_seen_ns).limit(limit)
    return q.with_for_update(skip_locked=True) if lock else q


CACHE_TAG_VALUES = 32  # series per cache tag key: a tag with more values is no cache-key tag


def _cap_cache_tags(conn: Connection, summary, used_keys: list[int], registry: SeriesRegistry) -> None:
    """Bound the ``cache`` series: a tag key (per service and cache) gets series for its first
    ``CACHE_TAG_VALUES`` values; contributions of later values go to its overflow series
    (value ''), so a high-cardinality attribute (a user id) costs one series, and the
    detectors see that the key is not a bounded tag. Only keys not cached by the registry
    are looked up (new ones), one query per tag key. A cache's TOTAL series (caller and
    callee '') and the ``cache_untagged`` series are no tag values: never capped."""
    new = [k for k in used_keys if summary.keys[k][0] == SeriesKind.CACHE and summary.keys[k][6]
           and not registry.known(summary.keys[k])]
    if not new:
        return
    groups: dict[tuple[str, str, str], list[int]] = {}
    for k in new:
        key = summary.keys[k]
        groups.setdefault((key[1], key[2], key[5]), []).append(k)
    remap: dict[int, int] = {}
    for (service, cache, tag), ks in groups.items():
        existing = set(conn.execute(select(Series.callee).where(
            Series.kind == SeriesKind.CACHE, Series.service == service, Series.name == cache, Series.caller == tag)).scalars())
        existing.discard("")
        for k in sorted(ks, key=lambda k: summary.keys[k][6]):
            value = summary.keys[k][6]
            if value in existing:
                continue
            if len(existing) < CACHE_TAG_VALUES:
                existing.add(value)
                continue
            overflow = summary.keys[k][:6] + ("",)
            try:
                remap[k] = summary.keys.index(overflow)
            except ValueError:
                remap[k] = len(summary.keys)
                summary.keys.append(overflow)
    if remap:
        src = np.fromiter(remap, dtype=np.int64, count=len(remap))
        dst = np.fromiter(remap.values(), dtype=np.int64, count=len(remap))
        lookup = np.arange(len(summary.keys), dtype=np.int64)
        lookup[src] = dst
        summary.c_key = lookup[summary.c_key]


class BatchResult(NamedTuple):
    claimed: int  # pending trace rows the batch took
    settled: int  # of them settled (the others stay pending for the next pass)
    resolved: dict  # series ids the batch looked up or created
    reopened: int  # other traces it re-opened (consumers waiting for its producers)
    spans: int = 0  # spans it read


NOTHING = BatchResult(0, 0, {}, 0)


def _apply_summary(conn: Connection, summary, claimed: dict[str, bytes | None], now_ns: int,
                   registry: SeriesRegistry) -> BatchResult:
    """Write the settled state of the ``claimed`` traces: rollup deltas and trace rows."""
    n_claimed = len(claimed)
    index = {tid: i for i, tid in enumerate(summary.trace_ids)}
    keep = set(claimed) & set(index)
    handoffs.lock_producer_traces(conn, summary, keep)
    stale = handoffs.arrived_since(conn, summary, keep)
    if stale:  # left pending: settled again, producer included, on the next pass
        claimed = {t: blob for t, blob in claimed.items() if t not in stale}
        keep -= stale
    handoffs.record_waits(conn, summary, keep)
    reopened = handoffs.reopen_waiting(conn, summary, keep, now_ns)
    keep_idx = np.array(sorted(index[t] for t in claimed if t in index), dtype=np.int64)
    mask = np.isin(summary.c_trace, keep_idx)
    # Capped first, so the cache-tag cap and the registry's cache see stored names only.
    summary.keys = [cap_key(k) for k in summary.keys]
    _cap_cache_tags(conn, summary, sorted(set(summary.c_key[mask].tolist())), registry)
    used_keys = sorted(set(summary.c_key[mask].tolist()))
    resolved = registry.resolve(conn, [summary.keys[k] for k in used_keys])
    series_of_key = np.zeros(len(summary.keys), dtype=np.int64)
    for k in used_keys:
        series_of_key[k] = resolved[summary.keys[k]]
    c_trace = summary.c_trace[mask]
    new_all = np.zeros(len(c_trace), dtype=CONTRIB_DTYPE)
    new_all["series"] = series_of_key[summary.c_key[mask]]
    new_all["minute"] = summary.c_minute[mask]
    new_all["value"] = summary.c_value[mask]
    new_all["err"] = summary.c_err[mask]
    # One blob a trace: its contributions, so a later re-settle can take them back.
    order = np.argsort(c_trace, kind="stable")
    bounds = np.searchsorted(c_trace[order], np.arange(len(summary.trace_ids) + 1))
    sorted_contribs = new_all[order]
    new_blobs = {summary.trace_ids[t]: sorted_contribs[bounds[t]:bounds[t + 1]].tobytes()
                 for t in keep_idx.tolist()}

    old_parts = [unpack_contributions(b) for b in claimed.values() if b]
    old_all = np.concatenate(old_parts) if old_parts else np.zeros(0, CONTRIB_DTYPE)
    both = np.concatenate([old_all, new_all])
    signs = np.concatenate([-np.ones(len(old_all)), np.ones(len(new_all))])
    apply_contributions(conn, both["series"], both["minute"], both["value"], both["err"].astype(np.float64), signs)
    if len(both):  # findings cached and hours packed over these minutes are stale now
        changes.record_minutes(conn, np.unique(both["minute"]).tolist())

    if len(keep_idx):
        update_many(conn, Trace.__table__, _SETTLED_COLUMNS, ["trace_id"], [
            (summary.root_service[i], summary.root_name[i], int(summary.start_ns[i]), int(summary.duration_ns[i]),
             int(summary.span_count[i]), bool(summary.error[i]), summary.input_type[i], False, now_ns,
             new_blobs[summary.trace_ids[i]], summary.trace_ids[i])
            for i in keep_idx.tolist()])
        _write_calls(conn, summary, keep_idx, series_of_key)
        _write_stages(conn, summary, keep_idx)
        resettled = np.array(sorted(index[t] for t, blob in claimed.items() if blob and t in index), dtype=np.int64)
        _drop_stale_calls(conn, summary, resettled)
    empty = sorted(t for t in claimed if t not in index)
    if empty:  # a trace row whose spans were all deleted by retention
        conn.execute(delete(Trace).where(Trace.trace_id.in_(empty)))
    return BatchResult(n_claimed, len(claimed), resolved, reopened)


_SETTLED_COLUMNS = ["root_service", "root_name", "start_ns", "duration_ns", "span_count", "error", "input_type",
                    "pending", "settled_ns", "contributions"]


def _write_calls(conn: Connection, summary, keep_idx: np.ndarray, series_of_key: np.ndarray) -> None:
    """Upsert a ``pair_calls`` row per call of the settled traces. A re-settle rewrites its
    calls' rows (a late child may name another callee); a call never loses its pair."""
    mask = np.isin(summary.call_trace, keep_idx) & (summary.call_row >= 0)
    if not mask.any():
        return
    rows = [{"span_row": r, "series_id": sid, "start_ns": st, "duration_ns": d}
            for r, sid, st, d in zip(summary.call_row[mask].tolist(), series_of_key[summary.call_key[mask]].tolist(),
                                     summary.call_start[mask].tolist(), summary.call_dur[mask].tolist())]
    conn.execute(upsert(conn, PairCall.__table__, ["span_row"], ["series_id", "start_ns", "duration_ns"]), rows)


def _write_stages(conn: Connection, summary, keep_idx: np.ndarray) -> None:
    """Store the stages settling corrected (``traces.resolve_stages``) on their span rows,
    so the trace page shows what the rollups count: only rows whose stored stage differs,
    a few a trace with model calls."""
    mask = np.isin(summary.restage_trace, keep_idx)
    if not mask.any():
        return
    t = Span.__table__
    conn.execute(t.update().where(t.c.id == bindparam("b_id")).values(stage=bindparam("b_stage")),
                 [{"b_id": r, "b_stage": st} for r, st, keep in
                  zip(summary.restage_row.tolist(), summary.restage_stage, mask.tolist()) if keep])


def _drop_stale_calls(conn: Connection, summary, resettled: np.ndarray) -> None:
    """A re-settled trace's CLIENT spans that now make no call (their stage is a model call's
    since the parent arrived, or a model call of their service arrived under them) lose the
    ``pair_calls`` row an earlier settle wrote."""
    if not len(resettled) or not len(summary.uncalled_row):
        return
    rows = summary.uncalled_row[np.isin(summary.uncalled_trace, resettled)].tolist()
    for i in range(0, len(rows), 500):
        conn.execute(delete(PairCall).where(PairCall.span_row.in_(rows[i : i + 500])))


def settle_batch(conn: Connection, trace_ids: Sequence[str] | None, *, due_before_ns: int | None,
                 limit: int, now_ns: int, registry: SeriesRegistry) -> BatchResult:
    """Settle up to ``limit`` pending traces inside the caller's transaction.

    PostgreSQL: trace rows are claimed with FOR UPDATE SKIP LOCKED, so concurrent settlers
    take different traces and receivers wait only on the traces being settled.
    """
    rows = conn.execute(_claim_query(trace_ids, due_before_ns, limit, supports_skip_locked(conn))).all()
    if not rows:
        return NOTHING
    # (past the budget the rest stays pending; named traces are all taken: the caller sized them)
    taken = set(within_budget(conn, [r[0] for r in rows]) if trace_ids is None else [r[0] for r in rows])
    claimed = {r[0]: r[2] for r in rows if r[0] in taken}
    data = load_trace_rows(conn, list(claimed))
    summary = _summarize(data, load_link_targets(conn, data))
    return _apply_summary(conn, summary, claimed, now_ns, registry)._replace(claimed=len(rows), spans=len(data))


def settle_batch_optimistic(engine: Engine, trace_ids: Sequence[str] | None, *, due_before_ns: int | None,
                            limit: int, now_ns: int, registry: SeriesRegistry) -> BatchResult:
    """SQLite: read and compute outside the write lock, then write in a short transaction.

    SQLite has one write lock for the whole database; holding it while reading spans and
    computing would stall every receiver. A trace that gained a span between the read and
    the write (its ``version`` moved) is left pending for the next pass.
    """
    with engine.connect() as conn:
        conn = conn.execution_options(modalscope_deferred=True)
        with conn.begin():
            rows = conn.execute(_claim_query(trace_ids, due_before_ns, limit, False)).all()
            if not rows:
                return NOTHING
            ids = [r[0] for r in rows]
            taken = set(within_budget(conn, ids) if trace_ids is None else ids)
            seen = {r[0]: r[1] for r in rows if r[0] in taken}
            data = load_trace_rows(conn, list(seen))
            linked = load_link_targets(conn, data)
    summary = _summarize(data, linked)
    with engine.begin() as conn:
        current = conn.execute(
            select(Trace.trace_id, Trace.version, Trace.pending, Trace.contributions)
            .where(Trace.trace_id.in_(list(seen)))
        ).all()
        claimed = {tid: blob for tid, version, pending, blob in current if pending and version == seen[tid]}
        done = _apply_summary(conn, summary, claimed, now_ns, registry) if claimed else NOTHING
    # (traces whose version moved, or past the span budget, count as claimed and not
    # settled: a forced pass goes on)
    return done._replace(claimed=len(rows), spans=len(data))


#: Spans a settle batch reads, about: a batch claims as many traces as held that many spans
#: in the batches before (``BatchSizer``), so a settler's memory does not follow the size
#: of its traces. Smaller batches settle as fast and hold less (docs/benchmarks.md).
BATCH_SPANS = 8_000


class BatchSizer:
    """How many traces the next batch claims: ``BATCH_SPANS`` over the spans a trace held in
    recent batches (a moving average), at least one and at most the caller's limit."""

    def __init__(self, spans_per_trace: float = 32.0) -> None:
        self.spans_per_trace = spans_per_trace

    def traces(self, limit: int) -> int:
        return max(1, min(limit, int(BATCH_SPANS / self.spans_per_trace)))

    def observe(self, traces: int, spans: int) -> None:
        if traces:
            self.spans_per_trace = 0.5 * self.spans_per_trace + 0.5 * max(1.0, spans / traces)


class SettlePass(NamedTuple):
    settled: int  # traces settled
    more: bool  # stopped at ``max_batches`` with more due
    full: bool = False  # a batch took as many traces as it could: a backlog, not a trickle


def settle(engine: Engine, *, settle_seconds: float = 5.0, trace_ids: Sequence[str] | None = None,
           force: bool = False, limit: int = 2000, now_ns: int | None = None,
           registry: SeriesRegistry | None = None, max_batches: int | None = None, progress=None,
           sizer: BatchSizer | None = None) -> int:
    """Settle pending traces that have been idle ``settle_seconds`` (all of them with ``force``).

    Returns the number of traces settled. ``trace_ids`` restricts it to those traces.
    """
    return settle_pass(engine, settle_seconds=settle_seconds, trace_ids=trace_ids, force=force, limit=limit,
                       now_ns=now_ns, registry=registry, max_batches=max_batches, progress=progress,
                       sizer=sizer).settled


def settle_pass(engine: Engine, *, settle_seconds: float = 5.0, trace_ids: Sequence[str] | None = None,
                force: bool = False, limit: int = 2000, now_ns: int | None = None,
                registry: SeriesRegistry | None = None, max_batches: int | None = None, progress=None,
                sizer: BatchSizer | None = None) -> SettlePass:
    """``settle``, saying also whether it stopped at ``max_batches`` with more traces due.
    ``limit``: traces a batch at most (``sizer`` picks fewer for big traces)."""
    registry = registry or registry_for(engine)
    sizer = sizer or BatchSizer()
    total = 0
    batches = 0
    full = False
    ids = list(trace_ids) if trace_ids is not None else None
    while True:
        now = time.time_ns() if now_ns is None else now_ns
        due = None if force else now - int(settle_seconds * 1e9)
        size = sizer.traces(limit)
        chunk = None
        if ids is not None:
            if not ids:
                break
            chunk, ids = ids[:size], ids[size:]
        for attempt in range(5):
            try:
                if engine.dialect.name == "sqlite":
                    batch = settle_batch_optimistic(engine, chunk, due_before_ns=due, limit=size,
                                                    now_ns=now, registry=registry)
                else:
                    with engine.begin() as conn:
                        batch = settle_batch(conn, chunk, due_before_ns=due, limit=size,
                                             now_ns=now, registry=registry)
                registry.remember(batch.resolved)
                break
            except (IntegrityError, DBAPIError) as exc:
                # Two settlers created the same rollup row, or a deadlock: retry the batch.
                if attempt == 4:
                    raise
                if isinstance(exc, IntegrityError):  # maybe a cached series retention pruned
                    registry.forget()
                log.debug("settle retry after %s", exc.__class__.__name__)
                time.sleep(0.05 * (attempt + 1))
        sizer.observe(batch.claimed, batch.spans)
        total += batch.settled
        batches += 1
        if progress is not None and batch.settled:
            progress(batch.settled)
        # With force, also the traces the batch re-opened or left pending for a producer
        # that arrived meanwhile.
        full = full or batch.claimed == size
        more = batch.claimed == size or (force and (batch.reopened or batch.settled < batch.claimed))
        if chunk is None and not more:
            break
        if max_batches is not None and batches >= max_batches:
            return SettlePass(total, bool(ids) if chunk is not None else more, full)
    return SettlePass(total, False, full)
