"""`modalscope retag`: re-apply the current stage rules and rebuild what stages feed."""

from __future__ import annotations

import json
from typing import Any, Callable

import orjson
from sqlalchemy import Engine, bindparam, delete, func, select, update

from ..models import changes
from ..models import PAIR_CALLS_CURSOR, Cursor, HourlyRollup, PairCall, QuarterRollup, Rollup, Span, Trace
from ..core.spans import SpanRecord
from .settle import settle
from .stages import StageRules

CHUNK = 5000
# Signals that depend on the rules, not on the attributes alone: always recomputed.
_RULE_SIGNALS = ("call", "inh")


def _loads(text: str | None) -> Any:
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # written by json.dumps' fallback (e.g. NaN): still JSON to it
        return json.loads(text)


def _signals_text(new: dict[str, Any] | None, old_text: str | None) -> str | None:
    """The signals to store. Attribute-derived signals read at ingest saw the values whole;
    the stored attributes may be shorter, so such a signal the recomputation lacks is kept."""
    old = _loads(old_text)
    if isinstance(old, dict):
        kept = {k: v for k, v in old.items() if k not in _RULE_SIGNALS and (new is None or k not in new)}
        if kept:
            new = {**(new or {}), **kept}
    if not new:
        return None
    text = orjson.dumps(new).decode()
    # Same content, other key order: leave the stored text alone (no needless write).
    return old_text if old_text is not None and old == new else text


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
                select(t.c.id, t.c.trace_id, t.c.span_id, t.c.parent_span_id, t.c.service, t.c.name, t.c.kind,
                       t.c.stage, t.c.attributes, t.c.signals)
                .where(t.c.id > last_id).order_by(t.c.id).limit(CHUNK)
            ).all()
            if not rows:
                break
            records = [
                SpanRecord(trace_id=trace_id, span_id=span_id, parent_span_id=parent, service=service, name=name,
                           kind=kind, start_ns=0, end_ns=0, attributes=_loads(attrs) or {})
                for _, trace_id, span_id, parent, service, name, kind, _, attrs, _ in rows
            ]
            # The tag path: stages, the model-call and transport markers in signals, and
            # parents found in this chunk; the re-settle below completes the rest per trace.
            rules.tag(records)
            updates = []
            for row, rec in zip(rows, records):
                old_stage, old_signals = row[7], row[9]
                signals_text = _signals_text(rec.signals, old_signals)
                if rec.stage != old_stage or signals_text != old_signals:
                    updates.append({"b_id": row[0], "stage": rec.stage, "signals": signals_text})
                    if rec.stage != old_stage:
                        changed += 1
            if updates:
                conn.execute(
                    t.update().where(t.c.id == bindparam("b_id"))
                    .values(stage=bindparam("stage"), signals=bindparam("signals")),
                    updates,
                )
            last_id = rows[-1][0]
        if progress is not None:
            progress(len(rows))
    with engine.begin() as conn:
        conn.execute(delete(Rollup))
        conn.execute(delete(QuarterRollup))
        conn.execute(delete(HourlyRollup))
        changes.record_everything(conn)
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
