"""Attribute values are cut to the value limits as a request is decoded, and the span says so.

A legal 16 MiB request may hold one span with a four-million-element array: the decoders must
drop the elements past ``MAX_VALUE_ITEMS`` without building them, and list the attribute in
``modalscope.truncated``. The field-by-field reader of large KeyValues must agree with the
protobuf parser on every value (checked over random AnyValue trees).
"""

from __future__ import annotations

import base64
import json
import time

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from google.protobuf.json_format import MessageToDict
from sqlalchemy import select

from modalscope.ingest.otlp import LIMITS, DecodeError
from modalscope.ingest.otlp.attributes import _pb_any, _wire_kv
from modalscope.ingest.otlp.common import _Budget
from modalscope.ingest.otlp import (
    MAX_STRING_BYTES,
    MAX_VALUE_ITEMS,
    TRUNCATED_KEY,
    decode_json,
    decode_protobuf,
    decode_request_message,
)
from modalscope.ingest.otlp_http import create_ingest_app, serve_http
from modalscope.ingest.pipeline import IngestPipeline
from modalscope.ingest.writer import BatchWriter, WriterFull
from modalscope.models import Span
from modalscope.settings import Settings


def _request(*attributes: KeyValue) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.name = b"\x01" * 16, b"\x02" * 8, "vit.forward"
    sp.start_time_unix_nano, sp.end_time_unix_nano = 1_000, 2_000
    sp.attributes.extend(attributes)
    return req


def _int_array(key: str, n: int) -> KeyValue:
    kv = KeyValue(key=key)
    kv.value.array_value.values.extend(AnyValue(int_value=i) for i in range(n))
    return kv


def _all_decoders(req: ExportTraceServiceRequest) -> dict[str, dict]:
    """The span's attributes as each decoder reads them: protobuf bytes, an already parsed
    message (gRPC's generated classes) and OTLP/JSON."""
    body = MessageToDict(req)
    for rs in body["resourceSpans"]:  # OTLP/JSON ids are hex, not proto3 JSON's base64
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                sp["traceId"] = base64.b64decode(sp["traceId"]).hex()
                sp["spanId"] = base64.b64decode(sp["spanId"]).hex()
    as_json = json.dumps(body)
    return {
        "protobuf": decode_protobuf(req.SerializeToString()).spans[0].attributes,
        "message": decode_request_message(req).spans[0].attributes,
        "json": decode_json(as_json).spans[0].attributes,
    }


@pytest.mark.parametrize("n", [MAX_VALUE_ITEMS + 1, 200_000])
def test_long_arrays_keep_the_first_elements_and_the_span_says_so(n):
    for name, attrs in _all_decoders(_request(_int_array("embedding", n), _int_array("short", 3))).items():
        assert attrs["embedding"] == list(range(MAX_VALUE_ITEMS)), name
        assert attrs["short"] == [0, 1, 2], name
        assert attrs[TRUNCATED_KEY] == ["embedding"], name


def test_values_within_the_limits_are_whole_and_unmarked():
    kv = _int_array("embedding", MAX_VALUE_ITEMS)
    text = KeyValue(key="prompt")
    text.value.string_value = "é" * (MAX_STRING_BYTES // 2)  # exactly the byte limit
    for name, attrs in _all_decoders(_request(kv, text)).items():
        assert len(attrs["embedding"]) == MAX_VALUE_ITEMS, name
        assert attrs["prompt"] == text.value.string_value, name
        assert TRUNCATED_KEY not in attrs, name


def test_long_strings_and_bytes_are_cut_and_listed():
    text = KeyValue(key="gen_ai.prompt")
    text.value.string_value = "word " * (MAX_STRING_BYTES // 2)
    blob = KeyValue(key="audio.bytes")
    blob.value.bytes_value = bytes(range(256)) * (MAX_STRING_BYTES // 128)
    for name, attrs in _all_decoders(_request(text, blob)).items():
        assert len(attrs["gen_ai.prompt"].encode()) == MAX_STRING_BYTES, name
        assert len(attrs["audio.bytes"]) <= MAX_STRING_BYTES, name
        base64.b64decode(attrs["audio.bytes"], validate=True)  # still decodable
        assert sorted(attrs[TRUNCATED_KEY]) == ["audio.bytes", "gen_ai.prompt"], name


def test_nested_values_share_one_budget():
    kv = KeyValue(key="messages")
    outer = kv.value.array_value.values
    for _ in range(3):
        inner = outer.add().kvlist_value.values.add()
        inner.key = "parts"
        inner.value.array_value.values.extend(AnyValue(string_value="p") for _ in range(MAX_VALUE_ITEMS // 2))
    for name, attrs in _all_decoders(_request(kv)).items():
        kept = attrs["messages"]
        # 1 + 1 + N/2 elements for the first message, the same for the second (cut short)
        assert sum(1 + 1 + len(m.get("parts", [])) for m in kept) == MAX_VALUE_ITEMS, name
        assert attrs[TRUNCATED_KEY] == ["messages"], name


def test_a_four_million_element_array_decodes_without_building_it():
    import tracemalloc

    from tests.faults.test_hostile_ingest import huge_array_request

    data = huge_array_request(b"\x01" * 16, elements=4_000_000)
    assert len(data) > 12 * 2**20
    tracemalloc.start()
    try:
        attrs = decode_protobuf(data).spans[0].attributes
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert attrs["samples"] == [1] * MAX_VALUE_ITEMS
    # The attribute's bytes are copied once; the protobuf parser would build an object for
    # each element, hundreds of MB.
    assert peak < 2 * len(data), peak


def test_a_corrupt_large_value_is_a_decode_error():
    data = bytearray(_request(_int_array("x", 50_000)).SerializeToString())
    del data[-3:]  # the last element's bytes, so the lengths around it lie
    with pytest.raises(DecodeError):
        decode_protobuf(bytes(data))


# --------------------------------------------------------------------------- property

_scalars = st.one_of(
    st.builds(lambda s: AnyValue(string_value=s), st.text(max_size=20)),
    st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
    st.builds(lambda i: AnyValue(int_value=i), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda d: AnyValue(double_value=d), st.floats(allow_nan=False)),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=20)),
    st.just(AnyValue()),
)


def _array(values):
    v = AnyValue()
    v.array_value.values.extend(values)
    return v


def _kvlist(pairs):
    v = AnyValue()
    for k, item in pairs:
        v.kvlist_value.values.add(key=k).value.CopyFrom(item)
    return v


_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.builds(_array, st.lists(children, max_size=12)),
        st.builds(_kvlist, st.lists(st.tuples(st.text(max_size=5), children), max_size=6)),
    ),
    max_leaves=60,
)


@hsettings(max_examples=150, deadline=None)
@given(value=_values, items=st.integers(1, 40))
def test_the_field_reader_agrees_with_the_protobuf_parser(value, items):
    raw = KeyValue(key="k", value=value).SerializeToString()
    saved = LIMITS.items
    LIMITS.items = items
    try:
        by_parser = _Budget()
        expected = _pb_any(KeyValue.FromString(raw).value, by_parser)
        by_fields = _Budget()
        key, got = _wire_kv(memoryview(raw), 0, len(raw), by_fields, 0)
    finally:
        LIMITS.items = saved
    assert key == "k"
    assert got == expected
    assert by_fields.cut == by_parser.cut


# --------------------------------------------------------------------------- end to end


def test_an_sdk_span_with_a_huge_array_is_stored_cut(engine):
    settings = Settings(settle_seconds=0)
    pipeline = IngestPipeline(engine, settings, settle=False).start()
    server = serve_http(create_ingest_app(pipeline, settings), "127.0.0.1", 0)
    provider = TracerProvider(resource=Resource.create({"service.name": "embedder"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", timeout=30)))
    try:
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("embed") as span:
            span.set_attribute("embedding.vector", [0.5] * 100_000)
            span.set_attribute("embedding.model_name", "text-embedding-004")
        trace_id = format(span.get_span_context().trace_id, "032x")
    finally:
        provider.shutdown()
        server.shutdown()
        pipeline.close()
    with engine.connect() as conn:
        stored = json.loads(conn.execute(select(Span.attributes).where(Span.trace_id == trace_id)).scalar_one())
    assert stored["embedding.vector"] == [0.5] * MAX_VALUE_ITEMS
    assert stored["embedding.model_name"] == "text-embedding-004"
    assert stored[TRUNCATED_KEY] == ["embedding.vector"]


def test_the_writer_queue_is_bounded_in_bytes(engine):
    from modalscope.core.spans import SpanRecord

    def records(n):
        now = time.time_ns()
        return [SpanRecord(f"{i:032x}", f"{i + 1:016x}", None, "svc", "op", 1, now, now + 1, 0, "", {}, {}, [],
                           "otlp", "") for i in range(1, n + 1)]

    writer = BatchWriter(engine, max_queue_spans=1_000_000, max_queue_bytes=10_000)  # not started: nothing drains
    writer.submit(records(1), nbytes=60_000)  # one oversized request may enter an empty queue
    assert writer.busy() is not None
    with pytest.raises(WriterFull):
        writer.submit(records(1), nbytes=10)
    writer.close()  # writes what is queued, freeing its bytes
    assert writer.busy() is None
