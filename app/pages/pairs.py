"""Service pairs (``/pairs``): the heatmap (x = caller→callee by call volume, y = latency
bins on a log axis, colour = call density, P50/P90/P99 markers) and the sortable table
beside it. Clicking a cell opens the drilldown for that pair and latency band; clicking a
table row opens the pair's drilldown. URL state: window, filters, ``sort=column:asc|desc``.
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dash_table, dcc, html, no_update
from dash.dash_table.Format import Format, Group, Scheme

from modalscope.app import components as c
from modalscope.app import figures, ids, queries
from modalscope.app import state as st

dash.register_page(__name__, path="/pairs", name="Service pairs", title="modalscope · service pairs", order=1)

PATH = "/pairs"
SORTABLE = ("caller", "callee", "count", "calls_per_day", "p50_ms", "p90_ms", "p99_ms", "error_rate")


def parse_sort(value: str | None) -> list[dict]:
    """``p99_ms:desc`` -> DataTable ``sort_by``; unknown columns are ignored."""
    if not value:
        return [{"column_id": "count", "direction": "desc"}]
    col, _, direction = value.partition(":")
    if col not in SORTABLE:
        return [{"column_id": "count", "direction": "desc"}]
    return [{"column_id": col, "direction": "asc" if direction == "asc" else "desc"}]


def _columns():
    ms = Format(precision=3, scheme=Scheme.decimal_or_exponent, group=Group.yes)
    return [
        {"name": "caller", "id": "caller", "type": "text"},
        {"name": "callee", "id": "callee", "type": "text"},
        {"name": "calls", "id": "count", "type": "numeric", "format": Format(group=Group.yes)},
        {"name": "calls/day", "id": "calls_per_day", "type": "numeric",
         "format": Format(precision=0, scheme=Scheme.fixed, group=Group.yes)},
        {"name": "P50 (ms)", "id": "p50_ms", "type": "numeric", "format": ms},
        {"name": "P90 (ms)", "id": "p90_ms", "type": "numeric", "format": ms},
        {"name": "P99 (ms)", "id": "p99_ms", "type": "numeric", "format": ms},
        {"name": "errors", "id": "error_rate", "type": "numeric",
         "format": Format(precision=1, scheme=Scheme.percentage)},
    ]


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
                    actions=html.Span("click a cell: traces in that pair and latency band", className="ms-note")),
            c.panel("Pairs", c.loading(dash_table.DataTable(
                id=ids.PAIRS_TABLE, columns=_columns(), data=[], sort_action="native", sort_mode="single",
                sort_by=parse_sort(state.get("sort")), page_action="none", cell_selectable=True,
                style_as_list_view=True, fixed_rows={"headers": True},
                style_table={"maxHeight": "560px", "overflowY": "auto"},
                style_header={"fontWeight": "600", "backgroundColor": "#f8fafc", "color": "#374151"},
                style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "6px 8px",
                            "maxWidth": "180px", "overflow": "hidden", "textOverflow": "ellipsis"},
                style_cell_conditional=[{"if": {"column_id": col}, "textAlign": "left"} for col in ("caller", "callee")],
                style_data_conditional=[{"if": {"state": "active"}, "backgroundColor": "#eff6ff",
                                         "border": "1px solid #2563eb"}],
                tooltip_delay=300, tooltip_duration=None,
            )), actions=html.Span("click a row: its drilldown", className="ms-note")),
        ]),
    ])


@dash.callback(
    Output(ids.PAIRS_HEATMAP, "figure"),
    Output(ids.PAIRS_HEAT_DATA, "data"),
    Output(ids.PAIRS_TABLE, "data"),
    Output(ids.PAIRS_EMPTY, "children"),
    Input(ids.PAIRS_STATE, "data"),
)
def _fill(state):
    state = state or {}
    res = st.resolve(state)
    reader = c.reader()
    heat = queries.pair_heatmap(reader, res.window, res.filters)
    table = queries.pair_table(reader, res.window, res.filters)
    rows = [{**r, "id": i} for i, r in enumerate(table)]
    slim = {"pairs": [[p["caller"], p["callee"]] for p in heat["pairs"]],
            "bins": [[b["min_ms"], b["max_ms"]] for b in heat["bins"]]}
    empty = None if heat["pairs"] else c.no_data("service-pair calls")
    return figures.pair_heatmap(heat), slim, rows, empty


def drill_href(state: dict, caller: str, callee: str, band: tuple[float, float] | None = None) -> str:
    new = st.with_(st.carried(state), caller=caller, callee=callee, stage=None,
                   min_ms=st.num(band[0]) if band else None, max_ms=st.num(band[1]) if band else None)
    return st.to_href("/drilldown", new)


def heatmap_click_href(state: dict, heat: dict, click: dict | None) -> str | None:
    """Pure: the drilldown href for a click on the heatmap (a cell or a percentile marker)."""
    try:
        point = (click or {})["points"][0]
        i, j = point["customdata"][:2]
        caller, callee = heat["pairs"][int(i)]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    band = None
    if int(j) >= 0:
        try:
            lo, hi = heat["bins"][int(j)]
        except (IndexError, TypeError, ValueError):
            return None
        band = (lo, hi)
    return drill_href(state, caller, callee, band)


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.PAIRS_HEATMAP, "clickData"),
    State(ids.PAIRS_HEAT_DATA, "data"),
    State(ids.PAIRS_STATE, "data"),
    prevent_initial_call=True,
)
def _heatmap_click(click, heat, state):
    href = heatmap_click_href(state or {}, heat or {}, click)
    return href if href else no_update


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.PAIRS_TABLE, "active_cell"),
    State(ids.PAIRS_TABLE, "data"),
    State(ids.PAIRS_STATE, "data"),
    prevent_initial_call=True,
)
def _row_click(cell, rows, state):
    if not cell or cell.get("row_id") is None:
        return no_update
    match = [r for r in rows or [] if r.get("id") == cell["row_id"]]
    if not match:
        return no_update
    return drill_href(state or {}, match[0]["caller"], match[0]["callee"])


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.PAIRS_TABLE, "sort_by"),
    State(ids.PAIRS_STATE, "data"),
    prevent_initial_call=True,
)
def _sort(sort_by, state):
    state = state or {}
    value = f"{sort_by[0]['column_id']}:{sort_by[0]['direction']}" if sort_by else None
    current = parse_sort(state.get("sort"))
    if sort_by == current or (not sort_by and not state.get("sort")):
        return no_update
    return st.to_href(PATH, st.with_(state, sort=value))
