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
from tests.factories import multimodal_trace, settled_copy

MIN = 60_000_000_000


@pytest.fixture
def stored(engine, db_url, small_templates):
    rng = random.Random(3)
    base = (time.time_ns() // MIN - 40) * MIN
    traces = [multimodal_trace(rng, base + i * 3_000_000_000, images=1 + i % 2, error=(i % 10 == 0))
              for i in range(60)]
    settled_copy(small_templates, engine, db_url, f"api-{base}", [s for t in traces for s in t])
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
    assert set(row) == {"caller", "callee", "count", "p50_ms", "p90_ms", "p99_ms", "error_rate", "models"}
    durations = [
        (s.end_ns - s.start_ns) / 1e6 for t in traces for s in t if s.name == "vision.Encode"
    ]
    assert row["count"] == len(durations)
    for key, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99)):
        assert row[key] == pytest.approx(np.percentile(durations, q), rel=0.01)
    assert 0 <= row["error_rate"] <= 1
    # Filters narrow: another callee, or a stage the calling span is not in, has no pairs
    # (vision.Encode is encoder time by its name).
    assert client.get("/api/v1/pairs?range=2h&callee=billing").get_json() == []
    assert client.get("/api/v1/pairs?range=2h&stage=network").get_json() == []
    assert len(client.get("/api/v1/pairs?range=2h&stage=encoder").get_json()) == 1
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


# -- span links ---------------------------------------------------------------------------

from tests.ingest.test_receivers import _no_otel_env, session, start_stack  # noqa: E402,F401 - a running receiver


def _render(x) -> str:
    import json

    return json.dumps(x, default=lambda o: o.to_plotly_json() if hasattr(o, "to_plotly_json") else str(o))


def test_trace_detail_returns_each_spans_links(engine, db_url):
    from sqlalchemy import update

    from modalscope.models import Span

    rng = random.Random(17)
    base = (time.time_ns() // MIN - 30) * MIN
    producer = multimodal_trace(rng, base)
    consumer = multimodal_trace(rng, base + 5_000_000_000)
    consumer[0].links = [
        {"trace_id": producer[1].trace_id, "span_id": producer[1].span_id,
         "attributes": {"messaging.operation": "receive", "lag_ms": 12.5, "ratio": float("nan")}},
        {"trace_id": "0" * 32, "span_id": "0" * 16, "attributes": {"reason": "no context"}},
    ]
    write_spans(engine, producer + consumer)
    with engine.begin() as conn:  # a row stored before spans had links: NULL
        conn.execute(update(Span).where(Span.span_id == consumer[-1].span_id).values(links=None))
    settle(engine, force=True)
    app = create_app(Settings(database_url=db_url))
    try:
        client = app.test_client()
        body = client.get(f"/api/v1/traces/{consumer[0].trace_id}").get_json()
        spans = {s["span_id"]: s for s in body["spans"]}
        assert spans[consumer[0].span_id]["links"] == [
            {"trace_id": producer[1].trace_id, "span_id": producer[1].span_id,
             "attributes": {"messaging.operation": "receive", "lag_ms": 12.5, "ratio": None}},  # stored as null
            {"trace_id": "0" * 32, "span_id": "0" * 16, "attributes": {"reason": "no context"}},
        ]
        assert all(spans[s.span_id]["links"] == [] for s in consumer[1:])
        assert all(s["links"] == [] for s in client.get(f"/api/v1/traces/{producer[0].trace_id}").get_json()["spans"])

        # The trace page: the linked trace is a link (window kept, linked span selected);
        # the all-zero one is text only.
        from modalscope.app.pages import trace as trace_page

        with app.test_request_context():
            out = _render(trace_page._fill({"trace_id": consumer[0].trace_id,
                                            "state": {"range": "2h", "span": consumer[0].span_id}}))
        href = f"/trace/{producer[1].trace_id}?range=2h&span={producer[1].span_id}"
        assert f'"href": "{href}"' in out
        assert "messaging.operation=receive" in out and "trace-links" in out
        assert f'"href": "/trace/{"0" * 32}' not in out and "0" * 32 in out
    finally:
        app.extensions["modalscope"]["engine"].dispose()


def test_trace_page_links_only_well_formed_ids():
    from dash import dcc

    from modalscope.app.pages.trace import link_href, links_table

    state = {"range": "1h", "service": "gateway", "span": "1" * 16}
    tid, sid = "AB" * 16, "CD" * 8
    assert link_href({"trace_id": tid, "span_id": sid}, state) == f"/trace/{'ab' * 16}?range=1h&span={'cd' * 8}"
    assert link_href({"trace_id": tid, "span_id": "javascript:x"}, state) == f"/trace/{'ab' * 16}?range=1h"
    assert link_href({"trace_id": tid, "span_id": "0" * 16}, {}) == f"/trace/{'ab' * 16}"
    for bad in ("javascript:alert(1)", "ab" * 15, "0" * 32, None, 7, "ab" * 16 + "/../x", "g" * 32):
        assert link_href({"trace_id": bad, "span_id": sid}, state) is None, bad
    span = {"links": [{"trace_id": "<script>alert(1)</script>", "span_id": sid, "attributes": {"a": "<b>x</b>"}},
                      {"trace_id": tid, "span_id": sid, "attributes": {}}, "not a link"]}
    table = links_table(span, state)
    found = []

    def walk(node):
        if isinstance(node, dcc.Link):
            found.append(node.href)
        children = getattr(node, "children", None)
        for child in children if isinstance(children, list) else [children]:
            if child is not None and not isinstance(child, str):
                walk(child)

    walk(table)
    assert found == [f"/trace/{'ab' * 16}?range=1h&span={'cd' * 8}"]
    text = _render(table)
    assert "<script>alert(1)</script>" in text and "a=<b>x</b>" in text  # as text children, never markup
    assert links_table({"links": []}, state) is None and links_table({}, state) is None


def test_links_from_the_sdk_reach_the_api_through_the_receiver(engine, db_url, start_stack):  # noqa: F811
    """Real SDK spans with links, exported by the real OTLP/HTTP exporter to a running
    receiver, come back from /api/v1/traces/<id>; a bad link id rejects its span only."""
    import json

    from opentelemetry import context as otel_context
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link, SpanKind

    stack = start_stack()
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ingest-worker"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("modalscope.test")
    with tracer.start_as_current_span("upload image", kind=SpanKind.PRODUCER) as producer:
        produced = producer.get_span_context()
    token = otel_context.attach(otel_context.Context())
    try:
        with tracer.start_as_current_span("encode batch", kind=SpanKind.CONSUMER,
                                          links=[Link(produced, {"messaging.batch.index": 3})]) as consumer:
            consumed = consumer.get_span_context()
    finally:
        otel_context.detach(token)
    exporter = OTLPSpanExporter(endpoint=stack.url, timeout=10, session=session())
    try:
        assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        provider.shutdown()

    app = create_app(Settings(database_url=db_url))
    try:
        client = app.test_client()
        body = client.get(f"/api/v1/traces/{consumed.trace_id:032x}").get_json()
        (span,) = body["spans"]
        assert span["links"] == [{"trace_id": f"{produced.trace_id:032x}", "span_id": f"{produced.span_id:016x}",
                                  "attributes": {"messaging.batch.index": 3}}]
        (plain,) = client.get(f"/api/v1/traces/{produced.trace_id:032x}").get_json()["spans"]
        assert plain["links"] == []

        good = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "ok",
                "links": [{"traceId": f"{produced.trace_id:032x}", "spanId": f"{produced.span_id:016x}"}]}
        bad = {"traceId": "1" * 32, "spanId": "3" * 16, "name": "bad link",
               "links": [{"traceId": "not hex", "spanId": "4" * 16}]}
        request = {"resourceSpans": [{"scopeSpans": [{"spans": [good, bad]}]}]}
        with session() as s:
            r = s.post(stack.url, data=json.dumps(request), headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["partialSuccess"]["rejectedSpans"] == "1"
        assert "link trace id" in r.json()["partialSuccess"]["errorMessage"]
        (kept,) = client.get(f"/api/v1/traces/{'1' * 32}").get_json()["spans"]
        assert kept["name"] == "ok" and kept["links"][0]["span_id"] == f"{produced.span_id:016x}"
    finally:
        app.extensions["modalscope"]["engine"].dispose()


def test_the_model_filter_narrows_pairs_and_traces(stored):
    client, _ = stored
    rows = client.get("/api/v1/pairs?range=2h").get_json()
    assert [r["models"] for r in rows] == [[]]  # the factory's calls request no model
    assert client.get("/api/v1/pairs?range=2h&model=gemini-2.0-flash").get_json() == []
    assert client.get("/api/v1/traces?range=2h&caller=gateway&model=gemini-2.0-flash").get_json() == []
    assert client.get("/api/v1/traces?range=2h&caller=gateway").get_json()
    r = client.get("/api/v1/pairs?range=2h&model=" + "m" * 2000)
    assert r.status_code == 400 and "model" in r.get_json()["error"]
