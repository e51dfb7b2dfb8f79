"""Pure figure builders: rows in, Plotly figures out; no database, no Dash."""

from __future__ import annotations

import json
import math

import plotly.graph_objects as go
import pytest

from modalscope.app import figures

HOSTILE = "<img src=x onerror=alert(1)>"


def _heat():
    return {
        "pairs": [
            {"caller": "api", "callee": HOSTILE, "count": 3, "calls_per_day": 72, "error_rate": 0.0,
             "p50_ms": 10.0, "p90_ms": 12.0, "p99_ms": 12.5, "counts": [0, 3, 0]},
            {"caller": "api", "callee": "userdb", "count": 10, "calls_per_day": 240, "error_rate": 0.1,
             "p50_ms": 8.0, "p90_ms": 40.0, "p99_ms": 90.0, "counts": [6, 2, 2]},
        ],
        "bins": [{"lo_ms": 6.3, "hi_ms": 7.9, "min_ms": 6.28, "max_ms": 7.95},
                 {"lo_ms": 7.9, "hi_ms": 10.0, "min_ms": 7.94, "max_ms": 10.01},
                 {"lo_ms": 10.0, "hi_ms": 100.0, "min_ms": 9.99, "max_ms": 100.1}],
    }


def _trace():
    t0 = 1_700_000_000_000_000_000
    mk = lambda sid, parent, name, start, dur, stage, depth, crit: {  # noqa: E731
        "span_id": sid, "parent_span_id": parent, "service": "svc", "name": name, "kind": "INTERNAL",
        "stage": stage, "start_unix_nano": t0 + int(start * 1e6), "duration_ms": dur, "self_ms": dur / 2,
        "status": "UNSET", "depth": depth, "critical": crit, "rank": 0.97, "op_count": 10}
    return {"trace_id": "ab" * 16, "spans": [
        mk("a", None, "root", 0, 100, "other", 0, True),
        mk("b", "a", HOSTILE, 5, 60, "encoder", 1, True),
        mk("c", "a", "parallel", 5, 70, "preprocessing", 1, False),  # children outlast the root together
        mk("d", "b", "leaf", 10, 20, "inference", 2, True),
    ]}


def _all_text(fig: go.Figure) -> str:
    return json.dumps(fig.to_plotly_json(), default=str)


def test_plot_text_escapes_and_shortens():
    assert figures.plot_text(HOSTILE) == "&lt;img src=x onerror=alert(1)&gt;"
    assert figures.plot_text("a & b") == "a &amp; b"
    assert figures.plot_text("x" * 500, 10) == "x" * 9 + "…"


def test_pair_heatmap():
    fig = figures.pair_heatmap(_heat())
    heat, *markers = fig.data
    assert heat.type == "heatmap" and len(markers) == 3
    assert [m.name for m in markers] == ["P50", "P90", "P99"]
    assert list(heat.x) == [0, 1]
    # y holds log10 bin edges (one more than rows), z the log10 of the counts (None: empty).
    assert len(heat.y) == 4 and heat.y[0] == pytest.approx(math.log10(6.3))
    assert heat.z[0][0] is None and heat.z[1][0] == pytest.approx(math.log10(3))
    assert [list(c) for c in heat.customdata[1]] == [[0, 1], [1, 1]]
    assert markers[2].y[1] == pytest.approx(math.log10(90.0))
    text = _all_text(fig)
    assert HOSTILE not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    assert list(fig.layout.xaxis.ticktext) == ["api → &lt;img src=x onerror=alert(1)&gt;", "api → userdb"]
    band = figures.pair_heatmap(_heat(), band=(1, 7.9, 10.0))
    assert len(band.layout.shapes) == 1


def test_empty_figures_say_what_to_do():
    for fig in (figures.pair_heatmap({"pairs": [], "bins": []}), figures.latency_histogram({"bins": []}),
                figures.percentile_timeseries([]), figures.traffic_figure([]), figures.stage_stack({"stages": []}),
                figures.stage_timeseries([]), figures.vit_layers_figure([]), figures.waterfall({"spans": []}),
                figures.icicle({"spans": []})):
        assert fig.data == () and fig.layout.annotations[0].text
    assert "modalscope demo" in figures.traffic_figure([]).layout.annotations[0].text
    assert "mm.layer" in figures.vit_layers_figure([]).layout.annotations[0].text


def test_latency_histogram_with_cdf_percentiles_and_band():
    dist = {"subject": "pair", "count": 10, "p50_ms": 9.0, "p90_ms": 40.0, "p99_ms": 95.0, "bins": [
        {"lo_ms": 7.9, "hi_ms": 10.0, "min_ms": 7.9, "max_ms": 10.0, "count": 6, "cdf": 0.6},
        {"lo_ms": 10.0, "hi_ms": 12.6, "min_ms": 10.0, "max_ms": 12.6, "count": 0, "cdf": 0.6},
        {"lo_ms": 12.6, "hi_ms": 100.0, "min_ms": 12.6, "max_ms": 100.0, "count": 4, "cdf": 1.0}]}
    fig = figures.latency_histogram(dist, band=(10.0, 12.6))
    bars, cdf = fig.data
    assert list(bars.y) == [6, 0, 4] and [list(c) for c in bars.customdata][0] == [7.9, 10.0]
    assert list(cdf.y) == [0.6, 0.6, 1.0] and cdf.yaxis == "y2"
    assert list(bars.marker.color) == [figures.ACCENT, figures.DANGER, figures.ACCENT]
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert sorted(round(s.x0, 6) for s in lines) == sorted(round(math.log10(v), 6) for v in (9.0, 40.0, 95.0))
    labels = [a.text for a in fig.layout.annotations]
    assert "P50 9 ms" in labels and "P99 95 ms" in labels


def test_time_charts_pick_readable_units():
    rows = [{"t": f"2026-11-30T14:0{i}:00.000Z", "count": 5, "p50_ms": 800.0, "p90_ms": 2500.0, "p99_ms": 6400.0}
            for i in range(3)]
    fig = figures.percentile_timeseries(rows)
    assert [d.name for d in fig.data] == ["P50", "P90", "P99"]
    assert fig.layout.yaxis.title.text == "latency (s)" and fig.data[2].y[0] == pytest.approx(6.4)
    assert fig.layout.dragmode == "select"
    small = figures.percentile_timeseries([{**r, "p90_ms": 20.0, "p99_ms": 30.0, "p50_ms": 10.0} for r in rows])
    assert small.layout.yaxis.title.text == "latency (ms)"
    traffic = figures.traffic_figure([
        {"t": "2026-11-30T14:00:00.000Z", "input_type": it, "count": 6, "rate_per_min": 6.0, "p50_ms": 300.0,
         "p99_ms": 500.0, "error_count": 0} for it in ("multi_image", "text", "zzz")])
    names = [d.name for d in traffic.data if d.type == "bar"]
    assert names == ["text", "multi_image", "zzz"]  # canonical input-type order, then the rest


def test_stage_stack_orders_stages_and_marks_end_to_end():
    rows = [{"input_type": it, "stage": st, "traces": 5, "p50_ms": 100.0, "p99_ms": 300.0, "mean_ms": 120.0,
             "total_ms": 600.0} for it in ("image", "text") for st in ("inference", "encoder", "preprocessing")]
    bd = {"stages": rows, "traces": {"text": {"count": 5, "p50_ms": 250.0, "p99_ms": 800.0},
                                     "image": {"count": 5, "p50_ms": 290.0, "p99_ms": 850.0}}}
    fig = figures.stage_stack(bd)
    bars = [d for d in fig.data if d.type == "bar"]
    assert [d.name for d in bars[:3]] == ["preprocessing", "encoder", "inference"]
    assert list(bars[0].x) == ["text", "image"]
    e2e = [d for d in fig.data if d.name == "end-to-end"]
    assert len(e2e) == 2 and list(e2e[1].y) == [800.0, 850.0]
    assert fig.layout.barmode == "stack"
    ts = figures.stage_timeseries([{"t": "2026-11-30T14:00:00.000Z", "stage": s, "count": 3, "value_ms": 5.0}
                                   for s in ("network", "encoder")])
    assert [d.name for d in ts.data] == ["encoder", "network"]


def test_vit_layers_figure():
    rows = [{"layer": l, "count": 10, "total_ms": 100.0, "mean_ms": 10.0, "p50_ms": 9.0, "p99_ms": 20.0,
             "operations": ["x"], "share": s} for l, s in (("patch_embed", 0.05), ("attention", 0.18), ("mlp", 0.36))]
    fig = figures.vit_layers_figure(rows)
    assert list(fig.data[0].y) == ["patch_embed", "attention", "mlp"]
    assert list(fig.data[0].text) == ["5.0 %", "18.0 %", "36.0 %"]
    assert fig.layout.xaxis.tickformat == ".0%"


def test_waterfall_indents_colours_and_highlights_the_critical_path():
    fig = figures.waterfall(_trace(), selected="b")
    # The selection is a pale band across its row plus an outline: neither is a stage.
    stage_bars = [d for d in fig.data if d.name not in ("critical path", "selected", "selected row")]
    band = [d for d in fig.data if d.name == "selected row"][0]
    assert list(band.y) == [1] and band.showlegend is False
    chosen = [d for d in fig.data if d.name == "selected"][0]
    # Accent, not red: a red outline marks an error span.
    assert list(chosen.y) == [1] and chosen.marker.line.color == figures.ACCENT and chosen.showlegend is False
    crit = [d for d in fig.data if d.name == "critical path"][0]
    assert {d.name for d in stage_bars} == {"other", "encoder", "preprocessing", "inference"}
    assert list(crit.y) == [0, 1, 3] and list(crit.base)[1] == pytest.approx(5.0)
    enc = [d for d in stage_bars if d.name == "encoder"][0]
    assert enc.marker.color == figures.STAGE_COLORS["encoder"]
    assert list(enc.customdata[0]) == ["b"]
    notes = fig.layout.annotations
    # From the 320 px label margin's left edge (+10 px), 10 px a level of depth.
    assert [a.xshift for a in notes] == [-310, -300, -300, -290]
    # "● service · name": critical mark, the service muted, the untrusted name escaped.
    assert notes[1].text == '● <span style="color:#6b7280">svc</span> · &lt;img src=x onerror=alert(1)&gt;'
    assert HOSTILE not in _all_text(fig)
    assert "P97 for" in enc.text[0]


def test_icicle_widens_parents_to_hold_their_children():
    fig = figures.icicle(_trace())
    ic = fig.data[0]
    values = dict(zip(ic.ids, ic.values))
    assert values["a"] == pytest.approx(130.0)  # 60 + 70 of parallel children > 100 ms
    assert values["b"] == 60 and values["d"] == 20
    assert list(ic.parents) == ["", "a", "a", "b"]
    assert HOSTILE not in _all_text(fig)


def test_every_figure_serialises():
    for fig in (figures.pair_heatmap(_heat()), figures.waterfall(_trace()), figures.icicle(_trace())):
        json.loads(fig.to_json())


def test_the_template_is_set_as_plotly_would_set_it():
    """base_layout sets plotly_white without re-validating it: the same JSON as the public way."""
    import plotly.graph_objects as go

    from modalscope.app.figures import base_layout

    ours = base_layout(go.Figure(), height=300).to_plotly_json()["layout"]
    public = go.Figure().update_layout(template="plotly_white").to_plotly_json()["layout"]
    assert ours["template"] == public["template"]
    assert ours["template"]["layout"]["plot_bgcolor"] == "white"
    assert ours["height"] == 300


def test_dict_built_figures_validate_and_match_the_validated_build(monkeypatch):
    """stage_stack and stage_timeseries skip plotly's validation for speed: built once with
    validation on, the same inputs give the same JSON (so every property they write is a
    valid one), and the two-panel layout is the one make_subplots lays out."""
    import json

    from plotly.subplots import make_subplots

    rows = [{"input_type": it, "stage": st, "traces": 5, "p50_ms": 10.0 * i, "p99_ms": None if i == 2 else 900.0 * i,
             "mean_ms": 1.0, "total_ms": 5.0}
            for it in ("image", "<b>x</b>") for i, st in enumerate(("inference", "encoder", "weird\u202estage"))]
    bd = {"stages": rows, "traces": {"image": {"count": 5, "p50_ms": 250.0, "p99_ms": 8000.0}}}
    series = [{"t": f"2026-11-30T14:{m:02d}:00.000Z", "stage": s, "count": 3, "value_ms": 5.0 * m}
              for m in range(0, 60, 15) for s in ("network", "encoder", "<i>odd</i>")]
    fast = [json.loads(figures.stage_stack(bd).to_json()), json.loads(figures.stage_timeseries(series).to_json())]
    monkeypatch.setattr(figures, "VALIDATE", True)
    checked = [json.loads(figures.stage_stack(bd).to_json()), json.loads(figures.stage_timeseries(series).to_json())]
    assert fast == checked
    layout = fast[0]["layout"]
    grid = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                         subplot_titles=("P50 of each stage alone (not additive)",
                                         "P99 of each stage alone (not additive)")).to_plotly_json()
    for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2"):
        assert {k: layout[axis][k] for k in grid["layout"][axis]} == grid["layout"][axis]
        assert layout[axis]["gridcolor"] == figures.GRID
    assert [{k: a[k] for k in g} for a, g in zip(layout["annotations"], grid["layout"]["annotations"])] \
        == grid["layout"]["annotations"]
    assert layout["template"]["layout"]["plot_bgcolor"] == "white"
    # Untrusted names still arrive escaped.
    assert "&lt;b&gt;x&lt;/b&gt;" in fast[0]["data"][0]["x"] and "<b>" not in json.dumps(fast)


def test_the_evidence_figure_built_from_dicts_is_the_validated_one(monkeypatch):
    """evidence_figure skips validation: the same JSON with validation on, and the shaded
    window is the rectangle add_vrect draws."""
    import json
    from datetime import datetime, timezone

    rows = [{"t": f"2026-11-30T14:{m:02d}:00.000Z", "count": 4, "p50_ms": 20.0 + m, "p95_ms": 50.0,
             "p99_ms": None if m == 10 else 2500.0 + m} for m in range(0, 60, 5)]
    start, end = datetime(2026, 11, 30, 14, 20, tzinfo=timezone.utc), datetime(2026, 11, 30, 14, 35, tzinfo=timezone.utc)
    fast = json.loads(figures.evidence_figure(rows, start, end).to_json())
    monkeypatch.setattr(figures, "VALIDATE", True)
    assert json.loads(figures.evidence_figure(rows, start, end).to_json()) == fast
    drawn = json.loads(go.Figure().add_vrect(x0=start, x1=end, fillcolor=figures.DANGER, opacity=0.12,
                                             line_width=0).to_json())["layout"]["shapes"]
    assert fast["layout"]["shapes"] == drawn
    assert [len(t["x"]) for t in fast["data"]] == [11, 11]  # the minute without a P99 is left out
    assert fast["data"][1]["y"][0] == 2.5 and fast["layout"]["yaxis"]["title"]["text"] == "s"
    assert fast["layout"]["height"] == 180 and fast["layout"]["showlegend"] is True
