"""What the pages draw for an on-call reader, checked without a server: table cells that
keep words whole and numbers right-aligned, the pair table's few columns, the extrapolated
calls/day saying so, the latency histogram's log counts and shaded band, the waterfall's
rows and error spans."""

from __future__ import annotations

import math

import pytest
from dash import html

from modalscope.app import components as c
from modalscope.app import figures, panels
from modalscope.app import state as st

DIST = {
    "subject": "pair", "count": 1011, "p50_ms": 12.0, "p90_ms": 40.0, "p99_ms": 900.0, "error_rate": 0.0,
    "bins": [
        {"lo_ms": 10.0, "hi_ms": 20.0, "min_ms": 10.0, "max_ms": 20.0, "count": 1000, "cdf": 0.989},
        {"lo_ms": 20.0, "hi_ms": 100.0, "min_ms": 20.0, "max_ms": 100.0, "count": 0, "cdf": 0.989},
        {"lo_ms": 100.0, "hi_ms": 1000.0, "min_ms": 100.0, "max_ms": 1000.0, "count": 11, "cdf": 1.0},
    ],
}
PAIRS = [
    {"caller": "gateway", "callee": "vision-encoder", "count": 1070, "calls_per_day": 25680.0, "p50_ms": 972.0,
     "p90_ms": 2100.0, "p99_ms": 4010.0, "error_rate": 0.004},
    {"caller": "metering", "callee": "usagedb.internal.example.com:5432", "count": 12, "calls_per_day": 288.0,
     "p50_ms": 2.5, "p90_ms": 4.0, "p99_ms": 8.3, "error_rate": 0.25},
]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The page modules register with Dash, so an app must exist before they import."""
    from modalscope.app import create_app
    from modalscope.settings import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path_factory.mktemp('pages') / 'store.db'}"))
    from modalscope.app.pages import drilldown, pairs

    yield {"pairs": pairs, "drilldown": drilldown}
    app.extensions["modalscope"]["engine"].dispose()


def _walk(component):
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children] if children is not None else []:
        if hasattr(child, "to_plotly_json"):
            yield from _walk(child)


def _classes(component) -> list[str]:
    return (getattr(component, "className", None) or "").split()


def test_text_table_right_aligns_numbers_and_keeps_words_whole():
    long_id = "mm.preprocessing_variant_for_multi_image_requests"
    table = c.text_table([("stage", "stage"), ("p50", "P50"), ("share", "share"), ("counts", "spans"),
                          ("note", "note")],
                         [{"stage": "preprocessing", "p50": "1.23 s", "share": "12 %", "counts": "1,234 / 56",
                           "note": long_id},
                          {"stage": "vit forward", "p50": "—", "share": "3.5 %", "counts": "7 / 0",
                           "note": "two words"}])
    head = table.children[0].children
    assert [("col-num" in _classes(th)) for th in head.children] == [False, True, True, True, False]
    first = table.children[1].children[0].children
    assert [("col-num" in _classes(td)) for td in first] == [False, True, True, True, False]
    # One word: kept on its line; past LONG_WORD characters, cut with the whole text in its tooltip.
    assert "ms-word" in _classes(first[0]) and first[0].children == "preprocessing"
    cut = first[4].children
    assert cut.className == "ms-cut" and cut.title == long_id and cut.children == long_id
    # Text with spaces wraps at them: left as plain text.
    second = table.children[1].children[1].children
    assert second[0].children == "vit forward" and second[4].children == "two words"
    # Key/value tables show span data whole, as plain text.
    kv = c.text_table([("key", "key"), ("value", "value")], [{"key": long_id, "value": "x" * 100}],
                      className="ms-table ms-kv")
    assert [td.children for td in kv.children[1].children[0].children] == [long_id, "x" * 100]


def test_number_text():
    for text in ("1,234", "12.3 ms", "850 µs", "2.79 s", "4.2 min", "−4 s", "+12 ms", "2.5 %", "1.4×",
                 "3.1/min", "320 ms / 410 ms", "12 k", "1.2 M"):
        assert c.is_number_text(text), text
    for text in ("preprocessing", "P97", "ok (+3 %)", "", "gateway → llm", "1.2.3"):
        assert not c.is_number_text(text), text


def test_pair_table_has_room_for_errors_and_says_calls_per_day_is_extrapolated(pages):
    pairs = pages["pairs"]

    out = pairs.pairs_table(PAIRS, {})
    table = out.children[0]
    assert "extrapolated" in out.children[1].children
    head = [th.className.split()[0] for th in table.children[0].children.children]
    assert head == ["col-caller", "col-count", "col-p50_ms", "col-p99_ms", "col-error_rate"]
    rows = table.children[1].children
    assert len(rows) == 2
    first = rows[0].children
    assert "extrapolated" in first[1].title and "25.7 k calls/day" in first[1].title
    assert [td.children for td in first[1:]] == ["1,070", "972 ms", "4.01 s", "0.4 %"]
    assert all("col-num" in td.className for td in first[1:])
    # Caller and callee in one link, each whole; a long name cut with an ellipsis and a tooltip.
    spans = [x for x in _walk(rows[1].children[0]) if isinstance(x, html.Span)]
    assert [s.children for s in spans] == ["metering", " → ", "usagedb.internal.example.com:5432"]
    assert "ms-cut" in spans[2].className and spans[2].title == "usagedb.internal.example.com:5432"
    assert "ms-bad" in rows[1].children[-1].className
    # Old links sorting by calls/day or P90 still sort (calls/day by the calls column).
    sorted_head = pairs.pairs_table(PAIRS, {"sort": "calls_per_day:asc"}).children[0].children[0].children.children
    assert "▲" in sorted_head[1].children.children
    # The embedded and PNG pair table names its extrapolation too.
    assert ("calls_per_day", "calls/day (extrapolated)") in panels.pair_table(PAIRS).columns


def test_latency_histogram_log_counts_and_shaded_band():
    fig = figures.latency_histogram(DIST)
    assert fig.layout.yaxis.type in (None, "linear")
    assert not [s for s in fig.layout.shapes if s.type == "rect"]
    fig = figures.latency_histogram(DIST, (100.0, 1000.0), log_counts=True)
    assert fig.layout.yaxis.type == "log" and "log" in fig.layout.yaxis.title.text
    bars = fig.data[0]
    assert list(bars.y) == [1000, None, 11]  # an empty bin has no bar on a log axis
    assert list(bars.marker.color) == [figures.ACCENT, figures.ACCENT, figures.DANGER]
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == 1
    band = rects[0]
    assert (band.x0, band.x1) == (2.0, 3.0) and band.yref == "y domain" and band.layer == "below"
    assert any("selected 100 ms – 1 s" in a.text for a in fig.layout.annotations)
    # An open band runs to the histogram's edge; a band outside the bins shades nothing.
    open_band = [s for s in figures.latency_histogram(DIST, (100.0, None)).layout.shapes if s.type == "rect"][0]
    assert (open_band.x0, open_band.x1) == (2.0, 3.0)
    assert not [s for s in figures.latency_histogram(DIST, (5000.0, 9000.0)).layout.shapes if s.type == "rect"]


def test_drilldown_log_counts_lives_in_the_url(pages):
    drilldown = pages["drilldown"]

    state = st.from_query({"counts": "log", "input_type": "image", "min_ms": "100"})
    assert state["counts"] == "log" and drilldown.log_counts(state)
    assert "counts=log" in drilldown.page_href(state, min_ms=None)
    control = next(x for x in _walk(drilldown.counts_control(state)) if getattr(x, "id", None) == drilldown.COUNTS_ID)
    assert control.value == "log"
    assert not drilldown.log_counts(st.from_query({}))
    assert "counts" not in st.carried(state)  # a drilldown view setting, not carried to other pages


def test_waterfall_rows_name_services_seconds_past_10s_and_errors_stand_out():
    t0 = 1_700_000_000_000_000_000
    ms = 1_000_000

    def span(i, parent, service, name, start_ms, dur_ms, status="OK"):
        return {"span_id": f"{i:016x}", "parent_span_id": parent and f"{parent:016x}", "service": service,
                "name": name, "stage": "other", "kind": "INTERNAL", "start_unix_nano": t0 + start_ms * ms,
                "duration_ms": dur_ms, "self_ms": dur_ms, "status": status, "depth": 0 if parent is None else 1,
                "critical": parent is None}

    spans = [span(1, None, "gateway", "POST /chat", 0, 12_500), span(2, 1, "llm", "llm.generate", 100, 12_000,
                                                                       "ERROR")]
    fig = figures.waterfall({"spans": spans}, None)
    layout = fig["layout"] if isinstance(fig, dict) else fig.layout
    data = fig["data"] if isinstance(fig, dict) else fig.data

    def get(obj, key):
        return obj[key] if isinstance(obj, dict) else getattr(obj, key)

    labels = [get(a, "text") for a in get(layout, "annotations")]
    assert "gateway" in labels[0] and "llm" in labels[1] and figures.DANGER in labels[1] and "✕" in labels[1]
    assert "✕" not in labels[0]
    xaxis = get(layout, "xaxis")
    assert get(get(xaxis, "title"), "text") == "s since trace start" and math.isclose(get(xaxis, "range")[1], 12.75)
    outline = [d for d in data if get(d, "name") == "error outline"]
    assert outline and get(get(get(outline[0], "marker"), "line"), "color") == figures.DANGER
    marks = [d for d in data if get(d, "name") == "error"]
    assert marks and "status ERROR" in get(marks[0], "text")[0]
    short = figures.waterfall({"spans": [span(1, None, "gateway", "GET /", 0, 250)]}, None)
    short_layout = short["layout"] if isinstance(short, dict) else short.layout
    assert get(get(get(short_layout, "xaxis"), "title"), "text") == "ms since trace start"
