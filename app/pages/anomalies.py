"""Anomalies (``/anomalies``): the anomaly catalog's findings in the window (the same as
``/api/v1/anomalies``) grouped by incident (``/api/v1/incidents``): a section per incident,
most severe first, headed by its likely cause (or its leading symptom and Compare's
suspects), with the window's findings it folds under it. Each finding card has its evidence
numbers, the hint (a folded symptom's links to its incident), a small chart of its
subject's P50/P99 with the finding's window shaded, and links to the drilldown, Compare and
its exemplar traces. Findings the incidents judged over their own spans leave out are
listed last. URL state: window and filters (a filter keeps the incidents one of whose
findings names it), ``kind=`` (incidents with a finding of that kind), ``severity=`` and
``incident=<id>`` (that incident first, marked; its section's anchor is ``#incident-<id>``).

The list comes first and each chart after it, in its own request (a pattern-matching
callback per card, as a dashboard loads its panels): a dozen charts over a day took half of
the page's 300 ms budget and most of its bytes on a slow machine.
"""

from __future__ import annotations

from datetime import datetime, timezone

import re

import dash
from dash import MATCH, Input, Output, dcc, html

from modalscope.app import components as c
from modalscope.app import evaluations, figures, findings, ids, links, queries
from modalscope.app import incidents as inc
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


def finding_card(f: dict, i: int, state: dict, chart: bool, hint=None, role: str = "") -> html.Article:
    """One finding: ``hint`` replaces its hint text (a folded symptom's, with the link to its
    incident); ``role`` is an extra class (``ms-incident-head``, ``ms-incident-folded``)."""
    evidence = f.get("evidence") or {}
    ev_rows = [{"name": str(k), "value": c.evidence_text(v)} for k, v in evidence.items()]
    cls = f"ms-panel ms-finding-card ms-finding-{f.get('severity', 'info')} {role}".strip()
    return html.Article(className=cls, children=[
        html.Div(c.finding_title(f), className="ms-finding-title"),
        html.Div(f"{f.get('start', '')} → {f.get('end', '')}", className="ms-note"),
        html.P(hint if hint is not None else str(f.get("hint") or ""), className="ms-finding-hint"),
        html.Div(className="ms-grid-2", children=[
            c.text_table([("name", "evidence"), ("value", "value")], ev_rows, className="ms-table ms-evidence"),
            _chart_or_blank(f, i, chart),
        ]),
        html.Div(c.finding_links(f, state), className="ms-finding-links"),
    ])


KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
ID_RE = re.compile(r"[0-9a-f]{16}")


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


def _filter_links(state: dict, page: dict, kinds: list[str]) -> html.Div:
    """The kind and severity filters: links (the URL is the state), the current one marked."""
    def chips(key: str, values: list[str], label: str, cid: str):
        items = [html.Span(label, className="ms-filter-label")]
        for v in [None, *values]:
            href = inc.page_href(state, **{**page, key: v, "incident": None})
            active = page.get(key) == v
            items.append(dcc.Link(c.kind_text(v) if v else "all", href=href,
                                  className="ms-chip active" if active else "ms-chip",
                                  style={"marginLeft": "0.6em", "fontWeight": 600 if active else None},
                                  title=f"{label}: {'current' if active else 'show'}"))
        return html.Div(items, id=cid, className="ms-incident-filter", style={"margin": "0.2em 0"})

    return html.Div([chips("severity", list(c.SEVERITY_ORDER), "Severity", ids.AN_SEVERITY_FILTER),
                     chips("kind", kinds, "Kind", ids.AN_KIND_FILTER)], className="ms-incident-filters")


def folded_hint(f: dict, incident: dict, href: str):
    """A folded symptom's hint with the URL in its text turned into a link to its incident."""
    hint = str(f.get("hint") or "")
    head = incident["headline"]
    url = inc.incident_page_href(incident["id"], {**links.finding_window(head), **links.finding_filters(head)})
    before, sep, after = hint.partition(f"see {url}.")
    if not sep:
        return [hint, " ", dcc.Link("see the incident", href=href, className="ms-finding-link")]
    return [before, dcc.Link("see the incident", href=href, className="ms-incident-hint-link"),
            "." + after]


def incident_section(i: dict, members: list[tuple[int, dict]], state: dict, page: dict,
                     selected: bool) -> html.Section:
    """One incident: its headline card (the window's finding, or the incident's own when the
    window's is cut differently), then the window's findings it folds, then its links."""
    href = inc.incident_page_href(i["id"], state, **{k: page.get(k) for k in ("kind", "severity")})
    mine = {id(f): m for m in i["findings"] for _, f in members if inc.pick([[m]], f) is not None}
    cards = []
    head_shown = False
    for n, f in members:
        m = mine.get(id(f), f)
        is_head = not head_shown and inc.pick([[i["headline"]]], f) is not None
        head_shown = head_shown or is_head
        folded = not is_head and i["cause_known"] and not inc.is_cause(m)
        cards.append((not is_head, finding_card(
            f, n, state, n < MAX_CHARTS, hint=folded_hint(m, i, href) if folded else None,
            role="ms-incident-head" if is_head else "ms-incident-folded")))
    cards.sort(key=lambda x: x[0])  # the headline first
    cls = "ms-incident-section" + (" ms-incident-selected" if selected else "")
    related = len(i["findings"]) - 1
    return html.Section(id=inc.ANCHOR_PREFIX + i["id"], className=cls, **{"data-incident": i["id"]}, children=[
        html.Div(className=f"ms-panel ms-incident ms-finding-{i['severity']}", children=[
            html.H2(c.incident_headline(i), className="ms-incident-title",
                    style={"fontSize": "1.1rem", "margin": "0 0 0.3em"}),
            html.Div([c.span_text(i["start"], i["end"]),
                      f" · +{related} related finding{'' if related == 1 else 's'}" if related else "",
                      " · ", dcc.Link("link to this incident", href=href, className="ms-finding-link")],
                     className="ms-note"),
            c.incident_cause(i),
            html.Div([dcc.Link("compare", href=i["links"]["compare"], className="ms-finding-link"),
                      dcc.Link("drilldown", href=i["links"]["drilldown"], className="ms-finding-link")],
                     className="ms-finding-links"),
        ]),
        html.Div([card for _, card in cards], className="ms-incident-findings",
                 style={"marginLeft": "1.25rem"}),
    ])


def page_incidents(res, state: dict) -> tuple[evaluations.Evaluation, list[dict]]:
    """The window's findings (as ``/api/v1/anomalies``) and incidents (as ``/api/v1/incidents``)."""
    from modalscope.models.reader import Filters

    reader, th = c.reader(), c.thresholds()
    ev = evaluations.find_for(reader, res.window, Filters(), th, relative=evaluations.ends_now(state))

    def finder(w):  # an incident's own span: an absolute window, stored once evaluated
        return evaluations.find_for(reader, w, Filters(), th, relative=False).findings

    return ev, inc.incidents(reader, res.window, finder, res.filters, found=ev.findings)


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
    kinds = sorted({f["kind"] for i in all_incidents for f in i["findings"]} | {f["kind"] for f in found})
    shown = [i for i in all_incidents
             if (not page.get("kind") or any(f["kind"] == page["kind"] for f in i["findings"]))
             and (not page.get("severity") or i["severity"] == page["severity"])]
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
            if inc.pick([i["findings"]], f) is not None:
                owner[n] = k
                break
    by_incident: dict[int, list[tuple[int, dict]]] = {}
    for n, k in owner.items():
        by_incident.setdefault(k, []).append((n, found[n]))
    index = {id(i): k for k, i in enumerate(all_incidents)}
    sections = [incident_section(i, by_incident.get(index[id(i)], []), state, page, i is chosen) for i in shown]
    loose = [(n, f) for n, f in enumerate(found) if n not in owner
             and (not page.get("kind") or f["kind"] == page["kind"])
             and (not page.get("severity") or f["severity"] == page["severity"])]
    if loose:
        sections.append(html.Section(id="anomalies-other-findings", className="ms-incident-section", children=[
            html.H2("Findings in no incident", className="ms-panel-title"),
            html.Div("The incidents, judged over their own spans, do not hold these.", className="ms-note"),
            *(finding_card(f, n, state, n < MAX_CHARTS) for n, f in loose)]))
    if not sections:
        sections = [c.empty_state("No incident matches these filters.", "Clear the kind or severity filter.")]
    counts = {s: sum(1 for i in all_incidents if i["severity"] == s) for s in c.SEVERITY_ORDER}
    head = html.Div([html.Span(f"{len(all_incidents)} incidents ("
                               + " · ".join(f"{n} {s}" for s, n in counts.items() if n) + f"), {len(found)} findings",
                               id="anomalies-counts"),
                     html.Span(" — " + c.evaluation_note(ev), id="anomalies-evaluated")], className="ms-note")
    return html.Div([*notes, head, _filter_links(state, page, kinds), html.Div(style={"height": "0.6em"}),
                     html.Div(sections, id=ids.AN_INCIDENTS)])
