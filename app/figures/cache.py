"""Cache charts: hit rate per cache and group over time, and each group's share of lookups."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from ..units import fmt_count, fmt_pct
from .theme import _times, base_layout, empty_figure, plot_text


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
