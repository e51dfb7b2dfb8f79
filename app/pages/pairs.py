"""Service pairs (``/pairs``): the heatmap (x = caller→callee by call volume, y = latency
bins on a log axis, colour = call density, P50/P90/P99 markers) and the sortable table
beside it. Clicking a cell opens the drilldown for that pair and latency band; clicking a
pair in the table opens the pair's drilldown. URL state: window, filters, ``sort=column:asc|desc``.
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html, no_update

from modalscope.app import components as c
from modalscope.app import figures, ids, links, queries
from modalscope.app import state as st
from modalscope.app.units import fmt_count, fmt_ms, fmt_pct

dash.register_page(__name__, path="/pairs", name="Service pairs", title="modalscope · service pairs", order=1)

PATH = "/pairs"
PAIR_SORTABLE = ("caller", "callee", "count", "calls_per_day", "p50_ms", "p90_ms", "p99_ms", "error_rate")
# Caller and callee share one cell, and P90 is left to the heatmap's markers, so the errors
# column shows beside the heatmap without a horizontal scroll (old sort links still work).
COLUMNS = (("caller", "caller → callee"), ("count", "calls"), ("p50_ms", "P50"), ("p99_ms", "P99"),
           ("error_rate", "errors"))
NUMERIC = ("count", "p50_ms", "p99_ms", "error_rate")
PAIR_NAME_CHARS = 24  # a longer service name is cut with an ellipsis (whole in its tooltip)
PER_DAY_NOTE = "extrapolated from the window's rate"


def per_day_text(r: dict) -> str:
    """The calls cell's tooltip: the window's count scaled to a day, said to be an estimate."""
    return f"≈ {fmt_count(round(r['calls_per_day']))} calls/day ({PER_DAY_NOTE})"


def pair_cell(r: dict, href: str):
    """"caller → callee" as one link: each name stays whole, a line break only at the arrow."""
    def end(name: str) -> html.Span:
        if len(name) > PAIR_NAME_CHARS:
            return html.Span(name, className="ms-pair-end ms-cut", title=name)
        return html.Span(name, className="ms-pair-end")

    return dcc.Link([end(r["caller"]), html.Span(" → ", className="ms-pair-arrow"), end(r["callee"])], href=href)


def pairs_table(rows: list[dict], state: dict) -> html.Div:
    """The pair table: a header click sorts (``sort=`` in the URL), a pair opens its drilldown."""
    col, direction = st.parse_sort(state.get("sort"), PAIR_SORTABLE, default="count")
    head = []
    for key, label in COLUMNS:
        active = key == col or (key == "caller" and col == "callee") or (key == "count" and col == "calls_per_day")
        if active:
            nxt = "asc" if direction == "desc" else "desc"
            label = f"{label} {'▼' if direction == 'desc' else '▲'}"
        else:
            nxt = "asc" if key == "caller" else "desc"
        cls = f"col-{key}" + (" col-num" if key in NUMERIC else "")
        head.append(html.Th(dcc.Link(label, href=st.to_href(PATH, st.with_(state, sort=f"{key}:{nxt}")),
                                     className="ms-sort"), className=cls))
    body = []
    for r in st.sort_rows(rows, col, direction):
        href = links.drill_href(state, r["caller"], r["callee"])
        bad = r["error_rate"] >= 0.05
        body.append(html.Tr([
            html.Td(pair_cell(r, href), className="col-caller"),
            html.Td(fmt_count(r["count"]), className="col-count col-num", title=per_day_text(r)),
            html.Td(fmt_ms(r["p50_ms"]), className="col-p50_ms col-num"),
            html.Td(fmt_ms(r["p99_ms"]), className="col-p99_ms col-num"),
            html.Td(fmt_pct(r["error_rate"]), className="col-error_rate col-num" + (" ms-bad" if bad else "")),
        ]))
    table = html.Table([html.Thead(html.Tr(head)), html.Tbody(body)], className="ms-table ms-pairs-table",
                       id="pairs-table-rows")
    return html.Div([table, html.Div(f"Hover a call count for its calls/day, {PER_DAY_NOTE}.",
                                     className="ms-note ms-table-foot", id="pairs-per-day-note")])


def layout(**query):
    state = st.from_query(query)
    res = st.resolve(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.PAIRS_STATE, data=state),
        dcc.Store(id=ids.PAIRS_HEAT_DATA),
        c.toolbar(PATH, state, show=("service", "pair", "input_type"), error=res.error),
        html.Div(id=ids.PAIRS_EMPTY),
        html.Div(className="ms-grid-pairs", children=[
            c.panel("Service-pair latency heatmap", c.loading(c.graph(ids.PAIRS_HEATMAP)),
                    actions=[html.Span("click a cell: traces in that pair and latency band", className="ms-note"),
                             c.share_control("pair-heatmap", state)]),
            c.panel("Pairs", c.loading(html.Div(id=ids.PAIRS_TABLE)),
                    actions=[html.Span("click a pair: its drilldown; a header: sort", className="ms-note"),
                             c.share_control("pair-table", state)]),
        ]),
    ])


@dash.callback(
    Output(ids.PAIRS_HEATMAP, "figure"),
    Output(ids.PAIRS_HEAT_DATA, "data"),
    Output(ids.PAIRS_TABLE, "children"),
    Output(ids.PAIRS_EMPTY, "children"),
    Input(ids.PAIRS_STATE, "data"),
)
def _fill(state):
    state = state or {}
    res = st.resolve(state)
    reader = c.reader()
    heat = queries.pair_heatmap(reader, res.window, res.filters)
    table = queries.pair_table(reader, res.window, res.filters)
    slim = links.heat_index(heat)
    empty = None if heat["pairs"] else c.no_data("service-pair calls")
    return figures.pair_heatmap(heat), slim, pairs_table(table, state) if table else None, empty


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.PAIRS_HEATMAP, "clickData"),
    State(ids.PAIRS_HEAT_DATA, "data"),
    State(ids.PAIRS_STATE, "data"),
    prevent_initial_call=True,
)
def _heatmap_click(click, heat, state):
    href = links.heatmap_click_href(state or {}, heat or {}, click)
    return href if href else no_update
