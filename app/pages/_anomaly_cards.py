"""The Anomalies page's cards and sections (``anomalies.py`` is the page; a module whose name
starts with ``_`` is never taken for a page by Dash): a finding's card, an incident's section
with the findings it folds, the kind and severity filters, and which cards get a chart."""

from __future__ import annotations

import re

from dash import dcc, html

from modalscope.app import components as c
from modalscope.app import ids, links
from modalscope.app import incidents as inc
from modalscope.app.pages._anomaly_charts import PLACEHOLDER, chart_spec, chart_title, evidence_window
from modalscope.app.units import evidence_items
from modalscope.core.findings import Finding, Incident

MAX_CHARTS = 12
KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
ID_RE = re.compile(r"[0-9a-f]{16}")


def _chart(f: Finding, i: int):
    """The card's chart, empty until its own callback (``anomalies._fill_chart``) draws it."""
    if evidence_window(f) is None:
        return None
    spec = chart_spec(f)
    return html.Div([html.Div(chart_title(spec), className="ms-note ms-evidence-chart-title"),
                     dcc.Store(id={"type": ids.AN_CHART_SPEC, "index": i}, data=spec),
                     c.loading(c.graph({"type": ids.AN_CHART, "index": i}, figure=PLACEHOLDER,
                                       config={"displayModeBar": False}))])


def _chart_or_blank(f: Finding, i: int, chart: bool, state: dict):
    out = _chart(f, i) if chart else None
    if out is None and not chart:
        kind = f.kind if KIND_RE.fullmatch(f.kind) else None
        more = [" ", dcc.Link(f"Show the {c.kind_text(kind)} findings", href=inc.page_href(state, kind=kind),
                              className="ms-finding-link")] if kind else []
        return html.Div([f"No chart on this card: the page draws {MAX_CHARTS} and the first of each kind.", *more],
                        className="ms-note ms-evidence-no-chart")
    return html.Div() if out is None else out


def finding_card(f: Finding, i: int, state: dict, chart: bool, hint=None, role: str = "") -> html.Article:
    """One finding: ``hint`` replaces its hint text (a folded symptom's, with the link to its
    incident); ``role`` is an extra class (``ms-incident-head``, ``ms-incident-folded``)."""
    ev_rows = [{"name": html.Span(label, title=key), "value": value}
               for key, label, value in evidence_items(dict(f.evidence))]
    cls = f"ms-panel ms-finding-card ms-finding-{f.severity} {role}".strip()
    return html.Article(className=cls, children=[
        html.Div(c.finding_title(f), className="ms-finding-title"),
        html.Div(c.span_text(f.start, f.end), className="ms-note"),
        html.P(hint if hint is not None else f.hint, className="ms-finding-hint"),
        html.Div(className="ms-grid-2", children=[
            c.text_table([("name", "evidence"), ("value", "value")], ev_rows, className="ms-table ms-evidence"),
            _chart_or_blank(f, i, chart, state),
        ]),
        html.Div(c.finding_links(f, state), className="ms-finding-links"),
    ])


def filter_links(state: dict, page: dict, kinds: list[str]) -> html.Div:
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


def folded_hint(f: Finding, incident: Incident, href: str):
    """A folded symptom's hint with the URL in its text turned into a link to its incident."""
    hint = f.hint
    head = incident.headline
    url = inc.incident_page_href(incident.id, {**links.finding_window(head), **links.finding_filters(head)})
    before, sep, after = hint.partition(f"see {url}.")
    if not sep:
        return [hint, " ", dcc.Link("see the incident", href=href, className="ms-finding-link")]
    return [before, dcc.Link("see the incident", href=href, className="ms-incident-hint-link"),
            "." + after]


def chart_budget():
    """Whether a card gets a chart, asked in the order the cards are shown: the first
    ``MAX_CHARTS``, and the first of each kind after them (every kind shows its evidence)."""
    kinds: set = set()
    drawn = [0]

    def take(f: Finding, n: int) -> bool:
        if drawn[0] < MAX_CHARTS or f.kind not in kinds:
            drawn[0] += 1
            kinds.add(f.kind)
            return True
        return False

    return take


def incident_section(i: Incident, members: list[tuple[int, Finding]], state: dict, page: dict,
                     selected: bool, charts=None) -> html.Section:
    """One incident: its headline card (the window's finding, or the incident's own when the
    window's is cut differently), then the window's findings it folds, then its links."""
    href = inc.incident_page_href(i.id, state, **{k: page.get(k) for k in ("kind", "severity")})
    mine = {id(f): m for m in i.findings for _, f in members if inc.pick([[m]], f) is not None}
    cards = []
    head_shown = False
    for n, f in members:
        m = mine.get(id(f), f)
        is_head = not head_shown and inc.pick([[i.headline]], f) is not None
        head_shown = head_shown or is_head
        folded = not is_head and i.cause_known and not inc.is_cause(m)
        cards.append((not is_head, finding_card(
            f, n, state, charts(f, n) if charts else n < MAX_CHARTS, hint=folded_hint(m, i, href) if folded else None,
            role="ms-incident-head" if is_head else "ms-incident-folded")))
    cards.sort(key=lambda x: x[0])  # the headline first
    cls = "ms-incident-section" + (" ms-incident-selected" if selected else "")
    related = len(i.findings) - 1
    return html.Section(id=inc.ANCHOR_PREFIX + i.id, className=cls, **{"data-incident": i.id}, children=[
        html.Div(className=f"ms-panel ms-incident ms-finding-{i.severity}", children=[
            html.H2(c.incident_headline(i), className="ms-incident-title",
                    style={"fontSize": "1.1rem", "margin": "0 0 0.3em"}),
            html.Div([c.span_text(i.start, i.end),
                      f" · +{related} related finding{'' if related == 1 else 's'}" if related else "",
                      " · ", dcc.Link("link to this incident", href=href, className="ms-finding-link")],
                     className="ms-note"),
            c.incident_cause(i, later=True),
            html.Div([dcc.Link("compare", href=i.links.compare, className="ms-finding-link"),
                      dcc.Link("drilldown", href=i.links.drilldown, className="ms-finding-link")],
                     className="ms-finding-links"),
        ]),
        html.Div([card for _, card in cards], className="ms-incident-findings",
                 style={"marginLeft": "1.25rem"}),
    ])
