"""`modalscope retag`: re-apply the current stage rules and rebuild what stages feed."""

from __future__ import annotations

import json
from typing import Callable

from sqlalchemy import Engine, bindparam, delete, func, select, update

from ..models import changes
from ..models import PAIR_CALLS_CURSOR, Cursor, HourlyRollup, PairCall, QuarterRollup, Rollup, Span, Trace
from .records import SpanRecord
from .settle import settle
from .stages import StageRules

CHUNK = 5000


def retag(engine: Engine, rules: StageRules, progress: Callable[[int], None] | None = None,
          settle_progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
    """Returns (spans whose stage changed, traces re-settled). ``progress(spans)`` follows the
    stage pass, ``settle_progress(traces, total)`` the re-settle.

    Stages are rewritten in id order, a chunk a transaction. The rollups (and ``pair_calls``)
    are then rebuilt from scratch: they are deleted and every trace re-settled, in one
    transaction for the reset so no reader ever sees half the old and half the new numbers
    mixed in a row.
    """
    changed = 0
    last_id = 0
    t = Span.__table__
    while True:
        with engine.begin() as conn:
            rows = conn.execute(
                select(t.c.id, t.c.service, t.c.name, t.c.kind, t.c.stage, t.c.attributes)
                .where(t.c.id > last_id).order_by(t.c.id).limit(CHUNK)
            ).all()
            if not rows:
                break
            updates = []
            for sid, service, name, kind, old_stage, attrs in rows:
                rec = SpanRecord(trace_id="", span_id="", parent_span_id=None, service=service, name=name,
                                 kind=kind, start_ns=0, end_ns=0,
                                 attributes=json.loads(attrs) if attrs else {})
                new_stage = rules.stage_of(rec)
                if new_stage != old_stage:
                    updates.append({"b_id": sid, "stage": new_stage})
            if updates:
                conn.execute(t.update().where(t.c.id == bindparam("b_id")).values(stage=bindparam("stage")), updates)
            changed += len(updates)
            last_id = rows[-1][0]
        if progress is not None:
            progress(len(rows))
    with engine.begin() as conn:
        conn.execute(delete(Rollup))
        conn.execute(delete(QuarterRollup))
        conn.execute(delete(HourlyRollup))
        changes.record(conn, 0, changes.EVERY_MINUTE)  # every cached finding is stale
        # Every trace is settled again below, so pair_calls becomes complete for all of them.
        conn.execute(delete(PairCall))
        conn.execute(delete(Cursor).where(Cursor.name == PAIR_CALLS_CURSOR))
        conn.execute(update(Trace).values(pending=True, contributions=None))
    if settle_progress is None:
        return changed, settle(engine, force=True)
    with engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
    settle_progress(0, total)
    traces = settle(engine, force=True, progress=lambda n: settle_progress(n, total))
    return changed, traces
