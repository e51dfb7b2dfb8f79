"""The read side of the store, behind one small interface (Jaeger's SpanReader idea).

Readers take typed query objects and return plain rows; all statistics are computed from
those rows by pure functions in ``modalscope.app.queries``. Percentiles never come from
raw spans here: ``rollups`` returns merged histograms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from sqlalchemy import Engine, and_, or_, select

from . import Rollup, Series, Span, Trace
from .sketch import Histogram

NS_PER_MINUTE = 60_000_000_000


@dataclass(frozen=True)
class Filters:
    """Filters that narrow any query; None means "any"."""

    service: str | None = None
    caller: str | None = None
    callee: str | None = None
    stage: str | None = None
    input_type: str | None = None


@dataclass(frozen=True)
class RollupQuery:
    kind: str  # op | pair | trace | tstage
    start_ns: int
    end_ns: int
    filters: Filters = field(default_factory=Filters)
    group_by: tuple[str, ...] = ()  # series dimensions to keep apart
    by_minute: bool = False


@dataclass
class RollupGroup:
    key: tuple[str, ...]  # values of group_by (plus the minute when by_minute)
    count: int
    error_count: int
    sum_ns: int
    histogram: Histogram


def minute_range(start_ns: int, end_ns: int) -> tuple[int, int]:
    """Minutes whose start lies in [start, end): a span belongs to a window by its start."""
    first = -(-start_ns // NS_PER_MINUTE)
    last = -(-end_ns // NS_PER_MINUTE)  # exclusive
    return first, last


class StoreReader:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- rollups ----------------------------------------------------------------------
    def _series_filter(self, kind: str, f: Filters):
        conds = [Series.kind == kind]
        if kind == "pair":
            if f.service:
                conds.append(or_(Series.caller == f.service, Series.callee == f.service))
        elif f.service:
            conds.append(Series.service == f.service)
        if f.caller and kind == "pair":
            conds.append(Series.caller == f.caller)
        if f.callee and kind == "pair":
            conds.append(Series.callee == f.callee)
        if f.stage and kind in ("op", "tstage"):
            conds.append(Series.stage == f.stage)
        if f.input_type:
            conds.append(Series.input_type == f.input_type)
        return and_(*conds)

    def rollups(self, q: RollupQuery) -> list[RollupGroup]:
        """Merge rollup rows per group (and minute, with by_minute)."""
        first, last = minute_range(q.start_ns, q.end_ns)
        dims = [getattr(Series, d) for d in q.group_by]
        stmt = (
            select(Rollup.minute, Rollup.count, Rollup.error_count, Rollup.sum_ns, Rollup.sketch, *dims)
            .join(Series, Series.id == Rollup.series_id)
            .where(self._series_filter(q.kind, q.filters), Rollup.minute >= first, Rollup.minute < last)
        )
        groups: dict[tuple, RollupGroup] = {}
        with self.engine.connect() as conn:
            for row in conn.execute(stmt):
                minute, count, errs, total, blob = row[:5]
                key = tuple(row[5:]) + ((minute,) if q.by_minute else ())
                g = groups.get(key)
                if g is None:
                    g = groups[key] = RollupGroup(key, 0, 0, 0, Histogram())
                g.count += count
                g.error_count += errs
                g.sum_ns += total
                g.histogram.add_blob(blob)
        return list(groups.values())

    # -- raw spans --------------------------------------------------------------------
    def trace_spans(self, trace_id: str) -> list[dict]:
        stmt = select(Span.__table__).where(Span.trace_id == trace_id).order_by(Span.start_ns, Span.id)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def trace_row(self, trace_id: str) -> dict | None:
        with self.engine.connect() as conn:
            cols = [Trace.__table__.c[c] for c in _TRACE_COLUMNS]
            row = conn.execute(select(*cols).where(Trace.trace_id == trace_id)).mappings().first()
            return None if row is None else dict(row)

    def counts(self) -> dict[str, int]:
        from sqlalchemy import func

        with self.engine.connect() as conn:
            return {
                "spans": conn.execute(select(func.count()).select_from(Span)).scalar_one(),
                "traces": conn.execute(select(func.count()).select_from(Trace)).scalar_one(),
                "pending_traces": conn.execute(
                    select(func.count()).select_from(Trace).where(Trace.pending.is_(True))
                ).scalar_one(),
            }


_SPAN_COLUMNS = [c.key for c in Span.__table__.columns]
_TRACE_COLUMNS = [c.key for c in Trace.__table__.columns if c.key != "contributions"]
