"""``SpanReader``: raw span and trace reads: a trace's spans and row, a drilldown's slowest
spans (``SpanQuery``, ``slowest``: the window sorted, or each service's duration buckets
walked), spans by id and their callees' children, trace rows and long traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
from sqlalchemy import Select, bindparam, func, or_, select
from sqlalchemy.orm import aliased

from .. import Series, Span, Trace, sketch
from ..buckets import MAX_BUCKET, duration_bucket
from .base import Filters, ReadContext, dict_rows, series_filter
from .tiers import TierPlan, plan_tiers, rows_of_series, series_and_kept_from, tier_plan
from .walks import (_CANDIDATE_COLUMNS, _TRACE_SUMMARY_COLUMNS, CALLEE_KIND_CODES, _stage_is, long_window,
                    named_in_attributes, of_model)
from ...durations import HOUR_NS, MINUTE_NS

# A callee's span starts after its caller's CLIENT span, up to that span's duration later
# (CALLEE_LATE_NS when no band bounds it), give or take clock skew between hosts.
CALLEE_SKEW_NS = MINUTE_NS
CALLEE_LATE_NS = HOUR_NS
# The walk's step: a service's next duration bucket below ``below`` holding any span.
_NEXT_BUCKET = select(func.max(Span.duration_bucket)).where(
    Span.service == bindparam("service"), Span.duration_bucket < bindparam("below"))


@dataclass(frozen=True)
class SpanQuery:
    """Raw spans in a window, slowest first: the exemplars behind a drilldown band.

    ``kind`` is the OTLP span-kind number (3: CLIENT) or None for any; ``min_ns`` /
    ``max_ns`` bound the span's duration (both inclusive); ``input_type`` narrows by the
    (settled) trace's input type.
    """

    start_ns: int
    end_ns: int
    kind: int | None = None
    service: str | None = None
    stage: str | None = None
    input_type: str | None = None
    min_ns: int | None = None
    max_ns: int | None = None
    limit: int = 200
    offset: int = 0
    # Without ``service``: the services whose spans can match (lets a long window use the
    # per-service duration index); empty means unknown.
    services: tuple[str, ...] = ()
    # Only spans that may call this service: a SERVER/CONSUMER child in it, or its name in
    # the span's attributes (peer.service, server.address, ...). A superset of the pair's
    # CLIENT spans, narrowed in SQL so a busy caller's other calls are never paged through;
    # the caller checks each row exactly as settling pairs them.
    may_call: str | None = None
    # Only spans that may be calls of this model (their signals name it; the caller checks).
    model: str | None = None


# Windows covering at least 1/N of the stored time range find their slowest spans through
# the duration index instead of sorting the window. The spans index holds start_ns, so its
# walk skips out-of-window spans in the index itself (cheap: ten minutes of a day already
# beat reading the window); for traces see ``calls.TRACE_WALK_SHARE``.
SPAN_WALK_SHARE = 200
# A stage's slowest spans are found below a ceiling the rollups give (plus the pending traces'
# own spans) when at most this many traces are pending in the window; past that the walk
# starts at each service's slowest span.
STAGE_CEILING_PENDING_AT_MOST = 2_000

_SPAN_COLUMNS = [c.key for c in Span.__table__.columns]
_TRACE_COLUMNS = [c.key for c in Trace.__table__.columns if c.key != "contributions"]


def _row_minutes(plan: TierPlan, minute: int) -> int:
    """How many minutes the rollup row of ``plan`` starting at ``minute`` covers (its tier's
    ranges do not overlap)."""
    if any(m0 <= minute < m1 for m0, m1 in plan.minute_ranges):
        return 1
    return 15 if any(q0 * 15 <= minute < q1 * 15 for q0, q1 in plan.quarter_ranges) else 60


def _callee_window(q: SpanQuery) -> tuple[int, int]:
    """When the spans of ``q.may_call`` that ``q``'s spans may have called can start."""
    return (q.start_ns - CALLEE_SKEW_NS,
            q.end_ns + (q.max_ns if q.max_ns is not None else CALLEE_LATE_NS) + CALLEE_SKEW_NS)


class SpanReader:
    """Raw spans and trace rows (``StoreReader.spans``)."""

    def __init__(self, context: ReadContext) -> None:
        self._ctx = context

    def of_trace(self, trace_id: str) -> list[dict]:
        stmt = select(Span.__table__).where(Span.trace_id == trace_id).order_by(Span.start_ns, Span.id)
        with self._ctx.connect() as conn:
            return dict_rows(conn.execute(stmt))

    def trace_row(self, trace_id: str) -> dict | None:
        with self._ctx.connect() as conn:
            cols = [Trace.__table__.c[c] for c in _TRACE_COLUMNS]
            row = conn.execute(select(*cols).where(Trace.trace_id == trace_id)).mappings().first()
            return None if row is None else dict(row)

    def counts(self) -> dict[str, int]:
        with self._ctx.connect() as conn:
            return {
                "spans": conn.execute(select(func.count()).select_from(Span)).scalar_one(),
                "traces": conn.execute(select(func.count()).select_from(Trace)).scalar_one(),
                "pending_traces": conn.execute(
                    select(func.count()).select_from(Trace).where(Trace.pending.is_(True))
                ).scalar_one(),
            }

    def slowest(self, q: SpanQuery) -> list[dict]:
        """Spans matching ``q``, slowest first (then earliest), ``limit`` from ``offset``.

        A short window is read through the ``start_ns`` index and sorted. A long one would
        sort millions of spans, so when the service is known (``service``, or the candidate
        ``services``) each service's duration buckets are walked downwards through the
        ``(service, duration_bucket, start_ns, duration_ns)`` index, each bucket's spans in
        the window sorted, stopping at ``offset + limit``. With ``input_type`` the trace row
        is joined.
        """
        services = [q.service] if q.service else list(q.services)
        if not services or not long_window(self._ctx, Span, q.start_ns, q.end_ns, SPAN_WALK_SHARE):
            return self._slowest_in_window(q)
        wanted = q.offset + q.limit
        bounds = self._stage_bounds(q, services) if q.stage else None
        # (built once for every service and bucket of the walk: building a statement cost
        # more than running it)
        in_bucket = self._window_statement(q, walk=True, callee_spans=self._callee_has_spans(q))
        rows: list[dict] = []
        for service in services:
            if bounds is None:
                rows.extend(self._walk_buckets(q, in_bucket, service, wanted))
            elif service in bounds[0]:  # (a service without a top has no span of the stage)
                rows.extend(self._walk_buckets(q, in_bucket, service, wanted, top=bounds[0][service],
                                               bottom=bounds[1]))
        rows.sort(key=lambda r: (-r["duration_ns"], r["start_ns"], r["_id"]))
        out = rows[q.offset : q.offset + q.limit]
        for r in out:
            del r["_id"]
        return out

    def _callee_has_spans(self, q: SpanQuery) -> bool:
        """False when ``q.may_call`` has no SERVER/CONSUMER span around the window for the
        walk to look up. A database or an outside API, named only in its callers' attributes,
        has none: the walk then leaves out the look-up it would make for every walked span."""
        if q.may_call is None:
            return True  # (nothing to look up)
        lo, hi = _callee_window(q)
        with self._ctx.connect() as conn:
            # From the slowest down: a service's SERVER spans enclose its other spans, so the
            # first is found at once rather than past all of its quick INTERNAL ones.
            return conn.execute(select(Span.id).where(
                Span.service == q.may_call, Span.kind.in_(CALLEE_KIND_CODES), Span.start_ns >= lo,
                Span.start_ns < hi).order_by(Span.duration_bucket.desc()).limit(1)).first() is not None

    def _stage_bounds(self, q: SpanQuery, services: list[str]) -> tuple[dict[str, int], int] | None:
        """Where the slowest spans of ``q.stage`` lie: per service, the duration bucket of its
        slowest span of the stage in the window (or one above), and a bucket every one of the
        ``offset + limit`` slowest is at or above (0: unknown). A service's slowest spans are
        mostly of other stages (a gateway's whole requests above its preprocessing), which a
        walk from the top, or down past the wanted rows, would read through.

        The ``op`` rollups bound the settled spans, as settling stored their stages: the
        window's minutes rounded out give each service's top, those wholly inside it the
        floor. The spans of pending traces are read themselves (they can only raise a top).
        None when too many traces are pending to read."""
        outer = (q.start_ns // MINUTE_NS, -(-q.end_ns // MINUTE_NS))
        inner = (-(-q.start_ns // MINUTE_NS), q.end_ns // MINUTE_NS)
        with self._ctx.connect() as conn:
            pending = conn.execute(select(Trace.trace_id).where(
                Trace.pending.is_(True), or_(Trace.first_start_ns.is_(None), Trace.first_start_ns < q.end_ns))
                .limit(STAGE_CEILING_PENDING_AT_MOST + 1)).scalars().all()
            if len(pending) > STAGE_CEILING_PENDING_AT_MOST:
                return None
            series, kept = series_and_kept_from(
                conn, series_filter("op", Filters(stage=q.stage, input_type=q.input_type)), [Series.service])
            series = {sid: dims for sid, dims in series.items() if dims[0] in services}
            plan = tier_plan(outer[0] * MINUTE_NS, outer[1] * MINUTE_NS, kept)
            by_service: dict[str, list[bytes]] = {}
            inside: list[bytes] = []
            for r in rows_of_series(conn, series, plan_tiers(plan)):
                minute, blob, service = r[0], r[4], r[5]
                by_service.setdefault(service, []).append(blob)
                if inner[0] <= minute and minute + _row_minutes(plan, minute) <= inner[1]:
                    inside.append(blob)
            bounds: dict[str, int] = {}
            for service, blobs in by_service.items():
                keys = np.flatnonzero(sketch.merge_blobs(blobs).counts)
                if not len(keys):
                    continue
                if keys[-1] >= sketch.NUM_KEYS - 1:  # the top key holds any larger value
                    return None
                # (a value of key k is at most bucket_upper(k): a little over, for float rounding)
                bounds[service] = duration_bucket(int(sketch.bucket_upper(int(keys[-1])) * (1 + 1e-9)) + 1)
            for i in range(0, len(pending), 500):
                for service, top in conn.execute(
                        select(Span.service, func.max(Span.duration_bucket))
                        .where(Span.trace_id.in_(pending[i : i + 500]), _stage_is(q.stage),
                               Span.service.in_(services)).group_by(Span.service)):
                    bounds[service] = max(bounds.get(service, 0), int(top))
        floor = 0
        from_top = np.cumsum(sketch.merge_blobs(inside).counts[::-1])
        wanted = q.offset + q.limit
        # Only for spans the rollups count as they are asked for (no kind, callee or model
        # narrowing, no band's ceiling): the wanted-th slowest settled span inside the window
        # is at or below the wanted-th slowest span the query finds.
        if q.kind is None and q.may_call is None and q.model is None and q.max_ns is None and from_top[-1] >= wanted:
            key = sketch.NUM_KEYS - 1 - int(np.searchsorted(from_top, wanted))
            # (values of key k are above bucket_upper(k - 1): a little under, for float rounding)
            floor = duration_bucket(int(sketch.bucket_upper(key - 1) * (1 - 1e-9))) if key > 1 else 0
        return bounds, floor

    def _walk_buckets(self, q: SpanQuery, in_bucket: Select, service: str, wanted: int, top: int = MAX_BUCKET,
                      bottom: int = 0) -> list[dict]:
        """``service``'s ``wanted`` slowest spans matching ``q``: bucket by bucket downwards
        from ``top`` to ``bottom`` (every span of a bucket is slower than every span below it,
        so the rows come out in order), each step one look-up for the next bucket holding any
        of its spans, then ``in_bucket`` (``_window_statement(q, walk=True)``) for its rows."""
        floor = max(duration_bucket(q.min_ns) if q.min_ns is not None else 0, bottom)
        below = min(duration_bucket(q.max_ns) if q.max_ns is not None else MAX_BUCKET, top) + 1
        rows: list[dict] = []
        with self._ctx.connect() as conn:
            while len(rows) < wanted:
                bucket = conn.execute(_NEXT_BUCKET, {"service": service, "below": below}).scalar()
                if bucket is None or bucket < floor:
                    break
                rows.extend(dict_rows(conn.execute(
                    in_bucket, {"walk_service": service, "walk_bucket": bucket, "walk_limit": wanted - len(rows)})))
                below = bucket
        return rows

    def _slowest_in_window(self, q: SpanQuery) -> list[dict]:
        """``slowest`` through the ``start_ns`` index: the window's matching spans sorted."""
        with self._ctx.connect() as conn:
            return dict_rows(conn.execute(self._window_statement(q)))

    def _window_statement(self, q: SpanQuery, walk: bool = False, callee_spans: bool = True) -> Select:
        """The spans matching ``q`` in its window, slowest first, ``limit`` from ``offset``; or
        (``walk``) one duration bucket of one service, read through the walk index, with
        the bind parameters ``walk_service``, ``walk_bucket`` and ``walk_limit``.
        ``callee_spans=False``: ``q.may_call`` has no span around the window to look up."""
        cols = [Span.__table__.c[c] for c in _CANDIDATE_COLUMNS]
        if walk:
            conds = [Span.service == bindparam("walk_service"), Span.duration_bucket == bindparam("walk_bucket"),
                     Span.start_ns >= q.start_ns, Span.start_ns < q.end_ns]
            cols.append(Span.id.label("_id"))
        else:
            conds = [Span.start_ns >= q.start_ns, Span.start_ns < q.end_ns]
        if q.kind is not None:
            conds.append(Span.kind == q.kind)
        if q.service and not walk:
            # "|| ''" keeps the planner on the start_ns index for a short window: walking a
            # busy service's duration index would visit days of spans to fill one hour.
            conds.append(Span.service.concat("") == q.service)
        if q.stage:
            conds.append(_stage_is(q.stage))
        if q.may_call is not None and not callee_spans:
            conds.append(named_in_attributes(self._ctx.engine.dialect.name, q.may_call))
        elif q.may_call is not None:
            child = aliased(Span)
            if walk or q.min_ns is not None:
                # One look-up a walked span, through its trace's spans (the (trace_id, span_id)
                # index). A walk runs this statement once a bucket, and would read all of the
                # callee's spans in the window again each time; a band bounds the spans read.
                calls = select(child.id).where(
                    child.trace_id == Span.trace_id, child.parent_span_id == Span.span_id,
                    child.service.concat("") == q.may_call, child.kind.in_(CALLEE_KIND_CODES)).exists()
            else:
                # A window sorted once: the callee's SERVER/CONSUMER spans starting around it,
                # read once through start_ns ("|| ''" keeps the planner off the service index,
                # which would visit every span the callee ever had), their parent ids matched
                # by span id only (64 random bits; the caller checks each row exactly).
                lo, hi = _callee_window(q)
                calls = Span.span_id.in_(select(child.parent_span_id).where(
                    child.service.concat("") == q.may_call, child.kind.in_(CALLEE_KIND_CODES),
                    child.start_ns >= lo, child.start_ns < hi))
            conds.append(or_(named_in_attributes(self._ctx.engine.dialect.name, q.may_call), calls))
        if q.model:
            conds.append(of_model(self._ctx.engine.dialect.name, q.model))
        if q.min_ns is not None:
            conds.append(Span.duration_ns >= q.min_ns)
        if q.max_ns is not None:
            conds.append(Span.duration_ns <= q.max_ns)
        stmt = select(*cols)
        if q.input_type:
            stmt = stmt.join(Trace, Trace.trace_id == Span.trace_id)
            conds.append(Trace.input_type == q.input_type)
        stmt = stmt.where(*conds).order_by(Span.duration_ns.desc(), Span.start_ns, Span.id)
        return stmt.limit(bindparam("walk_limit")) if walk else stmt.limit(q.limit).offset(q.offset)

    def callee_children(self, parents: Iterable[tuple[str, str]]) -> list[dict]:
        """SERVER/CONSUMER children of the given (trace_id, span_id) spans (found through the
        ``(trace_id, span_id)`` unique index's trace_id prefix)."""
        parents = list(parents)
        out: list[dict] = []
        if not parents:
            return out
        by_trace: dict[str, set[str]] = {}
        for tid, sid in parents:
            by_trace.setdefault(tid, set()).add(sid)
        tids = sorted(by_trace)
        cols = [Span.__table__.c[c] for c in _CANDIDATE_COLUMNS]
        with self._ctx.connect() as conn:
            for i in range(0, len(tids), 300):
                chunk = tids[i : i + 300]
                stmt = select(*cols).where(Span.trace_id.in_(chunk), Span.kind.in_(CALLEE_KIND_CODES),
                                           Span.parent_span_id.is_not(None))
                out.extend(r for r in dict_rows(conn.execute(stmt))
                           if r["parent_span_id"] in by_trace.get(r["trace_id"], ()))
        return out

    def by_id(self, keys: Iterable[tuple[str, str]]) -> list[dict]:
        """The spans with the given (trace_id, span_id) (candidate columns), through the
        ``(trace_id, span_id)`` unique index: the parents a pair check needs."""
        by_trace: dict[str, set[str]] = {}
        for tid, sid in keys:
            by_trace.setdefault(tid, set()).add(sid)
        out: list[dict] = []
        if not by_trace:
            return out
        cols = [Span.__table__.c[c] for c in _CANDIDATE_COLUMNS]
        tids = sorted(by_trace)
        with self._ctx.connect() as conn:
            for i in range(0, len(tids), 300):
                chunk = tids[i : i + 300]
                sids = sorted({sid for tid in chunk for sid in by_trace[tid]})
                stmt = select(*cols).where(Span.trace_id.in_(chunk), Span.span_id.in_(sids))
                out.extend(r for r in dict_rows(conn.execute(stmt)) if r["span_id"] in by_trace[r["trace_id"]])
        return out

    def trace_rows(self, trace_ids: Iterable[str]) -> dict[str, dict]:
        """Trace rows (summary columns) by id."""
        ids = sorted(set(trace_ids))
        out: dict[str, dict] = {}
        cols = [Trace.__table__.c[c] for c in _TRACE_SUMMARY_COLUMNS]
        with self._ctx.connect() as conn:
            for i in range(0, len(ids), 500):
                for r in dict_rows(conn.execute(select(*cols).where(Trace.trace_id.in_(ids[i : i + 500])))):
                    out[r["trace_id"]] = r
        return out

    def long_traces(self, start_ns: int, end_ns: int, min_duration_ns: int) -> list[dict]:
        """Settled traces starting in the window lasting at least ``min_duration_ns``."""
        cols = [Trace.__table__.c[c] for c in _TRACE_SUMMARY_COLUMNS]
        # Long traces are rare: "+ 0" sends the planner to the duration index (from the bound
        # up) instead of reading every trace of the window through start_ns.
        stmt = select(*cols).where(Trace.start_ns + 0 >= start_ns, Trace.start_ns + 0 < end_ns,
                                   Trace.duration_ns >= min_duration_ns, Trace.settled_ns.is_not(None))
        with self._ctx.connect() as conn:
            return dict_rows(conn.execute(stmt))
