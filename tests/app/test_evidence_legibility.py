"""Findings an on-call engineer can read: evidence numbers in their units (never ``2.999e+04``
or ``0.6437``) on the Anomalies page, the embeds and the CLI, while the JSON keeps the raw
numbers; and every kind's evidence chart has a legend, one unit, and the threshold, ceiling
or baseline its finding is judged against as a labelled line."""

from __future__ import annotations

import ast
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from modalscope.app import components, detectors, figures, panels
from modalscope.app.units import evidence_items, evidence_measure, evidence_unit, fmt_evidence, fmt_ms, fmt_num
from modalscope.incidents_cmd import format_incidents
from modalscope.anomalies_cmd import format_finding
from modalscope.core.findings import Finding, Incident
from tests.demo_stores import PATTERNS

SCIENTIFIC = re.compile(r"\d[eE][+-]\d")  # as Python and JavaScript write 2.999e+04
DETECTORS_SOURCES = sorted(Path(detectors.__file__).parent.glob("*.py"))  # the package's modules


def _evidence_keys_in_source() -> dict[str, set[str]]:
    """kind -> the evidence keys each ``finding(kind, ...)`` call in app/detectors/ writes."""
    out: dict[str, set[str]] = {}
    nodes = (node for source in DETECTORS_SOURCES for node in ast.walk(ast.parse(source.read_text())))
    for node in nodes:
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "finding" and len(node.args) >= 6:
            kind, evidence = node.args[0], node.args[5]
            if isinstance(kind, ast.Constant) and kind.value and isinstance(evidence, ast.Dict):
                keys = out.setdefault(kind.value, set())
                for k in evidence.keys:
                    assert isinstance(k, ast.Constant), f"{kind.value}: an evidence key that is not a literal"
                    keys.add(k.value)
    return out


def test_every_evidence_key_a_detector_writes_has_a_unit():
    keys = _evidence_keys_in_source()
    assert set(keys) == set(detectors.DETECTORS), set(detectors.DETECTORS) ^ set(keys)
    unknown = sorted((kind, k) for kind, ks in keys.items() for k in ks if evidence_unit(k) is None)
    assert unknown == [], "name the unit of these evidence keys (app/units.py EVIDENCE_UNIT_KEYS)"
    assert evidence_unit("mystery_number") is None  # the check can fail


def test_evidence_values_read_in_their_units():
    assert fmt_evidence("max_duration_ms", 29967.905) == "29.97 s"
    assert fmt_evidence("band_ms", 599.358) == "599.4 ms"
    assert fmt_evidence("ceiling_s", 30) == "30 s" and fmt_evidence("warmup_s", 120.0) == "2 min"
    assert fmt_evidence("hit_rate", 0.6437) == "64.4 %" and fmt_evidence("baseline_fallback_share", 0.0014) == "0.14 %"
    assert fmt_evidence("change", 0.5999) == "+60.0 %" and fmt_evidence("extra_latency_ratio", -0.25) == "−25.0 %"
    assert fmt_evidence("ratio", 4.622) == "×4.62" and fmt_evidence("threshold_ratio", 2.0) == "×2"
    assert fmt_evidence("sample_count", 29990) == "29,990" and fmt_evidence("calls_per_min", 1234.6) == "1,235/min"
    assert fmt_evidence("baseline_minutes", 60) == "60 min" and fmt_evidence("p99_ms", None) == "—"
    for key, v in (("p99_ms", 2.999e4), ("p99_ms", 1e12), ("mean_batch_size", 1.5e7), ("mystery", 3e-9),
                   ("sample_count", 1e15), ("mystery", 2.5e21)):
        assert not SCIENTIFIC.search(fmt_evidence(key, v)), (key, v, fmt_evidence(key, v))
    assert fmt_ms(1e12) == "16,666,667 min" and fmt_num(0.000012345) == "0.0000123"
    assert evidence_items({"p99_ms": 12888.7, "subject": {"x": 1}, "baseline_p99_ms": None}) == \
        [("p99_ms", "P99", "12.89 s")]
    assert evidence_measure({"max_duration_ms": 29967.9, "ceiling_s": 30}) == "longest 29.97 s vs ceiling 30 s"


# -- the chart --------------------------------------------------------------------------
T0 = datetime(2026, 11, 30, 14, 0, tzinfo=timezone.utc)
ROWS = [{"t": f"2026-11-30T14:{m:02d}:00Z", "p50_ms": 900.0 + m, "p99_ms": 2400.0 + 100 * m,
         "share": 0.2 + m / 100} for m in range(0, 40, 5)]


def _legend_names(fig: dict) -> list[str]:
    return [t["name"] for t in fig["data"] if t.get("showlegend", True)]


def test_evidence_chart_has_a_legend_and_its_threshold_in_one_unit(monkeypatch):
    start, end = T0.replace(minute=10), T0.replace(minute=25)
    fig = json.loads(figures.evidence_figure(ROWS, start, end, lines=[("timeout ceiling", 30_000.0),
                                                                       ("baseline P99", 850.0)]).to_json())
    assert fig["layout"]["showlegend"] is True
    names = _legend_names(fig)
    assert names[:2] == ["P50", "P99"]
    # The largest value (the 30 s ceiling) picks seconds once: every number on the chart is in s.
    assert fig["layout"]["yaxis"]["title"]["text"] == "s"
    assert names[2:] == ["timeout ceiling 30 s", "baseline P99 0.85 s"]
    ceiling = [t for t in fig["data"] if t["name"].startswith("timeout ceiling")][0]
    assert ceiling["y"] == [30.0, 30.0] and ceiling["line"]["dash"] == "dash" and ceiling["meta"] == "threshold"
    assert ceiling["x"] == ["2026-11-30T14:00:00+00:00", "2026-11-30T14:35:00+00:00"]  # across the chart
    assert fig["data"][1]["y"][0] == 2.4 and all("s<extra>" in t["hovertemplate"] for t in fig["data"][:2])
    assert fig["layout"]["shapes"][0]["type"] == "rect"  # the finding's window
    # Without a line past 2 s the same series stay in ms, and so do the lines' labels.
    small = json.loads(figures.evidence_figure([{**r, "p99_ms": 1500.0} for r in ROWS], None, None,
                                               lines=[("baseline P99", 850.0)]).to_json())
    assert small["layout"]["yaxis"]["title"]["text"] == "ms" and _legend_names(small)[-1] == "baseline P99 850 ms"
    # Shares draw as %, the threshold too; a missing reference draws nothing.
    pct = json.loads(figures.evidence_figure(ROWS, start, end, series=[("share", "batches of one", "#3b82f6")],
                                             lines=[("stuck threshold", 0.8), ("baseline", None)],
                                             unit="pct").to_json())
    assert pct["layout"]["yaxis"]["title"]["text"] == "%" and pct["layout"]["yaxis"]["ticksuffix"] == " %"
    assert _legend_names(pct) == ["batches of one", "stuck threshold 80 %"]
    assert pct["data"][0]["y"][0] == pytest.approx(20.0) and pct["data"][1]["y"] == [80.0, 80.0]
    # Built from dicts, the figure is the one plotly validates.
    monkeypatch.setattr(figures, "VALIDATE", True)
    assert json.loads(figures.evidence_figure(ROWS, start, end, series=[("share", "batches of one", "#3b82f6")],
                                              lines=[("stuck threshold", 0.8)], unit="pct").to_json()) == pct
    with pytest.raises(ValueError):
        figures.evidence_figure(ROWS, None, None, unit="furlongs")


# -- the demo's findings ----------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_findings(pattern_store):  # noqa: F811
    return pattern_store.get("anomalies")


def test_demo_findings_keep_raw_json_and_every_key_has_a_unit(demo_findings):
    assert {f["kind"] for f in demo_findings} == set(detectors.DETECTORS)
    for f in demo_findings:
        for k, v in f["evidence"].items():
            assert evidence_unit(k) is not None, (f["kind"], k)
            assert v is None or isinstance(v, (int, float)), (f["kind"], k, v)  # the API keeps numbers
    lb = next(f for f in demo_findings if f["kind"] == "lb_timeout_truncation")
    assert lb["evidence"]["max_duration_ms"] > 29_000 and lb["evidence"]["ceiling_s"] == 30


def test_every_kind_charts_its_threshold_on_the_anomalies_page(pattern_store, demo_findings):  # noqa: F811
    """The page's list shows evidence in units, and the chart of one finding of every kind has
    a legend, series over the window and a labelled reference line in one unit."""
    from modalscope.app.pages import anomalies

    window = {"start": str(PATTERNS.start_ns / 1e9), "end": str(PATTERNS.end_ns / 1e9 + 120)}
    with pattern_store.app.test_request_context():
        page = json.dumps(anomalies._fill(window).to_plotly_json(), default=lambda o: o.to_plotly_json())
        assert not SCIENTIFIC.search(page)
        assert "29.97 s" in page and "10.1 %" in page and "samples" in page
        # Past the charts the page draws, a card says so and links to its kind's findings.
        assert "ms-evidence-no-chart" in page and "kind=baseline_regression" in page
        seen = set()
        for f in demo_findings:
            if f["kind"] in seen:
                continue
            seen.add(f["kind"])
            spec = json.loads(json.dumps(anomalies.chart_spec(Finding.from_json(f))))  # as the browser sends it back
            fig = json.loads(anomalies._fill_chart(spec).to_json())
            lines = [t for t in fig["data"] if t.get("meta") == "threshold"]
            measured = [t for t in fig["data"] if t.get("meta") != "threshold"]
            assert fig["layout"]["showlegend"] and measured and all(len(t["y"]) >= 2 for t in measured), f["kind"]
            assert lines, f["kind"]
            unit = fig["layout"]["yaxis"]["title"]["text"]
            assert unit in ("ms", "s", "%"), f["kind"]
            assert all(t["name"].endswith(" " + unit) for t in lines), (f["kind"], [t["name"] for t in lines])
            assert not SCIENTIFIC.search(json.dumps([t["name"] for t in fig["data"]]))
            if f["kind"] == "lb_timeout_truncation":
                assert [t["name"] for t in lines] == ["timeout ceiling 30 s"]
            if f["kind"] == "cache_penetration":
                assert lines[0]["name"] == "hit-rate floor 44.3 %" and unit == "%"
        assert seen == set(detectors.DETECTORS)


def test_cli_and_embed_show_units(demo_findings, pattern_store):  # noqa: F811
    for f in demo_findings:
        text = format_finding(Finding.from_json(f))
        assert not SCIENTIFIC.search(text), text
        evidence = text.splitlines()[2]
        assert "_ms" not in evidence and "=" not in evidence and re.search(r"\d (ms|s|min)\b|\d %", evidence), evidence
    lb_finding = next(f for f in demo_findings if f["kind"] == "lb_timeout_truncation")
    lb = format_finding(Finding.from_json(lb_finding))
    assert "longest request 29.97 s" in lb and "timeout ceiling 30 s" in lb and "errors among them 100.0 %" in lb
    # The incident cards' headline number says how close to the ceiling the requests ended.
    assert components.finding_measure(Finding.from_json(lb_finding)) == "longest 29.97 s vs ceiling 30 s"
    table = format_incidents([Incident.from_json(i) for i in pattern_store.get("incidents")])
    assert table.splitlines()[0].split()[:6] == ["SEVERITY", "WHEN", "(UTC)", "HEADLINE", "MEASURE", "FINDINGS"]
    assert "longest 29.97 s vs ceiling 30 s" in table and not SCIENTIFIC.search(table)
    embed = panels.anomalies_table([Finding.from_json(f) for f in demo_findings])
    cells = " ".join(str(r["evidence"]) for r in embed.rows)
    assert "P95 3.36 s" in cells and not SCIENTIFIC.search(cells)
