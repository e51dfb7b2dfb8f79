"""Overview (``/``): the top incidents (findings grouped under their likely cause), the
reference input-type table computed live against a baseline, request rate and P99 over time,
the top findings, and tokens per request by input type and model.

The incidents must not slow the page: ``incidents.incidents`` judges each incident again
over its own span (a catalog run per incident, seconds on a cold store). The overview
takes those judgements only from stored evaluations (``incidents.cached_finder``: what the
Anomalies page or ``/api/v1/incidents`` computed before); when one is missing it groups the
window's own findings without reruns (``incidents.window_incidents``) and says so.

URL state: the window and filters, ``baseline=text:320:410,image:1300:2100,...`` (P50 and
P95 in ms per input type; unnamed types keep the reference figures) and ``margin`` (percent
over the baseline P95 that counts as a regression, default 10).
"""

from __future__ import annotations

import logging

import dash
from dash import Input, Output, State, dcc, html

from modalscope.app import components as c
from modalscope.app import evaluations
from modalscope.app import incidents as inc
from modalscope.app import figures, ids, links, queries, tokens
from modalscope.app import state as st
from modalscope.app.panels import baseline_status
from modalscope.app.units import fmt_count, fmt_ms, fmt_num, fmt_pct
from modalscope.models.reader import Filters

dash.register_page(__name__, path="/", name="Overview", title="modalscope · overview", order=0)

PATH = "/"

log = logging.getLogger(__name__)


def layout(**query):
    state = st.from_query(query)
    res = st.resolve(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.OV_STATE, data=state),
        c.toolbar(PATH, state, show=("service", "input_type"), error=res.error),
        c.panel("Top incidents", c.loading(html.Div(id=ids.OV_INCIDENTS)),
                actions=dcc.Link("all incidents", href=st.to_href("/anomalies", st.carried(state)))),
        c.panel("Input types vs baseline", c.loading(html.Div(id=ids.OV_TABLE)),
                actions=[html.Span("baseline: the reference P50/P95 (text 320/410 ms, image 1.3/2.1 s, "
                                   "multi_image 3.7/6.4 s) unless the URL sets baseline=", className="ms-note"),
                         c.share_control("input-types", state)]),
        html.Div(className="ms-grid-2-1", children=[
            c.panel("Request rate and P99 over time", c.loading(c.graph(ids.OV_TRAFFIC)),
                    actions=[html.Span("box-select to narrow the window", className="ms-note"),
                             dcc.Link("Compare this window →", href=links.compare_href(state), id=ids.OV_COMPARE,
                                      className="ms-compare-link")]),
            c.panel("Top findings (causes first)", c.loading(html.Div(id=ids.OV_FINDINGS)),
                    actions=dcc.Link("all findings", href=st.to_href("/anomalies", st.carried(state)))),
        ]),
        c.panel("Tokens per request by input type and model", c.loading(html.Div(id=tokens.OV_TOKENS)),
                actions=html.Span("mean tokens a model call, from the calls' reported usage", className="ms-note")),
    ])


def _margin(state) -> tuple[float, str | None]:
    raw = state.get("margin")
    if not raw:
        return queries.DEFAULT_MARGIN, None
    try:
        v = float(raw)
    except ValueError:
        return queries.DEFAULT_MARGIN, f"margin must be a number of percent, not {raw!r}"
    if not 0 <= v <= 1000:
        return queries.DEFAULT_MARGIN, "margin must be between 0 and 1000 (percent)"
    return v / 100, None


def overview_table(rows, state, margin):
    """The input-type table: live P50/P95/P99 and bottleneck stage against the baseline."""
    keep = st.carried(state)

    def row(r):
        it = r["input_type"]
        status = baseline_status(r)
        link = dcc.Link(it, href=st.to_href("/drilldown", st.with_(keep, input_type=it, caller=None, callee=None,
                                                                    stage=None, service=None)))
        return {
            "input_type": link,
            "count": fmt_count(r["count"]),
            "rate": f"{fmt_num(r['rate_per_min'])}/min" if r["count"] else "—",
            "p50": fmt_ms(r["p50_ms"]),
            "p95": fmt_ms(r["p95_ms"]),
            "p99": fmt_ms(r["p99_ms"]),
            "baseline": (f"{fmt_ms(r['baseline_p50_ms'])} / {fmt_ms(r['baseline_p95_ms'])}"
                         if r["baseline_p95_ms"] else "—"),
            "bottleneck": r["bottleneck_stage"] or "—",
            "errors": fmt_pct(r["error_rate"]) if r["count"] else "—",
            "status": html.Span(status, className="ms-regression" if r["regression"] else "ms-ok"),
            "_regression": r["regression"],
        }

    cols = [("input_type", "input type"), ("count", "traces"), ("rate", "rate"), ("p50", "P50"), ("p95", "P95"),
            ("p99", "P99"), ("baseline", "baseline P50 / P95"), ("bottleneck", "bottleneck stage"),
            ("errors", "errors"), ("status", f"vs baseline (margin {margin * 100:g} %)")]
    return c.text_table(cols, [row(r) for r in rows], id="overview-input-types",
                        numeric=("count", "rate", "p50", "p95", "p99", "baseline", "errors"), row_class=lambda r: "ms-row-regression" if r["_regression"] else None)


@dash.callback(
    Output(ids.OV_TABLE, "children"),
    Output(ids.OV_TRAFFIC, "figure"),
    Input(ids.OV_STATE, "data"),
)
def _fill(state):
    state = state or {}
    res = st.resolve(state)
    reader = c.reader()
    margin, margin_error = _margin(state)
    notes = []
    try:
        baseline = queries.parse_baseline(state.get("baseline"))
    except ValueError as exc:
        baseline = dict(queries.SEED_BASELINE)
        notes.append(c.banner(f"baseline: {exc}; using the reference figures"))
    if margin_error:
        notes.append(c.banner(margin_error))
    rows = queries.overview_rows(reader, res.window, res.filters, baseline, margin)
    traffic = queries.traffic_series(reader, res.window, res.filters, st.step_minutes(res.window))
    if not any(r["count"] for r in rows):
        table = html.Div([*notes, c.no_data("traces"),
                          overview_table(rows, state, margin)])
    else:
        table = html.Div([*notes, overview_table(rows, state, margin)])
    return table, figures.traffic_figure(traffic)


def tokens_table(rows: list[dict]) -> html.Table:
    """Per input type and model: model calls that reported usage, mean input tokens a call
    per modality and mean output tokens a call (``tokens.model_tokens`` rows)."""
    return c.text_table(tokens.table_columns(rows), [tokens.table_cells(r) for r in rows], id=tokens.OV_TOKENS_TABLE)


@dash.callback(
    Output(tokens.OV_TOKENS, "children"),
    Input(ids.OV_STATE, "data"),
)
def _tokens(state):
    res = st.resolve(state or {})
    rows = tokens.model_tokens(c.reader(), res.window, res.filters)
    if not rows:
        return c.empty_state("No token usage in this window.",
                             "Model calls report it as gen_ai.usage.* (OTel GenAI) or llm.token_count.* "
                             "(OpenInference) attributes.")
    return tokens_table(rows)


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.OV_TRAFFIC, "selectedData"),
    Input(ids.OV_TRAFFIC, "relayoutData"),
    State(ids.OV_STATE, "data"),
    prevent_initial_call=True,
)
def _narrow(selected, relayout, state):
    return c.narrow(PATH, state, selected, relayout)


@dash.callback(
    Output(ids.OV_FINDINGS, "children"),
    Input(ids.OV_STATE, "data"),
)
def _findings(state):
    state = state or {}
    res = st.resolve(state)
    try:
        found = c.find_findings(res, state).findings
    except Exception:  # noqa: BLE001 - the overview stands without its findings panel
        log.exception("overview: findings failed")
        return c.banner("The anomaly catalog failed for this window; see the server log.")
    return c.top_findings(found, state, n=3)


def incidents_for(res, state) -> tuple[list, bool]:
    """The window's incidents, most severe first, and whether each was judged over its own
    span (from stored evaluations) rather than over the window only (see the module doc)."""
    reader, th = c.reader(), c.thresholds()
    ev = evaluations.find_for(reader, res.window, Filters(), th, relative=evaluations.ends_now(state))
    try:
        return inc.incidents(reader, res.window, inc.cached_finder(reader, th), res.filters, found=ev.findings,
                             with_suspects=False), True
    except inc.NotJudged:
        return inc.window_incidents(reader, res.window, ev.findings, res.filters, suspects_for=0), False


TOP_INCIDENTS = 3


def top_incidents(found: list, state, judged: bool, n: int = TOP_INCIDENTS) -> html.Div:
    """The overview's panel: the ``n`` most severe incidents, each linking to its section on
    the Anomalies page."""
    if not found:
        return c.empty_state("No incidents in this window.",
                             "The anomaly catalog found nothing that needs attention.")
    # (suspects: each card's own request, ``components.incident_cause``)
    cards = [c.incident_card(i, inc.incident_page_href(i.id, state), later=True) for i in found[:n]]
    note = [] if judged else [html.Div("Judged over this window only; the Anomalies page judges each incident "
                                       "over its own span.", className="ms-note", id="overview-incidents-note")]
    more = dcc.Link(f"all {len(found)} incidents →", href=inc.page_href(state), id="overview-all-incidents")
    return html.Div([html.Ul(cards, className="ms-finding-list", id=ids.OV_INCIDENT_LIST), *note, more])


@dash.callback(
    Output(ids.OV_INCIDENTS, "children"),
    Input(ids.OV_STATE, "data"),
)
def _incidents(state):
    state = state or {}
    res = st.resolve(state)
    try:
        found, judged = incidents_for(res, state)
    except Exception:  # noqa: BLE001 - the overview stands without its incidents panel
        log.exception("overview: incidents failed")
        return c.banner("The anomaly catalog failed for this window; see the server log.")
    return top_incidents(found, state, judged)
