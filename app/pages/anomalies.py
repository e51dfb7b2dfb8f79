"""Anomalies (``/anomalies``): the anomaly catalog's findings in the window (the same as
``/api/v1/anomalies``) grouped by incident (``/api/v1/incidents``): a section per incident,
most severe first, headed by its likely cause (or its leading symptom and Compare's
suspects), with the window's findings it folds under it. Each finding card has its evidence
numbers in their units, the hint (a folded symptom's links to its incident), a small chart of
what fired it over time (``evidence_series``: the subject's percentiles, a hit rate, a share,
a spread) with the threshold, ceiling or baseline it is judged against as a labelled line and
the finding's window shaded, and links to the drilldown, Compare and its exemplar traces. Findings the incidents judged over their own spans leave out are
listed last. URL state: window and filters (a filter keeps the incidents one of whose
findings names it), ``kind=`` (incidents with a finding of that kind), ``severity=`` and
``incident=<id>`` (that incident first, marked; its section's anchor is ``#incident-<id>``).

The list comes first and each chart after it, in its own request (a pattern-matching
callback per card, as a dashboard loads its panels): a dozen charts over a day took much of
the page's 300 ms budget and most of its bytes on a slow machine. The first ``MAX_CHARTS``
cards shown get a chart, and so does the first card of every other kind.
"""

from __future__ import annotations

import dash
from dash import MATCH, Input, Output, dcc, html

from modalscope.app import components as c
from modalscope.app import evaluations, findings, ids
from modalscope.app import incidents as inc
from modalscope.app import state as st
from modalscope.core.findings import Finding, Incident
from modalscope.models.reader import Filters

# The parts, re-exported: tests and callers reach them through the page module.
from modalscope.app.pages._anomaly_cards import (  # noqa: F401
    ID_RE, KIND_RE, MAX_CHARTS, chart_budget, filter_links, finding_card, folded_hint, incident_section)
from modalscope.app.pages._anomaly_charts import (  # noqa: F401
    CHART_HEIGHT, CONTEXT_NS, MAX_CHART_S, PLACEHOLDER, chart_figure, chart_spec, chart_title, evidence_series,
    evidence_window)

dash.register_page(__name__, path="/anomalies", name="Anomalies", title="modalscope · anomalies", order=6)

PATH = "/anomalies"


@dash.callback(
    Output({"type": ids.AN_CHART, "index": MATCH}, "figure"),
    Input({"type": ids.AN_CHART_SPEC, "index": MATCH}, "data"),
)
def _fill_chart(spec):
    return chart_figure(spec)


def page_keys(query) -> tuple[dict[str, str], list[str]]:
    """``kind``, ``severity`` and ``incident`` from the URL, checked: (kept, what was wrong)."""
    out, errors = {}, []
    checks = {"kind": KIND_RE.fullmatch, "severity": lambda v: v in c.SEVERITY_ORDER, "incident": ID_RE.fullmatch}
    for key, ok in checks.items():
        value = (query or {}).get(key)
        if isinstance(value, (list, tuple)):
            value = value[-1] if value else None
        if value in (None, ""):
            continue
        value = str(value).strip()[:64]
        if ok(value):
            out[key] = value
        else:
            errors.append(f"{key}: {value!r} is not " + {"kind": "a finding kind",
                                                         "severity": "critical, warning or info",
                                                         "incident": "an incident id (16 hex digits)"}[key])
    return out, errors


def layout(**query):
    state = st.from_query(query)
    res = st.resolve(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.AN_STATE, data={**state, **{k: v for k, v in query.items() if k in inc.PAGE_KEYS}}),
        c.toolbar(PATH, state, error=res.error),
        html.Div(c.share_control("anomalies", state), className="ms-share-bar"),
        c.loading(html.Div(id=ids.AN_LIST)),
    ])


def page_incidents(res, state: dict) -> tuple[evaluations.Evaluation, list[Incident]]:
    """The window's findings (as ``/api/v1/anomalies``) and incidents (as ``/api/v1/incidents``)."""
    reader, th = c.reader(), c.thresholds()
    ev = evaluations.find_for(reader, res.window, Filters(), th, relative=evaluations.ends_now(state))

    def finder(w):  # an incident's own span: an absolute window, stored once evaluated
        return evaluations.find_for(reader, w, Filters(), th, relative=False).findings

    # (suspects: each incident's own request, ``components.incident_cause``)
    return ev, inc.incidents(reader, res.window, finder, res.filters, found=ev.findings, with_suspects=False)


@dash.callback(
    Output(ids.AN_LIST, "children"),
    Input(ids.AN_STATE, "data"),
)
def _fill(state):
    state = state or {}
    page, errors = page_keys(state)
    state = st.from_query(state)
    res = st.resolve(state)
    ev, all_incidents = page_incidents(res, state)
    found = [f for f in ev.findings if findings.matches(f, res.filters)]
    notes = [c.banner(e) for e in errors]
    if not found and not all_incidents:
        return html.Div([*notes, c.empty_state("No findings in this window.",
                             "Nothing in the anomaly catalog fired. Widen the time range, clear filters, or ",
                             *c.EMPTY_HINT)])
    kinds = sorted({f.kind for i in all_incidents for f in i.findings} | {f.kind for f in found})
    shown = [i for i in all_incidents
             if (not page.get("kind") or any(f.kind == page["kind"] for f in i.findings))
             and (not page.get("severity") or i.severity == page["severity"])]
    chosen = inc.find_incident(all_incidents, page.get("incident"),
                               lambda: inc.group(ev.findings, inc.topology(c.reader(), res.window)))
    if page.get("incident") and chosen is None:
        notes.append(c.banner("That incident is not in this window; widen the time range.", "info"))
    if chosen is not None:
        shown = [chosen, *(i for i in shown if i is not chosen)]
    # Each of the window's findings is shown once, under the first incident holding it.
    owner: dict[int, int] = {}
    for n, f in enumerate(found):
        for k, i in enumerate(all_incidents):
            if inc.pick([i.findings], f) is not None:
                owner[n] = k
                break
    by_incident: dict[int, list[tuple[int, Finding]]] = {}
    for n, k in owner.items():
        by_incident.setdefault(k, []).append((n, found[n]))
    index = {id(i): k for k, i in enumerate(all_incidents)}
    charts = chart_budget()
    sections = [incident_section(i, by_incident.get(index[id(i)], []), state, page, i is chosen, charts)
                for i in shown]
    loose = [(n, f) for n, f in enumerate(found) if n not in owner
             and (not page.get("kind") or f.kind == page["kind"])
             and (not page.get("severity") or f.severity == page["severity"])]
    if loose:
        sections.append(html.Section(id="anomalies-other-findings", className="ms-incident-section", children=[
            html.H2("Findings in no incident", className="ms-panel-title"),
            html.Div("The incidents, judged over their own spans, do not hold these.", className="ms-note"),
            *(finding_card(f, n, state, charts(f, n)) for n, f in loose)]))
    if not sections:
        sections = [c.empty_state("No incident matches these filters.", "Clear the kind or severity filter.")]
    counts = {s: sum(1 for i in all_incidents if i.severity == s) for s in c.SEVERITY_ORDER}
    head = html.Div([html.Span(f"{len(all_incidents)} incidents ("
                               + " · ".join(f"{n} {s}" for s, n in counts.items() if n) + f"), {len(found)} findings",
                               id="anomalies-counts"),
                     html.Span(" — " + c.evaluation_note(ev), id="anomalies-evaluated")], className="ms-note")
    return html.Div([*notes, head, filter_links(state, page, kinds), html.Div(style={"height": "0.6em"}),
                     html.Div(sections, id=ids.AN_INCIDENTS)])
