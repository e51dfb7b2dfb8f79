"""export-metrics with the real google-cloud-monitoring client against a local gRPC stand-in."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest

from modalscope.ingest.cloud_monitoring import (
    PAIR_ERRORS,
    PAIR_LATENCY,
    PAIR_REQUESTS,
    STAGE_LATENCY,
    ExportConfig,
    MetricsExporter,
    exporter_health,
    make_monitoring_client,
)
from modalscope.ingest.cursors import read_cursor
from modalscope.core.spans import KIND_CLIENT, KIND_SERVER, STATUS_ERROR, STATUS_UNSET, SpanRecord
from modalscope.ingest.settle import settle
from modalscope.ingest.rules_file import load_rules
from modalscope.ingest.writer import write_spans
from tests.cloud_standins import FakeMonitoring

NS = 1_000_000_000
MIN = 60 * NS
PROJECT = "proj-m"


@pytest.fixture
def fake():
    with FakeMonitoring() as server:
        yield server


def _fill(engine, minutes: list[int], pairs: list[tuple[str, str]], per_minute: int, seed: int = 3) -> dict:
    """CLIENT->SERVER calls with log-normal durations; returns exact durations per (caller, callee, minute)."""
    rng = random.Random(seed)
    exact: dict[tuple[str, str, int], list[int]] = {}
    records: list[SpanRecord] = []
    n = 0
    for minute in minutes:
        for caller, callee in pairs:
            for _ in range(per_minute):
                n += 1
                tid = f"{seed:08x}{n:024x}"
                start = minute * MIN + rng.randrange(0, 59 * NS)
                dur = int(rng.lognormvariate(17.5, 0.8))  # ~40 ms median
                err = rng.random() < 0.1
                exact.setdefault((caller, callee, minute), []).append(dur)
                records.append(SpanRecord(tid, "00000000000000a1", None, caller, "handle", KIND_SERVER, start - 1000,
                                          start + dur + 1000, resource={"service.name": caller}))
                records.append(SpanRecord(tid, "00000000000000a2", "00000000000000a1", caller, f"call {callee}",
                                          KIND_CLIENT, start, start + dur, STATUS_ERROR if err else STATUS_UNSET,
                                          resource={"service.name": caller}))
                records.append(SpanRecord(tid, "00000000000000a3", "00000000000000a2", callee, "serve", KIND_SERVER,
                                          start + 100, start + dur - 100, resource={"service.name": callee}))
    load_rules(None).tag(records)
    write_spans(engine, records)
    settle(engine, force=True)
    return exact


def _exporter(engine, fake, clock, **kw) -> MetricsExporter:
    cfg = ExportConfig(PROJECT, spacing=0, backoff_initial=0.01, backoff_max=0.05, **kw)
    return MetricsExporter(engine, make_monitoring_client(fake.endpoint), cfg, once=True, clock=clock)


def test_exported_percentiles_within_one_percent_and_descriptors_once(engine, fake):
    now_min = time.time_ns() // MIN
    minutes = [now_min - 6, now_min - 5]
    pairs = [("gateway", "vision-encoder"), ("gateway", "llm")]
    exact = _fill(engine, minutes, pairs, per_minute=300)
    clock = lambda: now_min * MIN + 10 * NS  # noqa: E731

    result = _exporter(engine, fake, clock).run()
    assert result.minutes == 60 and result.requests == 2  # the first run covers the last hour
    assert len(fake.descriptor_requests) == 4
    descs = {d.type: d for d in fake.descriptors.values()}
    assert set(descs) == {PAIR_LATENCY, PAIR_REQUESTS, PAIR_ERRORS, STAGE_LATENCY}
    assert [lab.key for lab in descs[PAIR_LATENCY].labels] == ["caller", "callee", "percentile"]
    assert [lab.key for lab in descs[STAGE_LATENCY].labels] == ["stage", "input_type", "percentile"]
    assert all(d.metric_kind == 1 for d in descs.values())  # GAUGE

    for (caller, callee, minute), durations in exact.items():
        end_ns = (minute + 1) * MIN
        base = (("callee", callee), ("caller", caller))
        for name, q in (("p50", 50), ("p95", 95), ("p99", 99)):
            points = dict(fake.points[(PAIR_LATENCY, tuple(sorted(base + (("percentile", name),))))])
            assert len(points) == len(minutes)
            value, truth = points[end_ns], np.percentile(np.array(durations) / 1e6, q)
            assert abs(value - truth) / truth < 0.01, (caller, callee, name, value, truth)
        assert dict(fake.points[(PAIR_REQUESTS, base)])[end_ns] == len(durations)
        assert dict(fake.points[(PAIR_ERRORS, base)])[end_ns] > 0
    # Name patterns come before CLIENT -> network: "call vision-encoder" is encoder time and
    # "call llm" inference; no model call or media, so every trace is of type unknown.
    stage_labels = {(dict(k[1])["stage"], dict(k[1])["input_type"]) for k in fake.points if k[0] == STAGE_LATENCY}
    assert stage_labels == {(s, "unknown") for s in ("encoder", "inference", "other", "end_to_end")}
    for req in fake.series_requests:
        for ts in req.time_series:
            assert ts.resource.type == "global" and ts.resource.labels["project_id"] == PROJECT

    # Nothing new: no second export, and the descriptors are not created again.
    again = _exporter(engine, fake, clock).run()
    assert again.minutes == 0 and len(fake.series_requests) == 2 and len(fake.descriptor_requests) == 4
    assert read_cursor(engine, "export-metrics:" + PROJECT).position == now_min - 3  # 2 min delay
    health = exporter_health(engine)
    assert health["exporters"][0]["project"] == PROJECT and health["exporters"][0]["last_error"] is None


def test_every_complete_minute_once_batched_by_200(engine, fake):
    now_min = time.time_ns() // MIN
    pairs = [(f"svc-{i}", f"dep-{i}") for i in range(60)]  # 60 x 5 pair series + stage series a minute
    _fill(engine, [now_min - 20], pairs, per_minute=3)
    t = [now_min * MIN - 15 * MIN]  # minute now-20 complete, now-19.. not yet
    exp = _exporter(engine, fake, lambda: t[0])
    first = exp.run()
    assert first.series >= 300 and all(len(r.time_series) <= 200 for r in fake.series_requests)
    assert len(fake.series_requests) == -(-first.series // 200)
    # Later minutes: only those are exported, each once, in order.
    _fill(engine, [now_min - 10, now_min - 9], pairs[:2], per_minute=5, seed=9)
    t[0] = now_min * MIN
    before = len(fake.series_requests)
    second = _exporter(engine, fake, lambda: t[0]).run()
    assert second.first_minute == first.last_minute + 1
    assert second.last_minute == now_min - 3 and second.skipped == 0
    assert len(fake.series_requests) - before == 2  # two minutes with data, a request each
    for key, points in fake.points.items():
        times = [p[0] for p in points]
        assert times == sorted(set(times))  # each minute once per series


def test_backlog_is_capped_at_24_hours(engine, fake):
    now_min = time.time_ns() // MIN
    exp = _exporter(engine, fake, lambda: now_min * MIN)
    assert exp.lease.acquire()
    exp.lease.save(position=now_min - 3 * 24 * 60)
    minutes = exp.pending_minutes(exp.lease.state().position)
    assert len(minutes) == 24 * 60 and minutes[-1] == now_min - 3


def test_cli_export_metrics_once(db_url, fake):
    from modalscope.models.engine import make_engine

    now_min = time.time_ns() // MIN
    eng = make_engine(db_url, write=True)
    try:
        _fill(eng, [now_min - 5], [("api", "billing")], per_minute=20)
    finally:
        eng.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env.update({"MODALSCOPE_DATABASE_URL": db_url, "MODALSCOPE_CLOUD_MONITORING_ENDPOINT": fake.endpoint})
    r = subprocess.run([sys.executable, "-m", "modalscope", "export-metrics", "--project", PROJECT, "--once"],
                       capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert "export-metrics proj-m:" in r.stdout and "1 requests" in r.stdout
    assert len(fake.descriptor_requests) == 4
    key = (PAIR_REQUESTS, (("callee", "billing"), ("caller", "api")))
    assert fake.points[key] == [((now_min - 4) * MIN, 20.0)]
