"""``AttributeReader``: spans read for their attributes: the operations carrying a key
(``ops``), the cache lookups (``cache_spans``), a Compare's population (``subjects``, a sample
spread over a long window) and the attribute-based detectors' bounded read (``spans``)."""

from __future__ import annotations

from typing import Iterable

import json as _json

from sqlalchemy import BigInteger, Connection, String, and_, case, func, literal, or_, select

from .. import Span, Trace
from ..dialect import index_by_bitmap, one_of, plan_for_parameters
from .base import Filters, ReadContext, dict_rows, plain_rows, services_in
from .walks import walk_bucket_list, walk_conds, walk_entries

#: Evenly spaced stretches a sampled ``subjects`` read takes from its window.
SUBJECT_CLUSTERS = 12
#: Services a stage's spans may come from for ``subjects`` to walk their span indexes
#: (more: the window is scanned through start_ns).
STAGE_WALK_SERVICES = 8
#: Traces whose root spans one statement looks up (two bound values each: a statement's
#: values stay well under SQLite's 32,766).
ROOTS_PER_STATEMENT = 2_000

ATTRIBUTE_SCAN_SLACK = 2  # ``spans`` reads by id range when it spans at most 2x the window's rows
# ``spans`` reads one service's spans through its index when they are at most a quarter
# of the window's rows (an index entry and a row look-up each, against a scan of every row).
ATTRIBUTE_SERVICE_SHARE = 4
# ``spans`` counts a service's spans of the window in its walk index up to this many
# before it decides (a larger share reads the window's rows by id or start instead).
ATTRIBUTE_WALK_COUNTED = 50_000
# SQLite: ``subjects`` finds a stretch's slow traces through the duration index when the
# store holds at most this many times as many traces that slow as traces in the stretch
# (an index entry each, against a row look-up for each trace of the stretch).
SLOW_TRACES_BY_DURATION = 2


def _few_that_slow(conn: Connection, lo: int, hi: int, min_ns: int) -> bool:
    """Whether the store holds at most ``SLOW_TRACES_BY_DURATION`` times as many traces of at
    least ``min_ns`` as traces starting in [lo, hi): two index-only counts, the second
    stopped at that bound."""
    in_stretch = conn.execute(select(func.count()).where(Trace.start_ns >= lo, Trace.start_ns < hi)).scalar_one()
    bound = SLOW_TRACES_BY_DURATION * in_stretch
    slow = select(literal(1)).where(Trace.duration_ns >= min_ns).limit(bound + 1).subquery()
    return conn.execute(select(func.count()).select_from(slow)).scalar_one() <= bound


class AttributeReader:
    """Spans with their attributes, for Compare, the cache view and the detectors
    (``StoreReader.attributes``)."""

    def __init__(self, context: ReadContext) -> None:
        self._ctx = context

    def ops(self, key: str, start_ns: int, end_ns: int,
            sample: int = 50_000) -> list[tuple[str, str, object]]:
        """(service, span name, value) of spans carrying attribute ``key``, among the newest
        ``sample`` spans of the window (a bounded scan: cost independent of the window's size).

        Used to find which operations are ViT layers (``mm.layer``); their numbers then come
        from the ``op`` rollups for the whole window.
        """
        inner = (
            select(Span.service, Span.name, Span.attributes)
            .where(Span.start_ns >= start_ns, Span.start_ns < end_ns)
            .order_by(Span.start_ns.desc())
            .limit(sample)
            .subquery()
        )
        needle = _json.dumps(key)
        stmt = select(inner.c.service, inner.c.name, inner.c.attributes).where(
            inner.c.attributes.contains(needle, autoescape=True))
        found: dict[tuple[str, str], object] = {}
        with self._ctx.connect() as conn:
            for service, name, attrs in conn.execute(stmt):
                if (service, name) in found:
                    continue
                try:
                    value = _json.loads(attrs).get(key)
                except (ValueError, AttributeError):
                    continue
                if value is not None:
                    found[(service, name)] = value
        return [(s, n, v) for (s, n), v in sorted(found.items())]

    # -- cache analytics and triage compare ---------------------------
    def cache_spans(self, start_ns: int, end_ns: int, limit: int = 500_000) -> list[tuple]:
        """``(start_ns, attributes JSON, resource JSON)`` of spans starting in the window whose
        attributes carry ``cache.name`` (the window on the ``start_ns`` index, the key as a
        portable substring test; at most ``limit`` rows, newest first)."""
        stmt = (
            select(Span.start_ns, Span.attributes, Span.resource)
            .where(Span.start_ns >= start_ns, Span.start_ns < end_ns,
                   Span.attributes.contains(_json.dumps("cache.name"), autoescape=True))
            .order_by(Span.start_ns.desc())
            .limit(limit)
        )
        with self._ctx.connect() as conn:
            return [tuple(r) for r in conn.execute(stmt)]

    def subjects(self, start_ns: int, end_ns: int, *, kind: int | None = None, service: str | None = None,
                 stage: str | None = None, input_type: str | None = None, root_only: bool = False,
                 min_ns: int | None = None, limit: int = 100_000, expected: int | None = None,
                 clusters: int = SUBJECT_CLUSTERS) -> list[dict]:
        """Spans starting in the window with their attributes, resource, instance and the
        trace's input type (``trace_id``, ``start_ns``, ``duration_ns``, ``attributes``,
        ``resource``, ``instance``, ``input_type``): the population a Compare ranks attribute
        values over. ``min_ns``: only spans at least that long. Newest first, at most
        ``limit`` rows.

        ``expected``: about how many spans match (from the rollups). When that is more than
        ``limit`` the rows are a sample spread over the window: ``clusters`` evenly spaced
        stretches of it, together about ``limit`` spans long, each read whole — not the
        window's newest minutes only, and a read bounded by ``limit`` rather than by the
        window (a day of one service's spans on a busy store took far too long to read).
        A service's spans are read through its span index (``ix_spans_duration_walk``),
        whole traces (``root_only``: each trace's root span, the earliest where it has
        several) through the traces table: at most ``limit`` traces."""
        parts = [(start_ns, end_ns)]
        per_part = limit
        if expected is not None and expected > limit and end_ns - start_ns > clusters:
            step = (end_ns - start_ns) / clusters
            width = max(1, int(step * limit / expected))
            parts = [(start_ns + int(i * step), min(end_ns, start_ns + int(i * step) + width))
                     for i in range(clusters - 1, -1, -1)]
            per_part = -(-limit // clusters)
        stmt = (select(Span.trace_id, Span.start_ns, Span.duration_ns, Span.attributes, Span.resource, Span.instance,
                       Trace.input_type)
                .select_from(Span).outerjoin(Trace, Trace.trace_id == Span.trace_id).order_by(Span.start_ns.desc()))
        narrowing = [cond for cond in (Span.duration_ns >= min_ns if min_ns is not None else None,
                                       Span.kind == kind if kind is not None else None,
                                       Span.stage == stage if stage else None,
                                       Trace.input_type == input_type if input_type else None) if cond is not None]
        out: list[dict] = []
        with self._ctx.transaction() as conn:  # (a transaction: plan_for_parameters' SET LOCAL)
            plan_for_parameters(conn)
            if service:
                walks = {service: walk_bucket_list(self._ctx, conn, service, min_ns, None)}
            elif stage and not root_only:
                # A stage's spans come from a few services (the services of its ``op`` series,
                # as the rollups Compare counts from know them): their span indexes, not every
                # service's spans of the window through start_ns (an hour's inference Compare at
                # ten million spans read far more spans than it kept). Past a few services the walks'
                # seeks (one a duration bucket a service) cost more than the scan they replace.
                names = services_in(conn, "op", Filters(stage=stage))
                walks = ({name: walk_bucket_list(self._ctx, conn, name, min_ns, None) for name in names}
                         if len(names) <= STAGE_WALK_SERVICES else None)
            else:
                walks = None
            if walks is not None:
                walks = {name: buckets for name, buckets in walks.items() if buckets}
                if not walks:
                    return []
            if root_only:  # every stretch's traces, then all their root spans in one statement
                traces: list = []
                for lo, hi in parts:
                    wanted = min(per_part, limit - len(traces))
                    if wanted <= 0:
                        break
                    traces.extend(self._slow_traces_in(conn, lo, hi, min_ns, input_type, wanted))
                return self._root_spans(conn, traces, min_ns)[:limit]
            for lo, hi in parts:
                wanted = min(per_part, limit - len(out))
                if wanted <= 0:
                    break
                if walks is None:
                    out.extend(dict_rows(conn.execute(
                        stmt.where(Span.start_ns >= lo, Span.start_ns < hi, *narrowing).limit(wanted))))
                    continue
                # (several services' walks OR-ed in one statement: a statement each cost
                # PostgreSQL its planning and a round trip, 72 for an hour's encoder Compare)
                span_range = or_(*(and_(*walk_conds(name, buckets, lo, hi, None, None))
                                   for name, buckets in walks.items()))
                out.extend(dict_rows(conn.execute(stmt.where(span_range, *narrowing).limit(wanted))))
        return out[:limit]

    @staticmethod
    def _slow_traces_in(conn: Connection, lo: int, hi: int, min_ns: int | None, input_type: str | None,
                        limit: int) -> list:
        """``(trace_id, input_type, start_ns)`` of the traces starting in [lo, hi) at least
        ``min_ns`` long, newest first. Settled traces only, as in the rollups Compare's counts
        and threshold come from: a pending trace's row has no start yet."""
        start = Trace.start_ns
        if min_ns is not None and conn.dialect.name == "sqlite" and _few_that_slow(conn, lo, hi, min_ns):
            # SQLite, without range statistics, would walk the stretch's traces by start time;
            # "+ 0" (in the order too) keeps it off the start index: it reads the duration
            # index's tail and sorts what it found.
            start = Trace.start_ns + 0
        conds = [start >= lo, start < hi]
        if min_ns is not None:  # (a root span is at most as long as its trace)
            conds.append(Trace.duration_ns >= min_ns)
        if input_type:
            conds.append(Trace.input_type == input_type)
        return conn.execute(select(Trace.trace_id, Trace.input_type, Trace.start_ns).where(*conds)
                            .order_by(start.desc()).limit(limit)).all()

    @staticmethod
    def _root_spans(conn: Connection, traces: list, min_ns: int | None) -> list[dict]:
        """``subjects`` rows of the root spans of ``traces`` (``_slow_traces_in``'s rows),
        in their order. (The traces first, then their roots: as one join PostgreSQL's planner
        took a parallel scan of the whole traces table for an hour's slow traces.)"""
        if not traces:
            return []
        # A settled trace starts where its root span does (the earliest root: the settler's
        # ``find_root``), so its root is found through the start_ns index, a look-up a trace.
        # By trace id every span of the trace was read to test its parent (~27 a trace at ten
        # million spans: an hour's whole-trace Compare spent much of its time there on SQLite).
        # "|| ''" keeps the planner off the trace id index; the ids only confirm each match.
        starts = {(t, s) for t, _, s in traces}
        roots: dict[str, list] = {}
        for i in range(0, len(traces), ROOTS_PER_STATEMENT):
            chunk = traces[i : i + ROOTS_PER_STATEMENT]
            span_conds = [one_of(conn, Span.start_ns, sorted({s for _, _, s in chunk}), BigInteger),
                          Span.parent_span_id.is_(None),
                          one_of(conn, Span.trace_id.concat(""), [t for t, _, _ in chunk], String)]
            if min_ns is not None:
                span_conds.append(Span.duration_ns >= min_ns)
            for r in plain_rows(conn, select(Span.trace_id, Span.start_ns, Span.duration_ns, Span.attributes,
                                             Span.resource, Span.instance).where(*span_conds)):
                if (r[0], r[1]) in starts:
                    roots.setdefault(r[0], []).append(r)
        keys = ("trace_id", "start_ns", "duration_ns", "attributes", "resource", "instance", "input_type")
        return [dict(zip(keys, (*r, it))) for t, it, _ in traces for r in roots.get(t, ())]

    def spans(self, start_ns: int, end_ns: int, keys: Iterable[str],
              kinds: Iterable[int] = (), service: str | None = None,
              limit: int | None = None, stages: Iterable[str] = ()) -> list[tuple]:
        """Spans starting in the window that carry one of the attribute ``keys`` or have one of
        the span ``kinds``: ``(trace_id, service, name, kind, stage, start_ns, duration_ns,
        status, instance, attributes JSON or '')``; attributes only where a key occurs;
        ``service`` narrows it to one service, ``stages`` to those pipeline stages; ``limit``
        keeps the first rows.

        Rows come in start-time order (ties by row id). A bounded read for the
        attribute-based detectors: callers keep the window bounded. The attribute test is a
        substring match (``instr`` on SQLite, ``LIKE`` elsewhere). Spans are stored roughly
        in time order, so when the window's row ids (from the ``start_ns`` index) form a
        tight range the rows are read by that primary-key range — sequential pages instead
        of one table seek per row through the index. One ``service``'s spans, when they are
        at most a quarter of the window's, are read through that service's span index.
        """
        if self._ctx.engine.dialect.name == "sqlite":  # instr: a plain substring test, cheaper than LIKE
            needles = [func.instr(Span.attributes, _json.dumps(k)) > 0 for k in keys]
        else:
            needles = [Span.attributes.contains(_json.dumps(k), autoescape=True) for k in keys]
        kinds = tuple(kinds)
        wanted = or_(*needles) if needles else literal(False)
        window = [Span.start_ns >= start_ns, Span.start_ns < end_ns]
        attrs = case((wanted, Span.attributes), else_=literal(""))
        with self._ctx.transaction() as conn:  # (a transaction: index_by_bitmap's SET LOCAL)
            by_service = decided = None
            if service is not None:
                # The service's spans of the window through its (service, duration_bucket,
                # start_ns, ...) index, bucket by bucket, when they are at most a quarter of
                # the window's (both counted in the indexes alone; the window only that far
                # while the service's are few: counting all of a half hour's spans cost more
                # than reading the service's). A scan reads every service's rows.
                buckets = walk_bucket_list(self._ctx, conn, service, None, None)
                walk = walk_entries(conn, {service: buckets}, start_ns, end_ns, None, None,
                                    ATTRIBUTE_WALK_COUNTED)
                if walk <= ATTRIBUTE_WALK_COUNTED:
                    enough = ATTRIBUTE_SERVICE_SHARE * max(walk, 1)
                    seen = conn.execute(select(func.count()).select_from(
                        select(literal(1).label("one")).where(*window).limit(enough).subquery())).scalar_one()
                    if not seen:
                        return []
                    decided = True
                    if seen >= enough:
                        by_service = walk_conds(service, buckets, start_ns, end_ns, None, None)
            if by_service is None:
                lo, hi, n = conn.execute(select(func.min(Span.id), func.max(Span.id), func.count())
                                         .where(*window)).one()
                if not n:
                    return []
                share = n // ATTRIBUTE_SERVICE_SHARE
                if service is not None and not decided and \
                        walk_entries(conn, {service: buckets}, start_ns, end_ns, None, None, share) <= share:
                    by_service = walk_conds(service, buckets, start_ns, end_ns, None, None)
            if by_service is not None:
                conds = list(by_service)
                index_by_bitmap(conn)
            elif hi - lo + 1 <= ATTRIBUTE_SCAN_SLACK * n:
                # "+ 0" keeps the planner off the start_ns index: the id range drives the scan.
                conds = [Span.id >= lo, Span.id <= hi, Span.start_ns + 0 >= start_ns, Span.start_ns + 0 < end_ns]
            else:
                conds = list(window)
            conds.append(or_(Span.kind.in_(kinds), wanted) if kinds else wanted)
            if stages:
                conds.append(Span.stage.in_(tuple(stages)))
            if service is not None and by_service is None:
                # "|| ''" keeps the planner on the window: with a plain equality it took the
                # service's duration index and read every span the service ever sent.
                conds.append(Span.service.concat("") == service)
            stmt = (select(Span.trace_id, Span.service, Span.name, Span.kind, Span.stage, Span.start_ns,
                           Span.duration_ns, Span.status, Span.instance, attrs)
                    .where(*conds).order_by(Span.start_ns, Span.id))
            if limit is not None:
                stmt = stmt.limit(limit)
            return plain_rows(conn, stmt)
