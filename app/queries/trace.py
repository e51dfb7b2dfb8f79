"""The Trace page and ``/api/v1/traces/<trace_id>``: one trace with every span, its self
times, critical path, percentile ranks and queue hand-offs."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from ...core.spans import KIND_NAMES, KIND_PRODUCER, STATUS_NAMES, SpanRecord
from ...ingest.traces import critical_path, find_root, input_type_of, self_times, trace_duration_ns
from ...models.reader import StoreReader
from ..params import Window
from .common import _ms


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity: such floats (legal in OTLP) are returned as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _loads(text: Any) -> Any:
    """A JSON column's value; None for NULL, empty or malformed text."""
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _records(rows: list[dict], with_attributes: bool) -> list[SpanRecord]:
    """SpanRecords of span rows, with their stored ``signals`` and ``links`` (when the rows
    carry them) so the settler's rules (input type, inherited stages, calls) read them."""
    out = []
    for r in rows:
        attrs = _loads(r.get("attributes")) if with_attributes else None
        sig = _loads(r.get("signals"))
        links = _loads(r.get("links"))
        out.append(SpanRecord(r["trace_id"], r["span_id"], r["parent_span_id"], r["service"], r["name"],
                              r["kind"], r["start_ns"], r["start_ns"] + r["duration_ns"], r["status"],
                              attributes=attrs if isinstance(attrs, dict) else {}, stage=r["stage"],
                              links=links if isinstance(links, list) else [],
                              signals=sig if isinstance(sig, dict) else None))
    return out


def trace_detail(reader: StoreReader, trace_id: str, *, ranks: bool = True) -> dict | None:
    """One trace with every span, self times and stages; None when no span is stored.

    Each span says whether it is on the critical path (``critical``) and, with ``ranks``,
    its percentile rank 0-100 (``rank_pct``) against the ``op`` rollups of its service and
    name in the hour centred on the trace's start (None without samples)."""
    rows = reader.spans.of_trace(trace_id)
    if not rows:
        return None
    records = _records(rows, with_attributes=True)  # with signals: the settler's input type
    selfs = self_times(records)
    on_path = set(critical_path(records))
    start, half_hour = min(int(r["start_ns"]) for r in rows), 1_800_000_000_000
    groups = reader.rollups.op_histograms(start - half_hour, start + half_hour,
                                          {(r["service"], r["name"]) for r in rows}) if ranks else {}
    trace_row = reader.spans.trace_row(trace_id)
    settled = trace_row is not None and not trace_row["pending"] and trace_row["settled_ns"] is not None
    input_type = trace_row["input_type"] if settled else input_type_of(records)
    duration = trace_row["duration_ns"] if settled else trace_duration_ns(records)
    spans = []
    for r, rec in zip(rows, records):
        g = groups.get((r["service"], r["name"]))
        rank = g.histogram.rank_of(r["duration_ns"]) if g is not None and g.count > 0 else None
        span = {
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
            # [{"trace_id", "span_id", "attributes"}] as decoded (ids lowercase hex); a row
            # stored before links were (NULL) has none
            "links": _json_safe(json.loads(r["links"]) if r.get("links") else []),
            "critical": r["span_id"] in on_path,
        }
        if ranks:
            span["rank_pct"] = None if rank is None else 100.0 * rank
        spans.append(span)
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


def trace_view(reader: StoreReader, trace_id: str, window: Window) -> dict | None:
    """``trace_detail`` plus depth, critical path and each span's percentile rank against
    its own operation (service, name) in the window, from the ``op`` rollups."""
    detail = trace_detail(reader, trace_id, ranks=False)  # ranked here against the page's window
    if detail is None:
        return None
    spans = detail["spans"]
    ids = {s["span_id"] for s in spans}
    parent = {s["span_id"]: s["parent_span_id"] for s in spans}
    depth: dict[str, int] = {}

    def depth_of(sid: str) -> int:
        chain = []
        while sid not in depth:
            chain.append(sid)
            p = parent.get(sid)
            if not p or p not in ids or p in chain or len(chain) > 512:
                depth[sid] = 0
                break
            sid = p
        for c in reversed(chain):
            if c not in depth:
                depth[c] = depth[parent[c]] + 1
        return depth[chain[0]] if chain else depth[sid]

    for s in spans:
        depth_of(s["span_id"])
    groups = reader.rollups.op_histograms(window.start_ns, window.end_ns, {(s["service"], s["name"]) for s in spans})
    for s in spans:
        g = groups.get((s["service"], s["name"]))
        s["depth"] = depth[s["span_id"]]
        s["rank"] = g.histogram.rank_of(s["duration_ms"] * 1e6) if g is not None and g.count > 0 else None
        s["op_count"] = g.count if g is not None else 0
    # Display order: depth-first from the roots, children by start time.
    children: dict[str | None, list[dict]] = {}
    for s in spans:
        p = s["parent_span_id"] if s["parent_span_id"] in ids else None
        children.setdefault(p, []).append(s)
    ordered: list[dict] = []
    stack = sorted(children.get(None, []), key=lambda s: (s["start_unix_nano"], s["span_id"]), reverse=True)
    seen = set()
    while stack:
        s = stack.pop()
        if s["span_id"] in seen:
            continue
        seen.add(s["span_id"])
        ordered.append(s)
        stack.extend(sorted(children.get(s["span_id"], []), key=lambda c: (c["start_unix_nano"], c["span_id"]),
                            reverse=True))
    ordered.extend(s for s in spans if s["span_id"] not in seen)  # cycles: shown, unindented
    _mark_queue_waits(reader, trace_id, spans)
    detail["spans"] = ordered
    detail["start_unix_nano"] = min(s["start_unix_nano"] for s in spans)
    detail["in_window"] = window.start_ns <= detail["start_unix_nano"] < window.end_ns
    return detail


MAX_LINKED_LOOKUPS = 64  # consumers whose linked producers a trace page looks up


def _mark_queue_waits(reader: StoreReader, trace_id: str, spans: list[dict]) -> None:
    """Each CONSUMER span's hand-off: ``queued_ms`` (its start minus the end of the PRODUCER
    span it came from: its parent, else the earliest producer its links name, in any trace)
    and ``producer_service``; the pair's latency includes this wait."""
    by_id = {s["span_id"]: s for s in spans}
    consumers = [s for s in spans if s["kind"] == "CONSUMER"]
    wanted: set[tuple[str, str]] = set()
    for s in consumers[:MAX_LINKED_LOOKUPS]:
        for ln in s.get("links") or []:
            if isinstance(ln, dict) and isinstance(ln.get("trace_id"), str) and isinstance(ln.get("span_id"), str):
                if ln["trace_id"] != trace_id:
                    wanted.add((ln["trace_id"], ln["span_id"]))
    linked = {(r["trace_id"], r["span_id"]): r for r in reader.spans.by_id(wanted)} if wanted else {}
    for s in consumers:
        producer = None  # (service, end_ns)
        parent = by_id.get(s["parent_span_id"] or "")
        if parent is not None and parent["kind"] == "PRODUCER":
            producer = (parent["service"], parent["start_unix_nano"] + int(round(parent["duration_ms"] * 1e6)))
        else:
            best = None
            for ln in s.get("links") or []:
                if not isinstance(ln, dict):
                    continue
                key = (ln.get("trace_id"), ln.get("span_id"))
                if key[0] == trace_id:
                    p = by_id.get(key[1])
                    cand = (p["start_unix_nano"], p["service"], p["start_unix_nano"] + int(round(p["duration_ms"] * 1e6))) \
                        if p is not None and p["kind"] == "PRODUCER" else None
                else:
                    r = linked.get(key)
                    cand = (r["start_ns"], r["service"], r["start_ns"] + r["duration_ns"]) \
                        if r is not None and r["kind"] == KIND_PRODUCER else None
                if cand is not None and (best is None or cand[0] < best[0]):
                    best = cand
            if best is not None:
                producer = (best[1], best[2])
        if producer is not None:
            s["producer_service"] = producer[0]
            s["queued_ms"] = _ms(max(0, s["start_unix_nano"] - producer[1]))
