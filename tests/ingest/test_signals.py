"""span_signals and trace_input_type on the shapes real instrumentation sends.

The attribute values below are copied from what the libraries emit (see
docs/instrumenting.md); tests/ingest/test_instrumented_apps.py drives the libraries
themselves.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from modalscope.ingest.otlp import decode_json, decode_protobuf
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, SpanRecord
from modalscope.ingest.signals import scan_parts, span_signals, trace_input_type

B64 = base64.b64encode(bytes(range(256)) * 40).decode()  # ~13.6 KB of base64, no quotes


def span(attributes: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None,
         kind: int = KIND_CLIENT) -> SpanRecord:
    return SpanRecord(
        trace_id="ab" * 16, span_id="cd" * 8, parent_span_id=None, service="svc", name="op",
        kind=kind, start_ns=1, end_ns=2, attributes=attributes or {}, events=events or [],
    )


def otel_messages(*parts: dict[str, Any]) -> str:
    """gen_ai.input.messages as opentelemetry-util-genai writes it (compact JSON)."""
    return json.dumps([{"role": "user", "parts": [{"content": "Describe.", "type": "text"}, *parts]}],
                      separators=(",", ":"))


def blob(mime: str) -> dict[str, Any]:
    return {"mime_type": mime, "modality": mime.split("/")[0], "content": B64, "type": "blob"}


def uri(mime: str) -> dict[str, Any]:
    return {"mime_type": mime, "modality": mime.split("/")[0], "uri": "gs://b/x", "type": "uri"}


OTEL_CALL = {
    "gen_ai.operation.name": "generate_content",
    "gen_ai.provider.name": "gemini",
    "gen_ai.request.model": "gemini-2.5-flash",
    "server.address": "generativelanguage.googleapis.com",
}


# -- fast exit -------------------------------------------------------------------------


@pytest.mark.parametrize("attributes", [
    {},
    {"http.request.method": "GET", "url.full": "http://inventory/items/1", "http.response.status_code": 200},
    {"http.method": "POST", "http.url": "http://x/y", "http.status_code": 500, "net.peer.name": "x"},
    {"rpc.system": "grpc", "rpc.service": "Billing", "server.address": "billing"},
    # a stray OpenInference attribute without the span kind says nothing
    {"llm.token_count.prompt": 12},
])
def test_ordinary_spans_say_nothing(attributes: dict[str, Any]) -> None:
    assert span_signals(span(attributes)) is None


def test_exception_event_says_nothing() -> None:
    ev = {"name": "exception", "time_unix_nano": 5, "attributes": {"exception.type": "ValueError"}}
    assert span_signals(span({"http.method": "GET"}, [ev])) is None


# -- OpenTelemetry GenAI ---------------------------------------------------------------


def test_otel_genai_call_with_tokens() -> None:
    attrs = OTEL_CALL | {
        "gen_ai.usage.input_tokens": 525,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.text.input_tokens": 9,
        "gen_ai.usage.image.input_tokens": 516,
        "gen_ai.input.messages": otel_messages(blob("image/png"), blob("image/jpeg")),
    }
    assert span_signals(span(attrs)) == {
        "call": 1, "text": 1, "provider": "gemini", "model": "gemini-2.5-flash",
        "tok": {"in": {"text": 9, "image": 516, "total": 525}, "out": 7},
        "usage": ["image"], "parts": {"image": 2},
    }


@pytest.mark.parametrize("parts,expected", [
    ((), None),
    ((blob("image/png"),), {"image": 1}),
    ((blob("image/png"), uri("image/webp")), {"image": 2}),
    ((blob("audio/wav"),), {"audio": 1}),
    ((uri("video/mp4"), blob("image/png")), {"video": 1, "image": 1}),
])
def test_otel_parts_counted(parts: tuple[dict[str, Any], ...], expected: dict[str, int] | None) -> None:
    sig = span_signals(span(OTEL_CALL | {"gen_ai.input.messages": otel_messages(*parts)}))
    assert sig is not None
    assert sig.get("parts") == expected


def test_parts_from_a_truncated_attribute() -> None:
    whole = otel_messages(blob("image/png"), blob("image/png"), blob("image/png"))
    second = whole.index('"mime_type"', whole.index('"mime_type"') + 1)
    # cut inside the second image's base64: its metadata came before its content
    cut = whole[: second + 200]
    with pytest.raises(ValueError):
        json.loads(cut)
    sig = span_signals(span(OTEL_CALL | {"gen_ai.input.messages": cut}))
    assert sig["parts"] == {"image": 2}
    # cut inside the first image's metadata: one image is all that is known
    assert scan_parts(whole[: whole.index('"modality"') + 14]) == {"image": 1}


def test_parts_in_messages_sent_as_a_structured_value() -> None:
    messages = json.loads(otel_messages(blob("image/png"), blob("audio/mp3")))
    sig = span_signals(span(OTEL_CALL | {"gen_ai.input.messages": messages}))
    assert sig["parts"] == {"image": 1, "audio": 1}


def test_parts_from_a_span_event() -> None:
    ev = {
        "name": "gen_ai.client.inference.operation.details",
        "time_unix_nano": 7,
        "attributes": {"gen_ai.input.messages": otel_messages(blob("image/png"), blob("image/png"))},
    }
    sig = span_signals(span(OTEL_CALL, [ev]))
    assert sig["parts"] == {"image": 2}
    # the same event through the real SDK, OTLP encoder and receiver decoder
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("chat gemini", kind=SpanKind.CLIENT) as sdk_span:
        sdk_span.set_attributes(OTEL_CALL)
        sdk_span.add_event(ev["name"], ev["attributes"])
    [record] = decode_protobuf(encode_spans(exporter.get_finished_spans()).SerializeToString()).spans
    assert record.events[0]["name"] == ev["name"]
    assert span_signals(record)["parts"] == {"image": 2}


def test_legacy_prompt_event_with_typed_parts() -> None:
    prompt = json.dumps([{"role": "user", "content": [
        {"type": "text", "text": "two pictures"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + B64[:100]}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
    ]}])
    ev = {"name": "gen_ai.content.prompt", "time_unix_nano": 1, "attributes": {"gen_ai.prompt": prompt}}
    sig = span_signals(span({"gen_ai.operation.name": "chat", "gen_ai.system": "openai"}, [ev]))
    assert sig["parts"] == {"image": 2}
    assert sig["provider"] == "openai"


def test_text_that_quotes_a_part_is_not_a_part() -> None:
    quoted = otel_messages()[:-3] + ',{"content":"{\\"type\\": \\"image\\"}","type":"text"}]}]'
    json.loads(quoted)
    assert span_signals(span(OTEL_CALL | {"gen_ai.input.messages": quoted})).get("parts") is None


def test_usage_without_content() -> None:
    attrs = OTEL_CALL | {"gen_ai.usage.input_tokens": 40, "gen_ai.usage.audio.input_tokens": 32,
                         "gen_ai.usage.text.input_tokens": 8, "gen_ai.usage.output_tokens": "5"}
    sig = span_signals(span(attrs))
    assert sig["usage"] == ["audio"]
    assert sig["tok"] == {"in": {"text": 8, "audio": 32, "total": 40}, "out": 5}
    assert trace_input_type([sig]) == "audio"


def test_tool_and_agent_operations_are_not_model_calls() -> None:
    for operation in ("execute_tool", "invoke_agent"):
        sig = span_signals(span({"gen_ai.operation.name": operation, "gen_ai.provider.name": "gemini"}))
        assert sig is None or "call" not in sig


def test_legacy_system_and_token_names() -> None:
    # OpenLLMetry's Vertex AI spans: no gen_ai.operation.name, gen_ai.system "Google"
    attrs = {
        "gen_ai.system": "Google", "llm.request.type": "completion",
        "gen_ai.request.model": "gemini-1.5-pro", "gen_ai.usage.prompt_tokens": 11,
        "gen_ai.usage.completion_tokens": 3,
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": json.dumps([{"type": "text", "text": "hi"},
                                               {"type": "image_url", "image_url": {"url": "https://u"}}]),
    }
    sig = span_signals(span(attrs))
    assert sig["call"] == 1 and sig["provider"] == "google" and sig["model"] == "gemini-1.5-pro"
    assert sig["tok"] == {"in": {"total": 11}, "out": 3}
    assert sig["parts"] == {"image": 1}


# -- OpenInference ---------------------------------------------------------------------


def oi_attrs(*types: str, input_value: str | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "openinference.span.kind": "LLM", "llm.provider": "google",
        "llm.model_name": "gemini-2.5-flash-001", "llm.input_messages.0.message.role": "user",
        "llm.token_count.prompt": 300, "llm.token_count.completion": 7,
    }
    for j, kind in enumerate(types):
        attrs[f"llm.input_messages.0.message.contents.{j}.message_content.type"] = kind
        if kind == "image":
            attrs[f"llm.input_messages.0.message.contents.{j}.message_content.image.image.url"] = "data:image/png;base64,AA"
    if input_value is not None:
        attrs["input.value"] = input_value
    return attrs


def test_openinference_llm_span() -> None:
    sig = span_signals(span(oi_attrs("text", "image", "image"), kind=KIND_INTERNAL))
    assert sig == {
        "call": 1, "text": 1, "provider": "google", "model": "gemini-2.5-flash-001",
        "tok": {"in": {"total": 300}, "out": 7}, "parts": {"image": 2},
    }
    assert trace_input_type([sig]) == "multi_image"


def test_openinference_audio_only_in_input_value() -> None:
    # google-genai audio parts reach OpenInference's messages as nothing; input.value has them
    request = json.dumps({"contents": [{"parts": [{"text": "Transcribe."}, {"inline_data": {
        "data": B64, "mime_type": "audio/wav"}}], "role": "user"}]})
    attrs = oi_attrs("text", input_value=request) | {"llm.token_count.prompt_details.audio": 8}
    sig = span_signals(span(attrs, kind=KIND_INTERNAL))
    assert sig["parts"] == {"audio": 1}
    assert sig["usage"] == ["audio"]
    assert sig["tok"]["in"] == {"audio": 8, "total": 300}


def test_openinference_images_in_messages_and_input_value_count_once() -> None:
    request = json.dumps({"contents": [{"parts": [{"inline_data": {"data": "AA", "mime_type": "image/png"}},
                                                  {"inline_data": {"data": "AA", "mime_type": "image/png"}}]}]})
    sig = span_signals(span(oi_attrs("image", "image", input_value=request), kind=KIND_INTERNAL))
    assert sig["parts"] == {"image": 2}


def test_openinference_chain_span_is_not_a_call() -> None:
    sig = span_signals(span({"openinference.span.kind": "CHAIN", "input.value": '{"mime_type": "image/png"}'}))
    assert sig is None


def test_openinference_embedding_span() -> None:
    sig = span_signals(span({"openinference.span.kind": "EMBEDDING", "llm.provider": "google",
                             "embedding.model_name": "text-embedding-004"}))
    assert sig == {"call": 1, "text": 1, "provider": "google", "model": "text-embedding-004"}


# -- mm.* and the trace ----------------------------------------------------------------


def test_mm_attributes_still_read() -> None:
    sig = span_signals(span({"mm.input_type": " Multi_Image ", "mm.image_count": "2", "mm.prompt_chars": 80}))
    assert sig == {"it": "multi_image", "mm": {"image": 2.0}, "text": 1}


def test_from_otlp_json_with_string_counts() -> None:
    body = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "gw"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": "ab" * 16, "spanId": "cd" * 8, "name": "generate_content gemini-2.5-flash", "kind": 3,
            "startTimeUnixNano": "1", "endTimeUnixNano": "2",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "generate_content"}},
                {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "266"}},
                {"key": "gen_ai.usage.image.input_tokens", "value": {"intValue": "258"}},
            ]}]}]}]}
    [record] = decode_json(body).spans
    sig = span_signals(record)
    assert sig["tok"] == {"in": {"image": 258, "total": 266}}
    assert trace_input_type([None, sig]) == "image"


@pytest.mark.parametrize("signals,expected", [
    ([], "unknown"),
    ([None, None], "unknown"),
    ([{"text": 1}], "text"),
    ([{"call": 1}, {"usage": ["image"]}], "image"),
    ([{"parts": {"image": 1}}, {"parts": {"image": 2}}], "multi_image"),
    ([{"parts": {"image": 2}}, {"parts": {"audio": 1}}], "audio"),
    ([{"parts": {"image": 1}}, {"usage": ["video"]}], "image"),  # counted parts outrank usage
    ([{"mm": {"image": 0.0}}, {"parts": {"image": 2}}], "text"),  # mm counts outrank parts
    ([{"it": "video"}, {"mm": {"image": 3.0}}], "video"),
    ([{"parts": {"video": 1, "image": 4}}], "video"),
])
def test_trace_input_type(signals: list[dict[str, Any] | None], expected: str) -> None:
    assert trace_input_type(signals) == expected
