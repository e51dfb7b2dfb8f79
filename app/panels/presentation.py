"""How a built panel is shown: the light/dark theme, table panels drawn as images, the figure
JSON made safe for a ``<script>`` element, and the text and links around an embed."""

from __future__ import annotations

import json
import math
from typing import Any

import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder

from .. import figures
from .. import state as st
from ..params import rfc3339
from .query import Built, PanelQuery
from .tables import Table


THEMES = ("light", "dark")
DARK = {"paper": "#111827", "plot": "#111827", "ink": "#e5e7eb", "muted": "#9ca3af", "grid": "#374151"}


def apply_theme(fig: go.Figure, theme: str) -> go.Figure:
    """Dark: the same figure on a dark ground (the builders draw light)."""
    if theme != "dark":
        return fig
    fig.update_layout(template="plotly_dark", paper_bgcolor=DARK["paper"], plot_bgcolor=DARK["plot"],
                      font=dict(color=DARK["ink"]))
    fig.update_xaxes(gridcolor=DARK["grid"], linecolor=DARK["grid"])
    fig.update_yaxes(gridcolor=DARK["grid"], linecolor=DARK["grid"])
    for ann in fig.layout.annotations or ():
        if ann.font is not None and ann.font.color in (figures.INK, figures.CRITICAL):
            ann.font.color = DARK["ink"]
        elif ann.font is not None and ann.font.color == figures.MUTED:
            ann.font.color = DARK["muted"]
    for trace in fig.data:
        marker = getattr(trace, "marker", None)
        if trace.type == "bar" and marker is not None and marker.color == figures.CRITICAL:
            marker.color = DARK["ink"]  # the critical path and end-to-end marks: light on dark
        if trace.type == "scatter" and marker is not None and marker.color == figures.CRITICAL:
            marker.color = DARK["ink"]
    return fig


TABLE_CELL_CHARS = 80  # characters of a cell an image shows
ALERT_ROWS = ("ms-row-regression", "ms-sev-critical")
_CHAR_PX, _LINE_PX = 6.6, 16  # 12 px text: average glyph width and line height


def _cell_values(table: Table) -> list[list[str]]:
    rows = table.rows or [{table.columns[0][0]: table.empty}]
    return [[figures.plot_text(r.get(k, ""), TABLE_CELL_CHARS) for r in rows] for k, _ in table.columns]


def _column_weights(table: Table) -> list[int]:
    """Relative column widths: a column as wide as its longer texts (within bounds)."""
    out = []
    for k, header in table.columns:
        texts = [str(r.get(k, ""))[:TABLE_CELL_CHARS] for r in table.rows]
        longest = max((min(len(t), 60) for t in texts), default=0)
        word = max((min(len(w), 30) for t in texts for w in t.split()), default=0)  # unbreakable
        out.append(max(len(header), longest, word + 3, 6) + 2)
    return out


def table_height(table: Table, width: int) -> int:
    """The image height that shows every row of ``table`` at ``width`` CSS pixels: wrapped
    cells make taller rows, so count each row's lines in its widest-wrapping cell."""
    weights = _column_weights(table)
    inner = max(width - 24, 100)
    col_px = [inner * w / sum(weights) for w in weights]
    rows = table.rows or [{table.columns[0][0]: table.empty}]
    total = 44 + 30 + 12  # title, header, bottom margin
    for r in rows:
        lines = 1
        for (k, _), px in zip(table.columns, col_px):
            text = str(r.get(k, ""))[:TABLE_CELL_CHARS]
            lines = max(lines, math.ceil(len(text) * _CHAR_PX / max(px - 16, 20)))
        total += max(26, 10 + _LINE_PX * lines)
    return int(min(4000, total))


def table_figure(table: Table, title: str, theme: str = "light") -> go.Figure:
    """A table panel as a Plotly Table (for PNG/SVG): every cell through ``plot_text``."""
    dark = theme == "dark"
    head_fill, cell_fill, line = ("#1f2937", DARK["paper"], DARK["grid"]) if dark else ("#f3f4f6", "white", "#e5e7eb")
    ink = DARK["ink"] if dark else figures.INK
    alert = "#3b1d1d" if dark else "#fef2f2"  # a regression or critical finding, as the embed marks it
    marked = [i < len(table.row_classes) and table.row_classes[i] in ALERT_ROWS for i in range(len(table.rows))]
    fills = [alert if m else cell_fill for m in marked] or [cell_fill]
    fig = go.Figure(go.Table(
        columnwidth=_column_weights(table),
        header=dict(values=[f"<b>{figures.plot_text(h)}</b>" for _, h in table.columns], fill_color=head_fill,
                    line_color=line, align="left", font=dict(color=ink, size=12), height=30),
        cells=dict(values=_cell_values(table), fill_color=[fills] * len(table.columns), line_color=line,
                   align="left", font=dict(color=ink, size=12), height=26),
    ))
    figures.base_layout(fig, height=table_height(table, 1000), margin=dict(l=12, r=12, t=44, b=12),
                        title=dict(text=figures.plot_text(title), x=0.01, font=dict(size=14)))
    return apply_theme(fig, theme)


def image_size(built: Built, width: int | None = None) -> tuple[int, int]:
    """Default width and (for that width) height of the panel's image, CSS pixels."""
    w, h = built.query.panel.size
    w = width or w
    if built.table is not None:
        return w, table_height(built.table, w)
    if not h and built.figure is not None:
        h = int(built.figure.layout.height or 480)
    return w, h or 480


def figure_json(fig: go.Figure) -> str:
    """The figure as JSON safe to place inside ``<script type="application/json">``: ``<``,
    ``>`` and ``&`` (and the JavaScript line separators) as ``\\u`` escapes, so no string
    in it can end the element or open a comment."""
    return script_json(fig.to_plotly_json())


def script_json(value: Any) -> str:
    text = json.dumps(value, cls=PlotlyJSONEncoder, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def page_path(q: PanelQuery) -> str:
    return f"{q.panel.page}/{q.trace_id}" if q.panel.name == "trace" else q.panel.page


def open_href(q: PanelQuery) -> str:
    """The full page with the same query: a relative link to our own page (``state.to_href``
    quotes every value), never built from span text."""
    params = {k: v for k, v in q.params.items() if k != "trace_id"}
    return st.to_href(page_path(q), params)


def window_text(q: PanelQuery) -> str:
    if q.relative:
        return f"last {q.params.get('range') or st.DEFAULT_RANGE_LABEL}"
    return f"{rfc3339(q.window.start_ns)} → {rfc3339(q.window.end_ns)}".replace("T", " ")


def refresh_seconds(q: PanelQuery) -> int:
    """How often an embed of a relative window re-reads its data (0: never; an absolute
    window does not change): a minute for short windows, at most every 15 minutes."""
    if not q.relative:
        return 0
    return int(max(60, min(900, q.window.seconds / 60)))
