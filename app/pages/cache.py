"""Cache (``/cache``): hit rate per cache (``cache.name``, ``cache.hit``) and group over
time, each group's share of the lookups, and the table behind them.

URL state: the window, ``group_by`` (any span attribute, e.g. ``user_tier``; default
``user_tier``) and ``cache`` (one cache name, default all). Answered from the settled
``cache`` rollups when they give exactly what the raw spans would (whole minutes; a tag key
with every value tagged), else from the raw spans carrying ``cache.name`` in the window
(``queries.cache_rates``).
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html, no_update

from modalscope.app import components as c
from modalscope.app import figures, ids, queries
from modalscope.app import state as st
from modalscope.app.units import fmt_count, fmt_pct

dash.register_page(__name__, path="/cache", name="Cache", title="modalscope · cache", order=5)

PATH = "/cache"
DEFAULT_GROUP_BY = "user_tier"


def group_by_of(state) -> tuple[str, str | None]:
    raw = state.get("group_by") or DEFAULT_GROUP_BY
    if queries.valid_group_by(raw):
        return raw, None
    return DEFAULT_GROUP_BY, "group_by must be an attribute key (letters, digits, _ . : / -); grouping by user_tier"


def layout(**query):
    state = st.from_query(query)
    res = st.resolve(state)
    group_by, _ = group_by_of(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.CA_STATE, data=state),
        c.toolbar(PATH, state, show=(), error=res.error),
        html.Div(className="ms-subject", children=[
            html.Label("Group by attribute", htmlFor=ids.CA_GROUP_BY, className="ms-filter-label"),
            dcc.Input(id=ids.CA_GROUP_BY, type="text", debounce=True, value=group_by, spellCheck=False,
                      className="ms-input ms-group-by", placeholder="e.g. user_tier"),
            html.Span(f"cache {state['cache']}" if state.get("cache") else "every cache", className="ms-note"),
        ]),
        html.Div(className="ms-grid-2-1", children=[
            c.panel("Hit rate by group over time", c.loading(c.graph(ids.CA_RATE)),
                    actions=c.share_control("cache", state)),
            c.panel("Share of lookups by group", c.loading(c.graph(ids.CA_SHARE))),
        ]),
        c.panel("Hits and misses", c.loading(html.Div(id=ids.CA_TABLE))),
    ])


def cache_table(rows: list[dict]) -> html.Table:
    cols = [("cache", "cache"), ("group", "group"), ("lookups", "lookups"), ("hits", "hits"), ("misses", "misses"),
            ("hit_rate", "hit rate"), ("share", "share of lookups")]
    return c.text_table(cols, [{
        "cache": r["cache"], "group": "(none)" if r["group"] is None else r["group"],
        "lookups": fmt_count(r["hits"] + r["misses"]), "hits": fmt_count(r["hits"]), "misses": fmt_count(r["misses"]),
        "hit_rate": fmt_pct(r["hit_rate"]), "share": fmt_pct(r["share"]),
    } for r in rows], id="cache-table-rows", numeric=[k for k, _ in cols[2:]])


@dash.callback(
    Output(ids.CA_RATE, "figure"),
    Output(ids.CA_SHARE, "figure"),
    Output(ids.CA_TABLE, "children"),
    Input(ids.CA_STATE, "data"),
)
def _fill(state):
    state = state or {}
    res = st.resolve(state)
    group_by, error = group_by_of(state)
    reader = c.reader()
    cache = state.get("cache") or None
    rows, series = queries.cache_rates_and_series(reader, res.window, group_by, cache,
                                                  st.step_minutes(res.window, 60))
    note = c.banner(error)
    if not rows:
        return (figures.cache_hit_rate_figure([]), figures.cache_share_figure([]),
                html.Div([note, c.no_data("cache lookups (spans with cache.name and cache.hit)")]))
    return figures.cache_hit_rate_figure(series), figures.cache_share_figure(rows), html.Div([note, cache_table(rows)])


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.CA_GROUP_BY, "value"),
    State(ids.CA_STATE, "data"),
    prevent_initial_call=True,
)
def _group_by(value, state):
    if c.rendering():
        return no_update
    state = state or {}
    value = (value or "").strip()
    if value == (state.get("group_by") or DEFAULT_GROUP_BY):
        return no_update
    return st.to_href(PATH, st.with_(state, group_by=value or None))


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.CA_RATE, "selectedData"),
    Input(ids.CA_RATE, "relayoutData"),
    State(ids.CA_STATE, "data"),
    prevent_initial_call=True,
)
def _narrow(selected, relayout, state):
    return c.narrow(PATH, state, selected, relayout)
