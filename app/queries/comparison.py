"""The Compare page ("What changed") and ``/api/v1/compare``: a window against its
baseline, per stage, and the attribute values over-represented among the slow spans."""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache
from itertools import chain

import orjson

from ...core.spans import KIND_CLIENT, STAGES
from ...models.reader import Filters, RollupQuery, StoreReader
from ...models.sketch import Histogram
from ..params import Window, rfc3339
from .common import _group_value, _ms, _subject_query, subject_of

#: Subject spans read per window: a sample spread over the window when it holds more
#: (``reader.attributes.subjects``). The selection's are its slow spans only.
COMPARE_MAX_SPANS = 2_000
COMPARE_MAX_VALUES = 50  # keys with more distinct values are skipped (ids, free text)
COMPARE_TOP = 10
COMPARE_MIN_SELECTION = 5  # slow spans in the selection carrying the value
COMPARE_MIN_SHARE = 0.05  # ... and at least this share of them
SLOW_QUANTILE = 0.9
_ID_KEY = re.compile(r"(^|[._])(id|uuid|guid|trace_?id|span_?id|request_?id)$", re.I)
_TIME_KEY = re.compile(r"(time|timestamp|_ns|_ms|date|unix)", re.I)
KEEP_ID_KEYS = ("service.instance.id", "host.id", "k8s.pod.uid", "cloud.availability_zone")


def default_baseline(window: Window) -> Window:
    """The same length just before the selection."""
    length = window.end_ns - window.start_ns
    return Window(window.start_ns - length, window.start_ns)


@lru_cache(maxsize=4096)  # (a few dozen keys, each tested once a span otherwise)
def _compare_key_ok(key: str) -> bool:
    if key in KEEP_ID_KEYS:
        return True
    return not (_ID_KEY.search(key) or _TIME_KEY.search(key))


def _blob_facets(blob) -> dict[str, str]:
    """The rankable scalars of one attributes or resource JSON object (``span_facets``)."""
    out: dict[str, str] = {}
    try:
        d = orjson.loads(blob) if isinstance(blob, (str, bytes)) else blob
    except orjson.JSONDecodeError:
        return out
    if not isinstance(d, dict):
        return out
    for k, v in d.items():
        if not isinstance(k, str) or not _compare_key_ok(k):
            continue
        g = _group_value(v)
        if g is not None and len(g) <= 256:
            out[k] = g
    return out


def span_facets(row: dict, blobs: dict | None = None) -> dict[str, str]:
    """Pure: the attribute values of one subject span a Compare ranks: span attributes,
    resource attributes (span wins on a clash), ``service.instance.id`` and the trace's
    ``input_type``; scalars only, keys that look like ids or timestamps dropped.
    ``blobs``: JSON text -> its facets, filled as spans are seen (a service's spans share a
    few resources and, mostly, a few attribute sets: parsing each span's copies was most of
    a Compare's own work)."""
    res = row.get("resource")
    out = dict(_facets_of(res, blobs)) if res else {}
    if row.get("attributes"):
        out.update(_facets_of(row["attributes"], blobs))
    if row.get("instance"):
        out.setdefault("service.instance.id", str(row["instance"]))
    if row.get("input_type"):
        out["input_type"] = str(row["input_type"])
    return out


def _facets_of(blob, blobs: dict | None) -> dict[str, str]:
    """``_blob_facets(blob)``, remembered in ``blobs`` by its text (never changed by callers)."""
    if blobs is None or not isinstance(blob, (str, bytes)):
        return _blob_facets(blob)
    known = blobs.get(blob)
    if known is None:
        known = blobs[blob] = _blob_facets(blob)
    return known


def attribute_lift(selection: list[dict[str, str]], baseline: list[dict[str, str]], *,
                   max_values: int = COMPARE_MAX_VALUES, top: int = COMPARE_TOP,
                   min_count: int = COMPARE_MIN_SELECTION, min_share: float = COMPARE_MIN_SHARE) -> list[dict]:
    """Pure: attribute values over-represented in ``selection`` (the slow spans' facets)
    against ``baseline`` (the baseline spans' facets).

    ``selection_share`` / ``baseline_share``: the part of each population carrying the
    value; ``lift`` = their ratio, the baseline share smoothed by half a span so a value
    never seen before has a finite lift. Keys with more than ``max_values`` distinct values
    across both populations are skipped; a value needs ``min_count`` selection spans and
    ``min_share`` of them. Top ``top`` by lift (then count), lift above 1 only.
    """
    if not selection or not baseline:
        return []
    # (Counter counts the (key, value) pairs in C, cheaper than a loop here)
    sel_counts = Counter(chain.from_iterable(facets.items() for facets in selection))
    base_counts = Counter(chain.from_iterable(facets.items() for facets in baseline))
    distinct = Counter(k for k, _ in sel_counts.keys() | base_counts.keys())  # values a key takes
    n_sel, n_base = len(selection), len(baseline)
    out = []
    for (k, v), c in sel_counts.items():
        if distinct[k] > max_values or c < min_count or c / n_sel < min_share:
            continue
        b = base_counts.get((k, v), 0)
        sel_share = c / n_sel
        base_share = b / n_base
        lift = sel_share / ((b + 0.5) / (n_base + 0.5)) if b == 0 else sel_share / base_share
        if lift <= 1.0:
            continue
        out.append({"key": k, "value": v, "selection_share": round(sel_share, 6),
                    "baseline_share": round(base_share, 6), "lift": round(lift, 4),
                    "selection_count": c, "baseline_count": b})
    out.sort(key=lambda r: (-r["lift"], -r["selection_count"], r["key"], r["value"]))
    return out[:top]


def _stage_query(filters: Filters, window: Window, kind: str = "tstage") -> RollupQuery:
    """Per-trace stage self time (``tstage``) of the window's traces, narrowed by input
    type and stage only (stage time is a trace's, whichever pair or service is the subject);
    ``kind="trace"`` gives the traces themselves (the per-trace denominator)."""
    if kind == "trace":
        return RollupQuery("trace", window.start_ns, window.end_ns, Filters(input_type=filters.input_type))
    return RollupQuery("tstage", window.start_ns, window.end_ns,
                       Filters(input_type=filters.input_type, stage=filters.stage), ("stage",))


def stage_deltas(sel: dict[str, tuple[int, int, Histogram]], base: dict[str, tuple[int, int, Histogram]],
                 sel_units: int, base_units: int) -> list[dict]:
    """Pure: per stage, selection vs baseline P50/P99 and each stage's share of the added
    time. ``sel``/``base``: stage -> (count, sum_ns, histogram); the added time of a stage
    is its time per trace (``sum_ns / units``, units = traces) in the selection minus the
    baseline's, and ``share_of_added_time`` is its part of the stages' positive additions."""
    order = {s: i for i, s in enumerate(STAGES)}
    rows = []
    added: dict[str, float] = {}
    for stage in sorted(set(sel) | set(base), key=lambda s: (order.get(s, 99), s)):
        sc, ss, sh = sel.get(stage, (0, 0, None))
        bc, bs, bh = base.get(stage, (0, 0, None))
        s50, s99 = (_ms(v) for v in sh.quantiles([0.5, 0.99])) if sc > 0 else (None, None)
        b50, b99 = (_ms(v) for v in bh.quantiles([0.5, 0.99])) if bc > 0 else (None, None)
        per_sel = ss / sel_units if sel_units else 0.0
        per_base = bs / base_units if base_units else 0.0
        added[stage] = per_sel - per_base
        rows.append({"stage": stage, "selection_p50_ms": s50, "baseline_p50_ms": b50,
                     "selection_p99_ms": s99, "baseline_p99_ms": b99,
                     "delta_p50_ms": None if s50 is None or b50 is None else round(s50 - b50, 3),
                     "delta_p99_ms": None if s99 is None or b99 is None else round(s99 - b99, 3),
                     "added_ms": _ms(per_sel - per_base) if sel_units and base_units else None,
                     "share_of_added_time": 0.0})
    positive = sum(v for v in added.values() if v > 0)
    if positive > 0 and sel_units and base_units:
        for r in rows:
            r["share_of_added_time"] = round(max(added[r["stage"]], 0.0) / positive, 6)
    return rows


def _subject_rows(reader: StoreReader, window: Window, filters: Filters, limit: int, *,
                  min_ns: int | None = None, expected: int | None = None) -> list[dict]:
    """The subject's spans of the window (at least ``min_ns`` long), at most ``limit``: a
    sample spread over the window when the rollups ``expected`` more."""
    subject = subject_of(filters)
    kw = dict(input_type=filters.input_type, limit=limit, min_ns=min_ns, expected=expected)
    if subject == "pair":
        if filters.callee:  # the callee's side of the calls: its instances, its attributes
            return reader.attributes.subjects(window.start_ns, window.end_ns, kind=2, service=filters.callee, **kw)
        return reader.attributes.subjects(window.start_ns, window.end_ns, kind=KIND_CLIENT, service=filters.caller,
                                          **kw)
    if subject in ("stage", "service"):
        return reader.attributes.subjects(window.start_ns, window.end_ns, service=filters.service,
                                          stage=filters.stage, **kw)
    return reader.attributes.subjects(window.start_ns, window.end_ns, root_only=True, **kw)


def compare(reader: StoreReader, window: Window, baseline: Window | None = None,
            filters: Filters = Filters()) -> dict:
    """What changed in ``window`` (the selection) against ``baseline`` (default: the same
    length just before).

    ``stages``: per stage, P50/P99 of per-trace stage self time in both windows, their
    deltas, and the stage's share of the added time per trace (``tstage`` rollups of the
    window's traces, narrowed by ``input_type`` and ``stage``).

    ``attributes``: attribute values over-represented among the SLOW spans of the selection,
    slow meaning above the selection's P90 of the subject (``subject_of(filters)``: a pair's
    calls, read on the callee's SERVER spans when a callee is named; a stage's or service's
    spans; else root spans, i.e. whole traces), against every subject span of the baseline.
    Span and resource attributes plus the trace's ``input_type``; keys with more than 50
    distinct values, ids and timestamps skipped; top 10 by lift with minimum counts
    (``attribute_lift``). At most ``COMPARE_MAX_SPANS`` raw spans a window: where it holds
    more, a sample spread over it (``reader.attributes.subjects``), the selection's read among
    its slow spans only.
    """
    baseline = baseline or default_baseline(window)
    # stage deltas (rollups)
    stage_sel, stage_base = {}, {}
    for w, dest in ((window, stage_sel), (baseline, stage_base)):
        q = _stage_query(filters, w)
        for g in reader.rollups.merged(q):
            if g.count > 0:
                dest[g.key[0]] = (g.count, g.sum_ns, g.histogram)
    units = [sum(g.count for g in reader.rollups.merged(_stage_query(filters, w, "trace"))) for w in (window, baseline)]
    stages_out = stage_deltas(stage_sel, stage_base, units[0], units[1])
    counts = []
    sel_hist = Histogram()
    for w in (window, baseline):
        groups = reader.rollups.merged(_subject_query(filters, w))
        counts.append(sum(g.count for g in groups))
        if w is window:
            for g in groups:
                sel_hist.merge(g.histogram)
    # slow-span attributes (raw spans)
    threshold_ns = sel_hist.quantile(SLOW_QUANTILE) if sel_hist.count > 0 else None
    attributes: list[dict] = []
    if threshold_ns is not None:
        # (only spans at or past the threshold are read: about a tenth of the selection's)
        sel_rows = _subject_rows(reader, window, filters, COMPARE_MAX_SPANS, min_ns=int(threshold_ns),
                                 expected=math.ceil(counts[0] * (1 - SLOW_QUANTILE)))
        blobs: dict = {}
        slow = [span_facets(r, blobs) for r in sel_rows if r["duration_ns"] > threshold_ns]
        if not slow:  # a sketch bucket's representative may sit above every span in it
            slow = [span_facets(r, blobs) for r in sel_rows if r["duration_ns"] >= threshold_ns]
        base_rows = _subject_rows(reader, baseline, filters, COMPARE_MAX_SPANS, expected=counts[1])
        attributes = attribute_lift(slow, [span_facets(r, blobs) for r in base_rows])
    return {
        "selection": {"start": rfc3339(window.start_ns), "end": rfc3339(window.end_ns), "count": counts[0], "traces": units[0]},
        "baseline": {"start": rfc3339(baseline.start_ns), "end": rfc3339(baseline.end_ns), "count": counts[1], "traces": units[1]},
        "subject": subject_of(filters),
        "slow_threshold_ms": _ms(threshold_ns),
        "stages": stages_out,
        "attributes": attributes,
    }
