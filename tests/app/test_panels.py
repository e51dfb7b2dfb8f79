"""app/panels.py without a server: parameters, dispatch to the pages' query and figure
functions, tables, theme, safe JSON and the share URLs."""

from __future__ import annotations

import html
import json
import time
from html.parser import HTMLParser
from urllib.parse import parse_qsl, urlsplit

import pytest

from modalscope.app import figures, panels, queries, signing
from modalscope.app import state as st
from modalscope.app.params import ParamError, Window
from modalscope.core.spans import STATUS_ERROR
from modalscope.models.reader import Filters
from tests.demo_stores import PATTERNS

HOSTILE = "<img src=x onerror=alert(1)>"
SECRET = "panel-test-secret"
CONTRACT_PANELS = ("pair-heatmap", "pair-table", "input-types", "stages", "latency-timeline", "cache", "anomalies",
                   "trace")


def _window_args() -> dict[str, str]:
    return {"start": str(PATTERNS.start_ns / 1e9), "end": str(PATTERNS.end_ns / 1e9 + 120)}


def _window() -> Window:
    return Window(PATTERNS.start_ns, PATTERNS.end_ns + 120 * 10**9)


# -- parameters ------------------------------------------------------------------------
def test_the_contract_panels_and_nothing_else():
    assert panels.PANEL_NAMES == CONTRACT_PANELS
    assert panels.get_panel("nope") is None
    for p in panels.PANELS.values():
        assert {"range", "start", "end"} <= set(p.keys)
        assert p.page.startswith("/") and p.kind in ("figure", "table")


def test_split_params_refuses_what_a_panel_does_not_take():
    stages = panels.PANELS["stages"]
    data, pres = panels.split_params(stages, [("range", "7d"), ("stage", ""), ("theme", "dark"), ("sig", "x"),
                                              ("exp", "1")], ("theme",))
    assert data == {"range": "7d"} and pres == {"theme": "dark"}  # blanks dropped, signature set aside
    with pytest.raises(ParamError) as exc:
        panels.split_params(stages, {"caller": "api"})
    assert exc.value.parameter == "caller" and "stages" in exc.value.message and "input_type" in exc.value.message
    with pytest.raises(ParamError) as exc:
        panels.split_params(stages, {"width": "300"})  # presentation the caller did not allow
    assert exc.value.parameter == "width"
    with pytest.raises(ParamError) as exc:
        panels.split_params(stages, [("range", "1h"), ("range", "7d")])
    assert exc.value.parameter == "range" and "once" in exc.value.message


@pytest.mark.parametrize("name, args, parameter", [
    ("stages", {"range": "7x"}, "range"),
    ("stages", {"range": "1h", "start": "1700000000"}, "range"),
    ("stages", {"start": "yesterday"}, "start"),
    ("stages", {"service": "x" * 2000}, "service"),
    ("pair-table", {"sort": "p99_ms:sideways"}, "sort"),
    ("pair-table", {"sort": "password"}, "sort"),
    ("input-types", {"baseline": "text:fast:410"}, "baseline"),
    ("input-types", {"margin": "-3"}, "margin"),
    ("input-types", {"margin": "nan"}, "margin"),
    ("cache", {"group_by": HOSTILE}, "group_by"),
    ("trace", {"range": "1h"}, "trace_id"),
    ("trace", {"trace_id": "javascript:alert(1)"}, "trace_id"),
    ("trace", {"trace_id": "ab" * 16, "span": "<b>"}, "span"),
    ("anomalies", {"range": "30d"}, "range"),  # the detectors' longest window: 7 days, as the API
])
def test_bad_values_name_their_parameter(name, args, parameter):
    with pytest.raises(ParamError) as exc:
        panels.parse_query(panels.PANELS[name], args)
    assert exc.value.parameter == parameter and exc.value.message


def test_parse_query_reads_each_panels_selection():
    q = panels.parse_query(panels.PANELS["pair-table"], {"range": "24h", "sort": "p99_ms:asc", "caller": "api"})
    assert q.sort == ("p99_ms", "asc") and q.filters == Filters(caller="api") and q.relative
    assert q.window.seconds == 86400
    q = panels.parse_query(panels.PANELS["input-types"], {"baseline": "text:100:200", "margin": "25"})
    assert q.baseline["text"] == (100.0, 200.0) and q.baseline["image"] == queries.SEED_BASELINE["image"]
    assert q.margin == 0.25
    q = panels.parse_query(panels.PANELS["cache"], {"group_by": "tenant.id", "cache": "profile"})
    assert (q.group_by, q.cache) == ("tenant.id", "profile")
    assert panels.parse_query(panels.PANELS["cache"], {}).group_by == "user_tier"  # as the Cache page
    q = panels.parse_query(panels.PANELS["trace"], {"trace_id": "AB" * 16, "span": "00000000000000A1",
                                                    "start": "1700000000", "end": "1700003600"})
    assert q.trace_id == "ab" * 16 and q.span == "00000000000000a1" and not q.relative


def test_panel_params_take_the_panels_part_of_a_page_state():
    state = {"range": "7d", "caller": "api", "callee": "db", "min_ms": "5", "sort": "count:desc", "span": "ab"}
    assert panels.panel_params(panels.PANELS["stages"], state) == {"range": "7d"}
    assert panels.panel_params(panels.PANELS["pair-table"], state) == {"range": "7d", "caller": "api",
                                                                       "callee": "db", "sort": "count:desc"}
    assert panels.panel_params(panels.PANELS["trace"], state, "cd" * 16) == {"trace_id": "cd" * 16, "range": "7d",
                                                                             "span": "ab"}


def test_open_href_is_our_page_with_the_same_query():
    q = panels.parse_query(panels.PANELS["pair-heatmap"], {"range": "7d", "service": 'x"&y=<b>', "caller": "a b"})
    href = panels.open_href(q)
    assert href.startswith("/pairs?")
    assert dict(parse_qsl(urlsplit(href).query)) == {"range": "7d", "service": 'x"&y=<b>', "caller": "a b"}
    assert '"' not in href and "<" not in href and " " not in href
    q = panels.parse_query(panels.PANELS["trace"], {"trace_id": "ab" * 16, "range": "1h", "span": "a1" * 8})
    assert panels.open_href(q) == f"/trace/{'ab' * 16}?range=1h&span={'a1' * 8}"
    q = panels.parse_query(panels.PANELS["input-types"], {})
    assert panels.open_href(q) == "/"
    q = panels.parse_query(panels.PANELS["latency-timeline"], {"stage": "encoder"})
    assert panels.open_href(q) == "/drilldown?stage=encoder"


def test_refresh_only_for_relative_windows():
    stages = panels.PANELS["stages"]
    assert panels.refresh_seconds(panels.parse_query(stages, {"range": "15m"})) == 60
    assert panels.refresh_seconds(panels.parse_query(stages, {"range": "7d"})) == 900
    assert panels.refresh_seconds(panels.parse_query(stages, {})) == 60  # the default: the last hour
    assert panels.refresh_seconds(panels.parse_query(stages, {"start": "1700000000", "end": "1700003600"})) == 0


# -- text, JSON and theme --------------------------------------------------------------
def test_cell_text_is_one_bounded_line_of_inert_characters():
    assert panels.cell_text("x" * (1 << 20)) == "x" * (panels.MAX_TEXT - 1) + "…"
    assert panels.cell_text("bell\x07 nul\x00 rlo\u202etxt") == "bell\ufffd nul\ufffd rlo\ufffdtxt"
    assert panels.cell_text(None) == "" and panels.cell_text(12) == "12"
    assert panels.cell_text(HOSTILE) == HOSTILE  # escaping is the template's job (autoescape)


def test_script_json_cannot_close_its_element():
    text = panels.script_json({"name": "</script><script>alert(1)</script>", "amp": "a&b", "sep": "\u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"name": "</script><script>alert(1)</script>", "amp": "a&b", "sep": "\u2028"}


def test_dark_theme_changes_the_ground_not_the_data():
    fig = figures.stage_stack({"stages": [{"input_type": "text", "stage": "inference", "traces": 3, "p50_ms": 1.0,
                                           "p99_ms": 2.0, "mean_ms": 1.0, "total_ms": 3.0}],
                               "traces": {"text": {"count": 3, "p50_ms": 1.0, "p99_ms": 2.0}}})
    before = [list(t.y) for t in fig.data]
    panels.apply_theme(fig, "dark")
    assert fig.layout.paper_bgcolor == panels.DARK["paper"] and fig.layout.font.color == panels.DARK["ink"]
    assert [list(t.y) for t in fig.data] == before
    light = figures.empty_figure("x")
    assert panels.apply_theme(light, "light").layout.paper_bgcolor is None


def test_table_figure_escapes_cells_and_grows_with_rows():
    table = panels.Table([("a", "A"), ("b", "B")], [{"a": HOSTILE, "b": "javascript:alert(1)"}] * 3, [""] * 3)
    fig = panels.table_figure(table, "T")
    cells = fig.data[0].cells.values
    assert cells[0][0] == "&lt;img src=x onerror=alert(1)&gt;" and cells[1][0] == "javascript:alert(1)"
    marked = panels.table_figure(panels.Table(table.columns, table.rows, ["", "ms-row-regression", ""]), "T")
    assert list(marked.data[0].cells.fill.color[0]) == ["white", "#fef2f2", "white"]
    more = panels.Table(table.columns, table.rows * 10, [""] * 30)
    assert panels.table_height(more, 1000) > panels.table_height(table, 1000)
    long = panels.Table(table.columns, [{"a": "word " * 16, "b": "x"}], [""])
    assert panels.table_height(long, 400) > panels.table_height(long, 2000)  # narrow: wrapped lines


# -- sharing ---------------------------------------------------------------------------
def test_share_urls_unsigned():
    out = panels.share_urls("https://ms.example/", "stages", {"range": "7d", "service": "a&b"})
    assert out["signed"] is False and out["expires"] is None
    assert out["link"] == "https://ms.example/stages?range=7d&service=a%26b"
    assert out["embed_url"] == "https://ms.example/embed/stages?range=7d&service=a%26b"
    assert out["image_url"] == "https://ms.example/render/stages.png?range=7d&service=a%26b"
    assert out["svg_url"] == "https://ms.example/render/stages.svg?range=7d&service=a%26b"
    with pytest.raises(ParamError):
        panels.share_urls("https://ms.example/", "stages", {"caller": "x"})


def test_share_urls_signed_cover_panel_and_query():
    now = time.time()
    out = panels.share_urls("http://h/", "pair-table", {"range": "24h", "sort": "p99_ms"}, secret=SECRET,
                            ttl_seconds=3600, now=now)
    assert out["signed"] is True and out["expires"].endswith("Z")
    for key in ("embed_url", "image_url", "svg_url"):
        query = parse_qsl(urlsplit(out[key]).query)
        assert int(dict(query)["exp"]) == int(now) + 3600
        assert signing.verify(SECRET, "pair-table", query, now=now)
        assert not signing.verify(SECRET, "pair-heatmap", query, now=now)
        assert not signing.verify(SECRET, "pair-table", query, now=now + 3601)
        # the theme stays free; an image size is part of what was signed
        assert signing.verify(SECRET, "pair-table", query + [("theme", "dark")], now=now)
        assert not signing.verify(SECRET, "pair-table", query + [("width", "800")], now=now)
    assert "sig=" not in out["link"]  # the page needs its own access
    unsigned = panels.share_urls("http://h/", "pair-table", {"range": "24h"}, secret=SECRET, sign=False)
    assert unsigned["signed"] is False and "sig=" not in unsigned["embed_url"]


def test_iframe_snippet_escapes_its_attributes():
    snippet = panels.iframe_snippet('https://h/embed/stages?a=1&b="><script>x</script>', 'T "quoted" <t>', 300)

    class Collect(HTMLParser):
        tags: list = []

        def handle_starttag(self, tag, attrs):
            self.tags.append((tag, dict(attrs)))

    parser = Collect()
    parser.feed(snippet)
    assert [t for t, _ in parser.tags] == ["iframe"]
    attrs = parser.tags[0][1]
    assert attrs["src"] == 'https://h/embed/stages?a=1&b="><script>x</script>'
    assert attrs["title"] == 'T "quoted" <t>' and attrs["height"] == "300"
    assert "<script" not in snippet and html.unescape(snippet).count("<script>") == 1


def test_parse_ttl():
    assert panels.parse_ttl(None) == panels.DEFAULT_TTL_SECONDS == 30 * 86400
    assert panels.parse_ttl("86400") == 86400
    for bad in ("0", "59", "abc", "1.5", str(signing.MAX_TTL_SECONDS + 1)):
        with pytest.raises(ParamError) as exc:
            panels.parse_ttl(bad)
        assert exc.value.parameter == "ttl"


# -- dispatch on real stores -----------------------------------------------------------
def test_every_panel_is_what_its_page_shows(pattern_store):
    """Each panel calls the page's query and figure functions: the same rows, the same figure."""
    reader = pattern_store.app.extensions["modalscope"]["reader"]
    args = _window_args()
    window, f = _window(), Filters()
    heat = panels.build("pair-heatmap", reader, args)
    assert heat.figure.to_json() == figures.pair_heatmap(queries.pair_heatmap(reader, window, f)).to_json()
    table = panels.build("pair-table", reader, {**args, "sort": "p99_ms:desc"}).table
    rows = queries.pair_table(reader, window, f)
    assert len(table.rows) == len(rows) > 3
    slowest = max(rows, key=lambda r: r["p99_ms"])
    assert (table.rows[0]["caller"], table.rows[0]["callee"]) == (slowest["caller"], slowest["callee"])
    its = panels.build("input-types", reader, args).table
    assert [r["input_type"] for r in its.rows] == [r["input_type"] for r in queries.overview_rows(reader, window, f)]
    assert any(c == "ms-row-regression" for c in its.row_classes)  # the injected baseline regression
    stages = panels.build("stages", reader, args).figure
    tail = queries.stage_time_at(reader, window, f, "p99", group_by="input_type")
    assert stages.to_json() == figures.stage_stack(queries.stage_breakdown(reader, window, f), tail).to_json()
    timeline = panels.build("latency-timeline", reader, {**args, "caller": "gateway", "callee": "userdb"}).figure
    series = queries.percentile_series(reader, window, Filters(caller="gateway", callee="userdb"),
                                       st.step_minutes(window))
    assert timeline.to_json() == figures.percentile_timeseries(series).to_json()
    cache = panels.build("cache", reader, args).figure
    assert {t.name for t in cache.data} >= {"bronze", "gold"}
    found = panels.build("anomalies", reader, args).table
    assert {r["kind"] for r in found.rows} >= {"p99_band_break", "cache_penetration", "hot_spot"}
    tid = queries.exemplar_traces(reader, window, f, limit=1)[0]["trace_id"]
    trace = panels.build("trace", reader, {**args, "trace_id": tid})
    assert trace.found and trace.figure.data[0].type == "bar"
    missing = panels.build("trace", reader, {**args, "trace_id": "ab" * 16})
    assert not missing.found


def test_panels_build_on_sqlite_and_postgresql(store):
    """The small exact store of tests/app/conftest.py, on both engines: the pair table has
    its three pairs, the heatmap and stage figures data, the trace its spans."""
    args = {"start": str(store.window.start_ns / 1e9), "end": str(store.window.end_ns / 1e9)}
    pairs = panels.build("pair-table", store.reader, args).table
    assert {(r["caller"], r["callee"]) for r in pairs.rows} == {("gateway", "vision-encoder"), ("gateway", "userdb"),
                                                                ("gateway", "llm")}
    assert len(panels.build("pair-heatmap", store.reader, args).figure.data) == 4
    assert panels.build("stages", store.reader, args).figure.data
    tid = store.images[0][0].trace_id
    trace = panels.build("trace", store.reader, {**args, "trace_id": tid})
    assert len(trace.figure.to_plotly_json()["data"][0]["y"]) >= 1
    # Every span is one bar of its stage's trace; the critical path, the error outline and
    # mark (this trace's root is an error) and a selection are overlays on those bars.
    stage_bars = [t for t in trace.figure.data if t.name in figures.STAGE_COLORS]
    assert sorted(cd[0] for t in stage_bars for cd in t.customdata) == sorted(s.span_id for s in store.images[0])
    assert {t.name for t in trace.figure.data} - set(figures.STAGE_COLORS) == {"critical path", "error outline",
                                                                                "error"}
    errors = sorted(s.span_id for s in store.images[0] if s.status == STATUS_ERROR)
    assert errors and all(sorted(cd[0] for cd in t.customdata) == errors
                          for t in trace.figure.data if t.name in ("error outline", "error"))
