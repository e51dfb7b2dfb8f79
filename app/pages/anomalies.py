"""Anomalies (``/anomalies``): the anomaly catalog's findings in the window, most severe
first (the same ``app.findings.find`` as ``/api/v1/anomalies``), each with its evidence
numbers, the hint, a small chart of its subject's P50/P99 with the finding's window
shaded, and links to the drilldown, Compare and its exemplar traces. URL state: window
and filters (a filter keeps the findings whose subject names it).

The list comes first and each chart after it, in its own request (a pattern-matching
callback per card, as a dashboard loads its panels): a dozen charts over a day took half of
the page's 300 ms budget and most of its bytes on a slow machine.
"""

from __future__ import annotations

from datetime import datetime, timezone

import dash
from dash import MATCH, Input, Output, dcc, html

from modalscope.app import components as c
from modalscope.app import figures, findings, ids, links, queries
from modalscope.app import state as st
from modalscope.app.params import ParamError, Window, parse_time
from modalscope.models.reader import Filters

dash.register_page(__name__, path="/anomalies", name="Anomalies", title="modalscope · anomalies", order=6)

PATH = "/anomalies"
MAX_CHARTS = 12
CONTEXT_NS = 45 * 60_000_000_000  # before the finding's window, on its chart
# A finding's window is at most the detectors' longest (its run may start in the baseline
# look-back before the judged window): a longer one came from an edited request.
MAX_CHART_S = findings.MAX_WINDOW_S + 2 * 3600
# What a card's chart shows until its callback draws it: no template, a few bytes.
PLACEHOLDER = {"data": [], "layout": {"height": 180, "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
                                      "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                      "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)"}}


def evidence_window(f: dict) -> tuple[Window, int, int] | None:
    try:
        s, e = parse_time(str(f["start"]), "start"), parse_time(str(f["end"]), "end")
    except (KeyError, ParamError):
        return None
    return Window(s - CONTEXT_NS, e + CONTEXT_NS // 3), s, e


def _chart(f: dict, i: int):
    """The card's chart, empty until its own callback (``_fill_chart``) draws it."""
    if evidence_window(f) is None:
        return None
    spec = {"start": str(f["start"]), "end": str(f["end"]), "subject": links.finding_filters(f)}
    return html.Div([html.Div(f"P50 / P99 of {queries.subject_label(Filters(**spec['subject']))}",
                              className="ms-note"),
                     dcc.Store(id={"type": ids.AN_CHART_SPEC, "index": i}, data=spec),
                     c.loading(c.graph({"type": ids.AN_CHART, "index": i}, figure=PLACEHOLDER,
                                       config={"displayModeBar": False}))])


def chart_figure(spec: dict | None):
    """A finding's chart: its subject's P50/P99 around its window (``spec``: the card's
    store, which the browser sends back, so it is checked like a query)."""
    spec = spec if isinstance(spec, dict) else {}
    subject = spec.get("subject") if isinstance(spec.get("subject"), dict) else {}
    ew = evidence_window({**spec, "subject": subject})
    if ew is None:
        return figures.empty_figure("This finding has no valid window.", 180)
    window, s, e = ew
    if window.seconds > MAX_CHART_S:
        return figures.empty_figure("This finding's window is too long to chart.", 180)
    filters = Filters(**links.finding_filters({"subject": subject}))
    rows = queries.percentile_series(c.reader(), window, filters, st.step_minutes(window, 60))
    return figures.evidence_figure(rows, datetime.fromtimestamp(s / 1e9, tz=timezone.utc),
                                   datetime.fromtimestamp(e / 1e9, tz=timezone.utc))


@dash.callback(
    Output({"type": ids.AN_CHART, "index": MATCH}, "figure"),
    Input({"type": ids.AN_CHART_SPEC, "index": MATCH}, "data"),
)
def _fill_chart(spec):
    return chart_figure(spec)


def _chart_or_blank(f: dict, i: int, chart: bool):
    out = _chart(f, i) if chart else None
    return html.Div() if out is None else out


def finding_card(f: dict, i: int, state: dict, chart: bool) -> html.Article:
    evidence = f.get("evidence") or {}
    ev_rows = [{"name": str(k), "value": c.evidence_text(v)} for k, v in evidence.items()]
    return html.Article(className=f"ms-panel ms-finding-card ms-finding-{f.get('severity', 'info')}", children=[
        html.Div(c.finding_title(f), className="ms-finding-title"),
        html.Div(f"{f.get('start', '')} → {f.get('end', '')}", className="ms-note"),
        html.P(str(f.get("hint") or ""), className="ms-finding-hint"),
        html.Div(className="ms-grid-2", children=[
            c.text_table([("name", "evidence"), ("value", "value")], ev_rows, className="ms-table ms-evidence"),
            _chart_or_blank(f, i, chart),
        ]),
        html.Div(c.finding_links(f, state), className="ms-finding-links"),
    ])


def layout(**query):
    state = st.from_query(query)
    res = st.resolve(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.AN_STATE, data=state),
        c.toolbar(PATH, state, error=res.error),
        html.Div(c.share_control("anomalies", state), className="ms-share-bar"),
        c.loading(html.Div(id=ids.AN_LIST)),
    ])


@dash.callback(
    Output(ids.AN_LIST, "children"),
    Input(ids.AN_STATE, "data"),
)
def _fill(state):
    state = state or {}
    res = st.resolve(state)
    ev = c.find_findings(res, state)
    found = ev.findings
    if not found:
        return c.empty_state("No findings in this window.",
                             "Nothing in the anomaly catalog fired. Widen the time range, clear filters, or ",
                             *c.EMPTY_HINT)
    counts = {s: sum(1 for f in found if f.get("severity") == s) for s in c.SEVERITY_ORDER}
    head = html.Div([html.Span(" · ".join(f"{n} {s}" for s, n in counts.items() if n), id="anomalies-counts"),
                     html.Span(" — " + c.evaluation_note(ev), id="anomalies-evaluated")], className="ms-note")
    return html.Div([head, html.Div([finding_card(f, i, state, i < MAX_CHARTS) for i, f in enumerate(found)],
                                    id="anomalies-findings")])
