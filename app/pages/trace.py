"""Trace view (``/trace/<trace_id>``): waterfall coloured by stage and indented by parent,
with the critical path; an icicle flame graph; each span's percentile rank against its
own operation in the window ("P97 for vit.forward", from the ``op`` rollups); the
selected span's attributes as an escaped key/value table; a box to open any trace id.

Big traces: the waterfall draws at most ``figures.WATERFALL_ROWS`` rows (the critical
path, errors and the slowest spans, then a row counting the rest) and the spans table
shows ``SPANS_PAGE`` spans a page, so a trace of thousands of spans opens in seconds.

URL state: the window (for the ranks), ``span`` (the selected span) and ``page`` (the spans
table's page; by default the one holding the selected span). Every piece of
span text is a Dash text child or goes through ``figures.plot_text``. The selected span's
links (OTLP span links: a batch consumer's producers, a follow-up's cause) lead to
``/trace/<linked trace id>`` with the linked span selected; those ids are the only span
data that becomes a link target, and only once checked as 32 (16) hex digits, not all zero.
"""

from __future__ import annotations

import json
import re

import dash
from dash import Input, Output, State, dcc, html, no_update

from modalscope.app import components as c
from modalscope.app import figures, ids, links, queries
from modalscope.app import state as st
from modalscope.app.params import ParamError, parse_trace_id, rfc3339
from modalscope.app.units import fmt_count, fmt_ms, fmt_rank

dash.register_page(__name__, path="/trace", path_template="/trace/<trace_id>", name="Trace",
                   title="modalscope · trace", order=3)

PATH = "/trace"
SPANS_PAGE = 25  # spans table rows a page: each row is ~11 components the browser re-checks on every update


def page_number(raw) -> int | None:
    """``page=`` as a page number from 1 (None: absent or not a positive whole number)."""
    if isinstance(raw, (list, tuple)):
        raw = raw[-1] if raw else None
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        return None
    return value if value >= 1 else None


def trace_href(tid: str, state: dict, page: int | None = None) -> str:
    """The trace page's link for ``state`` plus the spans table's ``page`` (trace-only state,
    so it is added here rather than carried by every page)."""
    href = st.to_href(f"{PATH}/{tid}", state)
    if page:
        href += ("&" if "?" in href else "?") + f"page={page}"
    return href


def layout(trace_id: str | None = None, **query):
    state = st.from_query(query)
    page = page_number(query.get("page"))
    res = st.resolve(state)
    tid, error = None, None
    if trace_id and trace_id != "none":
        try:
            tid = parse_trace_id(trace_id)
        except ParamError as exc:
            error = f"{exc.message} — got {trace_id[:80]!r}"
    path = f"{PATH}/{tid}" if tid else PATH
    children = [
        dcc.Store(id=ids.TR_STATE, data={"trace_id": tid, "state": state, "page": page}),
        c.toolbar(path, state, show=(), error=res.error),
        html.Div(className="ms-open", children=[
            html.Label("Open a trace", htmlFor=ids.TR_OPEN_INPUT, className="ms-filter-label"),
            dcc.Input(id=ids.TR_OPEN_INPUT, type="text", value=tid or "", placeholder="32 hexadecimal digits",
                      className="ms-input ms-mono ms-open-input", spellCheck=False, debounce=False),
            html.Button("Open", id=ids.TR_OPEN_BUTTON, n_clicks=0, className="ms-button"),
            html.Span(error or "", id=ids.TR_OPEN_ERROR, className="ms-toolbar-error", role="alert"),
        ]),
    ]
    if tid is None:
        # No trace yet: the slowest traces of the window to pick from. The other callback
        # targets exist on every trace page, hidden here.
        children.append(c.panel("Slowest traces in this window", c.loading(html.Div(id=ids.TR_SPANS)),
                                actions=html.Span("or paste a trace id above, or pick one on a drilldown",
                                                  className="ms-note")))
        children.append(html.Div(style={"display": "none"}, children=[
            html.Div(id=ids.TR_HEADER), c.graph(ids.TR_WATERFALL), c.graph(ids.TR_ICICLE),
            html.Div(id=ids.TR_DETAIL)]))
        return html.Div(className="ms-page", children=children)
    children += [
        c.loading(html.Div(id=ids.TR_HEADER, className="ms-trace-header")),
        c.panel("Waterfall", c.loading(c.graph(ids.TR_WATERFALL)),
                actions=[html.Span("● critical path · ✕ error · click a span for its attributes", className="ms-note"),
                         c.share_control("trace", state, trace_id=tid)]),
        html.Div(className="ms-grid-2", children=[
            c.panel("Selected span", c.loading(html.Div(id=ids.TR_DETAIL))),
            c.panel("Flame graph", c.loading(c.graph(ids.TR_ICICLE))),
        ]),
        c.panel("Spans", c.loading(html.Div(id=ids.TR_SPANS))),
    ]
    return html.Div(className="ms-page", children=children)


def _value_text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def kv_table(mapping: dict, id: str | None = None) -> html.Table | html.Div:
    if not mapping:
        return html.Div("none", className="ms-note")
    rows = [{"key": str(k), "value": _value_text(v)} for k, v in sorted(mapping.items(), key=lambda kv: str(kv[0]))]
    return c.text_table([("key", "key"), ("value", "value")], rows, id=id, className="ms-table ms-kv")


_HEX16 = re.compile(r"[0-9a-fA-F]{16}")


def link_href(link: dict, state: dict) -> str | None:
    """``/trace/<trace id>?span=<span id>`` for a span link, keeping the window; None when the
    linked trace id is not 32 hex digits (or all zeros); the span only when it is 16."""
    href = links.trace_href(link.get("trace_id"), state)
    if href is None:
        return None
    sid = link.get("span_id")
    if isinstance(sid, str) and _HEX16.fullmatch(sid) and sid.strip("0"):
        keep = {k: v for k, v in state.items() if k in st.TIME_KEYS}
        return st.to_href(href.partition("?")[0], st.with_(keep, span=sid.lower()))
    return href


def links_table(span: dict, state: dict) -> html.Table | None:
    """The span's links: linked trace (a link when its id is well formed) and span, and the
    link's attributes, all as text."""
    rows = []
    for ln in span.get("links") or []:
        if not isinstance(ln, dict):
            continue
        tid, sid = str(ln.get("trace_id") or ""), str(ln.get("span_id") or "")
        href = link_href(ln, state)
        attrs = ln.get("attributes") or {}
        rows.append({
            "trace": dcc.Link(tid, href=href, className="ms-mono ms-trace-link") if href
            else html.Span(tid or "(none)", className="ms-mono"),
            "span": html.Span(sid, className="ms-mono"),
            "attributes": ", ".join(f"{k}={_value_text(v)}" for k, v in attrs.items())
            if isinstance(attrs, dict) else _value_text(attrs),
        })
    if not rows:
        return None
    return c.text_table([("trace", "linked trace"), ("span", "span"), ("attributes", "attributes")], rows,
                        id="trace-links", className="ms-table ms-kv")


def rank_text(span: dict) -> str:
    if span.get("rank") is None:
        return "no samples of this operation in the window"
    n = span["op_count"]
    return f"{fmt_rank(span['rank'])} for {span['name']} ({fmt_count(n)} span{'' if n == 1 else 's'} in the window)"


def span_detail(trace: dict, span: dict, state: dict | None = None) -> html.Div:
    t0 = trace["start_unix_nano"]
    facts = [
        ("name", span["name"]), ("service", span["service"]), ("kind", span["kind"]), ("stage", span["stage"]),
        ("span id", span["span_id"]), ("parent", span["parent_span_id"] or "(root)"),
        ("starts at", f"+{fmt_ms((span['start_unix_nano'] - t0) / 1e6)}"),
        ("duration", fmt_ms(span["duration_ms"])), ("self time", fmt_ms(span["self_ms"])),
        ("rank", rank_text(span)), ("critical path", "yes" if span.get("critical") else "no"),
        *([("queued", f"{fmt_ms(span['queued_ms'])} after {span['producer_service']} published it "
                      "(part of the hand-off's latency)")] if span.get("queued_ms") is not None else []),
        ("status", span["status"] + (f": {span['status_message']}" if span.get("status_message") else "")),
        ("instance", span.get("instance") or "—"), ("source", span["source"]),
    ]
    events = span.get("events") or []
    ev_rows = []
    for e in events if isinstance(events, list) else []:
        if not isinstance(e, dict):
            continue
        t = e.get("time_unix_nano") or e.get("timeUnixNano")
        try:
            when = f"+{fmt_ms((int(t) - t0) / 1e6)}" if t is not None else ""
        except (TypeError, ValueError):
            when = ""
        ev_rows.append({"when": when, "name": str(e.get("name", "")),
                        "attributes": _value_text(e.get("attributes", {}))})
    linked = links_table(span, state or {})
    return html.Div(id="trace-span-detail-body", children=[
        c.text_table([("k", ""), ("v", "")], [{"k": k, "v": v} for k, v in facts], className="ms-table ms-kv ms-facts"),
        html.H3("Attributes", className="ms-subhead"),
        kv_table(span.get("attributes") or {}, id="trace-attributes"),
        html.H3("Resource", className="ms-subhead"),
        kv_table(span.get("resource") or {}),
        *([html.H3("Events", className="ms-subhead"),
           c.text_table([("when", "at"), ("name", "event"), ("attributes", "attributes")], ev_rows)] if ev_rows else []),
        *([html.H3("Links", className="ms-subhead"), linked] if linked is not None else []),
    ])


def spans_table(trace: dict, state: dict, selected: str | None, page: int | None = None) -> html.Div:
    """One page of the spans table (``SPANS_PAGE`` spans, tree order) with links to the
    other pages; without ``page``, the page holding the selected span."""
    tid = trace["trace_id"]
    spans = trace["spans"]
    pages = max(1, -(-len(spans) // SPANS_PAGE))
    if page is None:
        at = next((i for i, s in enumerate(spans) if s["span_id"] == selected), 0)
        page = at // SPANS_PAGE + 1
    page = min(page, pages)
    first = (page - 1) * SPANS_PAGE
    rows = []
    for s in spans[first:first + SPANS_PAGE]:
        indent = "\u2003" * min(s.get("depth", 0), 24)
        rows.append({
            "_id": s["span_id"],
            "name": [indent, dcc.Link(s["name"] if len(s["name"]) <= 120 else s["name"][:119] + "…",
                                      href=trace_href(tid, st.with_(state, span=s["span_id"]), page),
                                      className="ms-span-link")],
            "service": s["service"], "stage": s["stage"], "kind": s["kind"],
            "duration": fmt_ms(s["duration_ms"]), "self": fmt_ms(s["self_ms"]),
            "rank": f"{fmt_rank(s['rank'])}" if s.get("rank") is not None else "—",
            "critical": "●" if s.get("critical") else "",
            "status": s["status"] if s["status"] == "ERROR" else "",
        })
    cols = [("critical", ""), ("name", "span"), ("service", "service"), ("stage", "stage"), ("kind", "kind"),
            ("duration", "duration"), ("self", "self"), ("rank", "rank vs its operation"), ("status", "status")]
    table = c.text_table(cols, rows, id="trace-span-table",
                         row_class=lambda r: "ms-row-selected" if r["_id"] == selected else ("ms-row-error" if r["status"] else None))
    if pages == 1:
        return html.Div(table)

    def to(p: int, text: str):
        if p < 1 or p > pages or p == page:
            return html.Span(text, className="ms-note")
        return dcc.Link(text, href=trace_href(tid, state, p), className="ms-page-link")

    pager = html.Div(id="trace-span-pager", className="ms-pager", children=[
        html.Span(f"spans {fmt_count(first + 1)}–{fmt_count(first + len(rows))} of {fmt_count(len(spans))}",
                  className="ms-note"), " · ",
        to(1, "« first"), " · ", to(page - 1, "‹ previous"), " · ",
        html.Span(f"page {page} of {pages}", className="ms-note"), " · ",
        to(page + 1, "next ›"), " · ", to(pages, "last »"),
    ])
    return html.Div([pager, table])


@dash.callback(
    Output(ids.TR_HEADER, "children"),
    Output(ids.TR_WATERFALL, "figure"),
    Output(ids.TR_ICICLE, "figure"),
    Output(ids.TR_SPANS, "children"),
    Output(ids.TR_DETAIL, "children"),
    Input(ids.TR_STATE, "data"),
)
def _fill(data):
    data = data or {}
    tid, state = data.get("trace_id"), data.get("state") or {}
    blank = figures.empty_figure("No trace selected.")
    res = st.resolve(state)
    if not tid:
        rows = queries.exemplar_traces(c.reader(), res.window, res.filters, limit=20)
        pick = c.exemplar_table(rows, state, id="trace-pick-table") if rows else c.no_data("traces")
        return None, blank, blank, pick, None
    trace = queries.trace_view(c.reader(), tid, res.window)
    if trace is None:
        msg = c.empty_state(f"Trace {tid} is not stored.",
                            "It may not have arrived yet, or its raw spans passed retention "
                            "(MODALSCOPE_RETENTION_DAYS).")
        nothing = figures.empty_figure("Trace not found.")
        return msg, nothing, nothing, None, None
    selected_id = state.get("span")
    by_id = {s["span_id"]: s for s in trace["spans"]}
    selected = by_id.get(selected_id) or next((s for s in trace["spans"] if not s["parent_span_id"]),
                                              trace["spans"][0])
    errors = sum(1 for s in trace["spans"] if s["status"] == "ERROR")
    hidden = figures.waterfall_rows(trace["spans"], selected["span_id"])[1]
    header = html.Div(children=[
        html.H1(["Trace ", html.Span(tid, className="ms-mono")], className="ms-title"),
        html.Div(className="ms-summary", children=[
            html.Div([html.Span(k, className="ms-stat-label"), html.Span(v, className="ms-stat-value")],
                     className="ms-stat")
            for k, v in (("root", f"{trace['root_service'] or '?'} · {trace['root_name'] or '?'}"),
                         ("duration", fmt_ms(trace["duration_ms"])), ("input type", trace["input_type"]),
                         ("spans", fmt_count(trace["span_count"])), ("errors", str(errors)),
                         ("started", rfc3339(trace["start_unix_nano"]).replace("T", " ").replace("Z", " UTC")))
        ]),
        c.banner(None if trace["in_window"] else
                 "This trace started outside the selected window; ranks compare it with the window's spans.",
                 "info"),
        c.banner(None if trace["settled"] else "This trace has not settled yet (spans may still arrive).", "info"),
        c.banner(None if not hidden else
                 f"The waterfall shows {fmt_count(len(trace['spans']) - len(hidden))} of "
                 f"{fmt_count(len(trace['spans']))} spans (the critical path, errors, the slowest); "
                 f"{figures.hidden_summary(hidden)[2:]} are in the Spans table, {SPANS_PAGE} a page.", "info"),
    ])
    return (header, figures.waterfall(trace, selected["span_id"]), figures.icicle(trace),
            spans_table(trace, state, selected["span_id"], data.get("page")), span_detail(trace, selected, state))


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Output(ids.TR_OPEN_ERROR, "children"),
    Input(ids.TR_OPEN_BUTTON, "n_clicks"),
    Input(ids.TR_OPEN_INPUT, "n_submit"),
    State(ids.TR_OPEN_INPUT, "value"),
    State(ids.TR_STATE, "data"),
    prevent_initial_call=True,
)
def _open(_clicks, _submit, value, data):
    if c.rendering():
        return no_update, no_update
    href, error = links.open_href(value, (data or {}).get("state") or {})
    return (href, "") if href else (no_update, error)


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.TR_WATERFALL, "clickData"),
    State(ids.TR_STATE, "data"),
    prevent_initial_call=True,
)
def _select_span(click, data):
    data = data or {}
    try:
        span_id = str(click["points"][0]["customdata"][0])
    except (KeyError, IndexError, TypeError):
        return no_update
    if not data.get("trace_id"):
        return no_update
    return st.to_href(f"{PATH}/{data['trace_id']}", st.with_(data.get("state") or {}, span=span_id))
