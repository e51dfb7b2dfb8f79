"""``CallReader``: a pair's calls and the slowest traces: settled calls from ``pair_calls``
(``slowest``), the calls of traces not settled yet (``pending``: trace by trace, or a walk of
the callers' span indexes) and the slowest settled traces (``slowest_traces``)."""

from __future__ import annotations

import functools
from typing import Iterable

from sqlalchemy import Connection, bindparam, literal, or_, select, union_all
from sqlalchemy.orm import aliased

from .. import PAIR_CALLS_CURSOR, Cursor, PairCall, Series, Span, Trace
from .base import Filters, ReadContext, dict_rows, series_filter
from .walks import (_CANDIDATE_COLUMNS, _TRACE_SUMMARY_COLUMNS, CALLEE_KIND_CODES, KIND_CLIENT_CODE, _stage_is,
                    long_window, named_in_attributes, of_model, walk_bucket_list, walk_conds, walk_entries)

# A pair's exemplar search and the traces still pending (``CallReader.pending``): trace ids a query
# when read one by one; how many pending traces make a walk worth its look-ups; the share
# of them, earliest first, always read one by one (so one trace with old spans does not
# stretch the walk over hours); and the index entries a walked trace may cost before
# reading them one by one is cheaper (measured under live demo traffic: a trace read by id
# costs about as much as a few dozen walked entries; the demo's gateway has ~10 spans a trace).
PENDING_CHUNK = 300
PENDING_WALK_AFTER = 300
PENDING_STRAGGLER_SHARE = 0.02
PENDING_WALK_ENTRIES_PER_TRACE = 25

_COMPLETE_FROM = select(Cursor.position).where(Cursor.name == PAIR_CALLS_CURSOR)

# Windows covering at least 1/N of the stored time range find their slowest traces through
# the duration index instead of sorting the window; the traces index does not hold start_ns,
# so its walk reads out-of-window traces too (worth it from an hour of a day).
TRACE_WALK_SHARE = 24


class CallReader:
    """A pair's slowest calls, settled and pending, and the slowest traces
    (``StoreReader.calls``)."""

    def __init__(self, context: ReadContext) -> None:
        self._ctx = context

    def complete_from(self) -> int:
        """The span start (ns) from which ``pair_calls`` holds every settled call: 0 for a
        store created with it, later for one upgraded to it (see migration 0005); looked up
        once per pinned block."""
        return self._ctx.once_per_block("pair_calls_complete_from", lambda conn: int(
            conn.execute(_COMPLETE_FROM).scalar() or 0))

    def slowest(self, filters: Filters, start_ns: int, end_ns: int, *, min_ns: int | None = None,
                max_ns: int | None = None, limit: int = 20) -> tuple[list[dict], bool]:
        """Settled calls of the pair series matching ``filters`` (caller, callee, service,
        input type) starting in the window, slowest first (then earliest): the span rows
        (candidate columns and ``_id``), at most ``limit``. Each series walks the
        ``(series_id, duration_ns, start_ns)`` index slowest first; the walks are merged.
        The flag says whether more rows may exist beyond ``limit``."""
        with self._ctx.connect() as conn:
            series_ids = self._ctx.once_per_block(("pair_series", filters), lambda c: c.execute(
                select(Series.id).where(series_filter("pair", filters))).scalars().all(), conn)
            # One statement for every series, a limited branch each (each walks the index on its
            # own), as SQL text with the integers inline: a statement built a series cost more
            # in Python than the index walks.
            bounds = f"start_ns >= {int(start_ns)} AND start_ns < {int(end_ns)}"
            if min_ns is not None:
                bounds += f" AND duration_ns >= {int(min_ns)}"
            if max_ns is not None:
                bounds += f" AND duration_ns <= {int(max_ns)}"
            arms = [f"SELECT * FROM (SELECT duration_ns, start_ns, span_row, series_id FROM {PairCall.__tablename__} "
                    f"WHERE series_id = {int(sid)} AND {bounds} "
                    f"ORDER BY duration_ns DESC, start_ns, span_row LIMIT {int(limit)}) AS s{k}"
                    for k, sid in enumerate(series_ids)]
            picked: list[tuple[int, int, int]] = []
            per_series: dict[int, int] = {}
            for i in range(0, len(arms), 100):
                for duration, start, row, sid in conn.exec_driver_sql(" UNION ALL ".join(arms[i:i + 100])).all():
                    picked.append((duration, start, row))
                    per_series[sid] = per_series.get(sid, 0) + 1
            more = any(n == limit for n in per_series.values())  # that series may have more
            # The slowest `limit` of all are among each series' slowest `limit`: exact.
            picked.sort(key=lambda r: (-r[0], r[1], r[2]))
            more = more or len(picked) > limit
            picked = picked[:limit]
            cols = [Span.__table__.c[c] for c in _CANDIDATE_COLUMNS] + [Span.id.label("_id")]
            by_id: dict[int, dict] = {}
            ids = [r[2] for r in picked]
            for i in range(0, len(ids), 500):
                for r in dict_rows(conn.execute(select(*cols).where(Span.id.in_(ids[i : i + 500])))):
                    by_id[r["_id"]] = r
        # A row retention deleted between the two reads has no span: skipped.
        return [by_id[r[2]] for r in picked if r[2] in by_id], more

    def pending(self, start_ns: int, end_ns: int, services: Iterable[str] = (), *,
                input_type: str | None = None, min_ns: int | None = None, max_ns: int | None = None,
                may_call: str | None = None, stage: str | None = None, model: str | None = None,
                max_traces: int = 20_000) -> list[dict] | None:
        """CLIENT spans starting in the window of traces not settled yet (their calls are
        not in ``pair_calls``), of ``services`` when given, of traces whose row has
        ``input_type`` when given, narrowed to the spans that may call ``may_call`` as the
        raw-span search narrows them (a child span of that service, or the name in the
        attributes; the caller checks each row exactly), of ``stage`` and of calls that may be
        of ``model`` when given; None when more than ``max_traces``
        traces would be read one by one (a backlog: search the raw spans instead).

        Pending traces that begin after the window are skipped (``first_start_ns``). The
        rest are read through the span index of ``services`` from the earliest of them on
        (a walk over duration buckets: its cost follows the callers' spans that slow since
        then, not every span of every pending trace), when that reads few index entries a
        trace; the earliest-starting few (stragglers whose spans would widen the walk) and
        traces whose first start is not known are read one by one."""
        services = list(services)
        with self._ctx.connect() as conn:
            # (every pending trace, once per pinned block: each pair exemplar look-up asks)
            rows = [(tid, first) for tid, first in self._ctx.once_per_block("pending_traces", lambda c: [
                tuple(r) for r in c.execute(select(Trace.trace_id, Trace.first_start_ns).where(Trace.pending.is_(True)))
            ], conn) if first is None or first < end_ns]
            known = sorted((first, tid) for tid, first in rows if first is not None)
            one_by_one = [tid for tid, first in rows if first is None]
            walk_from = None
            if services and len(known) > PENDING_WALK_AFTER:
                cut = int(len(known) * PENDING_STRAGGLER_SHARE)
                walk_from = known[cut][0]
                budget = (len(known) - cut) * PENDING_WALK_ENTRIES_PER_TRACE
                # each caller's buckets between the bounds, looked up once for the count and the walk
                buckets = {s: walk_bucket_list(self._ctx, conn, s, min_ns, max_ns) for s in services}
                if walk_entries(conn, buckets, max(start_ns, walk_from), end_ns, min_ns, max_ns,
                                budget) > budget:
                    walk_from, cut = None, len(known)  # pending traces sparse among the window's: one by one
                one_by_one.extend(tid for _, tid in known[:cut])
            else:
                one_by_one.extend(tid for _, tid in known)
            if len(one_by_one) > max_traces:
                return None
            extra = (([_stage_is(stage)] if stage else [])
                     + ([of_model(self._ctx.engine.dialect.name, model)] if model else []))
            out = self._pending_one_by_one(conn, sorted(one_by_one), start_ns, end_ns, services,
                                           input_type=input_type, min_ns=min_ns, max_ns=max_ns, may_call=may_call,
                                           extra=extra)
            if walk_from is not None:
                seen = {r["_id"] for r in out}
                walked = {tid for first, tid in known if first >= walk_from}
                out.extend(r for r in self._pending_walk(conn, buckets, walk_from, start_ns, end_ns,
                                                         input_type=input_type, min_ns=min_ns, max_ns=max_ns,
                                                         may_call=may_call, extra=extra)
                           if r["trace_id"] in walked and r["_id"] not in seen)
        return out

    @staticmethod
    def _candidate_calls(conn: Connection, conds: list, input_type: str | None) -> list[dict]:
        """Candidate CLIENT span rows (with ``_id``) matching ``conds``, of traces whose row has
        ``input_type`` when given."""
        stmt = select(*[Span.__table__.c[c] for c in _CANDIDATE_COLUMNS], Span.id.label("_id"))
        if input_type:
            stmt = stmt.join(Trace, Trace.trace_id == Span.trace_id)
            conds = [*conds, Trace.input_type == input_type]
        return dict_rows(conn.execute(stmt.where(*conds)))

    def _pending_walk(self, conn: Connection, buckets: dict[str, list[int]], walk_from: int, start_ns: int,
                      end_ns: int, *, input_type: str | None, min_ns: int | None, max_ns: int | None,
                      may_call: str | None, extra: list = ()) -> list[dict]:
        """CLIENT spans of the services (service -> its buckets) starting in
        [max(start, walk_from), end) between the bounds, through the walk index bucket by
        bucket (settled traces' ones too: the caller keeps the pending traces')."""
        lo = max(start_ns, walk_from)
        out: list[dict] = []
        narrowed = None
        if may_call is not None:
            # The callee's SERVER/CONSUMER spans since walk_from (every span of a walked trace
            # starts no earlier), read once through its index bucket by bucket: their parent
            # ids (by span id only; the caller checks each row exactly). Or the name in the
            # attributes.
            child = aliased(Span)
            calls = Span.span_id.in_(select(child.parent_span_id).where(
                child.service == may_call,
                child.duration_bucket.in_(walk_bucket_list(self._ctx, conn, may_call, None, None)),
                child.start_ns >= walk_from, child.kind.in_(CALLEE_KIND_CODES)))
            narrowed = or_(named_in_attributes(self._ctx.engine.dialect.name, may_call), calls)
        for service, theirs in buckets.items():
            if not theirs:
                continue
            conds = walk_conds(service, theirs, lo, end_ns, min_ns, max_ns) + [Span.kind == KIND_CLIENT_CODE,
                                                                               *extra]
            if narrowed is not None:
                conds.append(narrowed)
            out.extend(self._candidate_calls(conn, conds, input_type))
        return out

    def _pending_one_by_one(self, conn: Connection, tids: list[str], start_ns: int, end_ns: int,
                            services: list[str], *, input_type: str | None, min_ns: int | None,
                            max_ns: int | None, may_call: str | None, extra: list = ()) -> list[dict]:
        """``pending`` for the given traces, each trace's spans through the
        ``(trace_id, span_id)`` index."""
        child = aliased(Span)

        def narrowed(chunk: list[str]):
            # The callee's SERVER/CONSUMER spans of these traces, read once: their parent ids
            # (matched by span id only; the caller checks each row exactly). Or the name in
            # the attributes.
            calls = Span.span_id.in_(select(child.parent_span_id).where(
                child.trace_id.in_(chunk), child.service.concat("") == may_call, child.kind.in_(CALLEE_KIND_CODES)))
            return or_(named_in_attributes(self._ctx.engine.dialect.name, may_call), calls)
        out: list[dict] = []
        # The other conditions are written so no other index qualifies ("+ 0", "|| ''"):
        # given the choice, SQLite walked a service's or the window's spans instead, far
        # slower for a day's pending traces on a large store.
        start, duration, service = Span.start_ns + 0, Span.duration_ns + 0, Span.service.concat("")
        for i in range(0, len(tids), PENDING_CHUNK):
            chunk = tids[i : i + PENDING_CHUNK]
            conds = [Span.trace_id.in_(chunk), Span.kind == KIND_CLIENT_CODE, start >= start_ns, start < end_ns,
                     *extra]
            if services:
                conds.append(service.in_(services))
            if min_ns is not None:
                conds.append(duration >= min_ns)
            if max_ns is not None:
                conds.append(duration <= max_ns)
            if may_call is not None:
                conds.append(narrowed(chunk))
            out.extend(self._candidate_calls(conn, conds, input_type))
        return out

    def slowest_traces(self, start_ns: int, end_ns: int, *, input_type: str | None = None,
                       root_service: str | None = None, min_ns: int | None = None, max_ns: int | None = None,
                       limit: int = 20) -> list[dict]:
        """Settled traces starting in the window, slowest first (the ``traces.start_ns`` index)."""
        walk = long_window(self._ctx, Trace, start_ns, end_ns, TRACE_WALK_SHARE)
        stmt = _slowest_traces_statement(walk, input_type is not None, root_service is not None, min_ns is not None,
                                         max_ns is not None)
        params = {"start": start_ns, "end": end_ns, "input_type": input_type, "root_service": root_service,
                  "min_ns": min_ns, "max_ns": max_ns, "limit": limit}
        with self._ctx.connect() as conn:
            return dict_rows(conn.execute(stmt, params))

    def slowest_traces_from(self, start_ns: int, ends: tuple[int, int], *, input_type: str | None = None,
                            min_ns: int | None = None, limit: int = 20) -> tuple[list[dict], list[dict]]:
        """``slowest_traces`` of the windows ``[start_ns, ends[0])`` and ``[start_ns, ends[1])``
        in one statement (an exemplar search reads a finding's first minute and its first five:
        one round trip instead of two)."""
        walks = {long_window(self._ctx, Trace, start_ns, end, TRACE_WALK_SHARE) for end in ends}
        if len(walks) > 1:  # (each window its own plan)
            return tuple(self.slowest_traces(start_ns, end, input_type=input_type, min_ns=min_ns, limit=limit)
                         for end in ends)
        stmt = _slowest_traces_pair_statement(walks.pop(), input_type is not None, min_ns is not None)
        params = {"start": start_ns, "end": ends[0], "end_b": ends[1], "input_type": input_type, "min_ns": min_ns,
                  "limit": limit}
        out: tuple[list[dict], list[dict]] = ([], [])
        with self._ctx.connect() as conn:
            for row in dict_rows(conn.execute(stmt, params)):
                out[row.pop("_window")].append(row)
        for rows in out:  # (a union promises no order: each branch's again)
            rows.sort(key=lambda r: (-r["duration_ns"], r["start_ns"], r["trace_id"]))
        return out


@functools.cache
def _slowest_traces_pair_statement(walk: bool, by_input: bool, has_min: bool):
    """``slowest_traces_from``'s statement: two limited branches, tagged ``_window`` 0 and 1."""
    arms = []
    for tag, end in ((0, "end"), (1, "end_b")):
        one = _slowest_traces_statement(walk, by_input, False, has_min, False, end)
        arms.append(select(one.subquery(), literal(tag).label("_window")))
    return union_all(*arms)


@functools.cache
def _slowest_traces_statement(walk: bool, by_input: bool, by_root: bool, has_min: bool, has_max: bool,
                              end_name: str = "end"):
    """``CallReader.slowest_traces``' statement for one shape of its arguments, built once (an
    evaluation runs it for every regression finding: building it cost more than running it)."""
    cols = [Trace.__table__.c[c] for c in _TRACE_SUMMARY_COLUMNS]
    start, end = bindparam("start"), bindparam(end_name)
    if walk:
        # A long window: walk the duration index slowest first ("+ 0": not the start index).
        # The duration bound (always true) is what makes SQLite's planner take that index.
        conds = [Trace.start_ns + 0 >= start, Trace.start_ns + 0 < end, Trace.settled_ns.is_not(None),
                 Trace.duration_ns >= 0]
    else:
        conds = [Trace.start_ns >= start, Trace.start_ns < end, Trace.settled_ns.is_not(None)]
    if by_input:
        conds.append(Trace.input_type == bindparam("input_type"))
    if by_root:
        conds.append(Trace.root_service == bindparam("root_service"))
    # A short window stays on the start index: "+ 0" keeps a band off the duration index.
    duration = Trace.duration_ns if walk else Trace.duration_ns + 0
    if has_min:
        conds.append(duration >= bindparam("min_ns"))
    if has_max:
        conds.append(duration <= bindparam("max_ns"))
    return (select(*cols).where(*conds).order_by(Trace.duration_ns.desc(), Trace.start_ns, Trace.trace_id)
            .limit(bindparam("limit")))
