"""Compare (``/compare``): the window (the selection) against a baseline — by default the
same length just before, or ``baseline_start``/``baseline_end`` — which stage's time grew,
and which attribute values are over-represented among the selection's slow spans
(``queries.compare``). Opened from "Compare this window" beside the time charts (after a
box-select has narrowed them to a spike) and from each finding. URL state: window,
filters, baseline.
"""

from __future__ import annotations

import dash
from dash import Input, Output, dcc, html

from modalscope.app import components as c
from modalscope.app import figures, ids, queries
from modalscope.app import state as st
from modalscope.app.params import ParamError, Window, parse_baseline_window
from modalscope.app.units import fmt_count, fmt_ms, fmt_num, fmt_pct

dash.register_page(__name__, path="/compare", name="Compare", title="modalscope · compare", order=7)

PATH = "/compare"


def baseline_of(state, window: Window) -> tuple[Window | None, str | None]:
    """The baseline window from the URL (None: the default), or an error message."""
    try:
        return parse_baseline_window(state, window), None
    except ParamError as exc:
        return None, f"{exc.parameter}: {exc.message} — using the same length just before"


def layout(**query):
    state = st.from_query(query)
    res = st.resolve(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.CMP_STATE, data=state),
        c.toolbar(PATH, state, error=res.error),
        html.Div(className="ms-subject", children=[
            html.H1(f"What changed: {queries.subject_label(res.filters)}", className="ms-title"),
            c.loading(html.Div(id=ids.CMP_SUMMARY, className="ms-summary")),
        ]),
        # Full width, one under the other: the stage table's eight columns and the attribute
        # values need the room (half a 1280 px screen broke their words).
        c.panel("Stage time: selection vs baseline", c.loading(c.graph(ids.CMP_STAGES)),
                html.Div(id=ids.CMP_STAGE_TABLE)),
        c.panel("Over-represented among slow spans", c.loading(html.Div(id=ids.CMP_ATTRS)),
                actions=html.Span("slow: above the selection's P90", className="ms-note")),
    ])


def _signed(ms):
    if ms is None:
        return "—"
    return ("+" if ms >= 0 else "−") + fmt_ms(abs(ms))


def stage_table(stages: list[dict]) -> html.Table:
    cols = [("stage", "stage"), ("sel50", "P50 selection"), ("base50", "P50 baseline"), ("d50", "Δ P50"),
            ("sel99", "P99 selection"), ("base99", "P99 baseline"), ("d99", "Δ P99"), ("share", "share of added time")]
    return c.text_table(cols, [{
        "stage": s["stage"], "sel50": fmt_ms(s["selection_p50_ms"]), "base50": fmt_ms(s["baseline_p50_ms"]),
        "d50": _signed(s["delta_p50_ms"]), "sel99": fmt_ms(s["selection_p99_ms"]),
        "base99": fmt_ms(s["baseline_p99_ms"]), "d99": _signed(s["delta_p99_ms"]),
        "share": fmt_pct(s["share_of_added_time"], 0),
    } for s in stages], id="compare-stage-rows", numeric=[k for k, _ in cols[1:]])


def attribute_table(rows: list[dict]) -> html.Table:
    cols = [("attr", "attribute"), ("lift", "lift"), ("sel", "share of slow spans (selection)"),
            ("base", "share (baseline)"), ("counts", "spans: slow selection / baseline")]
    return c.text_table(cols, [{
        "attr": f"{r['key']} = {r['value']}", "lift": f"{fmt_num(r['lift'])}×", "sel": fmt_pct(r["selection_share"]),
        "base": fmt_pct(r["baseline_share"]), "counts": f"{fmt_count(r['selection_count'])} / "
                                                        f"{fmt_count(r['baseline_count'])}",
    } for r in rows], id="compare-attribute-rows", numeric=[k for k, _ in cols[1:]])


@dash.callback(
    Output(ids.CMP_SUMMARY, "children"),
    Output(ids.CMP_STAGES, "figure"),
    Output(ids.CMP_STAGE_TABLE, "children"),
    Output(ids.CMP_ATTRS, "children"),
    Input(ids.CMP_STATE, "data"),
)
def _fill(state):
    state = state or {}
    res = st.resolve(state)
    baseline, error = baseline_of(state, res.window)
    out = queries.compare(c.reader(), res.window, baseline, res.filters)
    sel, base = out["selection"], out["baseline"]
    items = [("selection", c.span_text(sel["start"], sel["end"])), ("baseline", c.span_text(base["start"], base["end"])),
             ("samples", f"{fmt_count(sel['count'])} vs {fmt_count(base['count'])}"),
             ("slow above", fmt_ms(out["slow_threshold_ms"]))]
    summary = [html.Div([html.Span(k, className="ms-stat-label"), html.Span(v, className="ms-stat-value")],
                        className="ms-stat") for k, v in items]
    if error:
        summary.insert(0, c.banner(error))
    grown = sorted((s for s in out["stages"] if s["share_of_added_time"] > 0),
                   key=lambda s: -s["share_of_added_time"])
    if grown:
        summary.append(html.Div(f"{fmt_pct(grown[0]['share_of_added_time'], 0)} of the added time per trace is "
                                f"{grown[0]['stage']}", className="ms-note", id="compare-headline"))
    if sel["count"] == 0:
        return summary, figures.compare_stage_figure([]), c.no_data("samples for this selection"), html.Div()
    if out["attributes"]:
        attrs = attribute_table(out["attributes"])
    else:
        attrs = c.empty_state("No attribute value stands out among the slow spans.",
                              "The baseline may have no spans (raw spans past retention), or the slow spans "
                              "look like the rest.")
    return summary, figures.compare_stage_figure(out["stages"]), stage_table(out["stages"]), attrs
