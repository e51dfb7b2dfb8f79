"""The anomaly catalog on the demo's data, through /api/v1/anomalies and the CLI: every
injected pattern is found with its kind, subject and window; a clean run yields no warning
or critical finding. The demo stores are the session-shared ones of tests/ingest/test_demo.py."""

from __future__ import annotations

import json
import time

import pytest

from modalscope.app.params import parse_time
from modalscope.core.findings import Finding
from modalscope.ingest import demo
from tests.demo_stores import PATTERNS
from tests.test_cli import run

MIN = 60_000_000_000
TOLERANCE = 5 * MIN  # one detector block


@pytest.fixture(scope="module")
def pattern_findings(pattern_store):  # noqa: F811
    return pattern_store.get("anomalies")


@pytest.mark.parametrize("kind", demo.PATTERN_KINDS)
def test_every_injected_pattern_is_found(pattern_findings, kind):
    (p,) = [p for p in demo.injected_patterns(PATTERNS) if p.kind == kind]
    mine = [f for f in pattern_findings if f["kind"] == kind and f["subject"] == p.subject]
    assert mine, (kind, p.subject, [(f["kind"], f["subject"]) for f in pattern_findings])
    best = max(mine, key=lambda f: min(parse_time(f["end"], "end"), p.end_ns)
               - max(parse_time(f["start"], "start"), p.start_ns))
    start, end = parse_time(best["start"], "start"), parse_time(best["end"], "end")
    overlap = min(end, p.end_ns) - max(start, p.start_ns)
    assert overlap >= 0.5 * (p.end_ns - p.start_ns), (kind, best["start"], best["end"])
    assert abs(start - p.start_ns) <= TOLERANCE, (kind, best["start"])
    assert best["severity"] in ("critical", "warning")
    assert 1 <= len(best["exemplar_trace_ids"]) <= 5
    assert all(len(t) == 32 and t == t.lower() for t in best["exemplar_trace_ids"])
    assert best["hint"] and best["evidence"]["sample_count"] > 0


def test_findings_are_most_severe_first_and_shaped(pattern_findings):
    order = {"critical": 0, "warning": 1, "info": 2}
    ranks = [order[f["severity"]] for f in pattern_findings]
    assert ranks == sorted(ranks)
    assert any(f["kind"] == "baseline_regression" and f["severity"] == "critical" for f in pattern_findings)
    for f in pattern_findings:
        assert f["start"].endswith("Z") and f["end"].endswith("Z") and f["start"] < f["end"]


def test_clean_data_has_no_warning_or_critical(clean_store):  # noqa: F811
    found = clean_store.get("anomalies")
    assert not [f for f in found if f["severity"] in ("critical", "warning")], found


def test_filters_narrow_findings(pattern_store):  # noqa: F811
    only = pattern_store.get("anomalies", input_type="multi_image")
    assert only and all(f["subject"].get("input_type") == "multi_image" for f in only)
    pair = pattern_store.get("anomalies", service="userdb")
    assert {f["kind"] for f in pair} >= {"hot_spot"}


def test_bad_window_is_a_400(pattern_store):  # noqa: F811
    r = pattern_store.client.get("/api/v1/anomalies?range=soon")
    assert r.status_code == 400 and r.get_json()["parameter"] == "range"


@pytest.mark.slow
def test_cli_anomalies(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    env = {"MODALSCOPE_DATABASE_URL": url}
    assert run(["db", "upgrade"], env).returncode == 0
    r = run(["anomalies", "--since", "2h", "--json"], env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []
    r = run(["anomalies", "--since", "2h"], env)
    assert r.returncode == 0 and "no findings in the last 2h" in r.stdout
    r = run(["anomalies", "--since", "later"], env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--since" in r.stderr
    r = run(["anomalies", "--since", "30d"], env)  # the detectors judge at most 7 days
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "at most 7d" in r.stderr
    r = run(["anomalies"], {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path}/missing/dir.db"})
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_a_window_longer_than_a_week_is_judged_over_its_last_week(pattern_store):  # noqa: F811
    from modalscope.app import findings
    from modalscope.app.params import Window

    end = pattern_store.config.end_ns + 60_000_000_000
    week = findings.find(pattern_store.app.extensions["modalscope"]["reader"], Window(end - 7 * 86400 * 10**9, end), exemplars=False)
    t0 = time.perf_counter()
    long = findings.find(pattern_store.app.extensions["modalscope"]["reader"], Window(0, end), exemplars=False)  # from 1970
    assert time.perf_counter() - t0 < 120  # it once tried to allocate 57 GiB
    assert long == week and week


def test_cli_prints_findings(pattern_store, capsys, monkeypatch):  # noqa: F811
    from modalscope import anomalies_cmd

    found = pattern_store.get("anomalies")
    text = anomalies_cmd.format_finding(Finding.from_json(found[0]))
    assert found[0]["kind"] in text and found[0]["severity"].upper() in text and "hint:" in text
