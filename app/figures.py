"""Pure figure builders: rows from ``app.queries`` in, a ``plotly.graph_objects.Figure`` out.

No database, no Dash: every builder is tested on its own. Untrusted text (service and
span names, attribute values) reaches Plotly only through :func:`plot_text`, which
escapes ``<``, ``>`` and ``&``: Plotly renders a small HTML subset (``<a href>``,
``<b>``, ...) in labels and hover text, and entities come back out as literal text.
"""

from __future__ import annotations

import html
import math
import re
from datetime import datetime
from typing import Iterable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .units import fmt_count, fmt_ms, fmt_num, fmt_pct, fmt_rank, time_unit

FONT = "Inter, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
INK = "#1f2937"
MUTED = "#6b7280"
GRID = "#e5e7eb"
ACCENT = "#2563eb"
DANGER = "#dc2626"
CRITICAL = "#111827"

STAGE_COLORS = {
    "preprocessing": "#f59e0b",
    "encoder": "#3b82f6",
    "fusion": "#8b5cf6",
    "inference": "#10b981",
    "network": "#94a3b8",
    "other": "#d6d3d1",
}
INPUT_TYPE_COLORS = {
    "text": "#3b82f6",
    "image": "#f59e0b",
    "multi_image": "#ef4444",
    "audio": "#14b8a6",
    "unknown": "#a8a29e",
}
PCT_STYLE = {"p50": ("P50", "#10b981", "circle"), "p90": ("P90", "#f59e0b", "diamond"),
             "p99": ("P99", "#dc2626", "x")}
HEAT_SCALE = [[0.0, "#f8fafc"], [0.15, "#dbeafe"], [0.4, "#60a5fa"], [0.7, "#1d4ed8"], [1.0, "#172554"]]


# C0/C1 controls (but tab and newline) and bidirectional overrides: shown as U+FFFD, so a
# span name cannot reorder or hide the text around it in a label.
UNSAFE_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def plot_text(value: object, limit: int = 120) -> str:
    """Untrusted text made inert for Plotly (escaped, shortened, no control or bidi characters)."""
    text = str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(UNSAFE_CHARS.sub("\ufffd", text), quote=False)


def stage_color(stage: str | None) -> str:
    return STAGE_COLORS.get(stage or "other", STAGE_COLORS["other"])


def input_type_color(it: str) -> str:
    return INPUT_TYPE_COLORS.get(it, "#64748b")


def _use_template(fig: go.Figure, name: str = "plotly_white") -> None:
    """Set a built-in template without re-validating it: ``update_layout(template=...)``
    validates the whole template on every figure (25 ms of a page's ~50 ms a chart, measured).
    This is what plotly does itself when it applies ``pio.templates.default`` to a new figure;
    the JSON is identical (tests/app/test_figures.py)."""
    import plotly.io as pio

    layout = fig.layout
    if not hasattr(layout, "_validate"):  # another plotly: the public, slower way
        fig.update_layout(template=name)
        return
    layout._validate = False
    try:
        layout.template = pio.templates[name]
    finally:
        layout._validate = True


def _base_settings(height: int) -> dict:
    """The theme's layout for every chart (``base_layout`` and ``dict_figure``)."""
    return dict(
        font=dict(family=FONT, size=12, color=INK),
        margin=dict(l=64, r=24, t=36, b=48),
        height=height,
        hoverlabel=dict(font=dict(family=FONT, size=12)),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0, font=dict(size=11)),
    )


def _axis_style() -> dict:
    return {"gridcolor": GRID, "zeroline": False, "linecolor": GRID}


def base_layout(fig: go.Figure, *, height: int = 360, **kw) -> go.Figure:
    _use_template(fig)
    settings = _base_settings(height)
    settings.update(kw)
    fig.update_layout(**settings)
    fig.update_xaxes(**_axis_style())
    fig.update_yaxes(**_axis_style())
    return fig


# Figures built from plain dicts skip plotly's per-property validation (a chart of ~40
# traces: ~25 ms validated, ~3 ms not). Only for builders whose every property is tested to
# validate: tests/app/test_figures.py builds them once with VALIDATE = True and compares.
VALIDATE = False


def dict_figure(data: list[dict], layout: dict, *, height: int = 360,
                axes: Sequence[str] = ("xaxis", "yaxis")) -> go.Figure:
    """A figure from trace and layout dicts, styled as ``base_layout`` styles one (same
    template, font, margins, legend, and grid on each of ``axes``), built without
    re-validating what the builder wrote."""
    full = _base_settings(height)
    for axis in axes:
        full[axis] = _axis_style()
    for key, value in layout.items():
        if key in axes:
            full[key] = {**full[key], **value}
        else:
            full[key] = value
    try:
        fig = go.Figure(data=data, layout=full, _validate=VALIDATE)
    except TypeError:  # another plotly without the private flag: the public, validated way
        fig = go.Figure(data=data, layout=full)
    _use_template(fig)
    return fig


def empty_figure(message: str, height: int = 260) -> go.Figure:
    """A blank chart that says why it is blank (and what to do)."""
    fig = go.Figure()
    base_layout(fig, height=height)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.add_annotation(text=plot_text(message, 300), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color=MUTED))
    return fig


def log_ticks(lo_ms: float, hi_ms: float) -> tuple[list[float], list[str]]:
    """Tick positions (log10 ms) and labels (1 ms, 10 ms, 100 ms, 1 s ...) covering a range."""
    lo = math.floor(math.log10(max(lo_ms, 1e-6)))
    hi = math.ceil(math.log10(max(hi_ms, 1e-6)))
    vals, text = [], []
    for e in range(lo, hi + 1):
        for m in ((1, 2, 5) if hi - lo <= 2 else (1, 3) if hi - lo <= 4 else (1,)):
            v = m * 10.0 ** e
            if lo_ms * 0.8 <= v <= hi_ms * 1.25:
                vals.append(math.log10(v))
                text.append(fmt_ms(v))
    return vals, text


def _ordered(values: set, canonical: dict) -> list:
    """Known values in their canonical order, then the rest alphabetically."""
    known = [v for v in canonical if v in values]
    return known + sorted(v for v in values if v not in canonical)


def _lg(ms: float | None) -> float | None:
    return math.log10(ms) if ms and ms > 0 else None


def _times(rows: Iterable[dict]) -> list[datetime]:
    return [datetime.fromisoformat(r["t"].replace("Z", "+00:00")) for r in rows]


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
    cost 40 ms each (it resolves subplot references and re-validates all shapes); these are
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


# -- stages ----------------------------------------------------------------------------
def stage_stack(breakdown: dict, tail: dict | None = None) -> go.Figure:
    """Per input type, stacked per-trace stage time: left, each stage's own P50; right, with
    ``tail`` (``queries.stage_time_at``) the mean stage self time of the traces at or above
    the end-to-end percentile, which adds up to those traces' mean duration (the marker and
    the number above it), else each stage's own P99. Per-stage percentiles do not add up to
    the trace's percentile: their end-to-end marker shows how far apart they are. Two x axes
    side by side sharing one y axis (laid out as ``make_subplots(1, 2, shared_yaxes=True)``
    would, ~10× cheaper)."""
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


# -- one trace -------------------------------------------------------------------------
WATERFALL_ROWS = 200  # spans drawn as rows; past this the rest collapse into one summary row
ROW_PX = 18  # a row's height: room for an 11 px label, so every label fits
BAR_WIDTH = 0.7  # of one row, set on every bar: Plotly would size a bar by the gap to its
# trace's next bar, so a stage with rows far apart got bars several rows tall
LABEL_PX = 320  # left margin holding the "service · span" labels
SECONDS_FROM_MS = 10_000.0  # a trace this long reads in seconds, a shorter one in ms
SELECTED_BAND = "rgba(37,99,235,0.12)"


def waterfall_rows(spans: Sequence[dict], selected: str | None = None,
                   max_rows: int = WATERFALL_ROWS) -> tuple[list[dict], list[dict]]:
    """(shown, hidden): every span when ``max_rows`` hold them all; past that ``max_rows - 1``
    rows (the last one counts the rest): the selected span, the slowest spans of the critical
    path (up to 60 % of the rows), the slowest errors (up to 80 %), then the slowest of all,
    each with its ancestors so a row keeps its place in the tree; in the spans' own order."""
    spans = list(spans)
    if len(spans) <= max_rows:
        return spans, []
    by_id = {s["span_id"]: s for s in spans}
    budget = max(1, max_rows - 1)
    keep: set[str] = set()

    def take(s: dict) -> None:
        chain: list[str] = []
        cur: dict | None = s
        while cur is not None and cur["span_id"] not in keep and cur["span_id"] not in chain:
            chain.append(cur["span_id"])
            cur = by_id.get(cur.get("parent_span_id") or "")
        if len(keep) + len(chain) <= budget:
            keep.update(chain)

    slowest = sorted(spans, key=lambda s: -s["duration_ms"])
    # Each kind up to a share of the rows, so a long critical path leaves room for errors
    # and the slowest spans off the path; whatever is left goes to the slowest of all.
    passes = (([by_id[selected]] if selected in by_id else [], 1.0),
              ([s for s in slowest if s.get("critical")], 0.6),
              ([s for s in slowest if s.get("status") == "ERROR"], 0.8),
              (slowest, 1.0))
    for group, share in passes:
        cap = max(1, int(budget * share))
        for s in group:
            if len(keep) >= cap:
                break
            take(s)
    return [s for s in spans if s["span_id"] in keep], [s for s in spans if s["span_id"] not in keep]


def hidden_summary(hidden: Sequence[dict]) -> str:
    """"… 1,800 more spans in 14 services (12 errors)" for the spans a waterfall leaves out."""
    services = len({s["service"] for s in hidden})
    errors = sum(1 for s in hidden if s.get("status") == "ERROR")
    return (f"… {fmt_count(len(hidden))} more span{'' if len(hidden) == 1 else 's'} in {services} "
            f"service{'' if services == 1 else 's'}" + (f" ({errors} error{'' if errors == 1 else 's'})" if errors else ""))


def _row_label(s: dict, indent_px: int) -> str:
    """``● service · name``: service muted, an error's name red after a red ✕, cut to fit the margin."""
    room = max(16, int((LABEL_PX - 14 - indent_px) / 6.4))  # characters of 11 px text
    service = plot_text(s["service"], min(22, room // 2))
    error = s.get("status") == "ERROR"
    name = plot_text(s["name"], max(8, room - len(html.unescape(service)) - (6 if error else 4)))
    mark = "● " if s.get("critical") else ""
    if error:  # red, and marked ✕ as on its bar: not by colour alone
        mark += f'<span style="color:{DANGER}">✕</span> '
        name = f'<span style="color:{DANGER}">{name}</span>'
    return f'{mark}<span style="color:{MUTED}">{service}</span> · {name}'


def waterfall(trace: dict, selected: str | None = None, max_rows: int = WATERFALL_ROWS) -> go.Figure:
    """Spans on a time axis since the trace start (seconds from 10 s, else ms), one row
    each labelled "service · span" and indented by depth, coloured by stage; the critical
    path drawn as a dark bar inside the spans it runs through, error spans outlined in red
    with a red mark at their end. Past ``max_rows`` spans, :func:`waterfall_rows` picks the
    rows and a last row counts the rest.

    ``customdata[0]`` of every bar is the span id (a click selects the span)."""
    spans = trace.get("spans") or []
    if not spans:
        return empty_figure("This trace has no spans.")
    shown, hidden = waterfall_rows(spans, selected, max_rows)
    t0 = min(s["start_unix_nano"] for s in spans)
    total_ms = max((s["start_unix_nano"] - t0) / 1e6 + s["duration_ms"] for s in spans)
    div, unit = (1000.0, "s") if total_ms >= SECONDS_FROM_MS else (1.0, "ms")
    row = {s["span_id"]: i for i, s in enumerate(shown)}
    n_rows = len(shown) + (1 if hidden else 0)

    def bars(group: Sequence[dict]) -> dict:
        return {"y": [row[s["span_id"]] for s in group],
                "x": [max(s["duration_ms"], 0.0005) / div for s in group],
                "base": [(s["start_unix_nano"] - t0) / 1e6 / div for s in group],
                "customdata": [[s["span_id"]] for s in group]}

    data: list[dict] = []
    chosen = [s for s in shown if s["span_id"] == selected]
    if chosen:  # a pale band across the selected row, under everything
        data.append({"type": "bar", "orientation": "h", "y": [row[selected]], "x": [total_ms / div * 1.02],
                     "base": [0], "width": 1, "name": "selected row", "showlegend": False, "hoverinfo": "skip",
                     "marker": {"color": SELECTED_BAND, "line": {"width": 0}}})
    stages: dict[str, list[dict]] = {}
    for s in shown:
        stages.setdefault(s["stage"], []).append(s)
    for stage, group in stages.items():
        data.append({"type": "bar", "orientation": "h", **bars(group), "width": BAR_WIDTH, "name": plot_text(stage),
                     "marker": {"color": stage_color(stage), "line": {"width": 0}},
                     "text": [_span_hover(s) for s in group], "hovertemplate": "%{text}<extra></extra>",
                     "textposition": "none"})
    crit = [s for s in shown if s.get("critical")]
    if crit:
        data.append({"type": "bar", "orientation": "h", **bars(crit), "width": 0.18, "name": "critical path",
                     "marker": {"color": CRITICAL}, "text": [_span_hover(s) for s in crit],
                     "hovertemplate": "%{text}<extra>critical path</extra>", "textposition": "none"})
    errors = [s for s in shown if s.get("status") == "ERROR"]
    if errors:  # a red outline (its own trace: the stage legend keeps plain swatches) and a mark
        b = bars(errors)
        data.append({"type": "bar", "orientation": "h", **b, "width": BAR_WIDTH, "name": "error outline",
                     "showlegend": False, "hoverinfo": "skip",
                     "marker": {"color": "rgba(0,0,0,0)", "line": {"width": 2, "color": DANGER}}})
        data.append({"type": "scatter", "mode": "markers", "y": b["y"], "customdata": b["customdata"],
                     "x": [x + base for x, base in zip(b["x"], b["base"])], "name": "error",
                     "marker": {"color": DANGER, "symbol": "x", "size": 8, "line": {"width": 1, "color": DANGER}},
                     "text": [_span_hover(s) for s in errors], "hovertemplate": "%{text}<extra>error</extra>"})
    if chosen:
        data.append({"type": "bar", "orientation": "h", **bars(chosen), "width": BAR_WIDTH, "name": "selected",
                     "showlegend": False, "hoverinfo": "skip",
                     "marker": {"color": "rgba(0,0,0,0)", "line": {"width": 2.5, "color": ACCENT}}})
    labels = [dict(x=0, xref="paper", y=i, yref="y", xanchor="left",
                   xshift=-(LABEL_PX - 10) + 10 * min(s.get("depth", 0), 10), text=_row_label(s, 10 * min(s.get("depth", 0), 10)),
                   showarrow=False, align="left", font=dict(size=11, color=INK), captureevents=False)
              for i, s in enumerate(shown)]
    if hidden:
        labels.append(dict(x=0, xref="paper", y=len(shown), yref="y", xanchor="left", xshift=-(LABEL_PX - 10),
                           text=f"<i>{hidden_summary(hidden)} · all in the Spans table</i>", showarrow=False,
                           align="left", font=dict(size=11, color=MUTED), captureevents=False))
    layout = {
        "barmode": "overlay", "clickmode": "event", "hovermode": "closest", "annotations": labels,
        "margin": dict(l=LABEL_PX, r=24, t=40, b=48),
        "xaxis": {"title": {"text": f"{unit} since trace start"}, "range": [0, total_ms / div * 1.02],
                  "ticksuffix": f" {unit}", "exponentformat": "none", "separatethousands": True},
        # Rows are fixed, not autoranged: row i is y = i, top to bottom.
        "yaxis": {"range": [n_rows - 0.5, -0.5], "showticklabels": False, "showgrid": False, "zeroline": False,
                  "fixedrange": True},
    }
    return dict_figure(data, layout, height=max(220, 100 + ROW_PX * n_rows))


def _span_hover(s: dict) -> str:
    rank = s.get("rank")
    rank_text = f"<br>{fmt_rank(rank)} for {plot_text(s['name'], 60)} in the window" if rank is not None else ""
    err = "<br><b>status ERROR</b>" if s.get("status") == "ERROR" else ""
    return (f"<b>{plot_text(s['name'], 80)}</b> · {plot_text(s['service'], 40)}<br>"
            f"{plot_text(s['stage'])} · {s['kind']} · {fmt_ms(s['duration_ms'])} (self {fmt_ms(s['self_ms'])})"
            f"{rank_text}{err}")


def _merged_spans(spans: Sequence[dict]) -> list[dict]:
    """Siblings of the same service and name as one node (a flame graph's stacks): a node's
    duration is their sum, ``count`` how many; parents before children as in ``spans``."""
    ids = {s["span_id"] for s in spans}
    key: dict[str, str] = {}
    nodes: dict[str, dict] = {}
    for s in spans:  # depth-first order: a parent's key is known before its children's
        p = s["parent_span_id"]
        parent = key.get(p, "") if p in ids and p != s["span_id"] else ""
        k = key[s["span_id"]] = f"{parent}/{len(parent)}:{s['service']}\x00{s['name']}"
        node = nodes.get(k)
        if node is None:
            nodes[k] = {**s, "span_id": k, "parent_span_id": parent or None, "count": 1,
                        "error_count": int(s.get("status") == "ERROR")}
        else:
            node["duration_ms"] += s["duration_ms"]
            node["self_ms"] += s["self_ms"]
            node["count"] += 1
            node["rank"] = None  # a rank belongs to one span, not to a sum
            node["error_count"] += int(s.get("status") == "ERROR")
    return list(nodes.values())


def icicle(trace: dict, max_nodes: int = WATERFALL_ROWS) -> go.Figure:
    """Flame graph (icicle) of the trace: a span's width is its duration. Past ``max_nodes``
    spans, siblings of the same service and name merge into one node (their summed time),
    so a trace of thousands of spans draws as its few dozen distinct call stacks."""
    spans = trace.get("spans") or []
    if not spans:
        return empty_figure("This trace has no spans.")
    merged = len(spans) > max_nodes
    if merged:
        spans = _merged_spans(spans)
    ids = {s["span_id"] for s in spans}
    # Children can outlast a parent (clock skew): icicle "total" values need parent >= sum of
    # children, so values are widened bottom-up where necessary.
    value = {s["span_id"]: max(s["duration_ms"], 0.001) for s in spans}
    kids: dict[str, list[str]] = {}
    for s in spans:
        p = s["parent_span_id"]
        if p in ids and p != s["span_id"]:
            kids.setdefault(p, []).append(s["span_id"])
    for s in reversed(spans):  # spans come depth-first: children after parents
        ch = kids.get(s["span_id"])
        if ch:
            value[s["span_id"]] = max(value[s["span_id"]], sum(value[c] for c in ch))
    roots = [s for s in spans if s["parent_span_id"] not in ids or s["parent_span_id"] == s["span_id"]]
    fig = go.Figure(go.Icicle(
        ids=[s["span_id"] for s in spans],
        labels=[plot_text(s["name"], 60) for s in spans],
        parents=[(s["parent_span_id"] if s["parent_span_id"] in ids and s["parent_span_id"] != s["span_id"] else "")
                 for s in spans],
        values=[value[s["span_id"]] for s in spans],
        branchvalues="total",
        marker=dict(colors=[stage_color(s["stage"]) for s in spans], line=dict(color="white", width=1)),
        text=[_span_hover(s) + (f"<br>{s['count']} spans merged ({s['error_count']} errors)" if merged else "")
              for s in spans], hovertemplate="%{text}<extra></extra>",
        texttemplate="%{label}", tiling=dict(orientation="v"), root=dict(color="white"),
        sort=False,
    ))
    base_layout(fig, height=140 + 34 * min(max(s.get("depth", 0) for s in spans) + 1, 30),
                margin=dict(l=8, r=8, t=28 if merged else 8, b=8))
    if merged:
        fig.add_annotation(text=f"{fmt_count(len(trace['spans']))} spans as {fmt_count(len(spans))} call stacks "
                                "(same-name siblings merged)", x=0, y=1, xref="paper", yref="paper", showarrow=False,
                           xanchor="left", yanchor="bottom", font=dict(color=MUTED))
    if len(roots) > 1:
        fig.add_annotation(text=f"{len(roots)} roots", x=1, y=1, xref="paper", yref="paper", showarrow=False,
                           font=dict(color=MUTED))
    return fig


# -- cache, compare, findings ------------------------------------------------
GROUP_COLORS = ("#2563eb", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#14b8a6", "#ec4899", "#84cc16",
                "#6b7280", "#0ea5e9")


def group_label(cache: str, group: str | None, several_caches: bool) -> str:
    g = "(none)" if group is None else group
    return f"{cache} · {g}" if several_caches else g


def cache_hit_rate_figure(rows: Sequence[dict]) -> go.Figure:
    """Hit rate per cache and group over time (``queries.cache_series`` rows)."""
    if not rows:
        return empty_figure("No cache lookups (spans with cache.name and cache.hit) in this window.")
    several = len({r["cache"] for r in rows}) > 1
    keys = sorted({(r["cache"], r["group"]) for r in rows}, key=lambda k: (k[0], k[1] is None, k[1] or ""))
    fig = go.Figure()
    for i, (cache, group) in enumerate(keys[:20]):
        sub = [r for r in rows if r["cache"] == cache and r["group"] == group]
        label = plot_text(group_label(cache, group, several), 60)
        color = GROUP_COLORS[i % len(GROUP_COLORS)]
        fig.add_trace(go.Scatter(
            x=_times(sub), y=[r["hit_rate"] for r in sub], mode="lines+markers", name=label,
            line=dict(color=color, width=2), marker=dict(size=4, color=color),
            text=[f"{label}: {fmt_pct(r['hit_rate'])} of {fmt_count(r['hits'] + r['misses'])} lookups" for r in sub],
            hovertemplate="%{x|%H:%M} UTC · %{text}<extra></extra>",
        ))
    base_layout(fig, height=340)
    fig.update_yaxes(title_text="hit rate", range=[0, 1.05], tickformat=".0%")
    fig.update_xaxes(title_text="time (UTC)")
    fig.update_layout(dragmode="select", selectdirection="h", hovermode="x unified")
    return fig


def cache_share_figure(rows: Sequence[dict]) -> go.Figure:
    """Each group's share of its cache's lookups, with its hit rate (``queries.cache_rates`` rows)."""
    if not rows:
        return empty_figure("No cache lookups in this window.")
    several = len({r["cache"] for r in rows}) > 1
    labels = [plot_text(group_label(r["cache"], r["group"], several), 60) for r in rows]
    fig = go.Figure(go.Bar(
        x=[r["share"] for r in rows], y=labels, orientation="h",
        marker=dict(color=[GROUP_COLORS[i % len(GROUP_COLORS)] for i in range(len(rows))]),
        text=[f"{fmt_pct(r['share'], 0)} · hit {fmt_pct(r['hit_rate'], 0)}" for r in rows], textposition="auto",
        customdata=[fmt_count(r["hits"] + r["misses"]) for r in rows],
        hovertemplate="%{y}: %{x:.1%} of lookups (%{customdata})<extra></extra>",
    ))
    base_layout(fig, height=max(200, 60 + 34 * len(rows)))
    fig.update_xaxes(title_text="share of lookups", range=[0, 1], tickformat=".0%")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(showlegend=False)
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


#: Reference lines of an evidence chart (thresholds, ceilings, baselines), in order.
EVIDENCE_LINE_COLORS = ("#7c3aed", "#0f766e", "#b45309", "#64748b")
EVIDENCE_UNITS = ("ms", "pct")


def evidence_figure(rows: Sequence[dict], start: datetime | None, end: datetime | None, height: int = 180, *,
                    series: Sequence[tuple[str, str, str]] | None = None,
                    lines: Sequence[tuple[str, float]] = (), unit: str = "ms") -> go.Figure:
    """A finding's evidence over time, the finding's window shaded: ``series`` (``(key, name,
    colour)``: ``rows``' values of ``key`` against ``t``; by default the subject's P50 and P99,
    rows without a P99 left out) and each of ``lines`` (``(name, value)``: the threshold,
    ceiling or baseline the finding is about, a dashed line across the chart named with its
    value). One unit a chart: ``unit`` "ms" (durations, drawn in ms or s as the largest value
    of the series and lines asks) or "pct" (fractions, drawn as %); the legend names every
    line. Built from dicts (the Anomalies page draws a dozen: ~56 ms each validated)."""
    if unit not in EVIDENCE_UNITS:
        raise ValueError(f"unit must be one of {EVIDENCE_UNITS}")
    if series is None:
        rows = [r for r in rows if r.get("p99_ms") is not None]
        series = [("p50_ms", *PCT_STYLE["p50"][:2]), ("p99_ms", *PCT_STYLE["p99"][:2])]
    lines = [(str(name), float(v)) for name, v in lines
             if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    drawn = [(key, name, color, [r for r in rows if isinstance(r.get(key), (int, float))]) for key, name, color in series]
    if not any(pts for *_, pts in drawn):
        return empty_figure("No rollups for this subject around the window.", height=height)
    if unit == "ms":
        top = max([abs(r[key]) for key, _, _, pts in drawn for r in pts] + [abs(v) for _, v in lines] + [0])
        div, label = time_unit(top)
        hover = "%{y:.3g} " + label
    else:
        div, label, hover = 0.01, "%", "%{y:.1f} %"

    def text(v: float) -> str:
        return f"{fmt_num(v / div)} {label}"

    times = {key: _times(pts) for key, _, _, pts in drawn}
    every = [t for ts in times.values() for t in ts] + [t for t in (start, end) if t is not None]
    data = []
    for key, name, color, pts in drawn:
        data.append({"type": "scatter", "x": times[key], "y": [r[key] / div for r in pts], "mode": "lines",
                     "name": plot_text(name, 60), "line": {"color": color, "width": 1.5},
                     "hovertemplate": "%{x|%H:%M} UTC · " + plot_text(name, 60) + " " + hover + "<extra></extra>"})
    for n, (name, v) in enumerate(lines):
        color = EVIDENCE_LINE_COLORS[n % len(EVIDENCE_LINE_COLORS)]
        entry = plot_text(f"{name} {text(v)}", 80)
        data.append({"type": "scatter", "x": [min(every), max(every)], "y": [v / div, v / div], "mode": "lines",
                     "name": entry, "line": {"color": color, "width": 1.2, "dash": "dash"},
                     "hovertemplate": entry + "<extra></extra>", "meta": "threshold"})
    layout: dict = {"margin": {"l": 52, "r": 10, "t": 10, "b": 30}, "showlegend": True,
                    "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0,
                               "font": {"size": 10}},
                    "yaxis": {"title": {"text": label}, "rangemode": "tozero"}}
    if unit == "pct":
        layout["yaxis"]["ticksuffix"] = " %"
    if start is not None and end is not None:  # as add_vrect draws it
        layout["shapes"] = [{"type": "rect", "x0": start, "x1": end, "xref": "x", "y0": 0, "y1": 1,
                             "yref": "y domain", "fillcolor": DANGER, "opacity": 0.12, "line": {"width": 0}}]
    return dict_figure(data, layout, height=height)


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
