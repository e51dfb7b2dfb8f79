"""Cloud Trace: the v1 mapping, and the poller with the real google-cloud-trace client against a
local gRPC stand-in (tests/cloud_standins.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc
import pytest
from sqlalchemy import func, select

from modalscope.ingest.cloud_trace import (
    CloudTracePoller,
    PollError,
    PollerConfig,
    make_trace_client,
    parse_duration,
    poller_health,
    span_record,
    trace_records,
)
from modalscope.ingest.cursors import Lease, read_cursor
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, STATUS_ERROR, STATUS_UNSET, SpanRecord
from modalscope.ingest.writer import write_spans
from modalscope.models import Span, Trace
from modalscope.models.engine import make_engine
from tests.cloud_standins import FakeCloudTrace, make_span, make_trace

NS = 1_000_000_000
PROJECT = "proj-1"


# -- mapping (pure) ---------------------------------------------------------------------------

def test_span_mapping_ids_kinds_labels_status():
    t0 = 1_700_000_000 * NS + 123
    trace = make_trace(PROJECT, "0A1B2C3D4E5F60718293A4B5C6D7E8F9", [
        make_span(0xFFFFFFFFFFFFFFFF, "Recv./v1/chat", t0, t0 + 900_000_000, kind=1, labels={
            "service.name": "gateway", "mm.image_count": "2", "mm.prompt_chars": "311", "cache.hit": "false",
            "/http/status_code": "503", "user_tier": "bronze", "service.instance.id": "pod-7",
        }),
        make_span(5, "Sent.vision", t0 + 10, t0 + 500, parent=0xFFFFFFFFFFFFFFFF, kind=2,
                  labels={"g.co/r/k8s_container/container_name": "vision-encoder", "/http/status_code": "200",
                          "g.co/r/k8s_container/pod_name": "vis-1"}),
        make_span(6, "VisionEncoder/Encode", t0 + 20, t0 + 400, parent=5, labels={"g.co/gae/app/module": "vit"}),
        make_span(7, "decode", t0 + 20, t0 + 30, parent=6, labels={"/component": "preproc", "error": "true",
                                                                   "/error/message": "bad jpeg"}),
        make_span(8, "misc", t0, t0 + 1, parent=6),
        make_span(0, "no id", t0, t0 + 1),  # unusable id: dropped
    ])
    recs = {r.span_id: r for r in trace_records(trace)}
    assert len(recs) == 5
    root = recs["ffffffffffffffff"]
    assert root.trace_id == "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
    assert root.parent_span_id is None and root.kind == KIND_SERVER and root.source == "cloud-trace"
    assert root.start_ns == t0 and root.end_ns == t0 + 900_000_000
    assert root.service == "gateway" and root.instance == "pod-7"
    assert root.attributes["mm.image_count"] == 2 and root.attributes["mm.prompt_chars"] == 311
    assert root.attributes["cache.hit"] is False and root.attributes["user_tier"] == "bronze"
    assert root.status == STATUS_ERROR  # /http/status_code 503
    client = recs["0000000000000005"]
    assert client.kind == KIND_CLIENT and client.parent_span_id == "ffffffffffffffff"
    assert client.service == "vision-encoder" and client.status == STATUS_UNSET and client.instance == "vis-1"
    assert recs["0000000000000006"].service == "vit" and recs["0000000000000006"].kind == KIND_INTERNAL
    dec = recs["0000000000000007"]
    assert dec.service == "preproc" and dec.status == STATUS_ERROR and dec.status_message == "bad jpeg"
    assert recs["0000000000000008"].service == "unknown"
    # The raw protobuf message maps the same way as the proto-plus one.
    from google.cloud import trace_v1

    raw = trace_v1.TraceSpan.pb(trace.spans[0])
    assert span_record("0a1b2c3d4e5f60718293a4b5c6d7e8f9", raw) == root


def test_trace_id_and_duration_parsing():
    assert trace_records(make_trace(PROJECT, "not-hex", [make_span(1, "x", 0, 1)])) == []
    short = trace_records(make_trace(PROJECT, "abc", [make_span(1, "x", 0, 1)]))
    assert short[0].trace_id == "0" * 29 + "abc"
    assert parse_duration("500ms") == 0.5 and parse_duration("2m") == 120 and parse_duration("6h") == 21600
    assert parse_duration("90") == 90 and parse_duration("10s") == 10
    with pytest.raises(ValueError):
        parse_duration("soon")


# -- poller against the stand-in -------------------------------------------------------------

@pytest.fixture
def fake():
    with FakeCloudTrace() as server:
        yield server


def _traces(n: int, end_ns: int, start_index: int = 0, step_ns: int = NS // 10) -> list:
    out = []
    for i in range(start_index, start_index + n):
        end = end_ns - (start_index + n - i) * step_ns
        start = end - 400_000_000
        out.append(make_trace(PROJECT, f"{i + 1:032x}", [
            make_span(1, "Recv./generate", start, end, kind=1,
                      labels={"service.name": "gateway", "mm.image_count": "1"}),
            make_span(2, "Sent./encode", start + 1_000_000, end - 1_000_000, parent=1, kind=2,
                      labels={"service.name": "gateway"}),
            make_span(3, "vit.forward", start + 2_000_000, end - 2_000_000, parent=2, kind=1,
                      labels={"service.name": "vision-encoder"}),
        ]))
    return out


def _poller(engine, fake, **kw) -> CloudTracePoller:
    once = kw.pop("once", True)
    clock = kw.pop("clock", time.time_ns)
    holder = kw.pop("holder", None)
    cfg = PollerConfig(PROJECT, calls_per_minute=kw.pop("calls_per_minute", 60_000), backoff_initial=0.01,
                       backoff_max=0.05, chunk=kw.pop("chunk", 7200), **kw)
    return CloudTracePoller(engine, make_trace_client(fake.endpoint), cfg, once=once, clock=clock, holder=holder)


def _span_count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Span)).scalar_one()


def test_pagination_over_pages_writes_tags_and_settles(engine, fake):
    now = time.time_ns()
    fake.add(*_traces(250, now - 30 * NS))
    result = _poller(engine, fake).run()
    assert len(fake.requests) == 3 and result.calls == 3
    assert [r.page_token for r in fake.requests] == ["", "100", "200"]
    from google.cloud import trace_v1

    first = fake.requests[0]
    assert first.project_id == PROJECT and first.page_size == 100
    assert first.view == trace_v1.ListTracesRequest.ViewType.COMPLETE and first.filter == ""
    assert result.traces == 250 and result.spans == 750 and result.new_spans == 750
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar_one() == 750
        sources = {s for (s,) in conn.execute(select(Span.source).distinct())}
        stages = dict(conn.execute(select(Span.name, Span.stage).distinct()).all())
        pending = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
        input_types = {t for (t,) in conn.execute(select(Trace.input_type).distinct())}
    assert sources == {"cloud-trace"} and pending == 0 and input_types == {"image"}
    assert stages["Sent./encode"] == "encoder" and stages["vit.forward"] == "encoder"
    state = read_cursor(engine, "cloud-trace:" + PROJECT)
    assert state.holder is None  # released after --once
    assert now - 15 * NS < state.position <= time.time_ns() - 10 * NS  # now minus the indexing lag


def test_quota_errors_back_off_and_recover(engine, fake):
    fake.add(*_traces(5, time.time_ns() - 30 * NS))
    fake.errors.extend([grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.RESOURCE_EXHAUSTED])
    result = _poller(engine, fake).run()
    assert result.retries == 3 and result.calls == 4 and result.new_spans == 15
    assert _span_count(engine) == 15


def test_quota_never_recovering_fails_once_and_keeps_watermark(engine, fake):
    fake.add(*_traces(5, time.time_ns() - 30 * NS))
    fake.errors.extend([grpc.StatusCode.RESOURCE_EXHAUSTED] * 10)
    with pytest.raises(PollError, match="did not recover after 3 attempts: RESOURCE_EXHAUSTED"):
        _poller(engine, fake, max_attempts=3).run()
    state = read_cursor(engine, "cloud-trace:" + PROJECT)
    assert state.position == 0 and state.holder is None


def test_calls_are_spaced_by_the_quota(engine, fake):
    fake.add(*_traces(30, time.time_ns() - 30 * NS))
    _poller(engine, fake, page_size=10, calls_per_minute=600).run()  # 0.1 s apart
    gaps = [b - a for a, b in zip(fake.call_times, fake.call_times[1:])]
    # Arrival times jitter on a loaded machine (one late arrival shortens the next gap),
    # so judge the pacing over all calls: three calls at 0.1 s spacing take >= 0.2 s.
    assert len(gaps) == 2 and sum(gaps) >= 0.17 and min(gaps) >= 0.03, gaps


def test_restart_resumes_from_watermark_no_gap_no_duplicate(engine, fake):
    t = [time.time_ns()]
    clock = lambda: t[0]  # noqa: E731
    fake.add(*_traces(20, t[0] - 20 * NS))
    first = _poller(engine, fake, clock=clock).run()
    wm = read_cursor(engine, "cloud-trace:" + PROJECT).position
    assert wm == t[0] - 10 * NS and first.new_spans == 60

    # While "down": a trace ending just before the watermark was indexed late, and new ones came.
    late = _traces(1, wm - 30 * NS, start_index=1000)
    fresh = _traces(15, t[0] + 50 * NS, start_index=2000)
    fake.add(*late, *fresh)
    t[0] += 60 * NS
    fake.requests.clear()
    second = _poller(engine, fake, clock=clock).run()  # a new process: state only from the store
    req = fake.requests[0]
    start = req.start_time.timestamp() * NS
    assert abs(start - (wm - 120 * NS)) < 1e6  # watermark minus the 2 min overlap
    assert abs(req.end_time.timestamp() * NS - (t[0] - 10 * NS)) < 1e6
    # The overlap re-read the first pass's traces: nothing stored twice, nothing missed.
    assert second.new_spans == 3 * 16 and second.spans == 3 * 36
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar_one() == 3 * 36
        assert conn.execute(select(func.count()).select_from(Trace)).scalar_one() == 36


def test_failure_mid_pass_leaves_watermark_and_next_run_fills_in(engine, fake):
    fake.add(*_traces(250, time.time_ns() - 30 * NS))
    poller = _poller(engine, fake)
    calls = {"n": 0}
    real = poller.client.list_traces

    def flaky(**kw):
        calls["n"] += 1
        if calls["n"] == 2:
            fake.errors.append(grpc.StatusCode.PERMISSION_DENIED)
        return real(**kw)

    poller.client.list_traces = flaky
    with pytest.raises(PollError, match="PERMISSION_DENIED"):
        poller.run()
    assert read_cursor(engine, "cloud-trace:" + PROJECT).position == 0
    assert _span_count(engine) == 300  # the first page was written
    _poller(engine, fake).run()
    assert _span_count(engine) == 750


def test_span_from_otlp_and_cloud_trace_is_stored_once(engine, fake):
    trace = _traces(1, time.time_ns() - 30 * NS)[0]
    recs = trace_records(trace)
    otlp = [SpanRecord(r.trace_id, r.span_id, r.parent_span_id, r.service, r.name, r.kind, r.start_ns, r.end_ns,
                       attributes=dict(r.attributes), resource=dict(r.resource), source="otlp") for r in recs[:2]]
    assert write_spans(engine, otlp).inserted == 2
    fake.add(trace)
    result = _poller(engine, fake).run()
    assert result.spans == 3 and result.new_spans == 1
    with engine.connect() as conn:
        rows = dict(conn.execute(select(Span.span_id, Span.source)).all())
    # The first arrival wins: a re-sent or doubly-sourced span changes nothing.
    assert rows == {"0000000000000001": "otlp", "0000000000000002": "otlp", "0000000000000003": "cloud-trace"}


def test_second_poller_does_not_poll_while_lease_held(engine, fake):
    fake.add(*_traces(3, time.time_ns() - 30 * NS))
    other = Lease(engine, "cloud-trace:" + PROJECT, ttl=60, holder="other-host:1")
    assert other.acquire()
    with pytest.raises(PollError, match=r"another poller \(other-host:1\) holds the Cloud Trace lease"):
        _poller(engine, fake).run()
    assert fake.requests == []
    # A continuous poller stands by, then takes over once the lease is released.
    stop = threading.Event()
    poller = _poller(engine, fake, once=False, interval=0.2)
    poller.stop = stop
    th = threading.Thread(target=poller.run, daemon=True)
    th.start()
    time.sleep(0.5)
    assert fake.requests == []
    other.release()
    deadline = time.monotonic() + 10
    while _span_count(engine) < 9 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    th.join(10)
    assert _span_count(engine) == 9 and not th.is_alive()
    assert read_cursor(engine, "cloud-trace:" + PROJECT).holder is None


def test_min_latency_filter_is_recorded_as_sampled(engine, fake):
    fake.add(*_traces(5, time.time_ns() - 30 * NS))
    _poller(engine, fake, min_latency_ms=500).run()
    assert fake.requests[0].filter == "latency:500ms"
    assert _span_count(engine) == 0  # the stand-in's traces last 400 ms
    health = poller_health(engine)
    assert health["sampled"] is True and health["pollers"][0]["min_latency_ms"] == 500
    assert health["pollers"][0]["project"] == PROJECT and health["pollers"][0]["active"] is False


def test_traffic_beyond_the_quota_is_reported(engine, fake, caplog):
    now = time.time_ns()
    fake.add(*_traces(3, now - NS // 2, step_ns=NS // 10))
    # A 1-second window needing 3 calls: 180 calls a minute of traces, against 100 allowed.
    with caplog.at_level("WARNING"):
        result = _poller(engine, fake, backfill=1.5, lag=0.2, page_size=1, calls_per_minute=100,
                         clock=lambda: now).run()
    assert result.calls == 3 and result.falling_behind
    assert "more than the read quota" in caplog.text
    assert poller_health(engine)["falling_behind"] is True
    # ... and /api/v1/health says so to the load balancer's and on-call's probes.
    from modalscope.app import create_app
    from modalscope.settings import Settings

    app = create_app(Settings(database_url=engine.url.render_as_string(hide_password=False)))
    try:
        body = app.test_client().get("/api/v1/health").get_json()
    finally:
        app.extensions["modalscope"]["engine"].dispose()
    assert body["status"] == "ok" and body["cloud_trace"]["falling_behind"] is True
    assert body["cloud_trace"]["pollers"][0]["project"] == PROJECT


def test_poller_health_is_none_without_pollers(engine):
    assert poller_health(engine) is None


# -- the command ----------------------------------------------------------------------------

def _run(args, env_extra, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_") and k != "GOOGLE_CLOUD_PROJECT"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "modalscope", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_cli_once_exits_zero_after_a_complete_pass(db_url, fake):
    fake.add(*_traces(120, time.time_ns() - 30 * NS))
    env = {"MODALSCOPE_DATABASE_URL": db_url, "MODALSCOPE_CLOUD_TRACE_ENDPOINT": fake.endpoint,
           "GOOGLE_CLOUD_PROJECT": PROJECT}
    r = _run(["ingest", "cloud-trace", "--once", "--calls-per-minute", "6000"], env)
    assert r.returncode == 0, r.stderr
    # The 1 h backfill is two 30-minute slices: one call for the empty one, two pages for the other.
    assert "360 spans (360 new) in 120 traces" in r.stdout and "3 calls" in r.stdout
    r = _run(["ingest", "cloud-trace", "--project", PROJECT, "--once", "--calls-per-minute", "6000"], env)
    assert r.returncode == 0 and "(0 new)" in r.stdout
    eng = make_engine(db_url)
    try:
        assert _span_count(eng) == 360
    finally:
        eng.dispose()


@pytest.mark.parametrize("code", [grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED])
def test_cli_once_permanent_error_is_one_line(tmp_path, fake, code):
    fake.errors.append(code)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    r = _run(["ingest", "cloud-trace", "--project", PROJECT, "--once"],
             {"MODALSCOPE_DATABASE_URL": url, "MODALSCOPE_CLOUD_TRACE_ENDPOINT": fake.endpoint})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("modalscope: error: Cloud Trace refused project 'proj-1': " + code.name)
    eng = make_engine(url)
    try:
        assert read_cursor(eng, "cloud-trace:" + PROJECT).holder is None  # lease released
    finally:
        eng.dispose()


def test_cli_without_project_is_one_line(tmp_path):
    r = _run(["ingest", "cloud-trace", "--once"], {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"})
    assert r.returncode == 2 and r.stderr.strip() == (
        "modalscope: error: no Google Cloud project: pass --project ID or set GOOGLE_CLOUD_PROJECT")
