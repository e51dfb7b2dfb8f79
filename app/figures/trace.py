"""One trace: the waterfall of its spans and its flame graph (icicle).

Big traces stay drawable: the waterfall shows at most ``WATERFALL_ROWS`` rows (chosen by
:func:`waterfall_rows`), and the icicle merges same-name siblings past that many spans.
"""

from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go

from ..units import fmt_count, fmt_ms, fmt_rank
from .theme import (ACCENT, CRITICAL, DANGER, INK, MUTED, base_layout, dict_figure, empty_figure, plot_text,
                    stage_color)


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
