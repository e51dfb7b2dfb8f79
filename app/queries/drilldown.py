"""The Drilldown page and ``/api/v1/traces``: the latency distribution and percentiles
over time of a subject (``common.subject_of``), and the exemplar traces behind a band."""

from __future__ import annotations

import math

from ...core.spans import KIND_CLIENT
from ...ingest.traces import Call, trace_calls
from ...models.reader import Filters, SpanQuery, StoreReader
from ...models.sketch import Histogram
from ..params import Window, rfc3339
from .bins import _nonzero_range, bin_band_ms, bin_edges_ms, binned_counts
from .common import _ms, _pcts, _subject_query, subject_label, subject_of
from .trace import _records, trace_detail
from ...durations import MINUTE_NS


def latency_distribution(reader: StoreReader, window: Window, filters: Filters = Filters()) -> dict:
    """Histogram (display bins) and CDF of the subject's latency, with P50/P90/P99."""
    groups = reader.rollups.merged(_subject_query(filters, window))
    hist = Histogram()
    errors = 0
    for g in groups:
        hist.merge(g.histogram)
        errors += g.error_count
    total = hist.count
    out = {"subject": subject_of(filters), "label": subject_label(filters), "count": total,
           "error_rate": round(errors / total, 6) if total else 0.0,
           "p50_ms": None, "p90_ms": None, "p99_ms": None, "bins": []}
    if total <= 0:
        return out
    out["p50_ms"], out["p90_ms"], out["p99_ms"] = _pcts(hist)
    counts = binned_counts(hist)
    rng = _nonzero_range([counts], pad=0)
    first, last = rng
    edges = bin_edges_ms(first, last)
    cum = 0
    for j in range(first, last + 1):
        c = int(counts[j])
        cum += c
        lo, hi = bin_band_ms(j)
        out["bins"].append({"bin": j, "lo_ms": edges[j - first], "hi_ms": edges[j - first + 1],
                            "min_ms": lo, "max_ms": hi, "count": c, "cdf": cum / total})
    return out


def percentile_series(reader: StoreReader, window: Window, filters: Filters = Filters(),
                      step_minutes: int = 1) -> list[dict]:
    """P50/P90/P99 and count of the subject per time step: ``[{"t", "count", "p50_ms", ...}]``."""
    groups = reader.rollups.steps(_subject_query(filters, window), step_minutes)
    out = []
    for g in sorted(groups, key=lambda g: g.key[-1]):
        if g.count <= 0:
            continue
        p50, p90, p99 = _pcts(g.histogram)
        out.append({"t": rfc3339(g.key[-1] * MINUTE_NS), "count": g.count,
                    "rate_per_min": round(g.count / step_minutes, 3), "error_count": g.error_count,
                    "p50_ms": p50, "p90_ms": p90, "p99_ms": p99})
    return out


# -- exemplar traces -------------------------------------------------------------------
EXEMPLAR_SCAN_LIMIT = 20_000  # raw spans examined at most for one exemplar query


def _trace_summary(row: dict) -> dict:
    return {
        "trace_id": row["trace_id"],
        "start_unix_nano": int(row["start_ns"]),
        "duration_ms": _ms(row["duration_ns"]),
        "root_service": row["root_service"],
        "root_name": row["root_name"],
        "input_type": row["input_type"],
        "span_count": int(row["span_count"]),
        "error": bool(row["error"]),
    }


def _unsettled_summary(reader: StoreReader, trace_id: str) -> dict | None:
    detail = trace_detail(reader, trace_id, ranks=False)
    if detail is None:
        return None
    start = min(s["start_unix_nano"] for s in detail["spans"])
    return {"trace_id": trace_id, "start_unix_nano": start, "duration_ms": detail["duration_ms"],
            "root_service": detail["root_service"], "root_name": detail["root_name"],
            "input_type": detail["input_type"], "span_count": detail["span_count"],
            "error": any(s["status"] == "ERROR" for s in detail["spans"])}


def _pair_of_candidates(reader: StoreReader, rows: list[dict]) -> dict[str, Call]:
    """(trace_id/span_id) -> the :class:`Call` of each CLIENT span row, as settling makes it
    (``traces.trace_calls``): from the row, its SERVER/CONSUMER children and, for a transport
    span that may take its stage from a model-call parent (signals ``inh``), that parent."""
    kids = reader.spans.callee_children((r["trace_id"], r["span_id"]) for r in rows)
    by_parent: dict[tuple[str, str], list[dict]] = {}
    for k in kids:
        by_parent.setdefault((k["trace_id"], k["parent_span_id"]), []).append(k)
    heirs = [(r["trace_id"], r["parent_span_id"]) for r in rows
             if r.get("parent_span_id") and r.get("signals") and '"inh"' in r["signals"]]
    parents = {(p["trace_id"], p["span_id"]): p for p in reader.spans.by_id(heirs)} if heirs else {}
    out = {}
    for r in rows:
        spans = _records([r], with_attributes=True)
        parent = parents.get((r["trace_id"], r["parent_span_id"])) if r.get("parent_span_id") else None
        if parent is not None:
            spans += _records([parent], with_attributes=True)
        spans += _records(by_parent.get((r["trace_id"], r["span_id"]), []), False)
        call = trace_calls(spans).get(r["span_id"])
        if call:
            out[r["trace_id"] + r["span_id"]] = call
    return out


def exemplar_traces(reader: StoreReader, window: Window, filters: Filters = Filters(),
                    min_ms: float | None = None, max_ms: float | None = None, limit: int = 20) -> list[dict]:
    """Traces behind a drilldown band, slowest first (raw spans, not rollups).

    The band bounds what ``subject_of(filters)`` measures: the call for a pair, the span
    for a stage or service, the trace otherwise; rows are ordered by that duration, one
    row per trace (its slowest matching span). Span-level rows add ``span_id``,
    ``span_name``, ``span_service`` and ``span_ms`` to the API's trace fields.
    """
    min_ns = None if min_ms is None else int(math.floor(min_ms * 1e6))
    max_ns = None if max_ms is None else int(math.ceil(max_ms * 1e6))
    subject = subject_of(filters)
    if subject == "trace":
        rows = reader.calls.slowest_traces(window.start_ns, window.end_ns, input_type=filters.input_type,
                                           min_ns=min_ns, max_ns=max_ns, limit=limit)
        return [_trace_summary(r) for r in rows]

    if subject == "pair":
        found = _slowest_calls(reader, window, filters, min_ns, max_ns, limit)
        if found is not None:
            return _exemplar_rows(reader, found)
        callers = () if filters.caller else tuple(reader.rollups.services_of("pair", filters))
        sq = SpanQuery(window.start_ns, window.end_ns, kind=KIND_CLIENT, service=filters.caller,
                       stage=filters.stage, input_type=filters.input_type, min_ns=min_ns, max_ns=max_ns,
                       services=callers, may_call=filters.callee, model=filters.model)
    else:
        services = () if filters.service else tuple(reader.rollups.services_of("op", filters))
        sq = SpanQuery(window.start_ns, window.end_ns, service=filters.service, stage=filters.stage,
                       input_type=filters.input_type, min_ns=min_ns, max_ns=max_ns, services=services)
    found: dict[str, dict] = {}
    page = max(20, limit * 3)  # grows x4 a page when rows share traces or fail the pair check
    offset = 0
    while len(found) < limit and offset < EXEMPLAR_SCAN_LIMIT:
        rows = reader.spans.slowest(SpanQuery(**{**sq.__dict__, "limit": page, "offset": offset}))
        offset += len(rows)
        exhausted = len(rows) < page
        rows = [r for r in rows if r["trace_id"] not in found]
        if subject == "pair" and rows:
            rows = _calls_of_pair(reader, rows, filters)
        for r in rows:
            if r["trace_id"] not in found and len(found) < limit:
                found[r["trace_id"]] = r
        if exhausted:  # a short page: nothing more to read
            break
        # Each page re-reads the ones before it (OFFSET): grow pages so a search that needs
        # many rows (one trace holding many of the slowest spans) takes a few reads, not many.
        page = min(page * 4, EXEMPLAR_SCAN_LIMIT - offset)
    return _exemplar_rows(reader, found)


def _calls_of_pair(reader: StoreReader, rows: list[dict], filters: Filters) -> list[dict]:
    """The CLIENT span rows whose pair (as settling pairs them) matches ``filters``."""
    calls_of = _pair_of_candidates(reader, rows)
    keep = []
    for r in rows:
        call = calls_of.get(r["trace_id"] + r["span_id"])
        if call is None:
            continue
        if filters.caller and call.caller != filters.caller:
            continue
        if filters.callee and call.callee != filters.callee:
            continue
        if filters.service and filters.service not in (call.caller, call.callee):
            continue
        if filters.model and call.model != filters.model:
            continue
        keep.append(r)
    return keep


def _call_order(r: dict) -> tuple[int, int, int]:
    return -r["duration_ns"], r["start_ns"], r["_id"]


def _slowest_calls(reader: StoreReader, window: Window, filters: Filters, min_ns: int | None,
                   max_ns: int | None, limit: int) -> dict[str, dict] | None:
    """trace id -> its slowest call of the pair, for the ``limit`` traces with the slowest
    calls: the settled calls from ``pair_calls`` (an index walk a pair series) and the
    calls of traces still pending, checked as the raw-span search checks them. None when
    ``pair_calls`` does not cover the window (an upgraded store) or settling is far behind:
    then the raw spans are searched."""
    if window.start_ns < reader.calls.complete_from():
        return None
    callers = [filters.caller] if filters.caller else reader.rollups.services_of("pair", filters)
    n = max(20, limit * 3)
    pending_floor: int | None = -1  # the floor the pending calls below were read with
    pending: list[dict] = []
    while True:
        settled, more = reader.calls.slowest(filters, window.start_ns, window.end_ns, min_ns=min_ns, max_ns=max_ns,
                                             limit=n)
        # A pending call slower than none of the n slowest settled ones cannot be among the
        # n slowest of all: read only those at least as slow (with a backlog, most are not).
        floor = settled[-1]["duration_ns"] if more and settled else None
        if pending_floor == -1 or (pending_floor is not None and (floor is None or floor < pending_floor)):
            bounds = [b for b in (floor, min_ns) if b is not None]
            lower = max(bounds) if bounds else None
            got = reader.calls.pending(window.start_ns, window.end_ns, callers, input_type=filters.input_type,
                                       min_ns=lower, max_ns=max_ns, may_call=filters.callee, stage=filters.stage,
                                       model=filters.model)
            if got is None:
                return None
            pending = _calls_of_pair(reader, got, filters) if got else []
            pending_floor = floor
        found: dict[str, dict] = {}
        seen: set[int] = set()
        # With more settled calls unread, only what sorts before the last one read is known
        # to be in its final order.
        last = _call_order(settled[-1]) if more and settled else None
        for r in sorted(settled + pending, key=_call_order):
            if last is not None and _call_order(r) > last:
                break
            if r["_id"] in seen:  # a re-opened trace: its call is both settled and pending
                continue
            seen.add(r["_id"])
            if r["trace_id"] not in found:
                found[r["trace_id"]] = r
                if len(found) >= limit:
                    return found
        if not more:
            return found
        n *= 4  # many of the slowest calls share traces: read deeper


def _exemplar_rows(reader: StoreReader, found: dict[str, dict]) -> list[dict]:
    """API rows for exemplar spans (trace id -> span row): the trace's summary and the span."""
    trace_rows = reader.spans.trace_rows(found)
    out = []
    for tid, span in found.items():
        tr = trace_rows.get(tid)
        if tr is not None and tr["settled_ns"] is not None:
            row = _trace_summary(tr)
        else:
            row = _unsettled_summary(reader, tid)
            if row is None:
                continue
        row.update({"span_id": span["span_id"], "span_name": span["name"], "span_service": span["service"],
                    "span_ms": _ms(span["duration_ns"])})
        out.append(row)
    return out
