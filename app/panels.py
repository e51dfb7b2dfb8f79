"""Panels: the named charts and tables that also live outside their page.

Every panel (``pair-heatmap``, ``pair-table``, ``input-types``, ``stages``,
``latency-timeline``, ``cache``, ``anomalies``, ``trace``) has three more addresses beside
its page: ``/embed/<panel>``, ``/render/<panel>.png`` and ``/render/<panel>.svg``
(``app/embed.py``). This module is what they share, with no Flask in it:

- which query parameters a panel takes (exactly its page's: time, the filters its page
  shows, and its own selection such as the cache's ``group_by``), parsed strictly with
  ``app/params.py`` so a typo is a 400 naming the parameter, not a silently different view;
- panel -> (query, figure or table) dispatch, calling the SAME pure query
  (``app/queries/``) and figure (``app/figures.py``) functions as the Dash pages, so an
  embed shows what the page shows;
- tables as rows of plain text (the embed escapes them; an image draws them as a Plotly
  Table through :func:`figures.plot_text`);
- the light/dark theme, the figure JSON made safe for a ``<script>`` element, and the
  URLs of :func:`share_urls` (``/api/v1/share`` and the pages' Share control).

Untrusted span text only ever reaches a figure through ``figures.plot_text`` and a table
cell through :func:`cell_text`; nothing from a span becomes a link.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import quote, urlencode

import plotly.graph_objects as go

from ..models.reader import Filters
from . import figures, queries, signing
from . import state as st
from .params import ParamError, Window, parse_filters, parse_trace_id, parse_window, rfc3339
from .units import fmt_count, fmt_ms, fmt_num, fmt_pct

TIME_KEYS = ("range", "start", "end")
ALL_FILTERS = ("service", "caller", "callee", "stage", "input_type")
THEMES = ("light", "dark")
DEFAULT_TTL_SECONDS = 30 * 86400
MIN_TTL_SECONDS = 60
MAX_TEXT = 200  # characters of span text a table cell shows
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
class Table:
    columns: list[tuple[str, str]]  # (key, header)
    rows: list[dict[str, str]]
    row_classes: list[str] = field(default_factory=list)
    empty: str = ""  # shown when set: the panel has no data in the window


@dataclass
class Built:
    query: PanelQuery
    figure: go.Figure | None = None
    table: Table | None = None
    found: bool = True  # False: the trace panel's trace is not stored


def cell_text(value: Any, limit: int = MAX_TEXT) -> str:
    """Untrusted text for a table cell: one line of at most ``limit`` characters, control
    and bidi-override characters replaced. (HTML escaping is the template's job.)"""
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return figures.UNSAFE_CHARS.sub("\ufffd", text)


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
        from . import detectors, evaluations

        th = thresholds if thresholds is not None else detectors.Thresholds()
        ev = evaluations.find_for(reader, q.window, q.filters, th, relative=evaluations.ends_now(q.params))
        return Built(q, table=anomalies_table(ev.findings))
    if name == "trace":
        trace = queries.trace_view(reader, q.trace_id, q.window)
        if trace is None:
            return Built(q, figure=figures.empty_figure(f"Trace {q.trace_id} is not stored."), found=False)
        return Built(q, figure=figures.waterfall(trace, q.span))
    raise KeyError(name)


def pair_table(rows: list[dict], sort: tuple[str, str] = ("count", "desc")) -> Table:
    cols = [("caller", "caller"), ("callee", "callee"), ("count", "calls"), ("calls_per_day", "calls/day (extrapolated)"),
            ("p50_ms", "P50"), ("p90_ms", "P90"), ("p99_ms", "P99"), ("error_rate", "errors")]
    out = []
    for r in st.sort_rows(rows, *sort):
        out.append({"caller": cell_text(r["caller"]), "callee": cell_text(r["callee"]),
                    "count": fmt_count(r["count"]), "calls_per_day": fmt_count(round(r["calls_per_day"])),
                    "p50_ms": fmt_ms(r["p50_ms"]), "p90_ms": fmt_ms(r["p90_ms"]), "p99_ms": fmt_ms(r["p99_ms"]),
                    "error_rate": fmt_pct(r["error_rate"])})
    return Table(cols, out, [""] * len(out), "" if out else "No service-pair calls in this window.")


def baseline_status(row: dict) -> str:
    """Pure: an ``overview_rows`` row's verdict against its baseline, as the overview shows it."""
    change = row["p95_change"]
    if change is None:
        return "no baseline" if row["baseline_p95_ms"] is None else "no traffic"
    if row["regression"]:
        return f"▲ regression: P95 {fmt_pct(change, 0)} over baseline"
    return f"ok ({'+' if change >= 0 else ''}{fmt_pct(change, 0)})"


def input_types_table(rows: list[dict], margin: float) -> Table:
    """The overview's input-type table: live P50/P95/P99 and bottleneck against the baseline."""
    cols = [("input_type", "input type"), ("count", "traces"), ("rate", "rate"), ("p50", "P50"), ("p95", "P95"),
            ("p99", "P99"), ("baseline", "baseline P50 / P95"), ("bottleneck", "bottleneck stage"),
            ("errors", "errors"), ("status", f"vs baseline (margin {margin * 100:g} %)")]
    out, classes = [], []
    for r in rows:
        status = baseline_status(r)
        out.append({
            "input_type": cell_text(r["input_type"]), "count": fmt_count(r["count"]),
            "rate": f"{fmt_num(r['rate_per_min'])}/min" if r["count"] else "—",
            "p50": fmt_ms(r["p50_ms"]), "p95": fmt_ms(r["p95_ms"]), "p99": fmt_ms(r["p99_ms"]),
            "baseline": (f"{fmt_ms(r['baseline_p50_ms'])} / {fmt_ms(r['baseline_p95_ms'])}"
                         if r["baseline_p95_ms"] else "—"),
            "bottleneck": cell_text(r["bottleneck_stage"] or "—"),
            "errors": fmt_pct(r["error_rate"]) if r["count"] else "—", "status": status,
        })
        classes.append("ms-row-regression" if r["regression"] else "")
    empty = "No traces in this window." if not any(r["count"] for r in rows) else ""
    return Table(cols, out, classes, empty)


def subject_text(subject: Mapping[str, Any]) -> str:
    """A finding's subject as one line of text (as the Anomalies page shows it)."""
    parts = []
    if subject.get("caller") or subject.get("callee"):
        parts.append(f"{subject.get('caller') or 'any'} → {subject.get('callee') or 'any'}")
    for key in ("service", "stage", "input_type", "cache"):
        if subject.get(key) not in (None, ""):
            parts.append(f"{key} {subject[key]}")
    attr = subject.get("attribute")
    if isinstance(attr, Mapping):
        parts.append(f"{attr.get('key')}={attr.get('value')}")
    return " · ".join(str(p) for p in parts) or "everything"


def _evidence_text(evidence: Mapping[str, Any], limit: int = 4) -> str:
    from .units import evidence_items  # (in units, as the Anomalies page shows them)

    return " · ".join(f"{label} {value}" for _, label, value in evidence_items(dict(evidence), limit))


def anomalies_table(found: list[dict]) -> Table:
    cols = [("severity", "severity"), ("kind", "finding"), ("subject", "subject"), ("window", "window (UTC)"),
            ("evidence", "evidence"), ("hint", "hint")]
    out, classes = [], []
    for f in found:
        sev = str(f.get("severity", "info"))
        window = f"{f.get('start', '')} → {f.get('end', '')}".replace("T", " ").replace("Z", "")
        out.append({"severity": cell_text(sev), "kind": cell_text(f.get("kind", "")),
                    "subject": cell_text(subject_text(f.get("subject") or {})), "window": cell_text(window),
                    "evidence": cell_text(_evidence_text(f.get("evidence") or {})),
                    "hint": cell_text(f.get("hint") or "", 400)})
        classes.append(f"ms-sev-{sev}" if sev in ("critical", "warning", "info") else "")
    return Table(cols, out, classes, "" if out else "No findings in this window.")


# -- presentation ----------------------------------------------------------------------
DARK = {"paper": "#111827", "plot": "#111827", "ink": "#e5e7eb", "muted": "#9ca3af", "grid": "#374151"}


def apply_theme(fig: go.Figure, theme: str) -> go.Figure:
    """Dark: the same figure on a dark ground (the builders draw light)."""
    if theme != "dark":
        return fig
    fig.update_layout(template="plotly_dark", paper_bgcolor=DARK["paper"], plot_bgcolor=DARK["plot"],
                      font=dict(color=DARK["ink"]))
    fig.update_xaxes(gridcolor=DARK["grid"], linecolor=DARK["grid"])
    fig.update_yaxes(gridcolor=DARK["grid"], linecolor=DARK["grid"])
    for ann in fig.layout.annotations or ():
        if ann.font is not None and ann.font.color in (figures.INK, figures.CRITICAL):
            ann.font.color = DARK["ink"]
        elif ann.font is not None and ann.font.color == figures.MUTED:
            ann.font.color = DARK["muted"]
    for trace in fig.data:
        marker = getattr(trace, "marker", None)
        if trace.type == "bar" and marker is not None and marker.color == figures.CRITICAL:
            marker.color = DARK["ink"]  # the critical path and end-to-end marks: light on dark
        if trace.type == "scatter" and marker is not None and marker.color == figures.CRITICAL:
            marker.color = DARK["ink"]
    return fig


TABLE_CELL_CHARS = 80  # characters of a cell an image shows
ALERT_ROWS = ("ms-row-regression", "ms-sev-critical")
_CHAR_PX, _LINE_PX = 6.6, 16  # 12 px text: average glyph width and line height


def _cell_values(table: Table) -> list[list[str]]:
    rows = table.rows or [{table.columns[0][0]: table.empty}]
    return [[figures.plot_text(r.get(k, ""), TABLE_CELL_CHARS) for r in rows] for k, _ in table.columns]


def _column_weights(table: Table) -> list[int]:
    """Relative column widths: a column as wide as its longer texts (within bounds)."""
    out = []
    for k, header in table.columns:
        texts = [str(r.get(k, ""))[:TABLE_CELL_CHARS] for r in table.rows]
        longest = max((min(len(t), 60) for t in texts), default=0)
        word = max((min(len(w), 30) for t in texts for w in t.split()), default=0)  # unbreakable
        out.append(max(len(header), longest, word + 3, 6) + 2)
    return out


def table_height(table: Table, width: int) -> int:
    """The image height that shows every row of ``table`` at ``width`` CSS pixels: wrapped
    cells make taller rows, so count each row's lines in its widest-wrapping cell."""
    weights = _column_weights(table)
    inner = max(width - 24, 100)
    col_px = [inner * w / sum(weights) for w in weights]
    rows = table.rows or [{table.columns[0][0]: table.empty}]
    total = 44 + 30 + 12  # title, header, bottom margin
    for r in rows:
        lines = 1
        for (k, _), px in zip(table.columns, col_px):
            text = str(r.get(k, ""))[:TABLE_CELL_CHARS]
            lines = max(lines, math.ceil(len(text) * _CHAR_PX / max(px - 16, 20)))
        total += max(26, 10 + _LINE_PX * lines)
    return int(min(4000, total))


def table_figure(table: Table, title: str, theme: str = "light") -> go.Figure:
    """A table panel as a Plotly Table (for PNG/SVG): every cell through ``plot_text``."""
    dark = theme == "dark"
    head_fill, cell_fill, line = ("#1f2937", DARK["paper"], DARK["grid"]) if dark else ("#f3f4f6", "white", "#e5e7eb")
    ink = DARK["ink"] if dark else figures.INK
    alert = "#3b1d1d" if dark else "#fef2f2"  # a regression or critical finding, as the embed marks it
    marked = [i < len(table.row_classes) and table.row_classes[i] in ALERT_ROWS for i in range(len(table.rows))]
    fills = [alert if m else cell_fill for m in marked] or [cell_fill]
    fig = go.Figure(go.Table(
        columnwidth=_column_weights(table),
        header=dict(values=[f"<b>{figures.plot_text(h)}</b>" for _, h in table.columns], fill_color=head_fill,
                    line_color=line, align="left", font=dict(color=ink, size=12), height=30),
        cells=dict(values=_cell_values(table), fill_color=[fills] * len(table.columns), line_color=line,
                   align="left", font=dict(color=ink, size=12), height=26),
    ))
    figures.base_layout(fig, height=table_height(table, 1000), margin=dict(l=12, r=12, t=44, b=12),
                        title=dict(text=figures.plot_text(title), x=0.01, font=dict(size=14)))
    return apply_theme(fig, theme)


def image_size(built: Built, width: int | None = None) -> tuple[int, int]:
    """Default width and (for that width) height of the panel's image, CSS pixels."""
    w, h = built.query.panel.size
    w = width or w
    if built.table is not None:
        return w, table_height(built.table, w)
    if not h and built.figure is not None:
        h = int(built.figure.layout.height or 480)
    return w, h or 480


def figure_json(fig: go.Figure) -> str:
    """The figure as JSON safe to place inside ``<script type="application/json">``: ``<``,
    ``>`` and ``&`` (and the JavaScript line separators) as ``\\u`` escapes, so no string
    in it can end the element or open a comment."""
    return script_json(fig.to_plotly_json())


def script_json(value: Any) -> str:
    from plotly.utils import PlotlyJSONEncoder

    text = json.dumps(value, cls=PlotlyJSONEncoder, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def page_path(q: PanelQuery) -> str:
    return f"{q.panel.page}/{q.trace_id}" if q.panel.name == "trace" else q.panel.page


def open_href(q: PanelQuery) -> str:
    """The full page with the same query: a relative link to our own page (``state.to_href``
    quotes every value), never built from span text."""
    params = {k: v for k, v in q.params.items() if k != "trace_id"}
    return st.to_href(page_path(q), params)


def window_text(q: PanelQuery) -> str:
    if q.relative:
        return f"last {q.params.get('range') or st.DEFAULT_RANGE_LABEL}"
    return f"{rfc3339(q.window.start_ns)} → {rfc3339(q.window.end_ns)}".replace("T", " ")


def refresh_seconds(q: PanelQuery) -> int:
    """How often an embed of a relative window re-reads its data (0: never; an absolute
    window does not change): a minute for short windows, at most every 15 minutes."""
    if not q.relative:
        return 0
    return int(max(60, min(900, q.window.seconds / 60)))


# -- sharing ---------------------------------------------------------------------------
def _query_string(pairs: Iterable[tuple[str, str]]) -> str:
    items = list(pairs)
    return "?" + urlencode(items, quote_via=quote, safe=":,") if items else ""


def _ordered(panel: Panel, params: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(k, params[k]) for k in panel.keys if params.get(k) not in (None, "")]


def parse_ttl(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_TTL_SECONDS
    try:
        ttl = int(raw)
    except ValueError:
        raise ParamError("ttl", "ttl must be a whole number of seconds") from None
    if not MIN_TTL_SECONDS <= ttl <= signing.MAX_TTL_SECONDS:
        raise ParamError("ttl", f"ttl must be between {MIN_TTL_SECONDS} and {signing.MAX_TTL_SECONDS} seconds")
    return ttl


def iframe_snippet(url: str, title: str, height: int = 480) -> str:
    """An ``<iframe>`` for a wiki page, every attribute value escaped."""
    return (f'<iframe src="{html.escape(url, quote=True)}" width="100%" height="{int(height)}" '
            f'style="border:0" loading="lazy" title="{html.escape(title, quote=True)}"></iframe>')


def share_urls(base_url: str, name: str, params: Mapping[str, str], *, secret: str = "",
               ttl_seconds: int | None = None, sign: bool = True, now: float | None = None) -> dict:
    """The addresses of a panel for its Share control and ``/api/v1/share``.

    ``params`` are the panel's data parameters (validated here: ``ParamError`` names a bad
    one). ``link`` is the full page (it needs a login when access is restricted); with a
    ``secret`` (and ``sign``) the embed, PNG and SVG URLs carry ``exp`` and ``sig``
    (``app/signing.py``): read-only, this panel and query only, until ``exp``."""
    panel = PANELS[name]
    data, _ = split_params(panel, params)
    q = parse_query(panel, data)
    base = base_url.rstrip("/")
    pairs = _ordered(panel, q.params)
    signed = bool(secret) and sign
    exp = None
    if signed:
        ttl = DEFAULT_TTL_SECONDS if ttl_seconds is None else ttl_seconds
        pairs = signing.sign(secret, panel.name, pairs, ttl, now=now)
        exp = int(dict(pairs)["exp"])
    search = _query_string(pairs)
    embed_url = f"{base}/embed/{panel.name}{search}"
    w, h = panel.size
    return {
        "panel": panel.name,
        "link": base + open_href(q),
        "embed_url": embed_url,
        "image_url": f"{base}/render/{panel.name}.png{search}",
        "svg_url": f"{base}/render/{panel.name}.svg{search}",
        "iframe": iframe_snippet(embed_url, f"modalscope · {panel.title}", h if h else 480),
        "signed": signed,
        "expires": rfc3339(exp * 1_000_000_000) if exp is not None else None,
    }
