"""Stages (``/stages``): where the time goes per input type.

Per input type: each stage's own P50 of per-trace stage time (``tstage`` rollups: a trace's
self time summed per stage; these do not add up), and where the P99 time goes: the mean stage
self time of the traces at or above the end-to-end P99 (``/api/v1/stages?at=p99``, the same
function), which adds up to those traces' mean duration. Then the P99 of each stage's
per-trace time over time, the ViT layer split (patch_embed / attention / mlp) when spans
carry ``mm.layer``, and the ``/api/v1/stages`` table (span-duration percentiles and each
stage's share of self time).
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html

from modalscope.app import components as c
from modalscope.app import figures, ids, queries
from modalscope.app import state as st
from modalscope.app.units import fmt_count, fmt_ms, fmt_pct

dash.register_page(__name__, path="/stages", name="Stages", title="modalscope · stages", order=4)

PATH = "/stages"
#: The end-to-end percentile whose time the stack splits by stage.
AT = "p99"


def layout(**query):
    state = st.from_query(query)
    res = st.resolve(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.ST_STATE, data=state),
        c.toolbar(PATH, state, show=("service", "stage", "input_type"), error=res.error),
        c.panel("Stage time per input type", c.loading(c.graph(ids.ST_STACK)),
                actions=[html.Span("left: each stage's own P50 (not additive); right: traces at or above the "
                                   "end-to-end P99, mean self time per stage, adding up to their mean "
                                   "end-to-end time (line and number)", className="ms-note"),
                         c.share_control("stages", state)]),
        html.Div(className="ms-grid-2", children=[
            c.panel("Stage P99 over time (per-trace stage time)", c.loading(c.graph(ids.ST_TIME)),
                    actions=html.Span("box-select to narrow the window", className="ms-note")),
            c.panel("ViT layers", c.loading(c.graph(ids.ST_VIT)),
                    actions=html.Span("spans with mm.layer", className="ms-note")),
        ]),
        c.panel("Stages: span-duration percentiles", c.loading(html.Div(id=ids.ST_TABLE)),
                actions=html.Span("percentiles of single spans' durations per stage; share: of self time",
                                  className="ms-note")),
    ])


def stages_table(rows: list[dict], state: dict) -> html.Table:
    keep = st.carried(state)

    def row(r):
        link = dcc.Link(r["stage"], href=st.to_href("/drilldown", st.with_(keep, stage=r["stage"], caller=None,
                                                                            callee=None, input_type=r["input_type"])))
        return {"input_type": r["input_type"], "stage": link, "count": fmt_count(r["count"]),
                "p50": fmt_ms(r["p50_ms"]), "p95": fmt_ms(r["p95_ms"]), "p99": fmt_ms(r["p99_ms"]),
                "share": fmt_pct(r["share"])}

    cols = [("input_type", "input type"), ("stage", "stage"), ("count", "spans"), ("p50", "span P50"),
            ("p95", "span P95"), ("p99", "span P99"), ("share", "share of self time")]
    return c.text_table(cols, [row(r) for r in rows], id="stages-table-rows", numeric=[k for k, _ in cols[2:]])


@dash.callback(
    Output(ids.ST_STACK, "figure"),
    Output(ids.ST_TIME, "figure"),
    Output(ids.ST_VIT, "figure"),
    Output(ids.ST_TABLE, "children"),
    Input(ids.ST_STATE, "data"),
)
def _fill(state):
    state = state or {}
    res = st.resolve(state)
    reader = c.reader()
    breakdown = queries.stage_breakdown(reader, res.window, res.filters)
    tail = queries.stage_time_at(reader, res.window, res.filters, AT, group_by="input_type")
    series = queries.stage_series(reader, res.window, res.filters, st.step_minutes(res.window))
    layers = queries.vit_layers(reader, res.window, res.filters)
    rows = queries.stages(reader, res.window, res.filters, group_by="input_type")
    table = stages_table(rows, state) if rows else c.no_data("settled traces")
    return (figures.stage_stack(breakdown, tail), figures.stage_timeseries(series), figures.vit_layers_figure(layers),
            table)


@dash.callback(
    Output(ids.URL, "href", allow_duplicate=True),
    Input(ids.ST_TIME, "selectedData"),
    Input(ids.ST_TIME, "relayoutData"),
    State(ids.ST_STATE, "data"),
    prevent_initial_call=True,
)
def _narrow(selected, relayout, state):
    return c.narrow(PATH, state, selected, relayout)
