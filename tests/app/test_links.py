"""URL state, the hrefs every interaction computes, and readable units: pure functions."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from modalscope.app import ids, links
from modalscope.app import state as st
from modalscope.app.units import fmt_count, fmt_ms, fmt_pct, fmt_rank, time_unit

NOW = 1_796_000_000_000_000_000


def _q(href: str) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}


@pytest.mark.parametrize("ms,text", [(0.0004, "0.40 µs"), (0.85, "850 µs"), (12.34, "12.3 ms"), (320, "320 ms"),
                                     (1300, "1.3 s"), (6400, "6.4 s"), (125_000, "2.08 min"), (None, "—"), (0, "0 ms")])
def test_fmt_ms(ms, text):
    assert fmt_ms(ms) == text


def test_other_units():
    assert fmt_rank(0.97) == "P97" and fmt_rank(0.9973) == "P99.7" and fmt_rank(1.0) == "P100"
    assert fmt_rank(None) == "—" and fmt_count(142891) == "143 k" and fmt_count(1234) == "1,234"
    assert fmt_pct(0.0123) == "1.2 %" and time_unit(1999) == (1.0, "ms") and time_unit(2500) == (1000.0, "s")


def test_query_round_trip():
    state = st.from_query({"range": ["1h", "7d"], "service": " api ", "caller": "", "bogus": "x",
                           "callee": "a&b=c", "min_ms": "12.5"})
    assert state == {"range": "7d", "service": "api", "callee": "a&b=c", "min_ms": "12.5"}
    href = st.to_href("/drilldown", state)
    assert href == "/drilldown?range=7d&service=api&callee=a%26b%3Dc&min_ms=12.5"
    assert st.from_query(_q(href)) == state
    assert st.to_search({}) == ""
    times = st.to_search({"start": "2026-11-30T14:00:00.000Z"})
    assert times == "?start=2026-11-30T14:00:00.000Z"  # ':' stays readable
    assert st.carried({**state, "span": "ab", "sort": "x"}) == {"range": "7d", "service": "api", "callee": "a&b=c"}


def test_resolve_falls_back_with_a_message():
    res = st.resolve({"range": "abc"}, now_ns=NOW)
    assert res.error.startswith("range:") and res.window.seconds == 3600
    ok = st.resolve({"start": "2026-11-30T14:00:00Z", "end": "2026-11-30T15:00:00Z", "stage": "encoder"})
    assert ok.error is None and ok.filters.stage == "encoder" and not ok.relative
    assert st.band({"min_ms": "5", "max_ms": "nan"}) == (5.0, None)
    assert st.band({"min_ms": "-1"}) == (None, None)


def test_steps_and_pairs_and_sort():
    from modalscope.app.params import Window

    assert st.step_minutes(Window(0, 15 * 60 * 10**9)) == 1
    assert st.step_minutes(Window(0, 7 * 86400 * 10**9)) == 120
    v = st.pair_value("a\"b", "c,d")
    assert st.parse_pair_value(v) == ("a\"b", "c,d") and st.parse_pair_value("junk") == (None, None)
    assert st.parse_sort("p99_ms:asc", ("p99_ms",), "count") == ("p99_ms", "asc")
    assert st.parse_sort("evil:asc", ("p99_ms",), "count") == ("count", "desc")
    rows = [{"v": 2}, {"v": None}, {"v": 5}]
    assert st.sort_rows(rows, "v", "desc") == [{"v": 5}, {"v": 2}, {"v": None}]
    assert st.num(0.1250001) == "0.125" and st.num(3.0) == "3"


def test_toolbar_hrefs():
    state = {"start": "2026-11-30T14:00:00.000Z", "caller": "a", "callee": "b", "min_ms": "5", "max_ms": "9"}
    href, err = links.toolbar_href("/drilldown", state, ids.RANGE, {"range": "6h"})
    assert err == "" and _q(href) == {"range": "6h", "caller": "a", "callee": "b", "min_ms": "5", "max_ms": "9"}
    href, _ = links.toolbar_href("/", {}, ids.APPLY, {"start": "1796000000", "end": "2026-11-30T15:00Z"})
    assert _q(href)["start"].endswith("Z") and _q(href)["end"] == "2026-11-30T15:00:00.000Z"
    for values, message in (({"start": ""}, "Give a start"), ({"start": "yesterday"}, "RFC 3339"),
                            ({"start": "2026-11-30T15:00Z", "end": "2026-11-30T14:00Z"}, "after start")):
        href, err = links.toolbar_href("/", {}, ids.APPLY, values)
        assert href is None and message in err
    # A new pair drops the band (it belonged to the old subject).
    href, _ = links.toolbar_href("/drilldown", state, ids.PAIR,
                                 {"pair": st.pair_value("x", "y"), "service": None, "stage": None, "input_type": None})
    assert _q(href) == {"start": "2026-11-30T14:00:00.000Z", "caller": "x", "callee": "y"}
    href, _ = links.toolbar_href("/pairs", state, ids.CLEAR, {})
    assert href == "/pairs?start=2026-11-30T14:00:00.000Z"


def test_time_selection_from_box_select_or_zoom():
    sel = {"points": [], "range": {"x2": ["2026-11-30 14:05:10.5", "2026-11-30 14:20"], "y2": [0, 1]}}
    assert links.time_selection(sel, None) == ("2026-11-30T14:05:10.500Z", "2026-11-30T14:20:00.000Z")
    zoom = {"xaxis.range[0]": "2026-11-30 14:30", "xaxis.range[1]": "2026-11-30 14:30:20"}
    assert links.time_selection(None, zoom) == ("2026-11-30T14:30:00.000Z", "2026-11-30T14:31:00.000Z")
    assert links.time_selection(None, {"autosize": True}) is None
    assert links.time_selection({"range": {"x": ["junk", "x"]}}, None) is None
    href = links.narrow_href("/stages", {"range": "24h", "stage": "encoder"}, sel, None)
    assert _q(href) == {"start": "2026-11-30T14:05:10.500Z", "end": "2026-11-30T14:20:00.000Z", "stage": "encoder"}
    assert links.narrow_href("/stages", {}, None, None) is None


def test_heatmap_and_histogram_clicks():
    heat = links.heat_index({"pairs": [{"caller": "api", "callee": "db"}, {"caller": "api", "callee": "llm"}],
                             "bins": [{"lo_ms": 1.0, "hi_ms": 10.0, "min_ms": 0.998, "max_ms": 10.001},
                                      {"lo_ms": 10.0, "hi_ms": 100.0, "min_ms": 9.999, "max_ms": 100.2}]})
    state = {"range": "7d", "input_type": "image", "sort": "p99_ms:desc", "stage": "network"}
    cell = {"points": [{"curveNumber": 0, "x": 1, "y": 1.5, "z": 2}]}
    assert _q(links.heatmap_click_href(state, heat, cell)) == {
        "range": "7d", "caller": "api", "callee": "llm", "input_type": "image", "min_ms": "9.999", "max_ms": "100.2"}
    marker = {"points": [{"curveNumber": 3, "x": 0, "y": 0.4}]}
    assert _q(links.heatmap_click_href(state, heat, marker)) == {
        "range": "7d", "caller": "api", "callee": "db", "input_type": "image"}
    for bad in (None, {}, {"points": []}, {"points": [{"x": 7, "y": 1}]}, {"points": [{"x": 0, "y": 9}]}):
        assert links.heatmap_click_href(state, heat, bad) is None
    bar = {"points": [{"customdata": [12.5, 15.8]}]}
    assert _q(links.band_click_href({"callee": "db"}, bar)) == {"callee": "db", "min_ms": "12.5", "max_ms": "15.8"}
    assert links.band_click_href({}, {"points": [{}]}) is None


def test_open_trace_href():
    href, err = links.open_href(" ABCDEF0123456789ABCDEF0123456789 ", {"range": "6h", "service": "x", "span": "y"})
    assert err == "" and href == "/trace/abcdef0123456789abcdef0123456789?range=6h"
    href, err = links.open_href("javascript:alert(1)", {})
    assert href is None and "32 hexadecimal" in err
