"""Spans of real instrumented applications, through the real OTLP encoder, into signals.

An app calls the Gemini API with the real ``google-genai`` client (against a local stand-in,
tests/genai_standin.py), instrumented by the real OpenTelemetry or OpenInference
instrumentation; the finished SDK spans are encoded with the OTLP exporter's encoder and
decoded by modalscope's receiver decoder, then tagged by the default stage rules.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google import genai
from google.genai import types
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.instrumentation import _semconv
from opentelemetry.instrumentation.google_genai import GoogleGenAiSdkInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from modalscope.ingest.otlp import MAX_STRING_BYTES, decode_protobuf
from modalscope.core.spans import KIND_CLIENT, SpanRecord
from modalscope.ingest.signals import span_signals, trace_input_type
from modalscope.ingest.rules_file import default_rules
from openinference.instrumentation.google_genai import GoogleGenAIInstrumentor
from tests.genai_standin import IMAGE_TOKENS, GeminiStandin

MODEL = "gemini-2.5-flash"
EMBED_MODEL = "text-embedding-004"
SERVICE = "caption-api"

# A real 1x1 PNG and a short 16 kHz mono WAV (header + 0.25 s of silence).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
WAV = (
    b"RIFF" + (36 + 8000).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little")
    + (32000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    + b"data" + (8000).to_bytes(4, "little") + bytes(8000)
)


def _image(mime: str = "image/png") -> types.Part:
    return types.Part.from_bytes(data=PNG, mime_type=mime)


# (name, contents, input type, media parts, per-modality input tokens)
CASES: list[tuple[str, list[Any], str, dict[str, int], dict[str, int]]] = [
    ("text", ["Summarise the quarterly report in one line."], "text", {}, {}),
    ("image", ["What is in this picture?", _image()], "image", {"image": 1}, {"image": IMAGE_TOKENS}),
    (
        "multi_image",
        ["Compare these two pictures.", _image(), _image("image/jpeg")],
        "multi_image",
        {"image": 2},
        {"image": 2 * IMAGE_TOKENS},
    ),
    (
        "audio",
        ["Transcribe this.", types.Part.from_bytes(data=WAV, mime_type="audio/wav")],
        "audio",
        {"audio": 1},
        {"audio": 8},
    ),
]
CASE_IDS = [case[0] for case in CASES]


class App:
    """One instrumented app: its own TracerProvider and in-memory exporter."""

    def __init__(self, api: GeminiStandin) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("caption-app")
        self.client = genai.Client(api_key="dummy-key", http_options={"base_url": api.url})

    def records(self) -> list[SpanRecord]:
        """The finished spans as the OTLP receiver decodes them, tagged by the default rules."""
        request = encode_spans(self.exporter.get_finished_spans())
        result = decode_protobuf(request.SerializeToString())
        assert result.rejected == 0
        default_rules().tag(result.spans)
        return result.spans

    def shutdown(self) -> None:
        self.provider.shutdown()


def input_type(records: list[SpanRecord]) -> str:
    """The trace's input type, signals in the documented order: root first, then by start."""
    ordered = sorted(records, key=lambda r: (r.parent_span_id is not None, r.start_ns))
    return trace_input_type(r.signals for r in ordered)


def model_spans(records: list[SpanRecord]) -> list[SpanRecord]:
    return [r for r in records if r.signals and r.signals.get("call")]


@pytest.fixture
def api() -> Iterator[GeminiStandin]:
    with GeminiStandin() as standin:
        yield standin


@pytest.fixture
def genai_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    # The OTel instrumentor sets OTEL_INSTRUMENTATION_GENAI_EMIT_EVENT in os.environ
    # itself; setting it here first makes monkeypatch put the old value back.
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_EMIT_EVENT", "false")
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    return monkeypatch


@pytest.fixture
def otel_app(api: GeminiStandin, genai_env: pytest.MonkeyPatch) -> Iterator[App]:
    """google-genai under opentelemetry-instrumentation-google-genai, content on spans."""
    genai_env.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    app = App(api)
    instrumentor = GoogleGenAiSdkInstrumentor()
    instrumentor.instrument(tracer_provider=app.provider)
    try:
        yield app
    finally:
        instrumentor.uninstrument()
        app.shutdown()


@pytest.fixture
def otel_app_no_content(api: GeminiStandin, genai_env: pytest.MonkeyPatch) -> Iterator[App]:
    """The same with the default: no message content captured."""
    app = App(api)
    instrumentor = GoogleGenAiSdkInstrumentor()
    instrumentor.instrument(tracer_provider=app.provider)
    try:
        yield app
    finally:
        instrumentor.uninstrument()
        app.shutdown()


@pytest.fixture
def oi_app(api: GeminiStandin, genai_env: pytest.MonkeyPatch) -> Iterator[App]:
    """google-genai under openinference-instrumentation-google-genai (defaults)."""
    app = App(api)
    instrumentor = GoogleGenAIInstrumentor()
    instrumentor.instrument(tracer_provider=app.provider)
    try:
        yield app
    finally:
        instrumentor.uninstrument()
        app.shutdown()


def _serve(app: App, contents: list[Any], stream: bool = False) -> str:
    """An app request: a SERVER span around one model call; the model's reply text."""
    with app.tracer.start_as_current_span("POST /caption", kind=SpanKind.SERVER):
        if stream:
            return "".join(
                chunk.text or ""
                for chunk in app.client.models.generate_content_stream(model=MODEL, contents=contents)
            )
        return app.client.models.generate_content(model=MODEL, contents=contents).text or ""


def _check_tokens(sig: dict[str, Any], media_tokens: dict[str, int]) -> None:
    tok = sig["tok"]
    assert tok["out"] > 0
    assert tok["in"]["total"] == tok["in"].get("text", 0) + sum(media_tokens.values())
    for media, n in media_tokens.items():
        assert tok["in"][media] == n
    assert sorted(sig.get("usage", [])) == sorted(media_tokens)


# -- OpenTelemetry GenAI instrumentation -----------------------------------------------


@pytest.mark.parametrize("name,contents,expected,parts,media_tokens", CASES, ids=CASE_IDS)
def test_otel_genai_content_on_spans(
    otel_app: App, api: GeminiStandin, name: str, contents: list[Any], expected: str,
    parts: dict[str, int], media_tokens: dict[str, int],
) -> None:
    assert _serve(otel_app, contents)
    records = otel_app.records()
    assert input_type(records) == expected
    [call] = model_spans(records)
    assert call.name == f"generate_content {MODEL}"
    assert call.kind == KIND_CLIENT
    assert call.service == SERVICE
    sig = call.signals
    assert sig["provider"] == "gemini"
    assert sig["model"] == MODEL
    assert sig.get("parts", {}) == parts
    _check_tokens(sig, media_tokens)
    assert "gen_ai.input.messages" in call.attributes
    [root] = [r for r in records if r.parent_span_id is None]
    assert root.signals is None
    # the stand-in saw what the client sent: the key, and each media part
    [seen] = [s for s in api.requests if s.path.endswith(":generateContent")]
    assert seen.headers["x-goog-api-key"] == "dummy-key"
    assert call.stage == "inference"


def test_otel_genai_real_sized_images_are_counted_past_the_attribute_cap(otel_app: App) -> None:
    """Two photo-sized images make the captured messages far longer than the stored value's
    cap; the inline media is elided before the cut, so both image parts still count."""
    photo = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 240  # ~60 KB, base64 ~82 KB each
    contents = ["Compare these two photos.", types.Part.from_bytes(data=photo, mime_type="image/jpeg"),
                types.Part.from_bytes(data=photo, mime_type="image/jpeg")]
    assert _serve(otel_app, contents)
    [sdk_call] = [s for s in otel_app.exporter.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert len(sdk_call.attributes["gen_ai.input.messages"]) > 2 * MAX_STRING_BYTES
    records = otel_app.records()
    [call] = model_spans(records)
    assert len(call.attributes["gen_ai.input.messages"].encode()) <= MAX_STRING_BYTES
    assert "base64 characters elided" in call.attributes["gen_ai.input.messages"]
    assert call.signals["parts"] == {"image": 2}
    assert input_type(records) == "multi_image"


@pytest.mark.parametrize(
    "name,contents,expected,usage",
    [
        ("text", CASES[0][1], "text", []),
        ("image", CASES[1][1], "image", ["image"]),
        # without content the usage says images are there, not how many
        ("multi_image", CASES[2][1], "image", ["image"]),
        ("audio", CASES[3][1], "audio", ["audio"]),
    ],
    ids=CASE_IDS,
)
def test_otel_genai_without_content_falls_back_to_usage(
    otel_app_no_content: App, name: str, contents: list[Any], expected: str, usage: list[str]
) -> None:
    _serve(otel_app_no_content, contents)
    records = otel_app_no_content.records()
    [call] = model_spans(records)
    assert "gen_ai.input.messages" not in call.attributes
    assert "parts" not in call.signals
    assert call.signals.get("usage", []) == usage
    assert input_type(records) == expected


def test_otel_genai_streaming_call(otel_app: App) -> None:
    text = _serve(otel_app, CASES[2][1], stream=True)
    assert text == "A cat sitting on a red sofa."
    records = otel_app.records()
    [call] = model_spans(records)
    assert call.signals["parts"] == {"image": 2}
    assert call.signals["tok"]["in"]["image"] == 2 * IMAGE_TOKENS
    assert input_type(records) == "multi_image"
    assert call.stage == "inference"


def test_otel_genai_embeddings_are_encoder(otel_app: App) -> None:
    with otel_app.tracer.start_as_current_span("POST /index", kind=SpanKind.SERVER):
        result = otel_app.client.models.embed_content(model=EMBED_MODEL, contents="red sofa")
    assert result.embeddings and len(result.embeddings[0].values or []) == 8
    records = otel_app.records()
    [call] = model_spans(records)
    assert call.attributes["gen_ai.operation.name"] == "embeddings"
    assert call.signals["model"] == EMBED_MODEL
    assert call.signals["provider"] == "gemini"
    assert call.signals["tok"]["in"]["total"] > 0
    assert input_type(records) == "text"
    assert call.stage == "encoder"


def test_otel_genai_with_httpx_transport_span(otel_app: App, api: GeminiStandin) -> None:
    """google-genai sends over httpx; the transport span sits under the model call."""
    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=otel_app.provider)
    try:
        # a client made after instrumenting, as an app does at start-up
        otel_app.client = genai.Client(api_key="dummy-key", http_options={"base_url": api.url})
        _serve(otel_app, CASES[1][1])
    finally:
        instrumentor.uninstrument()
    records = otel_app.records()
    [call] = model_spans(records)
    [transport] = [r for r in records if r.parent_span_id == call.span_id]
    assert transport.kind == KIND_CLIENT
    # it says nothing of the request (the stage rules may mark it as an heir of the call)
    assert span_signals(transport) is None
    assert not set(transport.signals or {}) - {"inh"}
    assert ":generateContent" in str(transport.attributes.get("url.full") or transport.attributes.get("http.url"))
    assert input_type(records) == "image"
    assert call.stage == "inference"
    # waiting for the model is inference time, not network
    assert transport.stage == "inference"


# -- OpenInference instrumentation -----------------------------------------------------


@pytest.mark.parametrize("name,contents,expected,parts,media_tokens", CASES, ids=CASE_IDS)
def test_openinference_genai(
    oi_app: App, name: str, contents: list[Any], expected: str,
    parts: dict[str, int], media_tokens: dict[str, int],
) -> None:
    _serve(oi_app, contents)
    records = oi_app.records()
    assert input_type(records) == expected
    [call] = model_spans(records)
    assert call.name == "GenerateContent"
    assert call.attributes["openinference.span.kind"] == "LLM"
    sig = call.signals
    assert sig["provider"] == "google"
    # llm.model_name ends as the response's model version
    assert sig["model"].startswith(MODEL)
    assert sig.get("parts", {}) == parts
    tok = sig["tok"]
    assert tok["out"] > 0 and tok["in"]["total"] >= sum(media_tokens.values())
    # OpenInference reports audio input tokens, not image ones
    if "audio" in media_tokens:
        assert tok["in"]["audio"] == media_tokens["audio"]
        assert sig["usage"] == ["audio"]
    else:
        assert "usage" not in sig
    assert call.stage == "inference"


def test_openinference_embeddings_are_encoder(oi_app: App) -> None:
    with oi_app.tracer.start_as_current_span("POST /index", kind=SpanKind.SERVER):
        oi_app.client.models.embed_content(model=EMBED_MODEL, contents="red sofa")
    records = oi_app.records()
    [call] = model_spans(records)
    assert call.attributes["openinference.span.kind"] == "EMBEDDING"
    assert call.signals["model"] == EMBED_MODEL
    assert input_type(records) == "text"
    assert call.stage == "encoder"


# -- requests to an uninstrumented HTTP callee ---------------------------------------


@pytest.mark.parametrize(
    "opt_in,keys",
    [
        (None, ("http.method", "http.url", "http.status_code")),
        ("http", ("http.request.method", "url.full", "http.response.status_code", "server.address", "server.port")),
    ],
    ids=["default", "stable"],
)
def test_requests_call_to_uninstrumented_server(
    api: GeminiStandin, monkeypatch: pytest.MonkeyPatch, opt_in: str | None, keys: tuple[str, ...]
) -> None:
    if opt_in is None:
        monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
    else:
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    stability = _semconv._OpenTelemetrySemanticConventionStability
    # the opt-in is read once a process; read it again for this test, restore it after
    monkeypatch.setattr(stability, "_initialized", False)
    monkeypatch.setattr(stability, "_OTEL_SEMCONV_STABILITY_SIGNAL_MAPPING", {})
    app = App(api)
    instrumentor = RequestsInstrumentor()
    instrumentor.instrument(tracer_provider=app.provider)
    try:
        with app.tracer.start_as_current_span("GET /status", kind=SpanKind.SERVER):
            response = requests.get(f"{api.url}/inventory/42", timeout=5)
        assert response.status_code == 200
    finally:
        instrumentor.uninstrument()
        app.shutdown()
    records = app.records()
    [client] = [r for r in records if r.kind == KIND_CLIENT]
    for key in keys:
        assert key in client.attributes, key
    assert span_signals(client) is None
    assert not set(client.signals or {}) - {"inh"}
    assert client.stage == "network"
    assert input_type(records) == "unknown"
