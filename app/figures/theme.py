"""What every chart shares: the palette, the text guard, the base layout and the fast build.

Untrusted text reaches Plotly only through :func:`plot_text`; every builder styles its
figure with :func:`base_layout` (a ``go.Figure``) or :func:`dict_figure` (plain dicts).
"""

from __future__ import annotations

import html
import math
import re
import sys
from datetime import datetime
from typing import Iterable, Sequence

import plotly.graph_objects as go
import plotly.io as pio

from ..units import fmt_ms


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
    validates the whole template on every figure, a large share of building a chart.
    This is what plotly does itself when it applies ``pio.templates.default`` to a new figure;
    the JSON is identical (tests/app/test_figures.py)."""
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


def _validating() -> bool:
    """``VALIDATE`` of the package, read at each build: the flag lives on
    ``modalscope.app.figures``, where the tests switch it on."""
    return sys.modules[__package__].VALIDATE


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
        fig = go.Figure(data=data, layout=full, _validate=_validating())
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
