"""The OTLP receivers end to end, with real parts.

Real OpenTelemetry exporters (HTTP and gRPC) export a multimodal trace into a receiver
backed by the real pipeline and writer, on SQLite and on PostgreSQL; real HTTP requests
(``requests``) and a raw gRPC channel probe every refusal the OTLP specification names.
After each refused request the receiver must still take a good one, and nothing of the
refused request may be stored.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import time
import uuid
import zlib
from dataclasses import dataclass, field

import grpc
import pytest
import requests
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from sqlalchemy import func, select

from modalscope.ingest.otlp_grpc import FULL_METHOD, serve_grpc
from modalscope.ingest.otlp_http import PortInUse, create_ingest_app, serve_http
from modalscope.ingest.pipeline import IngestPipeline
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models import Span, Trace
from modalscope.settings import Settings

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CAP = 1 << 20  # 1 MiB: the size cap of the tests that probe it


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def span_count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Span)).scalar_one()


def new_trace_id() -> str:
    return uuid.uuid4().hex


def new_span_id() -> str:
    return uuid.uuid4().hex[:16]


def otlp_json(trace_id: str, spans: list[dict], service: str = "gateway") -> dict:
    """An OTLP/JSON request as real exporters vary it: ids in hex, int64 as strings or
    numbers, no ``parentSpanId`` on a root, an unknown ``flags`` field."""
    now = time.time_ns()
    out = []
    for i, sp in enumerate(spans):
        start = now + i * 1_000_000
        item = {
            "traceId": sp.get("trace_id", trace_id),
            "spanId": sp["span_id"],
            "name": sp["name"],
            "kind": sp.get("kind", 1),
            "flags": 257,
            "startTimeUnixNano": str(start) if i % 2 == 0 else start,
            "endTimeUnixNano": str(start + 5_000_000),
            "attributes": [{"key": k, "value": v} for k, v in sp.get("attributes", {}).items()],
            "status": {},
        }
        if sp.get("parent"):
            item["parentSpanId"] = sp["parent"]
        out.append(item)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
                "scopeSpans": [{"scope": {"name": "test", "version": "1"}, "spans": out}],
            }
        ]
    }


def good_json_body(n: int = 2) -> tuple[bytes, str]:
    """A small valid OTLP/JSON request of ``n`` spans in one new trace."""
    tid = new_trace_id()
    root = new_span_id()
    spans = [{"span_id": root, "name": "POST /v1/chat", "kind": 2,
              "attributes": {"mm.image_count": {"intValue": "1"}}}]
    for i in range(n - 1):
        spans.append({"span_id": new_span_id(), "parent": root, "name": f"image.decode.{i}"})
    return json.dumps(otlp_json(tid, spans)).encode(), tid


def pb_request(n: int = 2, *, bad_span_ids: int = 0, big_attribute: int = 0) -> bytes:
    """A protobuf ExportTraceServiceRequest: ``n`` good spans, plus spans with broken ids."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "gateway"
    ss = rs.scope_spans.add()
    tid = bytes.fromhex(new_trace_id())
    now = time.time_ns()
    for i in range(n + bad_span_ids):
        sp = ss.spans.add()
        sp.trace_id = tid
        sp.span_id = bytes.fromhex(new_span_id()) if i < n else b"\x01\x02\x03"  # 3 bytes: invalid
        sp.name = f"vit.forward.{i}"
        sp.kind = KIND_INTERNAL
        sp.start_time_unix_nano = now
        sp.end_time_unix_nano = now + 1_000_000
        if big_attribute and i == 0:
            a = sp.attributes.add()
            a.key, a.value.string_value = "blob", "a" * big_attribute
    return req.SerializeToString()


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # never through a proxy from the environment
    return s


@dataclass
class Stack:
    """A pipeline with an OTLP/HTTP (and optionally OTLP/gRPC) receiver in front of it."""

    pipeline: IngestPipeline
    settings: Settings
    http: object | None = None
    grpc_server: grpc.Server | None = None
    grpc_port: int = 0
    writer_started: bool = False
    channels: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.http.url}/v1/traces"

    def start_writer(self) -> None:
        if not self.writer_started:
            self.pipeline.start()
            self.writer_started = True

    def export_method(self):
        ch = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.channels.append(ch)
        return ch.unary_unary(FULL_METHOD)

    def stop(self) -> None:
        try:
            for ch in self.channels:
                ch.close()
            if self.grpc_server is not None:
                self.grpc_server.stop(None)
            if self.http is not None:
                self.http.shutdown()
        finally:
            self.start_writer()  # close() joins the writer thread: it must have started
            self.pipeline.close()


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def start_stack(engine):
    stacks: list[Stack] = []

    def _start(settings: Settings | None = None, *, run_writer: bool = True, with_grpc: bool = False,
               commit_timeout: float = 30.0, limit_lag: bool = False) -> Stack:
        settings = settings or Settings(settle_seconds=0)
        pipeline = IngestPipeline(engine, settings, settle=False, limit_lag=limit_lag)
        stack = Stack(pipeline, settings)
        stacks.append(stack)
        if run_writer:
            stack.start_writer()
        stack.http = serve_http(create_ingest_app(pipeline, settings, commit_timeout=commit_timeout),
                                "127.0.0.1", free_port())
        if with_grpc:
            stack.grpc_port = free_port()
            stack.grpc_server = serve_grpc(pipeline, settings, "127.0.0.1", stack.grpc_port, max_workers=4,
                                           commit_timeout=commit_timeout)
        return stack

    yield _start
    for stack in stacks:
        stack.stop()


def post(url: str, body, content_type: str = JSON, **headers) -> requests.Response:
    with session() as s:
        return s.post(url, data=body, headers={"Content-Type": content_type, **headers}, timeout=30)


def status_of(resp: requests.Response) -> status_pb2.Status:
    """The google.rpc.Status error body, in the response's content type."""
    if resp.headers["Content-Type"].startswith(PROTOBUF):
        return status_pb2.Status.FromString(resp.content)
    assert resp.headers["Content-Type"].startswith(JSON)
    obj = resp.json()
    assert isinstance(obj["message"], str) and obj["message"]
    return status_pb2.Status(code=obj["code"], message=obj["message"])


# --------------------------------------------------------------------------- the multimodal trace


def multimodal_spans():
    """gateway SERVER root -> CLIENT vision.Encode -> vision-encoder SERVER -> INTERNAL
    image.decode, vit.forward; then fusion.align and llm.generate in the gateway."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, set_span_in_context

    memory = InMemorySpanExporter()
    gateway = TracerProvider(resource=Resource.create({"service.name": "gateway"}))
    encoder = TracerProvider(resource=Resource.create({"service.name": "vision-encoder",
                                                       "service.instance.id": "pod-7"}))
    for provider in (gateway, encoder):
        provider.add_span_processor(SimpleSpanProcessor(memory))
    gw = gateway.get_tracer("modalscope.test")
    ve = encoder.get_tracer("modalscope.test")

    with gw.start_as_current_span("POST /v1/chat", kind=SpanKind.SERVER,
                                  attributes={"mm.image_count": 1, "mm.prompt_chars": 42}):
        with gw.start_as_current_span("vision.Encode", kind=SpanKind.CLIENT,
                                      attributes={"peer.service": "vision-encoder"}) as client:
            # The remote side: another process, parented through the propagated context.
            with ve.start_as_current_span("vision.Encode", kind=SpanKind.SERVER,
                                          context=set_span_in_context(client)):
                with ve.start_as_current_span("image.decode"):
                    time.sleep(0.001)
                with ve.start_as_current_span("vit.forward", attributes={"mm.modality": "vision"}):
                    time.sleep(0.001)
        with gw.start_as_current_span("fusion.align"):
            pass
        with gw.start_as_current_span("llm.generate"):
            pass
    spans = memory.get_finished_spans()
    gateway.shutdown()
    encoder.shutdown()
    assert len(spans) == 7
    return spans


EXPECTED = {
    # (name, kind): (service, stage, parent (name, kind))
    ("POST /v1/chat", KIND_SERVER): ("gateway", None, None),
    # name patterns come before the CLIENT -> network rule: the call is encoder time
    ("vision.Encode", KIND_CLIENT): ("gateway", "encoder", ("POST /v1/chat", KIND_SERVER)),
    ("vision.Encode", KIND_SERVER): ("vision-encoder", "encoder", ("vision.Encode", KIND_CLIENT)),
    ("image.decode", KIND_INTERNAL): ("vision-encoder", "preprocessing", ("vision.Encode", KIND_SERVER)),
    ("vit.forward", KIND_INTERNAL): ("vision-encoder", "encoder", ("vision.Encode", KIND_SERVER)),
    ("fusion.align", KIND_INTERNAL): ("gateway", "fusion", ("POST /v1/chat", KIND_SERVER)),
    ("llm.generate", KIND_INTERNAL): ("gateway", "inference", ("POST /v1/chat", KIND_SERVER)),
}


def assert_multimodal_stored(engine, trace_id: str) -> None:
    with engine.connect() as conn:
        rows = conn.execute(
            select(Span.span_id, Span.parent_span_id, Span.service, Span.name, Span.kind, Span.stage,
                   Span.source, Span.instance, Span.duration_ns).where(Span.trace_id == trace_id)
        ).all()
    assert len(rows) == 7
    by_id = {r.span_id: r for r in rows}
    got = {}
    for r in rows:
        parent = by_id[r.parent_span_id] if r.parent_span_id else None
        got[(r.name, r.kind)] = (r.service, r.stage, (parent.name, parent.kind) if parent else None)
        assert r.source == "otlp"
        assert r.duration_ns > 0
        assert len(r.span_id) == 16 and r.span_id == r.span_id.lower()
    for key, (service, stage, parent) in EXPECTED.items():
        assert key in got, key
        g_service, g_stage, g_parent = got[key]
        assert (g_service, g_parent) == (service, parent), key
        if stage is not None:
            assert g_stage == stage, key
    assert {r.instance for r in rows if r.service == "vision-encoder"} == {"pod-7"}

    assert settle(engine, force=True) >= 1
    with engine.connect() as conn:
        trace = conn.execute(select(Trace.input_type, Trace.span_count, Trace.root_name)
                             .where(Trace.trace_id == trace_id)).one()
    assert trace.input_type == "image"
    assert trace.span_count == 7
    assert trace.root_name == "POST /v1/chat"


def test_http_exporter_stores_a_multimodal_trace(engine, start_stack):
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    stack = start_stack()
    spans = multimodal_spans()
    exporter = OTLPSpanExporter(endpoint=stack.url, compression=Compression.Gzip, timeout=10, session=session())
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    # 200 means committed: the spans are readable right away.
    assert_multimodal_stored(engine, format(spans[0].context.trace_id, "032x"))


def test_grpc_exporter_stores_a_multimodal_trace(engine, start_stack):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    stack = start_stack(with_grpc=True)
    spans = multimodal_spans()
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{stack.grpc_port}", insecure=True,
                                compression=grpc.Compression.Gzip, timeout=10)
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        # Resending is harmless: idempotent writes.
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert_multimodal_stored(engine, format(spans[0].context.trace_id, "032x"))


# --------------------------------------------------------------------------- OTLP/HTTP details


def test_http_json_encodings_and_chunked_bodies(engine, start_stack):
    stack = start_stack()
    stored = 0

    # gzip, zlib deflate and raw deflate, JSON with parameters in the content type.
    raw_deflate = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    cases = [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda b: raw_deflate.compress(b) + raw_deflate.flush()),
        ("identity", lambda b: b),
    ]
    for encoding, compress in cases:
        body, tid = good_json_body(3)
        resp = post(stack.url, compress(body), "application/json; charset=utf-8", **{"Content-Encoding": encoding})
        assert resp.status_code == 200, (encoding, resp.text)
        assert resp.headers["Content-Type"].startswith(JSON)
        assert resp.json() == {}  # no partial_success when nothing was rejected
        stored += 3
        assert span_count(engine) == stored

    # Chunked upload (no Content-Length), as the JavaScript exporter sends: gzip in pieces.
    body, tid = good_json_body(4)
    compressed = gzip.compress(body)

    def pieces():
        for i in range(0, len(compressed), 100):
            yield compressed[i : i + 100]

    with session() as s:
        req = requests.Request("POST", stack.url, data=pieces(),
                               headers={"Content-Type": JSON, "Content-Encoding": "gzip"}).prepare()
        assert "Content-Length" not in req.headers and req.headers["Transfer-Encoding"] == "chunked"
        resp = s.send(req, timeout=30)
    assert resp.status_code == 200, resp.text
    stored += 4
    assert span_count(engine) == stored

    with engine.connect() as conn:
        rows = conn.execute(select(Span.parent_span_id, Span.name, Span.stage, Span.source)
                            .where(Span.trace_id == tid)).all()
    assert sorted(r.name for r in rows) == ["POST /v1/chat", "image.decode.0", "image.decode.1", "image.decode.2"]
    assert [r.parent_span_id for r in rows if r.name == "POST /v1/chat"] == [None]
    assert {r.source for r in rows} == {"otlp"}


BOMB = gzip.compress(bytes(30 << 20), 9)  # 30 MiB of zeros in ~30 KiB


def _bad_requests(url: str):
    """(what, send() -> response, expected HTTP status, expected body media type)."""

    def chunked_past_cap():
        def pieces():
            for _ in range(40):  # 40 x 64 KiB = 2.5 MiB > 1 MiB cap
                yield b"\x0a" * 65536

        with session() as s:
            return s.post(url, data=pieces(), headers={"Content-Type": PROTOBUF}, timeout=30)

    def get():
        with session() as s:
            return s.get(url, timeout=30)

    def other_path():
        with session() as s:
            return s.post(url.replace("/v1/traces", "/v1/metricz"), data=b"", timeout=30)

    good, _ = good_json_body(2)
    return [
        ("wrong content type", lambda: post(url, good, "text/plain"), 415, JSON),
        ("form content type", lambda: post(url, good, "application/x-www-form-urlencoded"), 415, JSON),
        ("unknown encoding", lambda: post(url, gzip.compress(good), JSON, **{"Content-Encoding": "br"}), 415, JSON),
        ("corrupt gzip", lambda: post(url, gzip.compress(good)[:-12] + b"garbage!" * 2, JSON,
                                      **{"Content-Encoding": "gzip"}), 400, JSON),
        ("truncated gzip", lambda: post(url, gzip.compress(good)[:30], JSON, **{"Content-Encoding": "gzip"}),
         400, JSON),
        ("not gzip at all", lambda: post(url, good, JSON, **{"Content-Encoding": "gzip"}), 400, JSON),
        ("garbage protobuf", lambda: post(url, b"\xff\xfe\xfd garbage \x00\x01", PROTOBUF), 400, PROTOBUF),
        ("malformed JSON", lambda: post(url, b'{"resourceSpans": [', JSON), 400, JSON),
        ("JSON of the wrong shape", lambda: post(url, b'{"resourceSpans": 7}', JSON), 400, JSON),
        ("JSON that is not UTF-8", lambda: post(url, b'{"resourceSpans": "\xff"}', JSON), 400, JSON),
        ("Content-Length past the cap", lambda: post(url, b"\x0a" * (CAP + 1), PROTOBUF), 413, PROTOBUF),
        ("chunked past the cap", chunked_past_cap, 413, PROTOBUF),
        ("gzip bomb", lambda: post(url, BOMB, PROTOBUF, **{"Content-Encoding": "gzip"}), 413, PROTOBUF),
        ("GET", get, 405, JSON),
        ("another path", other_path, 404, JSON),
    ]


def test_http_refusals_store_nothing_and_the_receiver_keeps_serving(engine, start_stack):
    stack = start_stack(Settings(settle_seconds=0, max_request_bytes=CAP))
    assert len(BOMB) < 64 * 1024
    stored = 0
    for what, send, expected, media in _bad_requests(stack.url):
        resp = send()
        assert resp.status_code == expected, (what, resp.status_code, resp.text[:300])
        assert resp.headers["Content-Type"].startswith(media), (what, resp.headers["Content-Type"])
        status = status_of(resp)
        assert status.message, what
        assert "Traceback" not in status.message
        if expected == 415:
            assert status.code == 3
        if expected == 405:
            assert "POST" in resp.headers["Allow"]
        assert span_count(engine) == stored, what
        # ... and the receiver still takes a good request.
        body, _ = good_json_body(2)
        ok = post(stack.url, body)
        assert ok.status_code == 200, (what, ok.text)
        stored += 2
        assert span_count(engine) == stored, what


def test_http_partial_success(engine, start_stack):
    stack = start_stack()

    # JSON: one span with a bad id among good ones.
    tid = new_trace_id()
    root = new_span_id()
    spans = [
        {"span_id": root, "name": "POST /v1/chat", "kind": 2},
        {"span_id": new_span_id(), "parent": root, "name": "image.decode"},
        {"span_id": "not-a-span-id!!!", "parent": root, "name": "vit.forward"},
        {"span_id": new_span_id(), "parent": root, "name": "fusion.align"},
    ]
    resp = post(stack.url, json.dumps(otlp_json(tid, spans)).encode())
    assert resp.status_code == 200, resp.text
    partial = resp.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1
    assert "span id" in partial["errorMessage"]
    with engine.connect() as conn:
        names = sorted(conn.execute(select(Span.name).where(Span.trace_id == tid)).scalars())
    assert names == ["POST /v1/chat", "fusion.align", "image.decode"]

    # Protobuf: the response is a protobuf ExportTraceServiceResponse.
    resp = post(stack.url, pb_request(3, bad_span_ids=2), PROTOBUF)
    assert resp.status_code == 200, resp.content
    assert resp.headers["Content-Type"] == PROTOBUF
    parsed = ExportTraceServiceResponse.FromString(resp.content)
    assert parsed.HasField("partial_success")
    assert parsed.partial_success.rejected_spans == 2
    assert span_count(engine) == 6

    # All good: an empty response message.
    resp = post(stack.url, pb_request(2), PROTOBUF)
    assert resp.status_code == 200
    assert not ExportTraceServiceResponse.FromString(resp.content).HasField("partial_success")
    assert span_count(engine) == 8


def _filler() -> list[SpanRecord]:
    now = time.time_ns()
    return [SpanRecord(trace_id=new_trace_id(), span_id=new_span_id(), parent_span_id=None, service="filler",
                       name="filler", kind=KIND_INTERNAL, start_ns=now, end_ns=now + 1)]


def test_http_writer_full_closed_or_slow(engine, start_stack):
    # A writer that is not running, with room for one span: fill it, and every request is refused.
    stack = start_stack(Settings(settle_seconds=0, max_queue_spans=1), run_writer=False, commit_timeout=0.3)
    filler = stack.pipeline.writer.submit(_filler())

    for content_type, body in ((JSON, good_json_body(2)[0]), (PROTOBUF, pb_request(2))):
        resp = post(stack.url, body, content_type)
        assert resp.status_code == 429, resp.text
        assert resp.headers["Retry-After"].isdigit() and int(resp.headers["Retry-After"]) >= 1
        assert resp.headers["Content-Type"] == content_type
        status = status_of(resp)
        assert status.code == 14 and "full" in status.message
    assert span_count(engine) == 0

    # Running again: the queue drains and requests are taken.
    stack.start_writer()
    filler.result(timeout=10)
    resp = post(stack.url, good_json_body(2)[0])
    assert resp.status_code == 200, resp.text
    assert span_count(engine) == 3

    # Shutting down: 503 with Retry-After.
    stack.pipeline.close()
    resp = post(stack.url, pb_request(2), PROTOBUF)
    assert resp.status_code == 503
    assert int(resp.headers["Retry-After"]) >= 1
    assert status_of(resp).code == 14
    assert span_count(engine) == 3


def test_http_commit_timeout_is_503(engine, start_stack):
    # Not committed within the commit timeout: no 200 (a 200 means committed), but a retry.
    stack = start_stack(Settings(settle_seconds=0), run_writer=False, commit_timeout=0.3)
    resp = post(stack.url, pb_request(2), PROTOBUF)
    assert resp.status_code == 503, resp.content
    assert int(resp.headers["Retry-After"]) >= 1
    assert "not committed" in status_of(resp).message
    assert span_count(engine) == 0


def test_http_unexpected_error_is_500_and_the_receiver_survives(engine, start_stack, monkeypatch, caplog):
    stack = start_stack()
    real_accept = stack.pipeline.accept

    def broken(records, nbytes=0):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(stack.pipeline, "accept", broken)
    resp = post(stack.url, good_json_body(2)[0])
    assert resp.status_code == 500
    status = status_of(resp)
    assert status.code == 13
    assert "secret" not in resp.text and "Traceback" not in resp.text
    assert "secret internal detail" in caplog.text  # logged for the operator

    monkeypatch.setattr(stack.pipeline, "accept", real_accept)
    assert post(stack.url, good_json_body(2)[0]).status_code == 200
    assert span_count(engine) == 2


def test_http_ingest_token(engine, start_stack):
    stack = start_stack(Settings(settle_seconds=0, ingest_token="s3cret-token"))
    body = pb_request(2)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"},
                    {"Authorization": "s3cret-token"}, {"Authorization": "Bearer s3cret-token-and-more"}):
        resp = post(stack.url, body, PROTOBUF, **headers)
        assert resp.status_code == 401, headers
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert status_of(resp).code == 16
        assert span_count(engine) == 0
    assert post(stack.url, body, PROTOBUF, Authorization="Bearer s3cret-token").status_code == 200
    assert post(stack.url, pb_request(2), PROTOBUF, Authorization="bearer s3cret-token").status_code == 200
    assert span_count(engine) == 4


# --------------------------------------------------------------------------- OTLP/gRPC details


def test_grpc_refusals(engine, start_stack):
    stack = start_stack(Settings(settle_seconds=0, max_request_bytes=64 * 1024), with_grpc=True)
    export = stack.export_method()

    def expect(code, request, **kwargs):
        with pytest.raises(grpc.RpcError) as info:
            export(request, timeout=10, **kwargs)
        assert info.value.code() == code, info.value.details()
        assert info.value.details()
        return info.value

    err = expect(grpc.StatusCode.INVALID_ARGUMENT, b"\xff\xfe\xfd garbage \x00\x01")
    assert "protobuf" in err.details()
    # Too large on the wire: grpc refuses it itself.
    expect(grpc.StatusCode.RESOURCE_EXHAUSTED, b"\x0a" * (100 * 1024))
    # Small on the wire, too large once inflated.
    big = pb_request(1, big_attribute=200 * 1024)
    assert len(gzip.compress(big)) < 64 * 1024
    expect(grpc.StatusCode.RESOURCE_EXHAUSTED, big, compression=grpc.Compression.Gzip)
    assert span_count(engine) == 0

    # Still serving; partial success on the gRPC path, gzip request.
    resp = ExportTraceServiceResponse.FromString(
        export(pb_request(3, bad_span_ids=1), timeout=10, compression=grpc.Compression.Gzip))
    assert resp.partial_success.rejected_spans == 1
    assert "span id" in resp.partial_success.error_message
    assert span_count(engine) == 3
    resp = ExportTraceServiceResponse.FromString(export(pb_request(2), timeout=10))
    assert not resp.HasField("partial_success")
    assert span_count(engine) == 5


def test_grpc_writer_full_is_unavailable_with_retry_info(engine, start_stack):
    stack = start_stack(Settings(settle_seconds=0, max_queue_spans=1), run_writer=False, with_grpc=True)
    filler = stack.pipeline.writer.submit(_filler())
    export = stack.export_method()

    with pytest.raises(grpc.RpcError) as info:
        export(pb_request(2), timeout=10)
    err = info.value
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    trailers = dict(err.trailing_metadata())
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert status.message == err.details()
    retry = error_details_pb2.RetryInfo()
    assert len(status.details) == 1 and status.details[0].Unpack(retry)
    assert retry.retry_delay.seconds >= 1
    # opentelemetry-python's exporter reads this trailer instead.
    bare = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
    assert bare.retry_delay.seconds == retry.retry_delay.seconds
    assert span_count(engine) == 0

    stack.start_writer()
    filler.result(timeout=10)
    ExportTraceServiceResponse.FromString(export(pb_request(2), timeout=10))
    assert span_count(engine) == 3


def test_a_settler_behind_is_answered_with_retry_hints_until_it_catches_up(engine, start_stack):
    """A trace pending longer than settle_seconds + MODALSCOPE_MAX_SETTLE_LAG_S: 429 /
    UNAVAILABLE with a retry delay and the reason, nothing stored; once settled, spans are
    taken again. A trace pending for less does not stop anything."""
    stack = start_stack(Settings(settle_seconds=1, max_settle_lag_s=5), with_grpc=True, limit_lag=True)
    write_spans(engine, _filler(), now_ns=time.time_ns() - 3_000_000_000)  # pending for 3 s
    assert post(stack.url, good_json_body(2)[0]).status_code == 200  # 3 s < 1 + 5 s: not behind
    write_spans(engine, _filler(), now_ns=time.time_ns() - 7_000_000_000)  # pending for 7 s
    time.sleep(stack.pipeline.writer.lag.every + 0.1)  # the look-up is at most this old
    for content_type, body in ((JSON, good_json_body(2)[0]), (PROTOBUF, pb_request(2))):
        resp = post(stack.url, body, content_type)
        assert resp.status_code == 429, resp.text
        assert int(resp.headers["Retry-After"]) >= 1
        status = status_of(resp)
        assert status.code == 14 and "the settler is more than 5 s behind" in status.message
    with pytest.raises(grpc.RpcError) as info:
        stack.export_method()(pb_request(2), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "settler is more than 5 s behind" in info.value.details()
    assert span_count(engine) == 4

    settle(engine, force=True)
    time.sleep(stack.pipeline.writer.lag.every + 0.1)
    resp = post(stack.url, good_json_body(2)[0])
    assert resp.status_code == 200, resp.text
    ExportTraceServiceResponse.FromString(stack.export_method()(pb_request(2), timeout=10))
    assert span_count(engine) == 8


def test_grpc_ingest_token(engine, start_stack):
    stack = start_stack(Settings(settle_seconds=0, ingest_token="s3cret-token"), with_grpc=True)
    export = stack.export_method()
    for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "s3cret-token"),)):
        with pytest.raises(grpc.RpcError) as info:
            export(pb_request(2), timeout=10, metadata=metadata)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert span_count(engine) == 0
    export(pb_request(2), timeout=10, metadata=(("authorization", "Bearer s3cret-token"),))
    assert span_count(engine) == 2


# --------------------------------------------------------------------------- ports


def test_port_in_use_is_named():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        settings = Settings()
        app = create_ingest_app(None, settings)  # type: ignore[arg-type]  # never reached

        with pytest.raises(PortInUse) as info:
            serve_http(app, "127.0.0.1", port)
        assert str(info.value) == f"port {port} (OTLP/HTTP) is already in use"
        assert isinstance(info.value, OSError)

        with pytest.raises(PortInUse) as info:
            serve_grpc(None, settings, "127.0.0.1", port)  # type: ignore[arg-type]
        assert str(info.value) == f"port {port} (OTLP/gRPC) is already in use"


def test_port_in_use_by_another_receiver():
    settings = Settings()
    server = serve_grpc(None, settings, "127.0.0.1", 0)  # type: ignore[arg-type]
    receiver = serve_http(create_ingest_app(None, settings), "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        # gRPC sets SO_REUSEPORT by default: a second receiver must not share the port silently.
        with pytest.raises(PortInUse, match=str(server.port)):
            serve_grpc(None, settings, "127.0.0.1", server.port)  # type: ignore[arg-type]
        with pytest.raises(PortInUse, match=str(receiver.port)):
            serve_http(create_ingest_app(None, settings), "127.0.0.1", receiver.port)  # type: ignore[arg-type]
    finally:
        server.stop(None)
        receiver.shutdown()
