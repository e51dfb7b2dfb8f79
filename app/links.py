"""Where a click or an edit leads: pure functions from (state, event data) to an href.

Every page keeps its whole state in the URL, so each interaction is "compute the next
URL": these functions do that, with no Dash or database in sight, and are tested alone.
A return of ``None`` means "stay" (the callback answers ``no_update``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..core.findings import SUBJECT_FILTERS, Finding  # noqa: F401 - SUBJECT_FILTERS: the pages read it here
from . import ids
from . import state as st
from .params import ParamError, parse_time, parse_trace_id, rfc3339
from .queries import valid_group_by
from ..durations import HOUR_NS, MINUTE_NS

TRACE_PATH = "/trace"
DRILLDOWN_PATH = "/drilldown"


def toolbar_href(path: str, state: Mapping[str, str], trigger: str | None, values: Mapping[str, Any]) -> tuple[str | None, str]:
    """Pure: the new href after a toolbar change, or (None, error message)."""
    new = dict(state)
    if trigger == ids.RANGE:
        new = st.with_(new, range=values.get("range"), start=None, end=None)
    elif trigger in (ids.APPLY, ids.START, ids.END):
        start, end = (values.get("start") or "").strip(), (values.get("end") or "").strip()
        if not start:
            return None, "Give a start time (RFC 3339, e.g. 2026-11-30T14:00:00Z, or unix seconds)."
        try:
            s = parse_time(start, "start")
            e = parse_time(end, "end") if end else None
        except ParamError as exc:
            return None, exc.message
        if e is not None and e <= s:
            return None, "end must be after start"
        new = st.with_(new, range=None, start=rfc3339(s), end=rfc3339(e) if e is not None else None)
    elif trigger == ids.CLEAR:
        new = {k: v for k, v in new.items() if k in st.TIME_KEYS}
    else:
        caller, callee = st.parse_pair_value(values.get("pair"))
        changes = {"service": values.get("service"), "caller": caller, "callee": callee,
                   "stage": values.get("stage"), "input_type": values.get("input_type")}
        if any((new.get(k) or None) != (v or None) for k, v in changes.items()):
            new = st.with_(new, **changes, min_ms=None, max_ms=None)  # a band belongs to its subject
    return st.to_href(path, new), ""


def time_selection(selected: Mapping | None, relayout: Mapping | None) -> tuple[str, str] | None:
    """Pure: (start, end) RFC 3339 from a box-select (``selectedData``) or a zoom
    (``relayoutData``) on a time axis; None when neither holds a range."""
    xs = None
    if selected and isinstance(selected.get("range"), Mapping):
        for key, val in selected["range"].items():
            if key.startswith("x") and isinstance(val, (list, tuple)) and len(val) == 2:
                xs = val
                break
    if xs is None and relayout:
        for k0 in relayout:
            if k0.startswith("xaxis") and k0.endswith(".range[0]"):
                k1 = k0.replace("range[0]", "range[1]")
                if k1 in relayout:
                    xs = [relayout[k0], relayout[k1]]
                    break
    if not xs:
        return None
    try:
        a, b = sorted(parse_time(str(v).replace(" ", "T"), "start") for v in xs)
    except ParamError:
        return None
    if b - a < MINUTE_NS:  # under a minute: the rollups' resolution
        b = a + MINUTE_NS
    return rfc3339(a), rfc3339(b)


def narrow_href(path: str, state: Mapping[str, str], selected, relayout) -> str | None:
    """The href for a box-select/zoom on a time chart (None when there is none)."""
    sel = time_selection(selected, relayout)
    if sel is None:
        return None
    return st.to_href(path, st.with_(state, range=None, start=sel[0], end=sel[1]))


def drill_href(state: dict, caller: str, callee: str, band: tuple[float, float] | None = None) -> str:
    new = st.with_(st.carried(state), caller=caller, callee=callee, stage=None,
                   min_ms=st.num(band[0]) if band else None, max_ms=st.num(band[1]) if band else None)
    return st.to_href(DRILLDOWN_PATH, new)


def heat_index(heat: dict) -> dict:
    """What a heatmap click needs to know, kept in a ``dcc.Store`` beside the figure."""
    bins = heat.get("bins") or []
    edges = ([math.log10(bins[0]["lo_ms"])] + [math.log10(b["hi_ms"]) for b in bins]) if bins else []
    return {"pairs": [[p["caller"], p["callee"]] for p in heat.get("pairs") or []],
            "bins": [[b["min_ms"], b["max_ms"]] for b in bins], "y_edges": edges}


def heatmap_click_href(state: dict, heat: dict, click: dict | None) -> str | None:
    """Pure: the drilldown href for a click on the heatmap: a cell opens the pair and that
    latency band, a P50/P90/P99 marker (curve > 0) the pair. Dash's ``clickData`` carries
    the cell's x (pair index) and y (log10 ms of the bin centre), not its customdata."""
    try:
        point = (click or {})["points"][0]
        i = int(round(float(point["x"])))
        caller, callee = heat["pairs"][i]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if i < 0 or point.get("curveNumber", 0) != 0:
        return drill_href(state, caller, callee) if i >= 0 else None
    edges = heat.get("y_edges") or []
    try:
        y = float(point["y"])
    except (KeyError, TypeError, ValueError):
        return None
    for j in range(len(edges) - 1):
        if edges[j] <= y < edges[j + 1]:
            lo, hi = heat["bins"][j]
            return drill_href(state, caller, callee, (lo, hi))
    return None


def band_click_href(state: dict, click: dict | None) -> str | None:
    """Pure: the href selecting the clicked histogram bar's band."""
    try:
        lo, hi = click["points"][0]["customdata"][:2]
        lo, hi = float(lo), float(hi)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return st.to_href(DRILLDOWN_PATH, st.with_(state, min_ms=st.num(lo), max_ms=st.num(hi)))


def open_href(value: str | None, state: dict) -> tuple[str | None, str]:
    """Pure: the href opening the trace id typed in the box, or (None, why not)."""
    try:
        tid = parse_trace_id((value or "").strip())
    except ParamError as exc:
        return None, exc.message
    keep = {k: v for k, v in state.items() if k in st.TIME_KEYS}
    return st.to_href(f"{TRACE_PATH}/{tid}", keep), ""


# -- compare and findings ----------------------------------------------------
COMPARE_PATH = "/compare"
ANOMALIES_PATH = "/anomalies"
CACHE_PATH = "/cache"


def compare_href(state: Mapping[str, str]) -> str:
    """Compare for the page's window and filters (baseline: the same length just before)."""
    return st.to_href(COMPARE_PATH, st.carried(state))


def finding_filters(finding: Finding) -> dict[str, str]:
    """The filters naming a finding's subject."""
    return finding.subject.filters()


def finding_window(finding: Finding) -> dict[str, str]:
    try:
        s, e = parse_time(finding.start, "start"), parse_time(finding.end, "end")
    except ParamError:
        return {}
    return {"start": rfc3339(s), "end": rfc3339(max(e, s + MINUTE_NS))}


def finding_drill_href(finding: Finding) -> str:
    """The drilldown for a finding's subject over its window."""
    return st.to_href(DRILLDOWN_PATH, {**finding_window(finding), **finding_filters(finding)})


def finding_compare_href(finding: Finding) -> str:
    """Compare for a finding's window (against the same length before) and subject."""
    return st.to_href(COMPARE_PATH, {**finding_window(finding), **finding_filters(finding)})


def finding_cache_href(finding: Finding) -> str | None:
    """The Cache page for a cache finding, grouped by its attribute when that is a plain key."""
    subject = finding.subject
    if subject.cache is None:
        return None
    attr = subject.attribute
    key = attr.key if attr is not None and valid_group_by(attr.key) else None
    win = finding_window(finding)
    if win:  # show the window with context before it
        s = parse_time(win["start"], "start") - HOUR_NS
        win = {"start": rfc3339(s), "end": win["end"]}
    return st.to_href(CACHE_PATH, {**win, "cache": subject.cache, "group_by": key})


def trace_href(trace_id: Any, state: Mapping[str, str]) -> str | None:
    """``/trace/<id>`` for a well-formed trace id (None otherwise: never a link from bad data)."""
    try:
        tid = parse_trace_id(str(trace_id))
    except ParamError:
        return None
    keep = {k: v for k, v in state.items() if k in st.TIME_KEYS}
    return st.to_href(f"{TRACE_PATH}/{tid}", keep)
