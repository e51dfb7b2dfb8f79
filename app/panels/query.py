"""Which panels there are, which query parameters each takes (exactly its page's), parsed
strictly so a typo is a 400 naming the parameter, and the dispatch from a parsed query to
the same query and figure functions the pages call."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import plotly.graph_objects as go

from ...models.reader import Filters
from .. import detectors, evaluations, figures, queries, signing
from .. import state as st
from ..params import ParamError, Window, parse_filters, parse_trace_id, parse_window
from .tables import Table, anomalies_table, input_types_table, pair_table


TIME_KEYS = ("range", "start", "end")
ALL_FILTERS = ("service", "caller", "callee", "stage", "input_type")
PAIR_SORTABLE = ("caller", "callee", "count", "calls_per_day", "p50_ms", "p90_ms", "p99_ms", "error_rate")
DEFAULT_CACHE_GROUP_BY = "user_tier"  # as the Cache page
MAX_ANOMALY_WINDOW_S = 7 * 86400  # as /api/v1/anomalies: the detectors work minute by minute
_SPAN_ID = re.compile(r"^[0-9a-fA-F]{16}$")


@dataclass(frozen=True)
class Panel:
    name: str
    title: str
    page: str  # the full page's path (the trace panel appends /<trace_id>)
    kind: str  # "figure" or "table"
    keys: tuple[str, ...]  # data parameters it takes (signed in a shared link)
    size: tuple[int, int]  # default image size, CSS pixels


PANELS: dict[str, Panel] = {p.name: p for p in (
    Panel("pair-heatmap", "Service-pair latency heatmap", "/pairs", "figure",
          TIME_KEYS + ALL_FILTERS, (1100, 560)),
    Panel("pair-table", "Service pairs", "/pairs", "table", TIME_KEYS + ALL_FILTERS + ("sort",), (1000, 0)),
    Panel("input-types", "Input types vs baseline", "/", "table",
          TIME_KEYS + ("service", "input_type", "baseline", "margin"), (1100, 0)),
    Panel("stages", "Stage time per input type", "/stages", "figure",
          TIME_KEYS + ("service", "stage", "input_type"), (1100, 460)),
    Panel("latency-timeline", "P50 / P90 / P99 over time", "/drilldown", "figure",
          TIME_KEYS + ALL_FILTERS, (1000, 380)),
    Panel("cache", "Cache hit rate by group over time", "/cache", "figure",
          TIME_KEYS + ("group_by", "cache"), (1000, 380)),
    Panel("anomalies", "Anomaly findings", "/anomalies", "table", TIME_KEYS + ALL_FILTERS, (1200, 0)),
    Panel("trace", "Trace waterfall", "/trace", "figure", ("trace_id",) + TIME_KEYS + ("span",), (1200, 0)),
)}
PANEL_NAMES = tuple(PANELS)


def get_panel(name: str) -> Panel | None:
    return PANELS.get(name)


# -- parameters ------------------------------------------------------------------------
def _pairs(args: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    if hasattr(args, "items"):
        try:
            return [(str(k), str(v)) for k, v in args.items(multi=True)]  # type: ignore[call-arg]
        except TypeError:
            return [(str(k), str(v)) for k, v in args.items()]
    return [(str(k), str(v)) for k, v in args]


@dataclass(frozen=True)
class PanelQuery:
    """A panel's parsed data query. ``params`` are the data parameters as given (blanks
    dropped): what a link to the panel or its page carries, and what a signature covers."""

    panel: Panel
    params: dict[str, str]
    window: Window
    filters: Filters
    sort: tuple[str, str] = ("count", "desc")
    baseline: dict[str, tuple[float, float]] = field(default_factory=dict)
    margin: float = queries.DEFAULT_MARGIN
    group_by: str = DEFAULT_CACHE_GROUP_BY
    cache: str | None = None
    trace_id: str | None = None
    span: str | None = None

    @property
    def relative(self) -> bool:
        """A window relative to now (``range=``, or the default): worth refreshing."""
        return not self.params.get("start")


def split_params(panel: Panel, args, presentation: Sequence[str] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """(data, presentation) parameters of a request, refusing what the panel does not take.

    ``presentation`` names what the caller (embed or image) accepts besides the panel's data
    keys; ``sig`` and ``exp`` are always allowed (checked by the caller). A repeated key is
    refused too: a signature covers one value."""
    data: dict[str, str] = {}
    pres: dict[str, str] = {}
    seen: set[str] = set()
    for k, v in _pairs(args):
        if k in seen:
            raise ParamError(k, f"give {k} at most once")
        seen.add(k)
        if k in signing.SIGNATURE_PARAMS:
            continue
        if k in panel.keys:
            if v != "":
                data[k] = v
        elif k in presentation:
            if v != "":
                pres[k] = v
        else:
            takes = ", ".join(panel.keys + tuple(presentation))
            raise ParamError(k, f"the {panel.name} panel does not take {k!r}; it takes {takes}")
    return data, pres


def parse_query(panel: Panel, data: Mapping[str, str], now_ns: int | None = None) -> PanelQuery:
    """The panel's query from its data parameters (:func:`split_params`); ``ParamError`` names
    any bad value."""
    data = {k: v for k, v in data.items() if k in panel.keys and v != ""}
    window = parse_window(data, now_ns)
    if panel.name == "anomalies" and window.seconds > MAX_ANOMALY_WINDOW_S:
        raise ParamError("range" if data.get("range") else "start",
                         f"the anomaly window is at most {MAX_ANOMALY_WINDOW_S // 86400} days")
    filters = parse_filters(data)
    kw: dict[str, Any] = {}
    if "sort" in data:
        col, _, direction = data["sort"].partition(":")
        if col not in PAIR_SORTABLE or direction not in ("", "asc", "desc"):
            raise ParamError("sort", f"sort must be column[:asc|desc], a column of {', '.join(PAIR_SORTABLE)}")
        kw["sort"] = (col, direction or "desc")
    if "baseline" in data:
        try:
            kw["baseline"] = queries.parse_baseline(data["baseline"])
        except ValueError as exc:
            raise ParamError("baseline", str(exc)) from None
    elif "baseline" in panel.keys:
        kw["baseline"] = dict(queries.SEED_BASELINE)
    if "margin" in data:
        try:
            margin = float(data["margin"])
        except ValueError:
            raise ParamError("margin", "margin must be a number of percent") from None
        if not (math.isfinite(margin) and 0 <= margin <= 1000):
            raise ParamError("margin", "margin must be between 0 and 1000 (percent)")
        kw["margin"] = margin / 100
    if "group_by" in data:
        if not queries.valid_group_by(data["group_by"]):
            raise ParamError("group_by", "group_by must be an attribute key: 1-128 letters, digits or _ . : / -")
        kw["group_by"] = data["group_by"]
    if "cache" in data:
        if len(data["cache"]) > st.MAX_VALUE_LEN:
            raise ParamError("cache", f"cache is longer than {st.MAX_VALUE_LEN} characters")
        kw["cache"] = data["cache"]
    if panel.name == "trace":
        if "trace_id" not in data:
            raise ParamError("trace_id", "the trace panel needs trace_id=<32 hexadecimal digits>")
        kw["trace_id"] = parse_trace_id(data["trace_id"])
    if "span" in data:
        if not _SPAN_ID.match(data["span"]):
            raise ParamError("span", "span must be a span id of 16 hexadecimal digits")
        kw["span"] = data["span"].lower()
    return PanelQuery(panel, dict(data), window, filters, **kw)


def panel_params(panel: Panel, state: Mapping[str, Any], trace_id: str | None = None) -> dict[str, str]:
    """The part of a page's URL state that a panel takes (what its Share control shares)."""
    out = {k: str(state[k]) for k in panel.keys if k != "trace_id" and state.get(k) not in (None, "")}
    if panel.name == "trace" and trace_id:
        out = {"trace_id": trace_id, **out}
    return out


# -- data, figures and tables ----------------------------------------------------------
@dataclass
class Built:
    query: PanelQuery
    figure: go.Figure | None = None
    table: Table | None = None
    found: bool = True  # False: the trace panel's trace is not stored


def build(name: str, reader, args, *, now_ns: int | None = None, thresholds=None,
          presentation: Sequence[str] = ()) -> Built:
    """Parse ``args`` for panel ``name`` and build its figure or table from the store.

    Raises ``KeyError`` for an unknown panel and ``ParamError`` for a bad parameter."""
    panel = PANELS[name]
    data, _ = split_params(panel, args, presentation)
    return build_query(parse_query(panel, data, now_ns), reader, thresholds=thresholds)


def build_query(q: PanelQuery, reader, *, thresholds=None) -> Built:
    name = q.panel.name
    if name == "pair-heatmap":
        return Built(q, figure=figures.pair_heatmap(queries.pair_heatmap(reader, q.window, q.filters)))
    if name == "pair-table":
        return Built(q, table=pair_table(queries.pair_table(reader, q.window, q.filters), q.sort))
    if name == "input-types":
        rows = queries.overview_rows(reader, q.window, q.filters, q.baseline, q.margin)
        return Built(q, table=input_types_table(rows, q.margin))
    if name == "stages":
        # as the Stages page draws it: the right side is where the P99 time goes, additive
        tail = queries.stage_time_at(reader, q.window, q.filters, "p99", group_by="input_type")
        return Built(q, figure=figures.stage_stack(queries.stage_breakdown(reader, q.window, q.filters), tail))
    if name == "latency-timeline":
        rows = queries.percentile_series(reader, q.window, q.filters, st.step_minutes(q.window))
        return Built(q, figure=figures.percentile_timeseries(rows))
    if name == "cache":
        rows = queries.cache_series(reader, q.window, q.group_by, q.cache, st.step_minutes(q.window, 60))
        return Built(q, figure=figures.cache_hit_rate_figure(rows))
    if name == "anomalies":
        th = thresholds if thresholds is not None else detectors.Thresholds()
        ev = evaluations.find_for(reader, q.window, q.filters, th, relative=evaluations.ends_now(q.params))
        return Built(q, table=anomalies_table(ev.findings))
    if name == "trace":
        trace = queries.trace_view(reader, q.trace_id, q.window)
        if trace is None:
            return Built(q, figure=figures.empty_figure(f"Trace {q.trace_id} is not stored."), found=False)
        return Built(q, figure=figures.waterfall(trace, q.span))
    raise KeyError(name)
