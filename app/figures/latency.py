"""Latency charts: the service-pair heatmap, the latency histogram, percentiles and traffic
over time, and model calls' duration against their tokens."""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..units import fmt_count, fmt_ms, fmt_pct, time_unit
from .theme import (ACCENT, DANGER, HEAT_SCALE, INK, INPUT_TYPE_COLORS, PCT_STYLE, _lg, _ordered, _times,
                    base_layout, empty_figure, input_type_color, log_ticks, plot_text)


# -- service pairs ---------------------------------------------------------------------
def pair_label(caller: str, callee: str) -> str:
    return f"{plot_text(caller, 40)} → {plot_text(callee, 40)}"


def pair_heatmap(heat: dict, band: tuple[int, float, float] | None = None) -> go.Figure:
    """x = caller→callee ordered by call volume (busiest right), y = latency bins on a log
    scale, colour = calls in the cell (log colour scale), P50/P90/P99 markers per pair.

    ``customdata`` of a cell is ``[pair index, bin index]``; of a marker ``[pair index, -1]``.
    """
    pairs, bins = heat.get("pairs") or [], heat.get("bins") or []
    if not pairs or not bins:
        return empty_figure("No service-pair calls in this window — CLIENT spans with a callee make pairs.")
    x = list(range(len(pairs)))
    labels = [pair_label(p["caller"], p["callee"]) for p in pairs]
    y_edges = [math.log10(bins[0]["lo_ms"])] + [math.log10(b["hi_ms"]) for b in bins]
    z, zlog, custom, hover = [], [], [], []
    for j, b in enumerate(bins):
        row, rowlog, crow, hrow = [], [], [], []
        for i, p in enumerate(pairs):
            c = p["counts"][j]
            row.append(c)
            rowlog.append(math.log10(c) if c > 0 else None)
            crow.append([i, j])
            hrow.append(f"{labels[i]}<br>{fmt_ms(b['min_ms'])} – {fmt_ms(b['max_ms'])}<br>"
                        f"{fmt_count(c)} calls ({fmt_pct(c / p['count'] if p['count'] else 0)} of the pair)"
                        "<br><i>click: traces in this band</i>")
        z.append(row)
        zlog.append(rowlog)
        custom.append(crow)
        hover.append(hrow)
    zmax = max((v for r in zlog for v in r if v is not None), default=1.0) or 1.0
    tick_vals = [v for v in range(0, int(math.ceil(zmax)) + 1)]
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        x=x, y=y_edges, z=zlog, customdata=custom, text=hover, hoverinfo="text", hovertemplate="%{text}<extra></extra>",
        colorscale=HEAT_SCALE, zmin=0, zmax=max(zmax, 1.0), xgap=2, ygap=0, name="calls",
        colorbar=dict(title=dict(text="calls", side="right"), tickvals=tick_vals,
                      ticktext=[fmt_count(10 ** v) for v in tick_vals], thickness=12),
    ))
    for key in ("p50", "p90", "p99"):
        name, color, symbol = PCT_STYLE[key]
        ys = [_lg(p[f"{key}_ms"]) for p in pairs]
        fig.add_trace(go.Scatter(
            x=x, y=ys, mode="markers", name=name, customdata=[[i, -1] for i in x],
            marker=dict(symbol=symbol, size=9, color=color, line=dict(width=1.5, color="white")),
            text=[f"{labels[i]}<br>{name} {fmt_ms(p[f'{key}_ms'])}" for i, p in enumerate(pairs)],
            hovertemplate="%{text}<extra></extra>",
        ))
    if band is not None:
        i, lo, hi = band
        fig.add_shape(type="rect", x0=i - 0.5, x1=i + 0.5, y0=math.log10(lo), y1=math.log10(hi),
                      line=dict(color=DANGER, width=2))
    tv, tt = log_ticks(bins[0]["lo_ms"], bins[-1]["hi_ms"])
    base_layout(fig, height=min(620, max(400, 14 * len(bins) + 160)), margin=dict(l=150 if len(pairs) > 3 else 64, r=24, t=36, b=110))
    fig.update_xaxes(tickvals=x, ticktext=labels, tickangle=-30 if len(pairs) > 3 else 0, automargin=True,
                     title_text="caller → callee (ordered by call volume, busiest right)", showgrid=False)
    fig.update_yaxes(tickvals=tv, ticktext=tt, title_text="call latency (log scale)",
                     range=[y_edges[0], y_edges[-1]], showgrid=False)
    # A marker wins a click only when the pointer is on it, so the cells around stay clickable.
    fig.update_layout(clickmode="event", hovermode="closest", hoverdistance=6)
    return fig


# -- distributions ---------------------------------------------------------------------
def _pct_lines(fig: go.Figure, dist: dict) -> None:
    """Dashed P50/P90/P99 lines with labels, in one layout update: ``add_vline`` per line
    is costly (it resolves subplot references and re-validates all shapes); these are
    the shapes and annotations it made, on the main x axis."""
    shapes, notes = list(fig.layout.shapes), list(fig.layout.annotations)
    for i, key in enumerate(("p50", "p90", "p99")):
        v = dist.get(f"{key}_ms")
        if v is None:
            continue
        name, color, _ = PCT_STYLE[key]
        x = math.log10(v)
        shapes.append(dict(type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="y domain",
                           line=dict(color=color, width=1.5, dash="dash")))
        notes.append(dict(text=f"{name} {fmt_ms(v)}", x=x, xref="x", y=1, yref="y domain", xanchor="left",
                          yanchor="top", yshift=-16 * i, showarrow=False, font=dict(size=11, color=color),
                          bgcolor="rgba(255,255,255,0.85)"))
    fig.update_layout(shapes=shapes, annotations=notes)


BAND_FILL = "rgba(220, 38, 38, 0.10)"  # the selected latency band, shaded behind the bars


def _band_shape(bins: Sequence[dict], band: tuple[float | None, float | None]) -> tuple[dict, dict] | None:
    """The selected band as a shaded region (log10 x) and its label; an open end runs to the
    histogram's edge. None when no band is selected or it lies outside the bins."""
    lo, hi = band
    if lo is None and hi is None:
        return None
    left, right = math.log10(bins[0]["lo_ms"]), math.log10(bins[-1]["hi_ms"])
    x0 = max(left, math.log10(lo)) if lo is not None and lo > 0 else left
    x1 = min(right, math.log10(hi)) if hi is not None and hi > 0 else right
    if x1 <= x0:
        return None
    label = f"selected {fmt_ms(lo) if lo is not None else '0'} – {fmt_ms(hi) if hi is not None else '∞'}"
    shape = dict(type="rect", x0=x0, x1=x1, xref="x", y0=0, y1=1, yref="y domain", layer="below",
                 fillcolor=BAND_FILL, line=dict(color=DANGER, width=1, dash="dot"), name="selected band")
    note = dict(text=label, x=(x0 + x1) / 2, xref="x", y=0, yref="y domain", yanchor="bottom", xanchor="center",
                showarrow=False, font=dict(size=11, color=DANGER), bgcolor="rgba(255,255,255,0.85)", yshift=2)
    return shape, note


def latency_histogram(dist: dict, band: tuple[float | None, float | None] = (None, None),
                      log_counts: bool = False) -> go.Figure:
    """Histogram (bars per log bin) and CDF (line, right axis) with P50/P90/P99 lines; the
    selected band shaded; ``log_counts`` puts the counts on a log axis, so the tail's few
    calls show beside the body's thousands.

    x is log10(ms) with readable tick labels; a bar's ``customdata`` is
    ``[min_ms, max_ms]`` of its band (what a click selects).
    """
    bins = dist.get("bins") or []
    if not bins:
        return empty_figure("No latency data for this selection in this window.")
    centers = [(math.log10(b["lo_ms"]) + math.log10(b["hi_ms"])) / 2 for b in bins]
    width = [math.log10(b["hi_ms"]) - math.log10(b["lo_ms"]) for b in bins]
    lo_b, hi_b = band
    colors = []
    for b in bins:
        selected = ((lo_b is not None or hi_b is not None) and (hi_b is None or b["min_ms"] < hi_b)
                    and (lo_b is None or b["max_ms"] > lo_b))
        colors.append(DANGER if selected else ACCENT)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(
        # An empty bin has no height on a log axis (log 0): left out rather than drawn at the floor.
        x=centers, y=[(b["count"] or None) if log_counts else b["count"] for b in bins], width=width,
        marker=dict(color=colors, line=dict(width=0)),
        name="calls" if dist.get("subject") == "pair" else "count",
        customdata=[[b["min_ms"], b["max_ms"]] for b in bins],
        text=[f"{fmt_ms(b['min_ms'])} – {fmt_ms(b['max_ms'])}: {fmt_count(b['count'])}"
              f"<br><i>click: traces in this band</i>" for b in bins],
        hovertemplate="%{text}<extra></extra>", textposition="none",
    ), secondary_y=False)
    fig.add_trace(go.Scatter(
        x=[math.log10(b["hi_ms"]) for b in bins], y=[b["cdf"] for b in bins], mode="lines",
        line=dict(color=INK, width=1.5, shape="hv"), name="CDF",
        text=[f"≤ {fmt_ms(b['max_ms'])}: {fmt_pct(b['cdf'])}" for b in bins], hovertemplate="%{text}<extra></extra>",
    ), secondary_y=True)
    _pct_lines(fig, dist)
    shaded = _band_shape(bins, band)
    if shaded is not None:
        # Assigned, not update_layout: that merges a list into the existing shapes item by item.
        fig.layout.shapes = [shaded[0], *fig.layout.shapes]
        fig.layout.annotations = [*fig.layout.annotations, shaded[1]]
    tv, tt = log_ticks(bins[0]["lo_ms"], bins[-1]["hi_ms"])
    base_layout(fig, height=340, bargap=0.05)
    fig.update_xaxes(tickvals=tv, ticktext=tt, title_text="latency (log scale)")
    if log_counts:
        # Ticks at powers of ten only: Plotly's 2 and 5 between them read as counts.
        fig.update_yaxes(type="log", title_text="count (log scale)", secondary_y=False, dtick=1,
                         exponentformat="none", separatethousands=True)
    else:
        fig.update_yaxes(title_text="count", secondary_y=False, separatethousands=True)
    fig.update_yaxes(title_text="CDF", range=[0, 1.02], tickformat=".0%", tickvals=[0, 0.25, 0.5, 0.75, 1],
                     secondary_y=True, showgrid=False)
    fig.update_layout(clickmode="event", hovermode="closest")
    return fig


def percentile_timeseries(rows: Sequence[dict]) -> go.Figure:
    """P50/P90/P99 over time (box-select or zoom on it narrows the window)."""
    rows = [r for r in rows if r.get("p50_ms") is not None]
    if not rows:
        return empty_figure("No data over time for this selection in this window.")
    div, unit = time_unit(max(r["p99_ms"] or 0 for r in rows))
    t = _times(rows)
    fig = go.Figure()
    for key in ("p50", "p90", "p99"):
        name, color, symbol = PCT_STYLE[key]
        fig.add_trace(go.Scatter(
            x=t, y=[r[f"{key}_ms"] / div for r in rows], mode="lines+markers", name=name,
            line=dict(color=color, width=2), marker=dict(size=4, color=color),
            text=[f"{name} {fmt_ms(r[f'{key}_ms'])} · {fmt_count(r['count'])} samples" for r in rows],
            hovertemplate="%{x|%H:%M} UTC · %{text}<extra></extra>",
        ))
    base_layout(fig, height=340)
    fig.update_yaxes(title_text=f"latency ({unit})", rangemode="tozero")
    fig.update_xaxes(title_text="time (UTC)")
    fig.update_layout(dragmode="select", selectdirection="h", hovermode="x unified")
    return fig


def traffic_figure(rows: Sequence[dict]) -> go.Figure:
    """Requests per minute (stacked by input type) and P99 per input type, over time."""
    if not rows:
        return empty_figure("No requests in this window — send OTLP to :4318 or run `modalscope demo`.")
    types = _ordered({r["input_type"] for r in rows}, INPUT_TYPE_COLORS)
    div, unit = time_unit(max(r["p99_ms"] or 0 for r in rows))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.4, 0.6])
    for it in types:
        sub = [r for r in rows if r["input_type"] == it]
        t = _times(sub)
        color = input_type_color(it)
        fig.add_trace(go.Bar(x=t, y=[r["rate_per_min"] for r in sub], name=plot_text(it), legendgroup=it,
                             marker=dict(color=color), hovertemplate="%{y:.3g} req/min<extra>" + plot_text(it) + "</extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=t, y=[(r["p99_ms"] or 0) / div for r in sub], mode="lines+markers",
                                 name=plot_text(it) + " P99", legendgroup=it, showlegend=False,
                                 line=dict(color=color, width=2), marker=dict(size=4),
                                 text=[fmt_ms(r["p99_ms"]) for r in sub],
                                 hovertemplate="P99 %{text}<extra>" + plot_text(it) + "</extra>"),
                      row=2, col=1)
    base_layout(fig, height=420, barmode="stack", bargap=0.1)
    fig.update_yaxes(title_text="requests / min", row=1, col=1)
    fig.update_yaxes(title_text=f"P99 ({unit})", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="time (UTC)", row=2, col=1)
    fig.update_layout(dragmode="select", selectdirection="h", hovermode="x")
    return fig


# -- tokens ------------------------------------------------------------------------------
TOKEN_COLORS = {True: "#f59e0b", False: "#3b82f6"}  # with image tokens / without


def tokens_latency_scatter(points: Sequence[dict]) -> go.Figure:
    """Model calls' duration against their input tokens (``tokens.scatter_points``), one
    colour for calls with image tokens and one for calls without."""
    if not points:
        return empty_figure("No model calls with token usage for this selection in this window.")
    div, unit = time_unit(max(p["y"] for p in points))
    fig = go.Figure()
    for image in (False, True):
        sub = [p for p in points if p["image"] is image]
        if not sub:
            continue
        name = "with image tokens" if image else "no image tokens"
        fig.add_trace(go.Scatter(
            x=[p["x"] for p in sub], y=[p["y"] / div for p in sub], mode="markers", name=name,
            marker=dict(color=TOKEN_COLORS[image], size=5, opacity=0.6),
            customdata=[p["trace_id"] for p in sub],
            text=[f"{plot_text(p['model'] or 'model')} · {p['x']:,} tokens in"
                  + (f" ({p['image_tokens']:,} image)" if image else "") + f" · {fmt_ms(p['y'])}" for p in sub],
            hovertemplate="%{text}<extra></extra>",
        ))
    base_layout(fig, height=340)
    fig.update_xaxes(title_text="input tokens", rangemode="tozero", separatethousands=True)
    fig.update_yaxes(title_text=f"model call duration ({unit})", rangemode="tozero")
    fig.update_layout(hovermode="closest")
    return fig
