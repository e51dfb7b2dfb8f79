"""A real instrumented multimodal app, end to end, as a new user runs one.

Four services on 127.0.0.1, each with its own TracerProvider and ``service.name``, all
exporting with the real OTLP/HTTP exporter to a real modalscope receiver:

- ``gateway``: Flask under opentelemetry-instrumentation-flask. For each request it calls
  the ``preprocessor`` over HTTP (``requests``, instrumented), an uninstrumented feature
  store (a plain ``http.server``, also through ``requests``), the ``vision-encoder`` over
  gRPC when the request has images (client interceptor), and Gemini through the real
  ``google-genai`` client (tests/genai_standin.py) under the OTel GenAI and httpx
  instrumentations, with text, one image, two images or audio.
- ``preprocessor``: Flask under opentelemetry-instrumentation-flask, with decode/resize/
  tokenize spans; its tokenize span links to the request it was batched with.
- ``vision-encoder``: a generic gRPC handler behind the server interceptor, with a
  ``vit.forward`` span.
- the feature store: no instrumentation at all.

The store is settled and read back through the dashboard's JSON API: input types, service
pairs, stages per span, tokens and span links, as docs/design.md's contracts promise. The
requests instrumentation runs once with its default HTTP conventions and once with
``OTEL_SEMCONV_STABILITY_OPT_IN=http``.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
import requests
from flask import Flask, jsonify, request
from google import genai
from google.genai import types
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation import _semconv
from opentelemetry.instrumentation.flask import FlaskInstrumentor
from opentelemetry.instrumentation.google_genai import GoogleGenAiSdkInstrumentor
from opentelemetry.instrumentation.grpc import client_interceptor, server_interceptor
from opentelemetry.instrumentation.grpc.grpcext import intercept_channel
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanContext
from werkzeug.serving import BaseWSGIServer, make_server

from modalscope.app import create_app
from modalscope.ingest.otlp_http import create_ingest_app, serve_http
from modalscope.ingest.pipeline import IngestPipeline
from modalscope.ingest.settle import settle
from modalscope.settings import Settings
from tests.genai_standin import IMAGE_TOKENS, GeminiStandin

GATEWAY, PREPROCESSOR, ENCODER = "gateway", "preprocessor", "vision-encoder"
MODEL = "gemini-2.5-flash"
GRPC_METHOD = "/vision.VisionEncoder/Encode"
WAIT_S = 15.0  # bound on every wait: spans ending, flushes

# A real 1x1 PNG and 0.25 s of 16 kHz mono WAV (8 audio tokens at the stand-in's rate).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
WAV = (
    b"RIFF" + (36 + 8000).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little")
    + (32000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    + b"data" + (8000).to_bytes(4, "little") + bytes(8000)
)
AUDIO_TOKENS = 8

# input type -> (prompt, media parts as (bytes, MIME type))
INPUTS: dict[str, tuple[str, list[tuple[bytes, str]]]] = {
    "text": ("Summarise the quarterly report in one line.", []),
    "image": ("What is in this picture?", [(PNG, "image/png")]),
    "multi_image": ("Compare these two pictures.", [(PNG, "image/png"), (PNG, "image/jpeg")]),
    "audio": ("Transcribe this.", [(WAV, "audio/wav")]),
}
# how many requests of each type the test sends: distinct, so a miscount shows
SENT = {"text": 3, "image": 2, "multi_image": 1, "audio": 1}


# --------------------------------------------------------------------------- helpers


class SpanWatch(SpanProcessor):
    """Counts spans started and ended (added after the exporting processor, so a span it
    has seen end is queued for export): the test waits until every span has ended."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.open = 0
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        with self._cond:
            self.open += 1

    def on_end(self, span: ReadableSpan) -> None:
        with self._cond:
            self.open -= 1
            self.ended.append(span)
            self._cond.notify_all()

    def wait_settled(self, roots: int, timeout: float) -> bool:
        """Until ``roots`` local roots (no parent) have ended and no span is open."""
        def done() -> bool:
            return self.open == 0 and sum(1 for s in self.ended if s.parent is None) >= roots
        with self._cond:
            return self._cond.wait_for(done, timeout)


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # never through a proxy from the environment
    return s


@dataclass
class Service:
    provider: TracerProvider
    tracer: trace.Tracer


def new_service(name: str, endpoint: str, watch: SpanWatch) -> Service:
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    exporter = OTLPSpanExporter(endpoint=endpoint, compression=Compression.Gzip, timeout=10, session=session())
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    provider.add_span_processor(watch)
    return Service(provider, provider.get_tracer("modalscope.e2e"))


def serve_wsgi(app: Flask) -> tuple[BaseWSGIServer, Callable[[], None]]:
    """Serve ``app`` on an ephemeral port in a thread; the server and how to stop it."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return server, stop


class FeatureStore:
    """An uninstrumented HTTP callee: a plain http.server answering GET with JSON."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if "traceparent" in self.headers:
                    self.server.traceparents += 1  # type: ignore[attr-defined]
                data = json.dumps({"user_tier": "free", "path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.traceparents = 0  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def preprocessor_app(svc: Service) -> Flask:
    app = Flask("preprocessor")
    batch: list[SpanContext] = []  # the previous request's span: requests are batched in pairs

    @app.post("/preprocess")
    def preprocess():
        body = request.get_json()
        links = [Link(batch[-1], {"batch.role": "batched_with"})] if batch else []
        batch.append(trace.get_current_span().get_span_context())
        for mime in body["media"]:
            kind = mime.split("/", 1)[0]
            with svc.tracer.start_as_current_span(f"{kind}.decode"):
                pass
            if kind == "image":
                with svc.tracer.start_as_current_span("image.resize", attributes={"image.width": 224}):
                    pass
        with svc.tracer.start_as_current_span("text.tokenize", links=links):
            tokens = len(body["prompt"].split())
        return jsonify({"tokens": tokens})

    FlaskInstrumentor.instrument_app(app, tracer_provider=svc.provider)
    return app


def vision_encoder(svc: Service) -> tuple[grpc.Server, int]:
    def encode(payload: bytes, context: grpc.ServicerContext) -> bytes:
        with svc.tracer.start_as_current_span("vit.forward", attributes={"mm.modality": "vision"}):
            return len(payload).to_bytes(4, "big")

    server = grpc.server(ThreadPoolExecutor(max_workers=4),
                         interceptors=[server_interceptor(tracer_provider=svc.provider)])
    # no codegen: bytes in, bytes out
    handler = grpc.method_handlers_generic_handler(
        "vision.VisionEncoder", {"Encode": grpc.unary_unary_rpc_method_handler(encode)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def gateway_app(svc: Service, preprocessor_url: str, features_url: str,
                encode: Callable[..., bytes], client: genai.Client) -> Flask:
    app = Flask("gateway")
    http = session()

    @app.post("/caption")
    def caption():
        kind = request.get_json()["input"]
        prompt, media = INPUTS[kind]
        pre = http.post(f"{preprocessor_url}/preprocess",
                        json={"prompt": prompt, "media": [mime for _, mime in media]}, timeout=10)
        pre.raise_for_status()
        features = http.get(f"{features_url}/features/user-42", timeout=10)
        features.raise_for_status()
        images = [data for data, mime in media if mime.startswith("image/")]
        if images:
            encode(b"".join(images), timeout=10)
        contents: list[Any] = [prompt, *(types.Part.from_bytes(data=d, mime_type=m) for d, m in media)]
        reply = client.models.generate_content(model=MODEL, contents=contents)
        trace_id = format(trace.get_current_span().get_span_context().trace_id, "032x")
        return jsonify({"text": reply.text, "trace_id": trace_id})

    FlaskInstrumentor.instrument_app(app, tracer_provider=svc.provider)
    return app


@dataclass
class Deployment:
    gateway_url: str
    features: FeatureStore
    watch: SpanWatch
    services: list[Service]
    sent: list[tuple[str, str]] = field(default_factory=list)  # (input type, trace id)

    def call(self, kind: str) -> None:
        req = urllib.request.Request(f"{self.gateway_url}/caption", data=json.dumps({"input": kind}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=20) as resp:
            assert resp.status == 200
            body = json.loads(resp.read())
        assert body["text"] == "A cat sitting on a red sofa."
        self.sent.append((kind, body["trace_id"]))

    def flush(self) -> None:
        """Every span ended, then exported: 200 from the receiver means committed."""
        assert self.watch.wait_settled(len(self.sent), WAIT_S), "spans still open"
        for svc in self.services:
            assert svc.provider.force_flush(int(WAIT_S * 1000)), "export did not finish"


def _reset_http_semconv(monkeypatch: pytest.MonkeyPatch, opt_in: str | None) -> None:
    if opt_in is None:
        monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
    else:
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    # The instrumentations read the opt-in once a process: read it again here, restore after.
    stability = _semconv._OpenTelemetrySemanticConventionStability
    monkeypatch.setattr(stability, "_initialized", False)
    monkeypatch.setattr(stability, "_OTEL_SEMCONV_STABILITY_SIGNAL_MAPPING", {})


@pytest.fixture(params=[None, "http"], ids=["http-default", "http-stable"])
def deployment(request: pytest.FixtureRequest, engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    for key in ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
                "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_PYTHON_REQUESTS_EXCLUDED_URLS",
                "OTEL_PYTHON_FLASK_EXCLUDED_URLS", "OTEL_PROPAGATORS"):
        monkeypatch.delenv(key, raising=False)
    # the GenAI instrumentor sets this in os.environ itself: set first so it is put back
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_EMIT_EVENT", "false")
    # the request's parts on the span, so two images read as multi_image
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    _reset_http_semconv(monkeypatch, request.param)

    closers: list[Callable[[], None]] = []
    try:
        settings = Settings(settle_seconds=0)
        pipeline = IngestPipeline(engine, settings, settle=False)
        pipeline.start()
        closers.append(pipeline.close)
        receiver = serve_http(create_ingest_app(pipeline, settings, commit_timeout=30.0), "127.0.0.1", 0)
        closers.append(receiver.shutdown)
        endpoint = f"{receiver.url}/v1/traces"

        watch = SpanWatch()
        gw, pre, ve = (new_service(n, endpoint, watch) for n in (GATEWAY, PREPROCESSOR, ENCODER))
        for svc in (gw, pre, ve):
            closers.append(svc.provider.shutdown)

        standin = GeminiStandin().__enter__()
        closers.append(lambda: standin.__exit__(None, None, None))
        features = FeatureStore()
        closers.append(features.close)

        # The gateway's client libraries, instrumented before its clients are made (as at start-up).
        for instrumentor in (RequestsInstrumentor(), HTTPXClientInstrumentor(), GoogleGenAiSdkInstrumentor()):
            instrumentor.instrument(tracer_provider=gw.provider)
            closers.append(instrumentor.uninstrument)
        client = genai.Client(api_key="dummy-key", http_options={"base_url": standin.url})

        grpc_server, grpc_port = vision_encoder(ve)
        closers.append(lambda: grpc_server.stop(None))
        channel = intercept_channel(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"),
                                    client_interceptor(tracer_provider=gw.provider))
        closers.append(channel.close)
        encode = channel.unary_unary(GRPC_METHOD)

        pre_server, stop_pre = serve_wsgi(preprocessor_app(pre))
        closers.append(stop_pre)
        gw_app = gateway_app(gw, f"http://127.0.0.1:{pre_server.port}", f"http://{features.address}", encode, client)
        gw_server, stop_gw = serve_wsgi(gw_app)
        closers.append(stop_gw)

        yield Deployment(f"http://127.0.0.1:{gw_server.port}", features, watch, [gw, pre, ve])
    finally:
        for close in reversed(closers):
            close()


# --------------------------------------------------------------------------- the test


def by_key(rows: list[dict], *keys: str) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row[k] for k in keys)
        assert key not in out, f"duplicate row {key}"
        out[key] = row
    return out


def test_instrumented_multimodal_app_end_to_end(deployment: Deployment, engine, db_url: str,
                                                request: pytest.FixtureRequest) -> None:
    stable = "http-stable" in request.node.callspec.id
    order = [kind for kind, n in SENT.items() for _ in range(n)]
    for kind in order:
        deployment.call(kind)
    deployment.flush()
    assert deployment.features.server.traceparents == len(order)  # type: ignore[attr-defined]
    assert settle(engine, force=True) == len(order)

    app = create_app(Settings(database_url=db_url))
    try:
        api = app.test_client()

        def get(path: str) -> Any:
            resp = api.get(path)
            assert resp.status_code == 200, (path, resp.get_data(as_text=True))
            return resp.get_json()

        # -- input types: one row a type, the traces counted, image tokens on image rows
        types_ = by_key(get("/api/v1/input-types"), "input_type")
        assert {k[0]: r["count"] for k, r in types_.items()} == SENT
        for kind, row in types_.items():
            tokens = row["tokens"]
            assert tokens is not None, kind
            assert tokens["output"] > 0
            assert tokens["input"]["text"] > 0
        assert types_[("image",)]["tokens"]["input"]["image"] == IMAGE_TOKENS
        assert types_[("multi_image",)]["tokens"]["input"]["image"] == 2 * IMAGE_TOKENS
        assert types_[("audio",)]["tokens"]["input"]["audio"] == AUDIO_TOKENS
        assert "image" not in types_[("text",)]["tokens"]["input"]
        assert "image" not in types_[("audio",)]["tokens"]["input"]

        # -- service pairs: instrumented callees by service, the plain server by host:port,
        # the model call by provider with the model as a facet
        total, with_images = len(order), SENT["image"] + SENT["multi_image"]
        pairs = by_key(get("/api/v1/pairs"), "caller", "callee")
        expected_pairs = {
            (GATEWAY, PREPROCESSOR): total,
            (GATEWAY, ENCODER): with_images,
            (GATEWAY, deployment.features.address): total,
            (GATEWAY, "gemini"): total,
        }
        assert {k: r["count"] for k, r in pairs.items()} == expected_pairs
        assert pairs[(GATEWAY, "gemini")]["models"] == [MODEL]
        for key in expected_pairs:
            assert pairs[key]["error_rate"] == 0, key
            if key != (GATEWAY, "gemini"):
                assert pairs[key]["models"] == [], key
        inference_pairs = by_key(get("/api/v1/pairs?stage=inference"), "caller", "callee")
        assert set(inference_pairs) == {(GATEWAY, "gemini")}
        assert inference_pairs[(GATEWAY, "gemini")]["count"] == total
        encoder_pairs = by_key(get("/api/v1/pairs?stage=encoder"), "caller", "callee")
        assert set(encoder_pairs) == {(GATEWAY, ENCODER)}

        # -- stages: every input type spends time in inference; images in the encoder
        stages = by_key(get("/api/v1/stages"), "input_type", "stage")
        for kind in SENT:
            for stage in ("inference", "preprocessing", "network"):
                assert (kind, stage) in stages, (kind, stage)
        for kind in ("image", "multi_image"):
            assert stages[(kind, "encoder")]["count"] == SENT[kind] * 3  # gRPC client + server + vit
        assert ("text", "encoder") not in stages

        # -- each trace: its input type, spans with their stages and links
        for kind, trace_id in deployment.sent:
            detail = get(f"/api/v1/traces/{trace_id}")
            assert detail["input_type"] == kind, trace_id
            check_trace(detail, kind, deployment.features.address, stable)

        # the preprocessor's tokenize span links to the request it was batched with
        (_, first), (_, second) = deployment.sent[:2]
        spans = get(f"/api/v1/traces/{second}")["spans"]
        [tokenize] = [s for s in spans if s["name"] == "text.tokenize"]
        [link] = tokenize["links"]
        assert link["trace_id"] == first
        first_spans = get(f"/api/v1/traces/{first}")["spans"]
        [pre_server] = [s for s in first_spans if s["service"] == PREPROCESSOR and s["kind"] == "SERVER"]
        assert link["span_id"] == pre_server["span_id"]
        assert link["attributes"] == {"batch.role": "batched_with"}
    finally:
        app.extensions["modalscope"]["engine"].dispose()


def check_trace(detail: dict, kind: str, features_address: str, stable: bool) -> None:
    spans = detail["spans"]
    by_id = {s["span_id"]: s for s in spans}
    for s in spans:
        assert isinstance(s["links"], list), s["name"]
        assert s["source"] == "otlp"
    [root] = [s for s in spans if s["parent_span_id"] is None]
    assert (root["service"], root["kind"], root["name"]) == (GATEWAY, "SERVER", "POST /caption")

    def children(parent: dict) -> list[dict]:
        return [s for s in spans if s["parent_span_id"] == parent["span_id"]]

    # the preprocessor: its server span and its work, all preprocessing
    pre = [s for s in spans if s["service"] == PREPROCESSOR]
    [pre_server] = [s for s in pre if s["kind"] == "SERVER"]
    assert pre_server["name"] == "POST /preprocess"
    caller = by_id[pre_server["parent_span_id"]]
    assert (caller["service"], caller["kind"], caller["parent_span_id"]) == (GATEWAY, "CLIENT", root["span_id"])
    assert caller["stage"] == "network"  # the gateway's wait on the wire
    _, media = INPUTS[kind]
    expected_names = Counter({"POST /preprocess": 1, "text.tokenize": 1})
    for _, mime in media:
        expected_names[f"{mime.split('/')[0]}.decode"] += 1
        if mime.startswith("image/"):
            expected_names["image.resize"] += 1
    assert Counter(s["name"] for s in pre) == expected_names
    for s in pre:
        assert s["stage"] == "preprocessing", s["name"]

    # the uninstrumented feature store: a requests CLIENT span, network
    def url(s: dict) -> str:
        return str(s["attributes"].get("url.full") or s["attributes"].get("http.url") or "")

    [plain] = [s for s in spans if s["kind"] == "CLIENT" and "/features/" in url(s)]
    assert children(plain) == []
    assert plain["stage"] == "network"
    attrs = plain["attributes"]
    if stable:
        assert attrs["url.full"].endswith("/features/user-42")
        assert f'{attrs["server.address"]}:{attrs["server.port"]}' == features_address
        assert "http.url" not in attrs
    else:
        assert attrs["http.url"].endswith("/features/user-42")
        assert "url.full" not in attrs

    # the vision encoder over gRPC: client and server spans, encoder by their name
    grpc_spans = [s for s in spans if s["name"] == GRPC_METHOD]
    images = sum(1 for _, mime in media if mime.startswith("image/"))
    if images:
        [client, server] = sorted(grpc_spans, key=lambda s: s["kind"])
        assert (client["service"], client["kind"], client["attributes"]["rpc.system"]) == (GATEWAY, "CLIENT", "grpc")
        assert (server["service"], server["kind"], server["parent_span_id"]) == (ENCODER, "SERVER", client["span_id"])
        assert client["stage"] == server["stage"] == "encoder"
        [vit] = children(server)
        assert (vit["name"], vit["stage"]) == ("vit.forward", "encoder")
    else:
        assert grpc_spans == []
        assert not [s for s in spans if s["service"] == ENCODER]

    # the model call and its httpx transport child: both inference
    [call] = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "generate_content"]
    assert (call["service"], call["kind"], call["name"]) == (GATEWAY, "CLIENT", f"generate_content {MODEL}")
    assert call["stage"] == "inference"
    assert call["attributes"]["gen_ai.provider.name"] == "gemini"
    [transport] = children(call)
    assert (transport["service"], transport["kind"], transport["name"]) == (GATEWAY, "CLIENT", "POST")
    assert ":generateContent" in url(transport)
    assert transport["stage"] == "inference"

    # nothing else: a root, the preprocessor call, the store call, the encoder call, the model
    expected = 1 + 1 + sum(expected_names.values()) + 1 + 2 + (3 if images else 0)
    assert len(spans) == expected, sorted((s["service"], s["name"]) for s in spans)
