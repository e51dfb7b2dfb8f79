"""/api/v1 shapes and errors, through the app factory, on SQLite and PostgreSQL."""

from __future__ import annotations

import random
import re
import time

import numpy as np
import pytest

from modalscope.app import create_app
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.settings import Settings
from tests.factories import multimodal_trace

MIN = 60_000_000_000


@pytest.fixture
def stored(engine, db_url):
    rng = random.Random(3)
    base = (time.time_ns() // MIN - 40) * MIN
    traces = [multimodal_trace(rng, base + i * 3_000_000_000, images=1 + i % 2, error=(i % 10 == 0))
              for i in range(60)]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    app = create_app(Settings(database_url=db_url))
    yield app.test_client(), traces
    app.extensions["modalscope"]["engine"].dispose()


def test_health(stored):
    client, _ = stored
    r = client.get("/api/v1/health")
    assert r.status_code == 200 and r.get_json()["status"] == "ok"


def test_pairs_shape_and_values(stored):
    client, traces = stored
    rows = client.get("/api/v1/pairs?range=2h").get_json()
    assert [(r["caller"], r["callee"]) for r in rows] == [("gateway", "vision-encoder")]
    row = rows[0]
    assert set(row) == {"caller", "callee", "count", "p50_ms", "p90_ms", "p99_ms", "error_rate"}
    durations = [
        (s.end_ns - s.start_ns) / 1e6 for t in traces for s in t if s.name == "vision.Encode"
    ]
    assert row["count"] == len(durations)
    for key, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99)):
        assert row[key] == pytest.approx(np.percentile(durations, q), rel=0.01)
    assert 0 <= row["error_rate"] <= 1
    # Filters narrow: another callee, or a non-network stage, has no pairs.
    assert client.get("/api/v1/pairs?range=2h&callee=billing").get_json() == []
    assert client.get("/api/v1/pairs?range=2h&stage=encoder").get_json() == []
    assert len(client.get("/api/v1/pairs?range=2h&service=vision-encoder").get_json()) == 1
    # A window before the data holds nothing.
    assert client.get("/api/v1/pairs?start=2020-01-01T00:00:00Z&end=2020-01-01T01:00:00Z").get_json() == []


def test_input_types(stored):
    client, traces = stored
    rows = client.get("/api/v1/input-types?range=2h").get_json()
    by_type = {r["input_type"]: r for r in rows}
    assert set(by_type) == {"image", "multi_image"}
    for it, images in (("image", 1), ("multi_image", 2)):
        durs = [(t[0].end_ns - t[0].start_ns) / 1e6 for t in traces if t[0].attributes["mm.image_count"] == images]
        r = by_type[it]
        assert r["count"] == len(durs)
        assert r["p95_ms"] == pytest.approx(np.percentile(durs, 95), rel=0.01)
        assert r["bottleneck_stage"] in {"encoder", "inference", "preprocessing"}
        assert set(r) >= {"input_type", "count", "p50_ms", "p95_ms", "p99_ms", "bottleneck_stage"}


def test_stages_shares_sum_to_one(stored):
    client, _ = stored
    rows = client.get("/api/v1/stages?group_by=input_type&range=2h").get_json()
    for it in ("image", "multi_image"):
        shares = [r["share"] for r in rows if r["input_type"] == it]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)


def test_trace_detail(stored):
    client, traces = stored
    t = traces[0]
    body = client.get(f"/api/v1/traces/{t[0].trace_id.upper()}").get_json()
    assert body["trace_id"] == t[0].trace_id and body["input_type"] == "image"
    spans = {s["span_id"]: s for s in body["spans"]}
    assert len(spans) == len(t)
    for rec in t:
        s = spans[rec.span_id]
        assert re.fullmatch(r"[0-9a-f]{16}", s["span_id"])
        assert s["parent_span_id"] == rec.parent_span_id
        assert s["service"] == rec.service and s["name"] == rec.name and s["stage"] == rec.stage
        assert isinstance(s["start_unix_nano"], int) and s["start_unix_nano"] == rec.start_ns
        assert s["source"] == "otlp" and s["status"] in {"OK", "ERROR", "UNSET"}
        assert s["kind"] in {"SERVER", "CLIENT", "INTERNAL"}
        assert s["attributes"] == rec.attributes
    root = [s for s in body["spans"] if s["parent_span_id"] is None]
    assert len(root) == 1 and root[0]["status"] == "ERROR"
    # Stage self times add up to the (sequential) trace's duration.
    assert sum(s["self_ms"] for s in body["spans"]) == pytest.approx(body["duration_ms"], abs=0.01)


@pytest.mark.parametrize("url,param", [
    ("/api/v1/pairs?range=abc", "range"),
    ("/api/v1/pairs?start=yesterday", "start"),
    ("/api/v1/pairs?start=2026-01-02T00:00:00Z&end=2026-01-01T00:00:00Z", "end"),
    ("/api/v1/input-types?end=notatime", "end"),
    ("/api/v1/stages?group_by=color", "group_by"),
    ("/api/v1/traces/zzzz", "trace_id"),
])
def test_bad_parameters_are_400_naming_the_parameter(stored, url, param):
    client, _ = stored
    r = client.get(url)
    assert r.status_code == 400
    assert r.get_json()["parameter"] == param and r.get_json()["error"]


def test_unknown_trace_is_404(stored):
    client, _ = stored
    r = client.get("/api/v1/traces/" + "ab" * 16)
    assert r.status_code == 404 and "error" in r.get_json()


def test_unix_seconds_window(stored):
    client, _ = stored
    now = time.time()
    r = client.get(f"/api/v1/pairs?start={now - 7200:.3f}&end={now:.0f}")
    assert r.status_code == 200 and r.get_json()[0]["count"] == 60


def test_auth_token_guards_everything_but_health(db_url):
    app = create_app(Settings(database_url=db_url, auth_token="s3cret"))
    client = app.test_client()
    try:
        assert client.get("/api/v1/health").status_code == 200
        for path in ("/api/v1/pairs", "/api/v1/input-types", "/api/v1/traces/" + "ab" * 16):
            assert client.get(path).status_code == 401
            assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        # A browser page goes to the sign-in form instead (the whole matrix: tests/app/test_auth.py).
        assert client.get("/").status_code == 302
        r = client.get("/api/v1/pairs", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.get_json() == []
    finally:
        app.extensions["modalscope"]["engine"].dispose()
