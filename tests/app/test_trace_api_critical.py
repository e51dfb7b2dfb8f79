"""/api/v1/traces/<id>: each span's "critical" and "rank_pct", on SQLite and PostgreSQL."""

from __future__ import annotations

import random
import time

import pytest

from modalscope.app import create_app
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.settings import Settings
from tests.factories import rules

MIN = 60_000_000_000
MS = 1_000_000


def skewed_trace(rng: random.Random, start_ns: int, vision_ms: float, early_ms: float = 3.0) -> list[SpanRecord]:
    """gateway: preprocess, then the vision and text encoders in parallel (text the faster),
    fusion starting ``early_ms`` before the vision call returns (its clock runs early), llm."""
    tid = f"{rng.getrandbits(128):032x}"
    ids = iter(f"{rng.getrandbits(64) | 1:016x}" for _ in range(16))
    spans: list[SpanRecord] = []

    def add(parent, service, name, kind, s_ms, e_ms):
        sid = next(ids)
        spans.append(SpanRecord(tid, sid, parent, service, name, kind, start_ns + int(s_ms * MS),
                                start_ns + int(e_ms * MS), 0, attributes={"mm.image_count": 1} if parent is None else {},
                                resource={"service.name": service}))
        return sid

    v_end = 20 + vision_ms
    f_end = v_end + 30
    total = f_end + 103
    root = add(None, "gateway", "POST /chat", KIND_SERVER, 0, total)
    add(root, "gateway", "preprocess.Run", KIND_CLIENT, 2, 19)
    vc = add(root, "gateway", "vision.Encode", KIND_CLIENT, 20, v_end)
    vs = add(vc, "vision-encoder", "VisionEncoder/Encode", KIND_SERVER, 20.5, v_end - 0.5)
    add(vs, "vision-encoder", "vit.forward", KIND_INTERNAL, 21, v_end - 1)
    add(root, "gateway", "text.Encode", KIND_CLIENT, 20, 40)
    add(root, "gateway", "fusion.Fuse", KIND_CLIENT, v_end - early_ms, f_end)
    add(root, "gateway", "llm.Generate", KIND_CLIENT, f_end + 1, total - 2)
    rules().tag(spans)
    return spans


@pytest.fixture
def client(db_url):
    app = create_app(Settings(database_url=db_url))
    yield app.test_client()
    app.extensions["modalscope"]["engine"].dispose()


def test_each_span_says_whether_it_is_on_the_critical_path(engine, client):
    rng = random.Random(5)
    base = (time.time_ns() // MIN - 60) * MIN
    trace = skewed_trace(rng, base, 550)
    write_spans(engine, trace)
    settle(engine, force=True)
    r = client.get(f"/api/v1/traces/{trace[0].trace_id}")
    assert r.status_code == 200
    spans = {s["name"]: s for s in r.get_json()["spans"]}
    critical = {name for name, s in spans.items() if s["critical"] is True}
    # The vision call fusion waited for is on the path despite the 3 ms skew; the faster
    # text encoder beside it is not.
    assert critical == {"POST /chat", "preprocess.Run", "vision.Encode", "VisionEncoder/Encode", "vit.forward",
                        "fusion.Fuse", "llm.Generate"}
    assert spans["text.Encode"]["critical"] is False


def test_rank_pct_is_against_the_same_operation_in_the_hour_around_the_trace(engine, client):
    rng = random.Random(7)
    t0 = (time.time_ns() // MIN - 90) * MIN
    subject = skewed_trace(rng, t0, 550)
    # Within the hour: vision calls of 100..1000 ms, 2 minutes apart on both sides.
    near = [skewed_trace(rng, t0 + (i - 5) * 2 * MIN + MIN // 2, 100 * (i + 1)) for i in range(10)]
    # Outside it (40+ minutes away): slow calls that would pull the rank down if counted.
    far = [skewed_trace(rng, t0 + sign * (41 + i) * MIN, 5000) for sign in (-1, 1) for i in range(3)]
    write_spans(engine, [s for t in [subject, *near, *far] for s in t])
    settle(engine, force=True)
    body = client.get(f"/api/v1/traces/{subject[0].trace_id}").get_json()
    spans = {s["name"]: s for s in body["spans"]}
    # 100..500 ms and the subject itself of 11 samples are at or below 550 ms.
    assert spans["vision.Encode"]["rank_pct"] == pytest.approx(100 * 6 / 11)
    assert spans["text.Encode"]["rank_pct"] == pytest.approx(100.0)  # all 20 ms: ties rank at the top
    assert all(isinstance(s["rank_pct"], float) and 0 <= s["rank_pct"] <= 100 for s in body["spans"])
    # A far trace ranks against its own hour: the slowest vision call there.
    far_body = client.get(f"/api/v1/traces/{far[0][0].trace_id}").get_json()
    far_vision = next(s for s in far_body["spans"] if s["name"] == "vision.Encode")
    assert far_vision["rank_pct"] == pytest.approx(100.0)
    fastest = client.get(f"/api/v1/traces/{near[0][0].trace_id}").get_json()
    fast_vision = next(s for s in fastest["spans"] if s["name"] == "vision.Encode")
    assert fast_vision["rank_pct"] == pytest.approx(100 / 11)


def test_rank_pct_is_null_without_samples_and_other_keys_are_unchanged(engine, client):
    rng = random.Random(9)
    trace = skewed_trace(rng, (time.time_ns() // MIN - 30) * MIN, 400)
    write_spans(engine, trace)  # not settled yet: no rollups to rank against
    body = client.get(f"/api/v1/traces/{trace[0].trace_id}").get_json()
    assert set(body) == {"trace_id", "input_type", "duration_ms", "root_service", "root_name", "span_count",
                         "settled", "spans"}
    for s in body["spans"]:
        assert s["rank_pct"] is None
        assert set(s) == {"span_id", "parent_span_id", "service", "name", "kind", "stage", "start_unix_nano",
                          "duration_ms", "self_ms", "status", "status_message", "source", "instance",
                          "attributes", "resource", "events", "links", "critical", "rank_pct"}
    assert {s["name"] for s in body["spans"] if s["critical"]} >= {"vision.Encode", "fusion.Fuse"}
    assert client.get("/api/v1/traces/" + "ab" * 16).status_code == 404
    assert client.get("/api/v1/traces/nothex").status_code == 400
