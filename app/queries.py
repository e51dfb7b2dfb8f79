"""Query functions shared by the JSON API and the pages.

Each takes a ``StoreReader``, a time window and filters, and returns plain rows (lists of
dicts, JSON-ready). Percentiles come from merged rollup histograms, never from raw spans;
only the single-trace view reads raw spans.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..ingest.records import KIND_NAMES, STAGES, STATUS_NAMES, SpanRecord
from ..ingest.traces import find_root, input_type_of, self_times, trace_duration_ns
from ..models.reader import Filters, RollupQuery, StoreReader
from .params import Window


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def pairs(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """Service pairs: a call is the CLIENT span (its duration and status); busiest first."""
    if filters.stage and filters.stage != "network":
        return []  # calls are network-stage spans; any other stage has no pairs
    groups = reader.rollups(RollupQuery("pair", window.start_ns, window.end_ns, filters, ("caller", "callee")))
    out = []
    for g in groups:
        if g.count <= 0:
            continue
        p50, p90, p99 = g.histogram.quantiles([0.5, 0.9, 0.99])
        out.append({
            "caller": g.key[0], "callee": g.key[1], "count": g.count,
            "p50_ms": _ms(p50), "p90_ms": _ms(p90), "p99_ms": _ms(p99),
            "error_rate": round(g.error_count / g.count, 6),
        })
    out.sort(key=lambda r: (-r["count"], r["caller"], r["callee"]))
    return out


def input_types(reader: StoreReader, window: Window, filters: Filters = Filters()) -> list[dict]:
    """Per input type: traces, P50/P95/P99 end-to-end latency and the stage taking most time."""
    f = Filters(service=filters.service, input_type=filters.input_type)
    groups = reader.rollups(RollupQuery("trace", window.start_ns, window.end_ns, f, ("input_type",)))
    stage_groups = reader.rollups(RollupQuery("tstage", window.start_ns, window.end_ns, f, ("input_type", "stage")))
    stage_time: dict[str, dict[str, int]] = {}
    for g in stage_groups:
        stage_time.setdefault(g.key[0], {})[g.key[1]] = g.sum_ns
    out = []
    for g in groups:
        if g.count <= 0:
            continue
        it = g.key[0]
        p50, p95, p99 = g.histogram.quantiles([0.5, 0.95, 0.99])
        stages = stage_time.get(it, {})
        bottleneck = max(sorted(stages), key=lambda s: stages[s]) if stages else None
        out.append({"input_type": it, "count": g.count, "p50_ms": _ms(p50), "p95_ms": _ms(p95),
                    "p99_ms": _ms(p99), "bottleneck_stage": bottleneck,
                    "error_rate": round(g.error_count / g.count, 6)})
    order = {t: i for i, t in enumerate(("text", "image", "multi_image", "audio", "unknown"))}
    out.sort(key=lambda r: (order.get(r["input_type"], 99), r["input_type"]))
    return out


def stages(reader: StoreReader, window: Window, filters: Filters = Filters(), group_by: str | None = "input_type") -> list[dict]:
    """Per (input type,) stage: span count and duration percentiles, and the stage's share of self time."""
    dims = ("input_type", "stage") if group_by == "input_type" else ("stage",)
    groups = reader.rollups(RollupQuery("op", window.start_ns, window.end_ns, filters, dims))
    time_groups = reader.rollups(RollupQuery("tstage", window.start_ns, window.end_ns,
                                             Filters(input_type=filters.input_type, stage=filters.stage), dims))
    stage_time = {g.key: g.sum_ns for g in time_groups}
    totals: dict[tuple, int] = {}
    for key, total in stage_time.items():
        totals[key[:-1]] = totals.get(key[:-1], 0) + total
    out = []
    for g in groups:
        if g.count <= 0:
            continue
        p50, p95, p99 = g.histogram.quantiles([0.5, 0.95, 0.99])
        denom = totals.get(g.key[:-1], 0)
        row = {"stage": g.key[-1], "count": g.count, "p50_ms": _ms(p50), "p95_ms": _ms(p95),
               "p99_ms": _ms(p99), "share": round(stage_time.get(g.key, 0) / denom, 6) if denom else 0.0}
        if group_by == "input_type":
            row = {"input_type": g.key[0], **row}
        out.append(row)
    order = {s: i for i, s in enumerate(STAGES)}
    out.sort(key=lambda r: (r.get("input_type", ""), order.get(r["stage"], 99)))
    return out


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity: such floats (legal in OTLP) are returned as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def trace_detail(reader: StoreReader, trace_id: str) -> dict | None:
    """One trace with every span, self times and stages; None when no span is stored."""
    rows = reader.trace_spans(trace_id)
    if not rows:
        return None
    records = []
    for r in rows:
        records.append(SpanRecord(
            trace_id=r["trace_id"], span_id=r["span_id"], parent_span_id=r["parent_span_id"],
            service=r["service"], name=r["name"], kind=r["kind"], start_ns=r["start_ns"],
            end_ns=r["start_ns"] + r["duration_ns"], status=r["status"],
            attributes=json.loads(r["attributes"]) if r["attributes"] else {}, stage=r["stage"],
        ))
    selfs = self_times(records)
    trace_row = reader.trace_row(trace_id)
    settled = trace_row is not None and not trace_row["pending"] and trace_row["settled_ns"] is not None
    input_type = trace_row["input_type"] if settled else input_type_of(records)
    duration = trace_row["duration_ns"] if settled else trace_duration_ns(records)
    spans = []
    for r, rec in zip(rows, records):
        spans.append({
            "span_id": r["span_id"],
            "parent_span_id": r["parent_span_id"],
            "service": r["service"],
            "name": r["name"],
            "kind": KIND_NAMES.get(r["kind"], "INTERNAL"),
            "stage": r["stage"],
            "start_unix_nano": int(r["start_ns"]),
            "duration_ms": _ms(r["duration_ns"]),
            "self_ms": _ms(selfs.get(r["span_id"], 0)),
            "status": STATUS_NAMES.get(r["status"], "UNSET"),
            "status_message": r["status_message"] or "",
            "source": r["source"],
            "instance": r["instance"],
            "attributes": _json_safe(rec.attributes),
            "resource": _json_safe(json.loads(r["resource"]) if r["resource"] else {}),
            "events": _json_safe(json.loads(r["events"]) if r["events"] else []),
        })
    root = find_root(records)
    return {
        "trace_id": trace_id,
        "input_type": input_type,
        "duration_ms": _ms(duration),
        "root_service": root.service if root else None,
        "root_name": root.name if root else None,
        "span_count": len(spans),
        "settled": settled,
        "spans": spans,
    }
