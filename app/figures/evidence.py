"""A finding's evidence over time, as the Anomalies page charts it beside the finding."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Sequence

import plotly.graph_objects as go

from ..units import fmt_num, time_unit
from .theme import DANGER, PCT_STYLE, _times, dict_figure, empty_figure, plot_text


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
    line. Built from dicts (the Anomalies page draws a dozen; validation would cost most)."""
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
