"""Drilldown (``/drilldown``): one subject's latency — a pair (``caller``/``callee``), a
stage, a service, or an input type's end-to-end requests (see ``queries.subject_of``).

Histogram and CDF with P50/P90/P99 lines (click a bar to select its band), P50/P90/P99
over time (box-select narrows the window), and exemplar traces in the band, slowest
first, linking to the trace view. A pair's calls that requested models list those models
(each narrows the drilldown to its calls: ``model=``). URL state: window, filters,
``min_ms``/``max_ms`` (the band, shaded on the histogram), ``counts=log`` (the histogram's
counts on a log axis).
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import quote, urlencode

import dash
from dash import Input, Output, State, dcc, html, no_update

from modalscope.app import components as c
from modalscope.app import figures, ids, links, queries, tokens
from modalscope.app import state as st
from modalscope.app.units import fmt_count, fmt_ms, fmt_pct

dash.register_page(__name__, path="/drilldown", name="Drilldown", title="modalscope · drilldown", order=2)

PATH = "/drilldown"
EXEMPLARS = 20
MODELS_ID = "drilldown-models"
COUNTS_ID = "drilldown-counts"  # the histogram's count axis: linear, or log (``counts=log``)


def log_counts(state: Mapping[str, Any]) -> bool:
    return (state or {}).get("counts") == "log"


def counts_control(state: Mapping[str, Any]) -> html.Div:
    """Linear or log counts on the histogram (``counts=log`` in the URL): on a log axis the
    tail's few slow calls show beside the body's thousands."""
    return html.Div(className="ms-hist-scale", title="count axis of the histogram", children=[
        dcc.RadioItems(id=COUNTS_ID, className="ms-presets", inline=True,
                       value="log" if log_counts(state) else "linear",
                       options=[{"label": "linear counts", "value": "linear"},
                                {"label": "log counts", "value": "log"}]),
    ])


def page_state(query: Mapping[str, Any] | None) -> dict[str, str]:
    """The URL state, with the ``model`` filter kept even where the shared state keys do
    not list it yet."""
    state = st.from_query(query)
    if "model" not in st.KEYS:
        value = (query or {}).get("model")
        if isinstance(value, (list, tuple)):
            value = value[-1] if value else None
        value = str(value).strip()[: st.MAX_VALUE_LEN] if value is not None else ""
        if value:
            state["model"] = value
    return state


def page_href(state: Mapping[str, Any], **changes: Any) -> str:
    """A drilldown link for ``state`` with ``changes`` (``model`` included)."""
    new = st.with_(state, **changes)
    out = st.to_href(PATH, new)
    if "model" not in st.KEYS and new.get("model"):
        out += ("&" if "?" in out else "?") + urlencode({"model": new["model"]}, quote_via=quote)
    return out


def models_table(rows: list[dict], state: Mapping[str, str]) -> html.Div:
    """The models the pair's calls requested; each narrows the drilldown to its calls (the
    band belongs to its subject: cleared). Names are untrusted span text: link text only."""
    current = state.get("model")
    body = []
    for r in rows:
        name = r["model"]
        cell = (html.Strong(name, className="ms-mono") if name == current
                else dcc.Link(name, href=page_href(state, model=name, min_ms=None, max_ms=None), className="ms-mono"))
        body.append(html.Tr([html.Td(cell, className="col-model"), html.Td(fmt_count(r["count"]), className="col-num"),
                             html.Td(fmt_ms(r["p50_ms"]), className="col-num"),
                             html.Td(fmt_ms(r["p99_ms"]), className="col-num"),
                             html.Td(fmt_pct(r["error_rate"]), className="col-num")]))
    head = html.Tr([html.Th(t) for t in ("model", "calls", "P50", "P99", "errors")])
    out: list = [html.Table([html.Thead(head), html.Tbody(body)], className="ms-table", id=MODELS_ID + "-table")]
    if current:
        out.append(dcc.Link("all models", href=page_href(state, model=None, min_ms=None, max_ms=None),
                            className="ms-clear", id=MODELS_ID + "-clear"))
    return html.Div(out)


def layout(**query):
    state = page_state(query)
    res = st.resolve(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.DD_STATE, data=state),
        c.toolbar(PATH, state, error=res.error),
        html.Div(className="ms-subject", children=[
            html.H1(queries.subject_label(res.filters), id=ids.DD_TITLE, className="ms-title"),
            c.loading(html.Div(id=ids.DD_SUMMARY, className="ms-summary")),
        ]),
        html.Div(className="ms-grid-2", children=[
            c.panel("Latency distribution", c.loading(c.graph(ids.DD_HIST)),
                    actions=[html.Span("click a bar: traces in that band", className="ms-note"),
                             counts_control(state)]),
            c.panel("P50 / P90 / P99 over time", c.loading(c.graph(ids.DD_TIME)),
                    actions=[html.Span("box-select to narrow the window", className="ms-note"),
                             dcc.Link("Compare this window →", href=links.compare_href(state), id=ids.DD_COMPARE,
                                      className="ms-compare-link"), c.share_control("latency-timeline", state)]),
        ]),
        html.Div(id=MODELS_ID),
        c.panel("Exemplar traces (slowest first)", c.loading(html.Div(id=ids.DD_EXEMPLARS))),
        tokens_panel(),
    ])


def summary(dist: dict, state: dict, band) -> list:
    items = [("samples", fmt_count(dist["count"])), ("P50", fmt_ms(dist["p50_ms"])), ("P90", fmt_ms(dist["p90_ms"])),
             ("P99", fmt_ms(dist["p99_ms"])), ("errors", fmt_pct(dist["error_rate"]))]
    out = [html.Div([html.Span(k, className="ms-stat-label"), html.Span(v, className="ms-stat-value")],
                    className="ms-stat") for k, v in items]
    lo, hi = band
    if lo is not None or hi is not None:
        text = f"band {fmt_ms(lo) if lo is not None else '0'} – {fmt_ms(hi) if hi is not None else '∞'}"
        out.append(html.Div(className="ms-stat ms-band", children=[
            html.Span("selected", className="ms-stat-label"), html.Span(text, className="ms-stat-value"),
            dcc.Link("clear", href=page_href(state, min_ms=None, max_ms=None),
                     className="ms-clear", id="drilldown-clear-band"),
        ]))
    return out


@dash.callback(
    Output(ids.DD_SUMMARY, "children"),
    Output(ids.DD_HIST, "figure"),
    Output(ids.DD_TIME, "figure"),
    Output(ids.DD_EXEMPLARS, "children"),
    Input(ids.DD_STATE, "data"),
)
def _fill(state):
    state = state or {}
    res = st.resolve(state)
    reader = c.reader()
    band = st.band(state)
    dist = queries.latency_distribution(reader, res.window, res.filters)
    series = queries.percentile_series(reader, res.window, res.filters, st.step_minutes(res.window))
    if dist["count"] == 0:
        exemplars = c.no_data("samples for this selection")
        return summary(dist, state, band), figures.latency_histogram(dist), figures.percentile_timeseries(series), exemplars
    rows = queries.exemplar_traces(reader, res.window, res.filters, band[0], band[1], limit=EXEMPLARS)
    if rows:
        exemplars = c.exemplar_table(rows, state)
    elif band != (None, None):
        exemplars = c.empty_state("No stored traces in this band.",
                                  "Raw spans may have passed retention, or the band is empty: pick another bar, "
                                  "or clear the band.")
    else:
        exemplars = c.empty_state("No stored traces for this selection.",
                                  "Raw spans may have passed retention (MODALSCOPE_RETENTION_DAYS).")
    return (summary(dist, state, band), figures.latency_histogram(dist, band, log_counts(state)),
            figures.percentile_timeseries(series), exemplars)


@dash.callback(Output(MODELS_ID, "children"), Input(ids.DD_STATE, "data"))
def _models(state):
    """A pair's models (none for other subjects, or a pair whose calls name no model)."""
    state = state or {}
    res = st.resolve(state)
    if queries.subject_of(res.filters) != "pair":
        return None
    rows = queries.pair_models(c.reader(), res.window, res.filters)
    if not rows:
        return None
    return c.panel("Models of this pair", models_table(rows, state),
                   actions=html.Span("click a model: its calls only", className="ms-note"))


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.DD_HIST, "clickData"),
    State(ids.DD_STATE, "data"),
    prevent_initial_call=True,
)
def _band(click, state):
    href = links.band_click_href(state or {}, click)
    return href if href else no_update


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(COUNTS_ID, "value"),
    State(ids.DD_STATE, "data"),
    prevent_initial_call=True,
)
def _counts(value, state):
    state = state or {}
    if c.rendering() or (value == "log") == log_counts(state):
        return no_update
    return page_href(state, counts="log" if value == "log" else None)


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.DD_TIME, "selectedData"),
    Input(ids.DD_TIME, "relayoutData"),
    State(ids.DD_STATE, "data"),
    prevent_initial_call=True,
)
def _narrow(selected, relayout, state):
    return c.narrow(PATH, state, selected, relayout)


# -- latency against input tokens (app/tokens.py) ----------------------------------------
def tokens_panel():
    return c.panel("Latency against input tokens", html.P(tokens.IMAGE_NOTE, id=tokens.DD_TOKENS_NOTE,
                                                          className="ms-note"),
                   c.loading(c.graph(tokens.DD_TOKENS)),
                   actions=html.Span(f"model calls of this selection: a sample of up to {tokens.SAMPLE_LIMIT:,} "
                                     "spread over the window", className="ms-note"))


def tokens_figure(reader, res, state: Mapping[str, Any]):
    """The scatter of the selection's sampled model calls (``model=`` narrows it too)."""
    rows = tokens.sample_model_calls(reader, res.window, res.filters, model=state.get("model") or None)
    return figures.tokens_latency_scatter(tokens.scatter_points(rows))


@dash.callback(
    Output(tokens.DD_TOKENS, "figure"),
    Input(ids.DD_STATE, "data"),
)
def _tokens(state):
    state = state or {}
    return tokens_figure(c.reader(), st.resolve(state), state)
