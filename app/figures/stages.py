"""Stage charts: where a trace's time goes per stage, over time, inside the ViT encoder, and
a selection against its baseline."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from ..units import fmt_count, fmt_ms, fmt_pct, time_unit
from .theme import (CRITICAL, INPUT_TYPE_COLORS, STAGE_COLORS, _ordered, _times, base_layout, dict_figure,
                    empty_figure, plot_text, stage_color)


def stage_stack(breakdown: dict, tail: dict | None = None) -> go.Figure:
    """Per input type, stacked per-trace stage time: left, each stage's own P50; right, with
    ``tail`` (``queries.stage_time_at``) the mean stage self time of the traces at or above
    the end-to-end percentile, which adds up to those traces' mean duration (the marker and
    the number above it), else each stage's own P99. Per-stage percentiles do not add up to
    the trace's percentile: their end-to-end marker shows how far apart they are. Two x axes
    side by side sharing one y axis (laid out as ``make_subplots(1, 2, shared_yaxes=True)``
    would, much cheaper)."""
    rows = breakdown.get("stages") or []
    tail_rows = (tail or {}).get("stages") or []
    if not rows and not tail_rows:
        return empty_figure("No settled traces in this window — stage times appear once traces settle.")
    stages = _ordered({r["stage"] for r in rows} | {r["stage"] for r in tail_rows}, STAGE_COLORS)
    types = _ordered({r["input_type"] for r in rows} | {r["input_type"] for r in tail_rows}, INPUT_TYPE_COLORS)
    by_cell = {(r["input_type"], r["stage"]): r for r in rows}
    e2e = breakdown.get("traces") or {}
    totals = (tail or {}).get("traces") or {}
    at = str((tail or {}).get("at") or "p99").upper()
    peak = max([r["p99_ms"] or 0 for r in rows] + [v.get("p99_ms") or 0 for v in e2e.values()]
               + [v.get("mean_ms") or 0 for v in totals.values()])
    div, unit = time_unit(peak * 2)
    xs = [plot_text(t) for t in types]
    data: list[dict] = []
    shown: set[str] = set()

    def bars(cells: dict, key: str, axes: dict, what: str) -> None:
        for st in stages:
            vals = [((cells[(it, st)][key] or 0) / div if (it, st) in cells else 0) for it in types]
            name = plot_text(st)
            data.append(dict(type="bar", x=xs, y=vals, name=name, legendgroup=st, showlegend=st not in shown,
                             marker=dict(color=stage_color(st)), text=[fmt_ms(v * div) for v in vals],
                             textposition="none", hovertemplate=name + " " + what + ": %{text}<extra>%{x}</extra>",
                             **axes))
            shown.add(st)

    def marker(ys: list[float], label: str, axes: dict, first: bool, with_text: bool = False) -> None:
        text = [fmt_ms(y * div) for y in ys]
        extra = dict(mode="markers+text", textposition="top center", textfont=dict(size=12, color=CRITICAL)) \
            if with_text else dict(mode="markers")
        data.append(dict(type="scatter", x=xs, y=ys, name="end-to-end", legendgroup="e2e", showlegend=first,
                         marker=dict(symbol="line-ew-open", size=36, color=CRITICAL, line=dict(width=2.5)),
                         text=text, hovertemplate=label + ": %{text}<extra>%{x}</extra>", **extra, **axes))

    left, right = dict(xaxis="x", yaxis="y"), dict(xaxis="x2", yaxis="y2")
    bars(by_cell, "p50_ms", left, "P50 alone")
    marker([((e2e.get(it) or {}).get("p50_ms") or 0) / div for it in types], "end-to-end P50", left, True)
    if tail is not None:
        bars({(r["input_type"], r["stage"]): r for r in tail_rows}, "self_ms", right,
             f"mean self time, traces ≥ {at}")
        marker([((totals.get(it) or {}).get("mean_ms") or 0) / div for it in types],
               f"mean end-to-end of traces ≥ {at}", right, False, with_text=True)
        right_title = f"Where the {at} time goes (traces ≥ {at}, mean)"
    else:
        bars(by_cell, "p99_ms", right, "P99 alone")
        marker([((e2e.get(it) or {}).get("p99_ms") or 0) / div for it in types], "end-to-end P99", right, False)
        right_title = "P99 of each stage alone (not additive)"
    title = dict(font=dict(size=16), showarrow=False, xanchor="center", xref="paper", y=1.0, yanchor="bottom",
                 yref="paper")
    layout = dict(
        barmode="stack", margin=dict(l=64, r=24, t=36, b=80),
        legend=dict(orientation="h", yanchor="top", y=-0.12, xanchor="left", x=0, font=dict(size=11)),
        xaxis=dict(anchor="y", domain=[0.0, 0.48]),
        yaxis=dict(anchor="x", domain=[0.0, 1.0], title=dict(text=f"time per trace ({unit})")),
        xaxis2=dict(anchor="y2", domain=[0.52, 1.0]),
        yaxis2=dict(anchor="x2", domain=[0.0, 1.0], matches="y", showticklabels=False),
        annotations=[dict(title, text="P50 of each stage alone (not additive)", x=0.24),
                     dict(title, text=right_title, x=0.76)],
    )
    return dict_figure(data, layout, height=420, axes=("xaxis", "yaxis", "xaxis2", "yaxis2"))


def stage_timeseries(rows: Sequence[dict]) -> go.Figure:
    """P99 of per-trace stage time, one line per stage."""
    if not rows:
        return empty_figure("No stage data over time in this window.")
    div, unit = time_unit(max(r["value_ms"] or 0 for r in rows))
    by_stage: dict[str, list[dict]] = {}
    for r in rows:
        by_stage.setdefault(r["stage"], []).append(r)
    data = []
    for st in _ordered(set(by_stage), STAGE_COLORS):
        sub = by_stage[st]
        name = plot_text(st)
        data.append(dict(type="scatter", x=_times(sub), y=[(r["value_ms"] or 0) / div for r in sub],
                         mode="lines+markers", name=name, line=dict(color=stage_color(st), width=2),
                         marker=dict(size=4), text=[fmt_ms(r["value_ms"]) for r in sub],
                         hovertemplate="%{text}<extra>" + name + "</extra>"))
    layout = dict(yaxis=dict(title=dict(text=f"P99 ({unit})"), rangemode="tozero"),
                  xaxis=dict(title=dict(text="time (UTC)")), dragmode="select", selectdirection="h",
                  hovermode="x unified")
    return dict_figure(data, layout, height=320)


def vit_layers_figure(rows: Sequence[dict]) -> go.Figure:
    """ViT layer split: share of encoder time per layer (bars), mean and P99 in the hover."""
    if not rows:
        return empty_figure("No spans with mm.layer in this window — tag ViT spans with "
                            "mm.layer=patch_embed|attention|mlp to see the split.", height=220)
    names = [plot_text(r["layer"]) for r in rows]
    has_share = all(r.get("share") is not None for r in rows)
    vals = [(r["share"] if has_share else r["total_ms"]) for r in rows]
    fig = go.Figure(go.Bar(
        x=vals, y=names, orientation="h", marker=dict(color=STAGE_COLORS["encoder"]),
        text=[fmt_pct(v) if has_share else fmt_ms(v) for v in vals], textposition="outside",
        customdata=[[fmt_ms(r["mean_ms"]), fmt_ms(r["p99_ms"]), fmt_count(r["count"])] for r in rows],
        hovertemplate="%{y}: %{text} · mean %{customdata[0]} · P99 %{customdata[1]} · %{customdata[2]} spans<extra></extra>",
    ))
    base_layout(fig, height=80 + 46 * len(rows), margin=dict(l=110, r=60, t=24, b=40))
    if has_share:
        fig.update_xaxes(title_text="share of encoder-stage time", tickformat=".0%",
                         range=[0, max(vals) * 1.25 if vals else 1])
    else:
        fig.update_xaxes(title_text="total time (ms)")
    fig.update_yaxes(autorange="reversed")
    return fig


def compare_stage_figure(stages: Sequence[dict]) -> go.Figure:
    """Per stage: P99 of per-trace stage time in the selection vs the baseline."""
    rows = [s for s in stages if s.get("selection_p99_ms") is not None or s.get("baseline_p99_ms") is not None]
    if not rows:
        return empty_figure("No stage time in these windows.")
    div, unit = time_unit(max(max(s.get("selection_p99_ms") or 0, s.get("baseline_p99_ms") or 0) for s in rows))
    names = [plot_text(s["stage"]) for s in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=[(s.get("baseline_p99_ms") or 0) / div for s in rows], name="baseline P99",
                         marker=dict(color="#cbd5e1"), hovertemplate="%{x}: baseline P99 %{y:.3g} " + unit
                         + "<extra></extra>"))
    fig.add_trace(go.Bar(x=names, y=[(s.get("selection_p99_ms") or 0) / div for s in rows], name="selection P99",
                         marker=dict(color=[stage_color(s["stage"]) for s in rows]),
                         text=[f"{fmt_pct(s['share_of_added_time'], 0)} of added" if s["share_of_added_time"] else ""
                               for s in rows], textposition="outside",
                         hovertemplate="%{x}: selection P99 %{y:.3g} " + unit + "<extra></extra>"))
    base_layout(fig, height=320)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text=f"per-trace stage time P99 ({unit})", rangemode="tozero")
    return fig
