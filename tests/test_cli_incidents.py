"""`modalscope incidents` as a user runs it: the table in human units, the JSON, one-line errors."""

from __future__ import annotations

import json
import re
import time

import pytest

from modalscope.core.findings import AttributeSuspect, Finding, Incident, StageSuspect, Subject
from modalscope.incidents_cmd import format_incidents, human_ms, human_span
from modalscope.ingest import demo
from tests.demo_stores import _build
from tests.test_cli import run


@pytest.fixture(scope="module")
def live_store(tmp_path_factory):
    """A demo store ending now (the command looks back from the wall clock)."""
    path = tmp_path_factory.mktemp("incidents") / "live.db"
    _build(path, demo.DemoConfig(now_ns=time.time_ns(), hours=1.5, rate=0.6))
    return {"MODALSCOPE_DATABASE_URL": f"sqlite:///{path}"}


def test_table_and_json_on_demo_data(live_store):
    r = run(["incidents", "--since", "2h"], live_store, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["SEVERITY", "WHEN", "(UTC)"]
    rows = lines[1:-1]
    assert rows and all(re.search(r"\d\d:\d\d–\d\d:\d\d \([\d.]+ (min|h)\)", row) for row in rows)
    assert any("cause: cold_start" in row for row in rows), r.stdout
    summary = re.fullmatch(r"(\d+) incidents \((\d+) critical, (\d+) warning, (\d+) info\) from (\d+) findings", lines[-1])
    assert summary, lines[-1]
    n, findings = int(summary.group(1)), int(summary.group(5))
    assert n == len(rows) and n < findings  # symptoms folded under their causes

    r = run(["incidents", "--range", "2h", "--json"], live_store, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert len(got) == n and sum(len(i["findings"]) for i in got) == findings
    assert [i["headline"]["kind"] for i in got] == [re.search(r"\) +(\S+) ", row).group(1) for row in rows]
    assert all(i["links"]["compare"].startswith("/compare?") for i in got)


def test_empty_store_and_one_line_errors(tmp_path):
    env = {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"}
    assert run(["db", "upgrade"], env).returncode == 0
    r = run(["incidents", "--since", "2h", "--json"], env)
    assert r.returncode == 0 and json.loads(r.stdout) == []
    r = run(["incidents"], env)
    assert r.returncode == 0 and "no incidents in the last 1h" in r.stdout
    for args, word in ((["--range", "soon"], "--range"), (["--since", "30d"], "--since"),
                       (["--since", "1h", "--range", "2h"], "either")):
        r = run(["incidents", *args], env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and word in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    r = run(["incidents"], {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'no' / 'such.db'}"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_human_units():
    assert human_ms(8.25) == "8.2 ms" and human_ms(412.4) == "412 ms" and human_ms(6400) == "6.4 s"
    assert human_span("2025-11-30T14:05:00Z", "2025-11-30T14:32:00Z") == "14:05–14:32 (27 min)"
    assert human_span("2025-11-30T23:00:00Z", "2025-12-01T02:00:00Z") == "2025-11-30 23:00–02:00 (3.0 h)"
    head = Finding("p99_band_break", "critical", Subject(caller="gateway", callee="vision-encoder"),
                   "2025-11-30T14:05:00Z", "2025-11-30T14:32:00Z")
    table = format_incidents([Incident(
        "ab" * 8, "critical", "2025-11-30T14:05:00Z", "2025-11-30T14:32:00Z", False, (head, head),
        (StageSuspect("preprocessing", 0.8), AttributeSuspect("service.instance.id", "pod-7", 4.04)))])
    row = table.splitlines()[1]
    assert "p99_band_break caller=gateway, callee=vision-encoder" in row
    assert row.endswith("suspects: preprocessing 80% of added time; service.instance.id=pod-7 ×4.0")
