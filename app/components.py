"""The shell every page shares: navigation, the time/filter toolbar, empty states, tables.

Layout builders are plain functions; the callbacks that serve the shell (nav links that
keep the window and filters, the toolbar writing the URL, the filter pickers' options)
are registered by :func:`register_callbacks`, which ``create_app`` calls once per app.
Everything here renders untrusted text as Dash text children (React escapes them),
never as Markdown or raw HTML.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Iterable, Mapping, Sequence

import dash
from dash import Input, Output, State, ctx, dcc, html, no_update

from . import ids
from . import state as st
from . import links
from .params import rfc3339
from .units import fmt_ms

NAV_ITEMS = (  # (path, label, link id)
    ("/", "Overview", ids.NAV_LINKS["/"]),
    ("/pairs", "Service pairs", ids.NAV_LINKS["/pairs"]),
    ("/drilldown", "Drilldown", ids.NAV_LINKS["/drilldown"]),
    ("/trace", "Trace", ids.NAV_LINKS["/trace"]),
    ("/stages", "Stages", ids.NAV_LINKS["/stages"]),
    ("/cache", "Cache", ids.NAV_LINKS["/cache"]),
    ("/anomalies", "Anomalies", ids.NAV_LINKS["/anomalies"]),
    ("/compare", "Compare", ids.NAV_LINKS["/compare"]),
)
EMPTY_HINT = ["send OTLP to ", html.Code(":4318"), " (or gRPC ", html.Code(":4317"), ") or run ",
              html.Code("modalscope demo"), "."]


def reader():
    from flask import current_app

    return current_app.extensions["modalscope"]["reader"]


# -- shell -----------------------------------------------------------------------------
def shell(account: Mapping[str, Any] | None = None) -> html.Div:
    """The page frame; ``account`` (``auth.account()``) adds "Signed in as …" / "Sign out"."""
    return html.Div(className="ms-app", children=[
        dcc.Location(id=ids.URL, refresh="callback-nav"),
        html.Header(className="ms-header", children=[
            dcc.Link(className="ms-brand", href="/", children=[html.Span("◆", className="ms-logo"), "modalscope"]),
            html.Nav(id=ids.NAV, className="ms-nav", children=[
                dcc.Link(label, id=link_id, href=path, className="ms-nav-link") for path, label, link_id in NAV_ITEMS
            ]),
            *account_links(account),
        ]),
        html.Main(className="ms-main", children=[dash.page_container]),
    ])


def account_links(account: Mapping[str, Any] | None) -> list:
    """Who is signed in (a proxy's identity, as text) and, for a login session, "Sign out":
    a plain link, since /logout is a server route, not a Dash page."""
    if not account:
        return []
    children: list = []
    if account.get("identity"):
        children.append(html.Span(f"Signed in as {account['identity']}", className="ms-account-who"))
    if account.get("session"):
        children.append(html.A("Sign out", href="/logout", className="ms-account-signout"))
    return [html.Div(children, className="ms-account")] if children else []


# -- small pieces ----------------------------------------------------------------------
def empty_state(title: str, *hint: Any, id: str | None = None) -> html.Div:
    kw = {"id": id} if id else {}
    return html.Div(className="ms-empty", children=[html.Div(title, className="ms-empty-title"),
                                                    html.Div(list(hint), className="ms-empty-hint")], **kw)


def no_data(what: str = "spans") -> html.Div:
    return empty_state(f"No {what} in this window.", "Widen the time range, clear filters, or ", *EMPTY_HINT)


def banner(text: str | None, kind: str = "error") -> html.Div | None:
    return html.Div(text, className=f"ms-banner ms-banner-{kind}", role="alert") if text else None


#: An unbroken identifier longer than this many characters is cut with an ellipsis (the
#: whole text in its tooltip) rather than broken mid-word or widening its table.
LONG_WORD = 32
# A cell a number reads in: "1,234", "12.3 ms", "−4 s", "2.5 %", "1.4×", "3.1/min", "12 / 30", "—".
_NUMBER = re.compile(r"^[−+-]?(\d[\d,]*(\.\d+)?|\.\d+)\s?(µs|ms|s|min|%|k|M|×|/min|/s|/day)?$")


def is_number_text(value: Any) -> bool:
    """Whether a cell's text is a number in human units (or several joined by " / ")."""
    if not isinstance(value, str) or not value.strip():
        return False
    return all(_NUMBER.match(part.strip()) for part in value.split(" / "))


def numeric_columns(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """The columns whose every text cell (blanks and "—" aside) is a number: right-aligned."""
    out = set()
    for k, _ in columns:
        values = [r.get(k) for r in rows if r.get(k) not in (None, "", "—")]
        if values and all(is_number_text(v) for v in values):
            out.add(k)
    return out


def cell_text(value: str, cut: bool = True) -> tuple[Any, str]:
    """A text cell that wraps at spaces only, as (content, extra cell class): one unbroken word
    stays on its line (the cell's own ``ms-word`` class, not a wrapper: every component costs
    the browser time on each update, and big tables have hundreds of cells), and one longer
    than ``LONG_WORD`` is cut with an ellipsis, whole in its tooltip."""
    if not cut or any(ch.isspace() for ch in value):
        return value, ""
    if len(value) > LONG_WORD:
        return html.Span(value, className="ms-cut", title=value), ""
    return value, " ms-word"


def text_table(columns: Sequence[tuple[str, str]], rows: Iterable[Mapping[str, Any]], *,
               row_class=None, id: str | None = None, className: str = "ms-table",
               numeric: Iterable[str] = ()) -> html.Table:
    """An HTML table of text cells: ``columns`` = [(key, header)]; a cell may also be a component.

    Number columns (``numeric``, and any whose every cell reads as a number) are right-aligned
    (``col-num``); text wraps at spaces only (``cell_text``), except in key/value tables
    (``ms-kv``), which show span data whole."""
    rows = list(rows)
    numeric = numeric_columns(columns, rows) | set(numeric)
    cut = "ms-kv" not in className.split()

    def cls(k: str) -> str:
        return f"col-{k} col-num" if k in numeric else f"col-{k}"

    head = html.Thead(html.Tr([html.Th(h, className=cls(k)) for k, h in columns]))
    body = []
    for r in rows:
        cells = []
        for k, _ in columns:
            v = r.get(k)
            if v is None or hasattr(v, "to_plotly_json") or isinstance(v, list):
                cells.append(html.Td(v, className=cls(k)))
            else:
                text, extra = (str(v), "") if k in numeric else cell_text(str(v), cut)
                cells.append(html.Td(text, className=cls(k) + extra))
        rc = row_class(r) if row_class else None
        body.append(html.Tr(cells, className=rc) if rc else html.Tr(cells))
    kw = {"id": id} if id else {}
    return html.Table([head, html.Tbody(body)], className=className, **kw)


def panel(title: str, *children: Any, id: str | None = None, className: str = "", actions=None) -> html.Section:
    kw = {"id": id} if id else {}
    head = [html.H2(title, className="ms-panel-title")]
    if actions:
        head.append(html.Div(actions, className="ms-panel-actions"))
    return html.Section(className=f"ms-panel {className}".strip(), children=[html.Div(head, className="ms-panel-head"),
                                                                              *children], **kw)


def loading(*children: Any) -> dcc.Loading:
    return dcc.Loading(type="default", delay_show=250, color="#2563eb", children=list(children))


def graph(component_id: str, **kw) -> dcc.Graph:
    config = {"displaylogo": False,
              "modeBarButtonsToRemove": ["lasso2d", "autoScale2d", "toImage"]}
    config.update(kw.pop("config", {}))
    return dcc.Graph(id=component_id, config=config, className="ms-graph", **kw)


def exemplar_table(rows: list[dict], state: Mapping[str, str], id: str = "drilldown-exemplar-table") -> html.Table:
    """Exemplar traces (``queries.exemplar_traces`` rows), each linking to its trace view."""
    keep = {k: v for k, v in st.carried(state).items() if k in st.TIME_KEYS}
    span_level = any("span_id" in r for r in rows)

    def row(r):
        href = st.to_href(f"/trace/{r['trace_id']}", st.with_(keep, span=r.get("span_id")))
        out = {
            "trace": dcc.Link(r["trace_id"][:16] + "…", href=href, className="ms-mono ms-trace-link",
                              title=r["trace_id"]),
            "start": rfc3339(r["start_unix_nano"]).replace("T", " ").replace("Z", " UTC"),
            "duration": fmt_ms(r["duration_ms"]),
            "root": f"{r['root_service'] or '?'} · {r['root_name'] or '?'}",
            "input_type": r["input_type"],
            "spans": str(r["span_count"]),
            "error": "error" if r["error"] else "",
        }
        if span_level:
            out["span"] = f"{r.get('span_service', '')} · {r.get('span_name', '')}"
            out["span_ms"] = fmt_ms(r.get("span_ms"))
        return out

    cols = [("trace", "trace")]
    if span_level:
        cols += [("span_ms", "matched span"), ("span", "span")]
    cols += [("duration", "trace duration"), ("start", "start"), ("root", "root"), ("input_type", "input type"),
             ("spans", "spans"), ("error", "status")]
    return text_table(cols, [row(r) for r in rows], id=id,
                        row_class=lambda r: "ms-row-error" if r["error"] else None)


# -- toolbar ---------------------------------------------------------------------------
def toolbar(path: str, state: Mapping[str, str], show: Sequence[str] = ("service", "pair", "stage", "input_type"),
            error: str | None = None) -> html.Div:
    """Time-range presets, absolute start/end, and the filter pickers, initialised from the URL.

    Every page renders every control (hidden where it does not apply), so the toolbar's
    one callback finds all its inputs on any page.
    """
    rng = state.get("range") or ("" if state.get("start") else st.DEFAULT_RANGE_LABEL)
    pair = st.pair_value(state.get("caller"), state.get("callee"))

    def picker(key: str, component_id: str, value, placeholder: str, label: str):
        opts = [{"label": option_label(_pair_text(value) if key == "pair" else str(value)), "value": value}] \
            if value else []
        return html.Div(className="ms-filter", style=None if key in show else {"display": "none"}, children=[
            html.Label(label, htmlFor=component_id, className="ms-filter-label"),
            dcc.Dropdown(id=component_id, options=opts, value=value, placeholder=placeholder, clearable=True,
                         className="ms-dropdown", optionHeight=32, maxHeight=320),
        ])

    return html.Div(id=ids.TOOLBAR, className="ms-toolbar", children=[
        dcc.Store(id=ids.TOOLBAR_STATE, data={"path": path, "state": dict(state)}),
        html.Div(className="ms-range", children=[
            html.Span("Time", className="ms-filter-label"),
            dcc.RadioItems(id=ids.RANGE, className="ms-presets", inline=True, value=rng,
                           options=[{"label": p, "value": p} for p in st.PRESETS]
                           + ([{"label": state["range"], "value": state["range"]}]
                              if state.get("range") and state["range"] not in st.PRESETS else [])),
            dcc.Input(id=ids.START, type="text", debounce=True, placeholder="start, e.g. 2026-11-30T14:00Z",
                      value=state.get("start") or "", className="ms-input ms-time", spellCheck=False),
            html.Span("→", className="ms-arrow"),
            dcc.Input(id=ids.END, type="text", debounce=True, placeholder="end (default now)",
                      value=state.get("end") or "", className="ms-input ms-time", spellCheck=False),
            html.Button("Apply", id=ids.APPLY, n_clicks=0, className="ms-button"),
        ]),
        html.Div(className="ms-filters", style=None if show else {"display": "none"}, children=[
            picker("service", ids.SERVICE, state.get("service"), "any service", "Service"),
            picker("pair", ids.PAIR, pair, "any pair", "Pair"),
            picker("stage", ids.STAGE, state.get("stage"), "any stage", "Stage"),
            picker("input_type", ids.INPUT_TYPE, state.get("input_type"), "any input type", "Input type"),
            html.Button("Clear filters", id=ids.CLEAR, n_clicks=0, className="ms-button ms-button-quiet"),
        ]),
        html.Div(error or "", id=ids.TOOLBAR_ERROR, className="ms-toolbar-error", role="alert"),
    ])


def _pair_text(value: str | None) -> str:
    caller, callee = st.parse_pair_value(value)
    return f"{caller or 'any'} → {callee or 'any'}"


# A picker holds at most this many options; typing searches every value on the server
# (the dropdown indexes each option's label for its own search, at a cost that grows with
# the option count and the square of the label's length).
FILTER_OPTIONS = 100
OPTION_LABEL_CHARS = 80


def option_label(text: str) -> str:
    return text if len(text) <= OPTION_LABEL_CHARS else text[: OPTION_LABEL_CHARS - 1] + "…"


def _matching(values: Iterable, text_of, search: str | None, current=None) -> list:
    """The first ``FILTER_OPTIONS`` of ``values`` whose text contains ``search`` (any case),
    and ``current`` (the selected value) among them, so the dropdown keeps it."""
    needle = (search or "").casefold()
    out = []
    for v in values:
        if len(out) >= FILTER_OPTIONS:
            break
        if not needle or needle in text_of(v).casefold():
            out.append(v)
    if current is not None and current not in out:
        out.append(current)
    return out


_VALUES_SECONDS = 5.0  # typing in a picker re-reads the known values at most this often
_values_cache: dict[int, tuple[float, Any, dict]] = {}


def _filter_values(store) -> dict:
    """``queries.filter_options`` of ``store``, kept a few seconds: every keystroke in a
    picker asks again, and reading every series takes a few hundred ms at 20,000 services."""
    from .queries import filter_options

    now = time.monotonic()
    hit = _values_cache.get(id(store))
    if hit is not None and hit[1] is store and now - hit[0] < _VALUES_SECONDS:
        return hit[2]
    values = filter_options(store)
    if len(_values_cache) > 16:
        _values_cache.clear()
    _values_cache[id(store)] = (now, store, values)
    return values


def toolbar_options(state: Mapping[str, Any], service_search: str | None = None,
                    pair_search: str | None = None) -> tuple[list, list, list, list]:
    """The pickers' options (service, pair, stage, input type) for a page's ``state``,
    services and pairs narrowed to those matching what is typed in their picker."""
    values = _filter_values(reader())
    services = _matching(values["services"], str, service_search, state.get("service") or None)
    current = (state.get("caller") or "", state.get("callee") or "")
    pairs = _matching([tuple(p) for p in values["pairs"]], lambda p: f"{p[0]} → {p[1]}", pair_search,
                      current if any(current) else None)
    stages = list(values["stages"])
    if state.get("stage") and state["stage"] not in stages:
        stages.append(state["stage"])
    its = list(values["input_types"])
    if state.get("input_type") and state["input_type"] not in its:
        its.append(state["input_type"])
    return ([{"label": option_label(s), "value": s} for s in services],
            [{"label": option_label(f"{c or 'any'} → {e or 'any'}"), "value": json.dumps([c, e])} for c, e in pairs],
            [{"label": option_label(s), "value": s} for s in stages],
            [{"label": option_label(t), "value": t} for t in its])


# -- callbacks -------------------------------------------------------------------------
def rendering() -> bool:
    """True when a callback runs because its inputs were just rendered (a page was laid out),
    not because a user changed one. Dash reports every input as triggered then, even for
    ``prevent_initial_call`` callbacks whose components a page change inserted; a user
    changes one input at a time."""
    return len(ctx.triggered) > 1


def register_callbacks() -> None:
    """Register the shell's callbacks (``dash.callback``) for the app being built."""
    register_share_callback()

    @dash.callback(
        [Output(link_id, "href") for _, _, link_id in NAV_ITEMS]
        + [Output(link_id, "className") for _, _, link_id in NAV_ITEMS],
        Input(ids.URL, "pathname"),
        Input(ids.URL, "search"),
    )
    def _nav_links(pathname, search):
        from urllib.parse import parse_qs

        state = st.from_query({k: v for k, v in parse_qs((search or "").lstrip("?")).items()})
        keep = st.carried(state)
        hrefs = [st.to_href(path, keep) for path, _, _ in NAV_ITEMS]
        current = pathname or "/"
        classes = []
        for path, _, _ in NAV_ITEMS:
            active = current == path or (path != "/" and current.startswith(path + "/"))
            classes.append("ms-nav-link active" if active else "ms-nav-link")
        return hrefs + classes

    @dash.callback(
        Output(ids.URL, "href", allow_duplicate=True),
        Output(ids.TOOLBAR_ERROR, "children"),
        Input(ids.RANGE, "value"),
        Input(ids.APPLY, "n_clicks"),
        Input(ids.START, "n_submit"),
        Input(ids.END, "n_submit"),
        Input(ids.SERVICE, "value"),
        Input(ids.PAIR, "value"),
        Input(ids.STAGE, "value"),
        Input(ids.INPUT_TYPE, "value"),
        Input(ids.CLEAR, "n_clicks"),
        State(ids.START, "value"),
        State(ids.END, "value"),
        State(ids.TOOLBAR_STATE, "data"),
        prevent_initial_call=True,
    )
    def _toolbar(rng, _apply, _s1, _s2, service, pair, stage, input_type, _clear, start, end, data):
        if rendering():
            return no_update, no_update
        data = data or {}
        href, error = links.toolbar_href(data.get("path") or "/", data.get("state") or {}, ctx.triggered_id,
                                   {"range": rng, "start": start, "end": end, "service": service, "pair": pair,
                                    "stage": stage, "input_type": input_type})
        if href is None:
            return no_update, error
        current = st.to_href(data.get("path") or "/", data.get("state") or {})
        return (no_update if href == current else href), ""

    @dash.callback(
        Output(ids.SERVICE, "options"),
        Output(ids.PAIR, "options"),
        Output(ids.STAGE, "options"),
        Output(ids.INPUT_TYPE, "options"),
        Input(ids.TOOLBAR_STATE, "data"),
        Input(ids.SERVICE, "search_value"),
        Input(ids.PAIR, "search_value"),
    )
    def _filter_options(data, service_search, pair_search):
        state = (data or {}).get("state") or {}
        opts = toolbar_options(state, service_search, pair_search)
        if not rendering() and ctx.triggered_id == ids.SERVICE:  # typing: only that picker changes
            return opts[0], no_update, no_update, no_update
        if not rendering() and ctx.triggered_id == ids.PAIR:
            return no_update, opts[1], no_update, no_update
        return opts


def narrow(path: str, state, selected, relayout):
    """Callback answer for a box-select/zoom on a time chart."""
    href = links.narrow_href(path, state or {}, selected, relayout)
    return no_update if href is None else href


# -- findings ----------------------------------------------------------------
SEVERITY_ORDER = ("critical", "warning", "info")


def thresholds():
    """The detectors' thresholds (environment), read once per app like ``/api/v1/anomalies``."""
    from flask import current_app

    from .detectors import Thresholds

    return Thresholds.kept_in(current_app.extensions["modalscope"])


def find_findings(res, state: Mapping[str, Any]):
    """The same findings ``/api/v1/anomalies`` returns, most severe first, as an
    ``evaluations.Evaluation`` (a window ending now may be answered by the worker's
    evaluation of up to 90 s ago; ``evaluation_note`` says so)."""
    from . import evaluations

    return evaluations.find_for(reader(), res.window, res.filters, thresholds(),
                                relative=evaluations.ends_now(state))


def evaluation_note(ev) -> str:
    """Plain text: which window the findings cover and when they were evaluated."""
    from .params import rfc3339

    def hm(ns: int) -> str:
        return rfc3339(ns)[11:19]

    when = f"evaluated at {hm(ev.evaluated_ns)} UTC" + (" (a stored evaluation)" if ev.stored else "")
    return (f"{when} over {rfc3339(ev.start_ns)[:16].replace('T', ' ')} → "
            f"{rfc3339(ev.end_ns)[:16].replace('T', ' ')} UTC")


def subject_text(subject: Mapping[str, Any]) -> str:
    """A finding's subject as plain text (values are span data: shown, never interpreted)."""
    from .panels import subject_text as text  # one definition, shared with the embeds

    return text(subject)


def evidence_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)[:200]
    return str(value)


def finding_links(f: Mapping[str, Any], state: Mapping[str, str], n_traces: int = 5) -> list:
    """Drilldown, Compare (and Cache) for the finding's subject and window, and its exemplar traces."""
    out = [dcc.Link("drilldown", href=links.finding_drill_href(f), className="ms-finding-link"),
           dcc.Link("compare", href=links.finding_compare_href(f), className="ms-finding-link")]
    cache_href = links.finding_cache_href(f)
    if cache_href:
        out.append(dcc.Link("cache", href=cache_href, className="ms-finding-link"))
    window = links.finding_window(f)
    traces = []
    for tid in (f.get("exemplar_trace_ids") or [])[:n_traces]:
        href = links.trace_href(tid, window or state)
        if href:
            traces.append(dcc.Link(str(tid)[:12] + "…", href=href, className="ms-mono ms-trace-link", title=str(tid)))
    if traces:
        out.append(html.Span("traces:", className="ms-note"))
        out.extend(traces)
    return out


def finding_title(f: Mapping[str, Any]) -> list:
    sev = str(f.get("severity", "info"))
    return [html.Span(sev, className=f"ms-severity ms-severity-{sev}"), " ",
            html.Strong(str(f.get("kind", ""))), " — ", html.Span(subject_text(f.get("subject") or {}))]


def top_findings(found: list[dict], state: Mapping[str, str], n: int = 3) -> html.Div:
    """The overview's panel: the ``n`` most severe findings with their links, findings that
    name a mechanism (the likely causes) before symptoms, most severe first within each."""
    from .incidents import is_cause

    if not found:
        return empty_state("No findings in this window.",
                           "The anomaly catalog (band breaks, hot spots, cache penetration, regressions …) "
                           "found nothing that needs attention.")
    items = []
    for f in sorted(found, key=lambda f: not is_cause(f))[:n]:
        items.append(html.Li(className="ms-finding", children=[
            html.Div(finding_title(f), className="ms-finding-title"),
            html.Div(span_text(f.get("start"), f.get("end")), className="ms-note"),
            html.Div(finding_links(f, state, n_traces=2), className="ms-finding-links"),
        ]))
    more = dcc.Link(f"all {len(found)} findings →", href=st.to_href("/anomalies", st.carried(state)),
                    id="overview-all-findings")
    return html.Div([html.Ul(items, className="ms-finding-list", id="overview-findings-list"), more])


# -- share control -----------------------------------------------------------
SHARE_TTLS = ((0, "not signed"), (86400, "1 day"), (7 * 86400, "7 days"), (30 * 86400, "30 days"))


def _share_secret() -> str:
    """MODALSCOPE_SECRET_KEY of the app serving this request ('' outside one)."""
    from flask import current_app, has_app_context

    return current_app.extensions["modalscope"]["settings"].secret_key if has_app_context() else ""


def _base_url() -> str:
    """This site's root as the browser reached it (through the proxy's host when trusted)."""
    from flask import has_request_context, request

    return request.url_root if has_request_context() else "/"


def share_values(panel: str, params: Mapping[str, str], ttl_seconds: int = 0) -> tuple[dict | None, str]:
    """The Share control's values: ``panels.share_urls`` (what ``/api/v1/share`` answers),
    signed when ``ttl_seconds`` > 0 and MODALSCOPE_SECRET_KEY is set; else (None, why not)."""
    from . import panels
    from .params import ParamError

    if panel not in panels.PANELS:
        return None, f"unknown panel {panel[:64]!r}"
    secret = _share_secret()
    try:
        values = panels.share_urls(_base_url(), panel, params, secret=secret,
                                   ttl_seconds=ttl_seconds or None, sign=bool(secret and ttl_seconds))
    except ParamError as exc:
        return None, f"{exc.parameter}: {exc.message}"
    if values["signed"]:
        note = (f"Signed: opens this panel read-only without a login until {values['expires']}; "
                "changing its time or filters voids the signature (width, height and theme stay free).")
    elif secret:
        note = "Not signed: whoever opens these needs access to the dashboard. Sign them to share without a login."
    else:
        note = "Not signed (set MODALSCOPE_SECRET_KEY to sign read-only, expiring links)."
    return values, note


def _share_field(label: str, kind: str, panel: str, value: str) -> html.Div:
    field_id = ids.share_id(kind, panel)
    return html.Div(className="ms-share-field", children=[
        html.Label(label, className="ms-filter-label"),
        html.Div(className="ms-share-row", children=[
            dcc.Input(id=field_id, type="text", value=value, readOnly=True, spellCheck=False,
                      className="ms-input ms-share-value"),
            dcc.Clipboard(target_id=field_id, title="copy", className="ms-share-copy"),
        ]),
    ])


def share_control(panel: str, state: Mapping[str, Any], trace_id: str | None = None) -> html.Details:
    """The "Share" button beside a panel: a popover with the deep link, the embed URL, the
    iframe snippet and the PNG URL in read-only fields with copy buttons, and (with
    MODALSCOPE_SECRET_KEY set) "signed, expires in 1 day | 7 days | 30 days", signed on the
    server by the same function as ``/api/v1/share``."""
    from . import panels

    params = panels.panel_params(panels.PANELS[panel], state, trace_id)
    values, note = share_values(panel, params)
    values = values or {}
    body = [
        dcc.Store(id=ids.share_id(ids.SHARE_QUERY, panel), data={"panel": panel, "params": params}),
        _share_field("Link to this view", ids.SHARE_LINK, panel, values.get("link", "")),
        _share_field("Embed URL (Notion, iframe macros)", ids.SHARE_EMBED, panel, values.get("embed_url", "")),
        _share_field("iframe snippet (HTML)", ids.SHARE_IFRAME, panel, values.get("iframe", "")),
        _share_field("PNG image (GitHub wiki, Markdown)", ids.SHARE_IMAGE, panel, values.get("image_url", "")),
    ]
    if _share_secret():
        body.append(html.Div(className="ms-share-sign", children=[
            html.Span("Signed, expires in", className="ms-filter-label"),
            dcc.RadioItems(id=ids.share_id(ids.SHARE_TTL, panel), value=0, inline=True, className="ms-share-ttl",
                           options=[{"label": label, "value": seconds} for seconds, label in SHARE_TTLS]),
        ]))
    body.append(html.Div(note, id=ids.share_id(ids.SHARE_NOTE, panel), className="ms-note ms-share-note"))
    return html.Details(id=ids.share_id(ids.SHARE, panel), className="ms-share", children=[
        html.Summary("Share", className="ms-share-button", title="link, embed and image of this panel"),
        html.Div(body, className="ms-share-pop"),
    ])


def register_share_callback() -> None:
    """Signing happens on the server: the chosen lifetime comes in, signed URLs go out."""
    from dash import MATCH

    @dash.callback(
        Output(ids.share_id(ids.SHARE_LINK, MATCH), "value"),
        Output(ids.share_id(ids.SHARE_EMBED, MATCH), "value"),
        Output(ids.share_id(ids.SHARE_IFRAME, MATCH), "value"),
        Output(ids.share_id(ids.SHARE_IMAGE, MATCH), "value"),
        Output(ids.share_id(ids.SHARE_NOTE, MATCH), "children"),
        Input(ids.share_id(ids.SHARE_TTL, MATCH), "value"),
        State(ids.share_id(ids.SHARE_QUERY, MATCH), "data"),
        prevent_initial_call=True,
    )
    def _share(ttl, data):
        data = data or {}
        try:
            ttl_seconds = int(ttl or 0)
        except (TypeError, ValueError):
            ttl_seconds = 0
        if ttl_seconds not in {s for s, _ in SHARE_TTLS}:
            ttl_seconds = 0
        values, note = share_values(str(data.get("panel") or ""), data.get("params") or {}, ttl_seconds)
        if values is None:
            return "", "", "", "", note
        return values["link"], values["embed_url"], values["iframe"], values["image_url"], note


# -- incidents -----------------------------------------------------------------
# (observed, baseline, how to show them): the first pair a finding's evidence holds is its
# measure, e.g. "P99 11.4 s vs 2.79 s".
MEASURES = (
    ("p99_ms", "baseline_p99_ms", "P99", "ms"),
    ("p95_ms", "baseline_p95_ms", "P95", "ms"),
    ("first_median_ms", "steady_median_ms", "first requests' median", "ms"),
    ("median_spread_ms", "baseline_spread_ms", "median sync wait", "ms"),
    ("share", "baseline_share", "share of time", "pct"),
    ("hit_rate", "baseline_hit_rate", "hit rate", "pct"),
    ("batch_one_share", "baseline_batch_one_share", "batches of one", "pct"),
    ("fallback_share", "baseline_fallback_share", "CUDA graph fallbacks", "pct"),
)


def kind_text(kind: Any) -> str:
    """A finding kind as words: ``cold_start`` → "cold start"."""
    return str(kind or "").replace("_", " ")


def finding_measure(f: Mapping[str, Any]) -> str:
    """The finding's headline number against its baseline, in human units ('' when none)."""
    from .units import fmt_pct

    ev = f.get("evidence") if isinstance(f.get("evidence"), Mapping) else {}
    if isinstance(ev.get("max_duration_ms"), (int, float)) and isinstance(ev.get("ceiling_s"), (int, float)):
        from .units import evidence_measure  # "longest 29.97 s vs ceiling 30 s": just under it

        return evidence_measure({k: ev[k] for k in ("max_duration_ms", "ceiling_s")})
    for obs, base, label, unit in MEASURES:
        o, b = ev.get(obs), ev.get(base)
        if isinstance(o, (int, float)) and not isinstance(o, bool):
            fmt = fmt_ms if unit == "ms" else fmt_pct
            vs = f" vs {fmt(b)}" if isinstance(b, (int, float)) and not isinstance(b, bool) else ""
            return f"{label} {fmt(o)}{vs}"
    return ""


def incident_headline(i: Mapping[str, Any]) -> list:
    """Severity badge, the headline finding's kind and subject, and its measure."""
    head = i.get("headline") if isinstance(i.get("headline"), Mapping) else {}
    sev = str(i.get("severity", "info"))
    measure = finding_measure(head)
    return [html.Span(sev, className=f"ms-severity ms-severity-{sev}"), " ",
            html.Strong(kind_text(head.get("kind"))), " — ", html.Span(subject_text(head.get("subject") or {})),
            *([html.Span(f" · {measure}", className="ms-incident-measure")] if measure else [])]


def span_text(start: Any, end: Any) -> str:
    """An incident's span as "2025-11-30 10:30 → 10:35 UTC" (the date once when it is one day)."""
    s, e = str(start or ""), str(end or "")
    if len(s) < 16 or len(e) < 16:
        return f"{s} → {e}"
    e_short = e[11:16] if s[:10] == e[:10] else e[:16].replace("T", " ")
    return f"{s[:16].replace('T', ' ')} → {e_short} UTC"


def incident_cause(i: Mapping[str, Any]) -> html.Div:
    """"Cause: <headline kind>" when a mechanism was found, else Compare's suspects."""
    if i.get("cause_known"):
        head = i.get("headline") or {}
        return html.Div(["Likely cause: ", html.Strong(kind_text(head.get("kind"))), " on ",
                         subject_text(head.get("subject") or {})], className="ms-incident-cause")
    parts = []
    for s in i.get("suspects") or []:
        if "stage" in s:
            parts.append(f"stage {s['stage']} ({fmt_pct_safe(s.get('added_share'))} of the added time)")
        else:
            parts.append(f"{s.get('key')}={s.get('value')} (×{float(s.get('lift') or 0):.2g})")
    text = "; ".join(str(p) for p in parts[:3]) or "none found"
    return html.Div(["Cause unknown — suspects: ", text], className="ms-incident-cause")


def fmt_pct_safe(v: Any) -> str:
    from .units import fmt_pct

    return fmt_pct(float(v), 0) if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"


def incident_card(i: Mapping[str, Any], href: str) -> html.Li:
    """The overview's card of one incident: badge, headline, span, "+N related findings",
    cause or suspects, and ``href`` (the incident on the Anomalies page)."""
    related = max(len(i.get("findings") or []) - 1, 0)
    sev = str(i.get("severity", "info"))
    return html.Li(className=f"ms-finding ms-incident ms-finding-{sev}", id=f"overview-incident-{i.get('id', '')}",
                   children=[
        html.Div(incident_headline(i), className="ms-finding-title"),
        html.Div([span_text(i.get("start"), i.get("end")),
                  f" · +{related} related finding{'' if related == 1 else 's'}" if related else ""],
                 className="ms-note"),
        incident_cause(i),
        html.Div(dcc.Link("open incident →", href=href, className="ms-finding-link ms-incident-link"),
                 className="ms-finding-links"),
    ])
