"""The Cache, Anomalies and Compare pages and the overview's top findings, without a
browser: pure links and figure builders, and the pages' callbacks run against the demo's
pattern store inside the app (what the browser would receive)."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlparse

import pytest

from modalscope.app import components as c
from modalscope.app import figures, links
from modalscope.core.findings import Finding, Subject
from modalscope.ingest import demo
from tests.demo_stores import PATTERNS

MIN = 60_000_000_000
HOSTILE = "<img src=x onerror=alert(1)>"

FINDING = Finding.from_json({
    "kind": "p99_band_break", "severity": "critical", "subject": {"caller": "gateway", "callee": "vision-encoder"},
    "start": "2026-11-30T14:00:00.000Z", "end": "2026-11-30T14:20:00.000Z",
    "evidence": {"p99_ms": 900.0, "baseline_p99_ms": 200.0, "sample_count": 1200},
    "exemplar_trace_ids": ["ab" * 16, "javascript:alert(1)", "CD" * 16], "hint": "contention"})


def _dump(x) -> str:
    return json.dumps(x, default=lambda o: o.to_plotly_json() if hasattr(o, "to_plotly_json") else str(o))


def _q(href: str) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}


def test_finding_links_name_subject_and_window():
    drill = links.finding_drill_href(FINDING)
    assert drill.startswith("/drilldown?")
    assert _q(drill) == {"caller": "gateway", "callee": "vision-encoder", "start": "2026-11-30T14:00:00.000Z",
                         "end": "2026-11-30T14:20:00.000Z"}
    assert links.finding_compare_href(FINDING).startswith("/compare?")
    assert links.finding_cache_href(FINDING) is None
    cache = FINDING.replace(subject=Subject.from_json({"cache": "profile",
                                                       "attribute": {"key": "user_tier", "value": "bronze"}}))
    q = _q(links.finding_cache_href(cache))
    assert q["cache"] == "profile" and q["group_by"] == "user_tier" and q["start"] < "2026-11-30T14:00"
    bad = FINDING.replace(subject=Subject.from_json({"cache": "p", "attribute": {"key": HOSTILE, "value": "x"}}))
    assert "group_by" not in _q(links.finding_cache_href(bad))


def test_trace_links_only_for_well_formed_ids():
    assert links.trace_href("ab" * 16, {"range": "1h", "service": "x"}) == "/trace/" + "ab" * 16 + "?range=1h"
    assert links.trace_href("CD" * 16, {}) == "/trace/" + "cd" * 16
    assert links.trace_href("javascript:alert(1)", {}) is None
    hrefs = [_dump(x) for x in c.finding_links(FINDING, {})]
    assert not any("javascript:" in h for h in hrefs)
    assert sum("/trace/" in h for h in hrefs) == 2


def test_compare_href_keeps_window_and_filters():
    assert links.compare_href({"start": "a", "end": "b", "caller": "x", "min_ms": "3"}) == "/compare?start=a&end=b&caller=x"


def test_subject_text_is_plain():
    assert c.subject_text({"cache": "profile", "attribute": {"key": "user_tier", "value": "bronze"}}) == \
        "cache profile · user_tier=bronze"
    assert c.subject_text({"caller": "a"}) == "a → any"


def test_figures_escape_untrusted_text():
    rows = [{"t": "2026-11-30T14:00:00.000Z", "cache": HOSTILE, "group": HOSTILE, "hits": 3, "misses": 1,
             "hit_rate": 0.75, "share": 1.0}]
    for fig in (figures.cache_hit_rate_figure(rows), figures.cache_share_figure(rows)):
        text = fig.to_json()
        assert "<img" not in text and "&lt;img" in text
    assert figures.cache_hit_rate_figure([]).layout.annotations
    stages = [{"stage": "preprocessing", "selection_p99_ms": 900.0, "baseline_p99_ms": 100.0,
               "share_of_added_time": 0.8}]
    assert len(figures.compare_stage_figure(stages).data) == 2
    ev = figures.evidence_figure([{"t": "2026-11-30T14:00:00.000Z", "p50_ms": 1.0, "p99_ms": 5.0}], None, None)
    assert len(ev.data) == 2


def test_top_findings_panel_lists_three_with_links():
    found = [FINDING.replace(kind=f"k{i}") for i in range(5)]
    panel = _dump(c.top_findings(found, {"range": "1h"}))
    assert panel.count('"ms-finding"') == 3 and "k3" not in panel
    assert "/drilldown?" in panel and "/trace/" in panel and "all 5 findings" in panel
    empty = _dump(c.top_findings([], {}))
    assert "No findings in this window." in empty


def test_top_findings_put_causes_before_the_symptoms_they_explain():
    symptoms = [FINDING.replace(kind="baseline_regression", subject=Subject(input_type=f"t{i}")) for i in range(3)]
    cause = FINDING.replace(kind="cold_start", severity="warning", subject=Subject(service="llm"))
    panel = _dump(c.top_findings(symptoms + [cause], {"range": "1h"}))
    assert panel.index("cold_start") < panel.index("baseline_regression"), panel
    assert "2026-11-30 14:00 \\u2192 14:20 UTC" in panel


# -- the pages' callbacks on the pattern store -----------------------------------------
@pytest.fixture(scope="module")
def window():
    return {"start": str(PATTERNS.start_ns / 1e9), "end": str(PATTERNS.end_ns / 1e9 + 120)}


def test_anomalies_page_lists_findings_with_evidence_and_links(pattern_store, window):  # noqa: F811
    from modalscope.app.pages import anomalies

    with pattern_store.app.test_request_context():
        out = _dump(anomalies._fill(window))
        api = pattern_store.get("anomalies")
    assert api
    first = api[0]
    assert first["kind"] in out
    for f in api:
        assert f["kind"] in out
    assert out.count("ms-finding-card") == len(api)
    assert "/drilldown?" in out and "/trace/" in out and "/compare?" in out
    assert "sample_count" in out


def test_anomalies_page_draws_each_chart_in_its_own_request(pattern_store, window):  # noqa: F811
    """The list carries a store per chart (the finding's window and subject) and a blank
    figure; each chart's callback draws the subject's P50/P99 with the window shaded."""
    from modalscope.app import ids
    from modalscope.app.pages import anomalies

    with pattern_store.app.test_request_context():
        tree = json.loads(_dump(anomalies._fill(window)))
        specs = []

        def walk(node):
            if isinstance(node, dict):
                props = node.get("props") or {}
                if isinstance(props.get("id"), dict) and props["id"].get("type") == ids.AN_CHART_SPEC:
                    specs.append((props["id"]["index"], props["data"]))
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(tree)
        api = pattern_store.get("anomalies")
        charted = sorted(i for i, _ in specs)
        assert len(charted) >= min(len(api), anomalies.MAX_CHARTS)
        assert {api[i]["kind"] for i in charted} == {f["kind"] for f in api}  # every kind has a chart
        listed = _dump(anomalies._fill(window))
        assert '"template"' not in listed and '"scatter"' not in listed  # no drawn figure in the list
        drawn = 0
        for i, spec in specs:
            assert spec["start"] == api[i]["start"] and spec["end"] == api[i]["end"]
            fig = anomalies._fill_chart(spec).to_plotly_json()
            names = [t.get("name") for t in fig["data"]]
            if names:
                assert fig["layout"]["shapes"] and fig["layout"]["showlegend"], (i, names)
                drawn += 1
        assert drawn == len(specs)
        # The spec comes back from the browser: an edited one gets a blank chart, not an error.
        for bad in (None, {}, {"start": "x", "end": "y"}, {"start": "0", "end": str(400 * 86400), "subject": {}}):
            fig = anomalies._fill_chart(bad).to_plotly_json()
            assert fig["data"] == [] and fig["layout"]["annotations"], bad
        anomalies._fill_chart({**specs[0][1], "subject": "<b>"})  # not an object: no filter


def test_cache_and_compare_pages_fill(pattern_store, window):  # noqa: F811
    from modalscope.app.pages import cache, compare

    (p,) = [p for p in demo.injected_patterns(PATTERNS) if p.kind == "cache_penetration"]
    with pattern_store.app.test_request_context():
        rate, share, table = cache._fill({**window, "group_by": "user_tier"})
        assert {t.name for t in rate.data} >= {"bronze", "gold"}
        assert "cache-table-rows" in _dump(table)
        bad = _dump(cache._fill({**window, "group_by": "<b>"})[2])
        assert "group_by must be an attribute key" in bad
        summary, fig, stages, attrs = compare._fill({"start": str(p.start_ns / 1e9), "end": str(p.end_ns / 1e9)})
        assert "compare-stage-rows" in _dump(stages)
        assert "compare-attribute-rows" in _dump(attrs)
    html = pattern_store.client.get("/compare?range=1h").get_data(as_text=True)
    assert pattern_store.client.get("/cache").status_code == 200 and "modalscope" in html
