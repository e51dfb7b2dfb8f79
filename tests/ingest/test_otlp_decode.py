"""OTLP decoding and response encoding, on real messages.

Protobuf requests are built by the OpenTelemetry SDK's own OTLP encoder from spans recorded
with an ``InMemorySpanExporter``; JSON requests are written as exporters write them.
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import re

import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from modalscope.ingest import otlp
from modalscope.ingest.otlp import attributes as otlp_attributes
from modalscope.ingest.otlp import common as otlp_common
from modalscope.ingest.otlp import (
    DecodeError,
    DecodeResult,
    NotTracesError,
    decode_json,
    decode_protobuf,
    decode_request_message,
    encode_response,
    encode_status,
)
from modalscope.core.spans import (
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_SERVER,
    KIND_UNSPECIFIED,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    SpanRecord,
)

from tests.otlp_payloads import logs_request_json, metrics_request_json, snake_case

PB = "application/x-protobuf"
JS = "application/json"


# ----------------------------------------------------------------------------- helpers


def _sdk_spans():
    """A small multimodal request recorded by the real SDK: SERVER root, CLIENT child,
    INTERNAL grandchild with an event and an error status, every attribute type."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "vlm-gateway", "service.instance.id": "pod-3", "deployment.tier": 2}
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("mm.gateway", "1.2.3")
    with tracer.start_as_current_span(
        "POST /v1/chat",
        kind=SpanKind.SERVER,
        attributes={
            "http.response.status_code": 200,
            "mm.image_count": 2,
            "mm.prompt_chars": 1234,
            "cache.hit": True,
            "gpu.util": 0.75,
            "big.int": 2**63 - 1,
            "neg.int": -(2**63),
            "user_tier": "pro",
            "unicode": "画像 \x00\x1b[31m <script>",
            "tags": ["a", "b"],
            "sizes": [224, 448],
            "ratios": [0.5, 1.5],
            "flags": [True, False],
            "blob": b"\x00\xffimg",
            "meta": {"model": "vit-l", "layers": [1, 2]},
        },
    ):
        with tracer.start_as_current_span("VisionEncoder/Encode", kind=SpanKind.CLIENT) as client:
            client.set_attribute("rpc.system", "grpc")
            with tracer.start_as_current_span("image.resize") as inner:
                inner.add_event("cache miss", {"cache.name": "patches", "attempt": 2})
                inner.set_status(Status(StatusCode.ERROR, "resize failed"))
    spans = exporter.get_finished_spans()
    provider.shutdown()
    return {s.name: s for s in spans}


@pytest.fixture(scope="module")
def sdk_spans():
    return _sdk_spans()


@pytest.fixture(scope="module")
def sdk_request(sdk_spans) -> ExportTraceServiceRequest:
    return encode_spans(list(sdk_spans.values()))


def _by_name(result: DecodeResult) -> dict[str, SpanRecord]:
    return {r.name: r for r in result.spans}


def _ids(span) -> tuple[str, str]:
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


def _any_to_json(v) -> dict:
    which = v.WhichOneof("value")
    if which is None:
        return {}
    if which == "string_value":
        return {"stringValue": v.string_value}
    if which == "bool_value":
        return {"boolValue": v.bool_value}
    if which == "int_value":
        return {"intValue": str(v.int_value)}
    if which == "double_value":
        d = v.double_value
        return {"doubleValue": d if math.isfinite(d) else str(d)}
    if which == "bytes_value":
        return {"bytesValue": base64.b64encode(v.bytes_value).decode()}
    if which == "array_value":
        return {"arrayValue": {"values": [_any_to_json(x) for x in v.array_value.values]}}
    return {"kvlistValue": {"values": _kvs_to_json(v.kvlist_value.values)}}


def _kvs_to_json(kvs) -> list:
    return [{"key": kv.key, "value": _any_to_json(kv.value)} for kv in kvs]


def _to_otlp_json(req: ExportTraceServiceRequest) -> dict:
    """The OTLP/JSON form of a request (hex ids; not json_format, which writes base64)."""
    out = []
    for rs in req.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans = []
            for sp in ss.spans:
                d = {
                    "traceId": sp.trace_id.hex().upper(),
                    "spanId": sp.span_id.hex(),
                    "name": sp.name,
                    "kind": sp.kind,
                    "startTimeUnixNano": str(sp.start_time_unix_nano),
                    "endTimeUnixNano": sp.end_time_unix_nano,  # as a number
                    "attributes": _kvs_to_json(sp.attributes),
                    "flags": sp.flags,
                    "droppedAttributesCount": 0,
                    "traceState": "",
                    "links": [
                        {"traceId": ln.trace_id.hex().upper(), "spanId": ln.span_id.hex(),
                         "attributes": _kvs_to_json(ln.attributes), "traceState": ln.trace_state}
                        for ln in sp.links
                    ],
                    "status": {"code": sp.status.code, "message": sp.status.message},
                }
                if sp.parent_span_id:
                    d["parentSpanId"] = sp.parent_span_id.hex()
                if sp.events:
                    d["events"] = [
                        {
                            "timeUnixNano": str(e.time_unix_nano),
                            "name": e.name,
                            "attributes": _kvs_to_json(e.attributes),
                        }
                        for e in sp.events
                    ]
                spans.append(d)
            scopes.append({"scope": {"name": ss.scope.name, "version": ss.scope.version}, "spans": spans})
        out.append(
            {
                "resource": {"attributes": _kvs_to_json(rs.resource.attributes)},
                "scopeSpans": scopes,
                "schemaUrl": rs.schema_url,
            }
        )
    return {"resourceSpans": out}


def _request(*spans, resource=None, scope="s") -> ExportTraceServiceRequest:
    """A hand-built request: ``spans`` are dicts of Span fields."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for key, value in (resource or {"service.name": "svc"}).items():
        kv = rs.resource.attributes.add(key=key)
        kv.value.string_value = value
    ss = rs.scope_spans.add()
    ss.scope.name = scope
    for fields in spans:
        ss.spans.add(**fields)
    return req


TID = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SID = bytes.fromhex("b7ad6b7169203331")


def _span(**over):
    base = {
        "trace_id": TID,
        "span_id": os.urandom(8),
        "name": "op",
        "start_time_unix_nano": 1_700_000_000_000_000_000,
        "end_time_unix_nano": 1_700_000_000_005_000_000,
    }
    base.update(over)
    return base


# ----------------------------------------------------------------------------- protobuf


def test_protobuf_from_sdk(sdk_spans, sdk_request):
    result = decode_protobuf(sdk_request.SerializeToString())
    assert result.rejected == 0 and result.errors == []
    got = _by_name(result)
    assert set(got) == {"POST /v1/chat", "VisionEncoder/Encode", "image.resize"}

    root, client, inner = got["POST /v1/chat"], got["VisionEncoder/Encode"], got["image.resize"]
    for name, rec in got.items():
        sdk = sdk_spans[name]
        assert (rec.trace_id, rec.span_id) == _ids(sdk)
        assert rec.start_ns == sdk.start_time and rec.end_ns == sdk.end_time
        assert rec.service == "vlm-gateway"
        assert rec.resource["service.instance.id"] == "pod-3"
        assert rec.resource["deployment.tier"] == 2
        assert rec.instance == "pod-3"
        assert rec.scope == "mm.gateway"
        assert rec.source == "otlp"
        assert rec.stage is None
    assert root.parent_span_id is None
    assert client.parent_span_id == root.span_id
    assert inner.parent_span_id == client.span_id
    assert len(root.trace_id) == 32 and root.trace_id == root.trace_id.lower()
    assert (root.kind, client.kind, inner.kind) == (KIND_SERVER, KIND_CLIENT, KIND_INTERNAL)

    assert root.attributes == {
        "http.response.status_code": 200,
        "mm.image_count": 2,
        "mm.prompt_chars": 1234,
        "cache.hit": True,
        "gpu.util": 0.75,
        "big.int": 2**63 - 1,
        "neg.int": -(2**63),
        "user_tier": "pro",
        "unicode": "画像 \x00\x1b[31m <script>",
        "tags": ["a", "b"],
        "sizes": [224, 448],
        "ratios": [0.5, 1.5],
        "flags": [True, False],
        "blob": base64.b64encode(b"\x00\xffimg").decode(),
        "meta": {"model": "vit-l", "layers": [1, 2]},
    }
    assert type(root.attributes["cache.hit"]) is bool
    assert type(root.attributes["gpu.util"]) is float
    assert client.attributes == {"rpc.system": "grpc"}

    assert inner.status == STATUS_ERROR and inner.status_message == "resize failed"
    assert root.status == STATUS_UNSET and root.status_message == ""
    assert inner.events == [
        {
            "name": "cache miss",
            "time_unix_nano": sdk_spans["image.resize"].events[0].timestamp,
            "attributes": {"cache.name": "patches", "attempt": 2},
        }
    ]
    assert root.events == []


def test_message_and_bytes_paths_agree(sdk_request):
    data = sdk_request.SerializeToString()
    by_bytes = decode_protobuf(data, source="import")
    by_message = decode_request_message(ExportTraceServiceRequest.FromString(data), source="import")
    assert by_bytes == by_message
    assert {r.source for r in by_bytes.spans} == {"import"}
    # The second decode is served from the attribute cache: same answer.
    assert decode_protobuf(data, source="import") == by_bytes


def test_protobuf_records_do_not_share_mutable_values():
    req = _request(*[_span(name=f"s{i}") for i in range(2)])
    for sp in req.resource_spans[0].scope_spans[0].spans:
        kv = sp.attributes.add(key="tags")
        kv.value.array_value.values.add(string_value="a")
        sp.attributes.add(key="k").value.string_value = "v"
    data = req.SerializeToString()
    a, b = decode_protobuf(data).spans
    a.attributes["tags"].append("mutated")
    assert b.attributes["tags"] == ["a"]
    assert decode_protobuf(data).spans[0].attributes == {"tags": ["a"], "k": "v"}


def test_protobuf_attribute_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(otlp_attributes, "_KV_CACHE", {})
    monkeypatch.setattr(otlp_attributes, "_KV_CACHE_MAX_ENTRIES", 10)
    req = _request(_span())
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    for i in range(25):
        sp.attributes.add(key=f"k{i}").value.int_value = i
    (rec,) = decode_protobuf(req.SerializeToString()).spans
    assert rec.attributes == {f"k{i}": i for i in range(25)}
    assert 0 < len(otlp_attributes._KV_CACHE) <= 10


def _kv_bytes(key: str, **value) -> bytes:
    return KeyValue(key=key, value=AnyValue(**value)).SerializeToString()


def _edge_attributes() -> list[bytes]:
    strings = ["", "a", "é", "画像", "\x00\x1b", "x" * 127, "y" * 128, "z" * 16383, "w" * 16384, "😀" * 40]
    ints = [0, 1, -1, 127, 128, 300, 2**31, -(2**31), 2**62, 2**63 - 1, -(2**63)]
    doubles = [0.0, -0.0, 1.5, -2.25, 1e308, 5e-324, math.inf, -math.inf]
    raws = [_kv_bytes(k, string_value=v) for k in ("k", "ключ", "k" * 130) for v in strings]
    raws += [_kv_bytes("n", int_value=v) for v in ints]
    raws += [_kv_bytes("b", bool_value=v) for v in (True, False)]
    raws += [_kv_bytes("d", double_value=v) for v in doubles]
    raws += [_kv_bytes("", string_value="empty key"), _kv_bytes("bytes", bytes_value=b"\x00\x01")]
    raws.append(KeyValue(key="empty").SerializeToString())
    raws.append(b"\x0a\x01e\x12\x00")  # a value with nothing set
    arr = AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(string_value="s")]))
    raws.append(KeyValue(key="arr", value=arr).SerializeToString())
    # Valid but not canonical: value before key, a repeated key (last wins), a oneof set
    # twice (last wins), bool 2 (true), an overlong varint, trailing unknown field.
    value = AnyValue(string_value="v").SerializeToString()
    raws.append(b"\x12" + bytes([len(value)]) + value + b"\x0a\x01k")
    raws.append(b"\x0a\x01a\x0a\x01b\x12" + bytes([len(value)]) + value)
    raws.append(b"\x0a\x01k\x12\x05\x0a\x01s\x18\x07")
    raws.append(b"\x0a\x01k\x12\x02\x10\x02")
    raws.append(b"\x0a\x01k\x12\x03\x18\x81\x00")
    raws.append(b"\x0a\x01k\x12\x03\x0a\x01v\x20\x01")
    return raws


def test_attribute_fast_path_matches_protobuf(monkeypatch):
    monkeypatch.setattr(otlp_attributes, "_KV_CACHE", {})
    for raw in _edge_attributes():
        expected = otlp_attributes._pb_attrs([KeyValue.FromString(raw)])
        fast = otlp_attributes._scalar_kv(raw)
        if fast is not None:
            assert dict([fast]) == expected, raw
            assert [type(v) for v in dict([fast]).values()] == [type(v) for v in expected.values()]
        for _ in range(2):  # a miss, then (when cacheable) a hit
            got = otlp_attributes._raw_attrs([raw])
            assert got == expected, raw
            assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]
            if got and isinstance(next(iter(got.values())), float) and math.copysign(1, next(iter(got.values()))) < 0:
                assert math.copysign(1, next(iter(expected.values()))) < 0


def test_attribute_with_bad_utf8_is_never_cached(monkeypatch):
    monkeypatch.setattr(otlp_attributes, "_KV_CACHE", {})
    good = _kv_bytes("k", string_value="abc")
    for bad in (good.replace(b"abc", b"a\xffc"), good.replace(b"\x0a\x01k", b"\x0a\x01\xff")):
        for _ in range(2):
            with pytest.raises(DecodeError, match="UTF-8"):
                otlp_attributes._raw_attrs([bad])
        assert bad not in otlp_attributes._KV_CACHE


def test_random_requests_decode_alike_on_both_paths():
    rng = random.Random(7)
    req = ExportTraceServiceRequest()
    for r in range(3):
        rs = req.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = f"svc{r}"
        for s in range(2):
            ss = rs.scope_spans.add()
            ss.scope.name = f"scope{s}"
            for _ in range(20):
                sp = ss.spans.add(**_span(name=rng.choice(["a", "b", "é"]), kind=rng.randrange(7)))
                for raw in rng.sample(_edge_attributes(), 12):
                    sp.attributes.append(KeyValue.FromString(raw))
                if rng.random() < 0.3:
                    ev = sp.events.add(name="e", time_unix_nano=rng.randrange(2**64))
                    ev.attributes.append(KeyValue.FromString(rng.choice(_edge_attributes())))
    data = req.SerializeToString()
    expected = decode_request_message(ExportTraceServiceRequest.FromString(data))
    assert len(expected.spans) == 120
    assert decode_protobuf(data) == expected  # cold
    assert decode_protobuf(data) == expected  # warm


def test_protobuf_bad_ids_rejected_individually():
    req = _request(
        _span(name="ok", parent_span_id=SID),
        _span(name="short trace", trace_id=b"\x01" * 8),
        _span(name="zero trace", trace_id=bytes(16)),
        _span(name="no span id", span_id=b""),
        _span(name="zero span", span_id=bytes(8)),
        _span(name="bad parent", parent_span_id=b"\x01" * 5),
        _span(name="zero parent", parent_span_id=bytes(8)),
    )
    for fn in (
        lambda: decode_protobuf(req.SerializeToString()),
        lambda: decode_request_message(req),
    ):
        result = fn()
        assert [r.name for r in result.spans] == ["ok", "zero parent"]
        assert result.spans[0].parent_span_id == SID.hex()
        assert result.spans[1].parent_span_id is None
        assert result.rejected == 5
        assert len(result.errors) == 3  # trace id, span id, parent id: one message each
        assert all("\n" not in e for e in result.errors)


def test_protobuf_edge_values():
    long_value = "é" * 40_000  # 80,000 bytes of UTF-8
    req = _request(
        _span(
            name="n" * 5000,
            kind=9,  # from a newer proto
            start_time_unix_nano=2_000,
            end_time_unix_nano=1_000,
            status={"code": 1},
        ),
        resource={"service.name": "", "host.name": "h"},
    )
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    sp.attributes.add(key="long").value.string_value = long_value
    sp.attributes.add(key="empty")  # a key without a value
    sp.attributes.add(key="nan").value.double_value = float("nan")
    for result in (decode_protobuf(req.SerializeToString()), decode_request_message(req)):
        (rec,) = result.spans
        assert len(rec.name) == 1024
        assert rec.kind == KIND_UNSPECIFIED
        assert (rec.start_ns, rec.end_ns) == (2_000, 2_000)
        assert rec.status == STATUS_OK
        assert rec.service == "unknown"
        assert rec.resource == {"service.name": "", "host.name": "h"}
        cut = rec.attributes["long"]
        assert len(cut.encode()) <= 64 * 1024 and long_value.startswith(cut)
        assert len(cut.encode()) > 64 * 1024 - 2
        assert "empty" not in rec.attributes
        assert math.isnan(rec.attributes["nan"])


def test_protobuf_sdk_default_service_kept():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("x"):
        pass
    data = encode_spans(exporter.get_finished_spans()).SerializeToString()
    (rec,) = decode_protobuf(data).spans
    assert rec.service.startswith("unknown_service")
    assert decode_protobuf(_request(_span(), resource={"host.name": "h"}).SerializeToString()).spans[0].service == "unknown"


def test_protobuf_legacy_instrumentation_library_spans():
    ss = ScopeSpans()
    ss.scope.name = "old.lib"
    ss.spans.add(**_span(name="legacy"))
    body = ss.SerializeToString()
    # ResourceSpans { instrumentation_library_spans (field 1000, wire type 2) = body }
    rs = b"\xc2\x3e" + _varint(len(body)) + body
    data = b"\x0a" + _varint(len(rs)) + rs
    for result in (decode_protobuf(data), decode_request_message(ExportTraceServiceRequest.FromString(data))):
        (rec,) = result.spans
        assert (rec.name, rec.scope, rec.service) == ("legacy", "old.lib", "unknown")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


@pytest.mark.parametrize(
    "data",
    [b"not a protobuf", b"\xff\xff\xff\xff", b"\x0a\x05abc", b"\x0a\xff\xff\xff\xff\x0f"],
)
def test_garbage_protobuf_is_a_decode_error(data):
    with pytest.raises(DecodeError) as err:
        decode_protobuf(data)
    assert str(err.value).startswith("invalid protobuf: ")
    assert "\n" not in str(err.value)
    assert "modalscope" not in str(err.value)  # our private message copy stays private


def test_protobuf_invalid_utf8_is_a_decode_error():
    req = _request(_span(name="abc123"))
    req.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="k").value.string_value = "xyz789"
    data = req.SerializeToString()
    for good, bad in ((b"abc123", b"ab\xff123"), (b"xyz789", b"xy\xfe789")):
        with pytest.raises(DecodeError, match="UTF-8"):
            decode_protobuf(data.replace(good, bad))


def test_empty_protobuf_request():
    assert decode_protobuf(b"") == DecodeResult([], 0, [])


# ----------------------------------------------------------------------------- JSON


def _json_request(*spans, resource_attrs=None) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": resource_attrs
                    if resource_attrs is not None
                    else [{"key": "service.name", "value": {"stringValue": "encoder"}}],
                    "droppedAttributesCount": 0,
                },
                "scopeSpans": [{"scope": {"name": "mm", "version": "1"}, "spans": list(spans)}],
            }
        ]
    }


JTID = "5B8EFFF798038103D269B633813FC60C"
JROOT = "EEE19B7EC3C1B174"
JCHILD = "eee19b7ec3c1b173"


def test_json_as_exporters_write_it():
    body = _json_request(
        {
            "traceId": JTID,
            "spanId": JROOT,
            # no parentSpanId key: a root
            "name": "POST /v1/chat",
            "kind": "SPAN_KIND_SERVER",
            "startTimeUnixNano": "1544712660000000000",
            "endTimeUnixNano": 1544712661000000000,
            "flags": 257,
            "traceState": "vendor=1",
            "droppedAttributesCount": 0,
            "droppedEventsCount": 0,
            "links": [],
            "attributes": [
                {"key": "mm.image_count", "value": {"intValue": "2"}},
                {"key": "batch.size", "value": {"intValue": 8}},
                {"key": "big", "value": {"intValue": "9223372036854775807"}},
                {"key": "neg", "value": {"intValue": "-9223372036854775808"}},
                {"key": "cache.hit", "value": {"boolValue": True}},
                {"key": "ratio", "value": {"doubleValue": 0.5}},
                {"key": "whole", "value": {"doubleValue": 3}},
                {"key": "nan", "value": {"doubleValue": "NaN"}},
                {"key": "inf", "value": {"doubleValue": "-Infinity"}},
                {"key": "text", "value": {"stringValue": "画像\x00\x1b <b>"}},
                {"key": "blob", "value": {"bytesValue": "AP9pbWc="}},
                {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "1"}]}}},
                {"key": "empty_array", "value": {"arrayValue": {}}},
                {
                    "key": "meta",
                    "value": {
                        "kvlistValue": {
                            "values": [
                                {"key": "model", "value": {"stringValue": "vit"}},
                                {"key": "dims", "value": {"arrayValue": {"values": [{"intValue": 3}]}}},
                            ]
                        }
                    },
                },
                {"key": "no_value", "value": {}},
            ],
            "events": [
                {
                    "timeUnixNano": "1544712660500000000",
                    "name": "first token",
                    "attributes": [{"key": "tokens", "value": {"intValue": "1"}}],
                    "droppedAttributesCount": 0,
                }
            ],
            "status": {"code": "STATUS_CODE_ERROR", "message": "upstream timeout"},
        },
        {
            "traceId": JTID.lower(),
            "spanId": JCHILD,
            "parentSpanId": JROOT,
            "name": "VisionEncoder/Encode",
            "kind": 3,
            "startTimeUnixNano": 1544712660100000000,
            "endTimeUnixNano": "1544712660900000000",
            "status": {},
        },
        {
            "traceId": JTID,
            "spanId": "00f067aa0ba902b7",
            "parentSpanId": "",  # empty: a root too
            "name": "other root",
        },
    )
    result = decode_json(json.dumps(body).encode())
    assert result.rejected == 0 and result.errors == []
    root, child, other = result.spans
    assert root.trace_id == JTID.lower() and root.span_id == JROOT.lower()
    assert root.parent_span_id is None and other.parent_span_id is None
    assert child.parent_span_id == JROOT.lower() and child.trace_id == JTID.lower()
    assert (root.kind, child.kind, other.kind) == (KIND_SERVER, KIND_CLIENT, KIND_UNSPECIFIED)
    assert (root.start_ns, root.end_ns) == (1544712660000000000, 1544712661000000000)
    assert (child.start_ns, child.end_ns) == (1544712660100000000, 1544712660900000000)
    assert (other.start_ns, other.end_ns) == (0, 0)
    assert root.service == "encoder" and root.scope == "mm" and root.resource == {"service.name": "encoder"}
    assert root.status == STATUS_ERROR and root.status_message == "upstream timeout"
    assert child.status == STATUS_UNSET
    a = root.attributes
    assert a["mm.image_count"] == 2 and a["batch.size"] == 8
    assert a["big"] == 2**63 - 1 and a["neg"] == -(2**63)
    assert a["cache.hit"] is True
    assert a["ratio"] == 0.5 and type(a["whole"]) is float and a["whole"] == 3.0
    assert math.isnan(a["nan"]) and a["inf"] == -math.inf
    assert a["text"] == "画像\x00\x1b <b>"
    assert a["blob"] == "AP9pbWc="
    assert a["tags"] == ["a", 1] and a["empty_array"] == []
    assert a["meta"] == {"model": "vit", "dims": [3]}
    assert "no_value" not in a
    assert root.events == [
        {"name": "first token", "time_unix_nano": 1544712660500000000, "attributes": {"tokens": 1}}
    ]


def test_json_and_protobuf_decode_the_same_request(sdk_request):
    from_pb = decode_protobuf(sdk_request.SerializeToString())
    as_json = _to_otlp_json(sdk_request)
    for form in (json.dumps(as_json).encode(), json.dumps(as_json), as_json):
        assert decode_json(form) == from_pb


def test_json_bad_span_rejected_others_kept():
    good = {"traceId": JTID, "spanId": JROOT, "name": "good"}
    body = _json_request(
        good,
        {"traceId": "xyz", "spanId": JCHILD, "name": "bad trace"},
        {"traceId": JTID[:30], "spanId": JCHILD, "name": "short trace"},
        {"traceId": "0" * 32, "spanId": JCHILD, "name": "zero trace"},
        {"spanId": JCHILD, "name": "missing trace"},
        {"traceId": JTID, "spanId": "12345", "name": "bad span"},
        {"traceId": JTID, "spanId": JCHILD, "parentSpanId": "nothex!!nothex!!", "name": "bad parent"},
        {"traceId": JTID, "spanId": JCHILD, "startTimeUnixNano": "soon", "name": "bad time"},
        {"traceId": JTID, "spanId": JCHILD, "attributes": [{"key": "n", "value": {"intValue": "x"}}]},
        "not a span",
        {"traceId": JTID, "spanId": JCHILD, "parentSpanId": "0" * 16, "name": "zero parent is root"},
    )
    result = decode_json(json.dumps(body))
    assert [r.name for r in result.spans] == ["good", "zero parent is root"]
    assert result.spans[1].parent_span_id is None
    assert result.rejected == 9
    assert len(result.errors) == len(set(result.errors)) >= 5
    assert any("trace id" in e for e in result.errors)
    assert any("span id" in e for e in result.errors)


def test_json_legacy_and_sparse_shapes():
    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "old"}}]},
                "instrumentationLibrarySpans": [
                    {"instrumentationLibrary": {"name": "lib"}, "spans": [{"traceId": JTID, "spanId": JROOT}]}
                ],
            },
            {"scopeSpans": [{"spans": [{"traceId": JTID, "spanId": JCHILD, "kind": "SPAN_KIND_CONSUMER"}]}]},
            {},
        ]
    }
    old, bare = decode_json(body).spans
    assert (old.service, old.scope, old.name) == ("old", "lib", "")
    assert (bare.service, bare.scope, bare.resource, bare.kind) == ("unknown", "", {}, 5)
    assert decode_json(b"{}") == DecodeResult([], 0, [])
    assert decode_json('{"resourceSpans": null}') == DecodeResult([], 0, [])


def test_json_lone_surrogate_replaced():
    body = json.dumps(_json_request({"traceId": JTID, "spanId": JROOT, "name": "a\ud800b"}))
    assert "\\ud800" in body
    (rec,) = decode_json(body.encode()).spans
    assert rec.name == "a\ufffdb"
    rec.name.encode("utf-8")  # storable
    (rec,) = decode_json(json.loads(body)).spans
    assert rec.name == "a\ufffdb"


def test_json_bytes_decode_as_the_standard_parser_reads_them():
    """Bytes go through orjson, and what it refuses through the standard parser, so every
    body decodes as ``json.loads`` reads it: a byte order mark, a bare NaN, numbers past
    64 bits, a lone surrogate, big unsigned timestamps as numbers."""
    span = {"traceId": JTID, "spanId": JROOT, "name": "n", "startTimeUnixNano": 1544712660000000001,
            "endTimeUnixNano": "1544712660000000002",
            "attributes": [{"key": "ok", "value": {"intValue": "-9223372036854775808"}},
                           {"key": "big", "value": {"intValue": 2 ** 64}}]}
    text = json.dumps(_json_request(span))
    bodies = {
        "plain": text.encode(),
        "bom": "\ufeff".encode() + text.encode(),
        "nan": text.replace('"name": "n"', '"name": "n", "x": NaN').encode(),
        "surrogate": text.replace('"name": "n"', '"name": "n\\ud800"').encode(),
    }
    for label, body in bodies.items():
        expected = decode_json(json.loads(body.decode("utf-8-sig")))
        got = decode_json(body)
        assert got == expected, label
        # The 65-bit intValue sinks its span, whichever parser read it.
        assert (got.rejected, got.spans, got.errors) == (1, [], ["intValue must be a 64-bit integer"]), label
    good = dict(span, attributes=span["attributes"][:1])
    (rec,) = decode_json(json.dumps(_json_request(good)).encode()).spans
    # A timestamp as a JSON number keeps every digit (not rounded through a double).
    assert rec.start_ns == 1544712660000000001 and rec.attributes == {"ok": -2 ** 63}
    (rec,) = decode_json(b"\xef\xbb\xbf" + json.dumps(_json_request(dict(good, name="a\ud800b"))).encode()).spans
    assert rec.name == "a\ufffdb"


def test_json_name_and_string_bounds():
    span = {
        "traceId": JTID,
        "spanId": JROOT,
        "name": "x" * 2000,
        "attributes": [{"key": "prompt", "value": {"stringValue": "p" * 100_000}}],
        "startTimeUnixNano": "10",
        "endTimeUnixNano": "5",
    }
    (rec,) = decode_json(_json_request(span)).spans
    assert len(rec.name) == 1024
    assert rec.attributes["prompt"] == "p" * 65536
    assert (rec.start_ns, rec.end_ns) == (10, 10)


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"{not json", "invalid JSON"),
        (b"", "invalid JSON"),
        (b'{"resourceSpans": [}', "invalid JSON"),
        (b"\xff\xfe{}", "UTF-8"),
        (b'{"resourceSpans": [{"scopeSpans": []}], "x": "\xc3\x28"}', "UTF-8"),
        (b"[]", "top level"),
        (b'"resourceSpans"', "top level"),
        (b"null", "top level"),
        (b'{"resourceSpans": {}}', "resourceSpans"),
        (b'{"resourceSpans": [1]}', "resourceSpans[0]"),
        (b'{"resourceSpans": [{"scopeSpans": "x"}]}', "scopeSpans"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": {}}]}]}', "spans"),
        (b"[" * 100_000, "nested"),
    ],
)
def test_malformed_json_is_a_decode_error(data, reason):
    with pytest.raises(DecodeError, match=reason.replace("[", r"\[")) as err:
        decode_json(data)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def test_deep_anyvalue_nesting_is_a_decode_error():
    value: dict = {"stringValue": "leaf"}
    for _ in range(3000):
        value = {"arrayValue": {"values": [value]}}
    body = _json_request({"traceId": JTID, "spanId": JROOT, "attributes": [{"key": "deep", "value": value}]})
    with pytest.raises(DecodeError):
        decode_json(body)


# ----------------------------------------------------------------------------- responses


def test_encode_response_protobuf():
    body = encode_response(3, "invalid or missing trace id", PB)
    resp = ExportTraceServiceResponse.FromString(body)
    assert resp.HasField("partial_success")
    assert resp.partial_success.rejected_spans == 3
    assert resp.partial_success.error_message == "invalid or missing trace id"

    ok = ExportTraceServiceResponse.FromString(encode_response(0, "", PB))
    assert not ok.HasField("partial_success")
    warn = ExportTraceServiceResponse.FromString(encode_response(0, "names truncated", PB))
    assert warn.HasField("partial_success") and warn.partial_success.rejected_spans == 0


def test_encode_response_json():
    body = encode_response(3, "bad ids", JS)
    assert json.loads(body) == {"partialSuccess": {"rejectedSpans": "3", "errorMessage": "bad ids"}}
    # It is canonical OTLP/JSON: protobuf's own JSON reader agrees.
    resp = json_format.Parse(body, ExportTraceServiceResponse())
    assert resp.partial_success.rejected_spans == 3
    assert json.loads(encode_response(0, "", JS)) == {}
    assert json.loads(encode_response(0, "", "application/json; charset=utf-8")) == {}


def test_encode_status():
    body = encode_status(3, "invalid JSON: Expecting value at line 1 column 1", PB)
    status = status_pb2.Status.FromString(body)
    assert (status.code, status.message) == (3, "invalid JSON: Expecting value at line 1 column 1")
    assert json.loads(encode_status(8, "too large", JS)) == {"code": 8, "message": "too large"}
    assert json.loads(encode_status(3, "x", "Application/JSON; charset=UTF-8")) == {"code": 3, "message": "x"}
    assert json_format.Parse(encode_status(14, "writer full", JS), status_pb2.Status()).code == 14
    # A message that cannot be UTF-8 (a lone surrogate from untrusted text) still encodes.
    assert status_pb2.Status.FromString(encode_status(3, "a\ud800", PB)).message == "a\ufffd"


def test_response_media_type():
    assert otlp.response_media_type("application/x-protobuf") == PB
    assert otlp.response_media_type("application/protobuf") == PB
    assert otlp.response_media_type("application/json; charset=utf-8") == JS
    assert otlp.response_media_type("text/plain") == JS
    assert otlp.response_media_type(None) == JS


def test_decode_error_is_one_line():
    assert str(DecodeError("a\nb\r\n  c")) == "a b c"



# ----------------------------------------------------------------------------- span links


def _linked_sdk_spans():
    """A queue hand-off recorded by the real SDK: a producer's trace, and a consumer's own
    trace linked to it with ``start_as_current_span(..., links=[Link(ctx)])``; plus a link
    to an invalid context that carries attributes (the SDK keeps it, with zero ids)."""
    from opentelemetry.trace import INVALID_SPAN_CONTEXT, Link

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ingest-queue"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("mm.queue")
    with tracer.start_as_current_span("publish image batch", kind=SpanKind.PRODUCER) as producer:
        produced = producer.get_span_context()
    with tracer.start_as_current_span("enqueue audio", kind=SpanKind.PRODUCER) as other:
        produced_2 = other.get_span_context()
    from opentelemetry import context as otel_context

    token = otel_context.attach(otel_context.Context())  # the consumer starts a trace of its own
    try:
        with tracer.start_as_current_span(
            "process batch",
            kind=SpanKind.CONSUMER,
            links=[
                Link(produced, {"messaging.operation": "receive", "batch.index": 0}),
                Link(produced_2),
                Link(INVALID_SPAN_CONTEXT, {"reason": "dropped by the broker"}),
            ],
        ):
            pass
    finally:
        otel_context.detach(token)
    spans = exporter.get_finished_spans()
    provider.shutdown()
    return {s.name: s for s in spans}


def _expected_links(consumer, producers) -> list[dict]:
    return [
        {"trace_id": format(p.context.trace_id, "032x"), "span_id": format(p.context.span_id, "016x"),
         "attributes": dict(attrs)}
        for p, attrs in producers
    ] + [{"trace_id": "0" * 32, "span_id": "0" * 16, "attributes": {"reason": "dropped by the broker"}}]


def test_links_from_the_sdk_decode_on_every_path():
    spans = _linked_sdk_spans()
    req = encode_spans(list(spans.values()))
    consumer = spans["process batch"]
    assert len(consumer.links) == 3  # the SDK kept the invalid-context link: it has attributes
    expected = _expected_links(consumer, [(spans["publish image batch"],
                                           {"messaging.operation": "receive", "batch.index": 0}),
                                          (spans["enqueue audio"], {})])
    assert format(consumer.context.trace_id, "032x") != expected[0]["trace_id"]
    data = req.SerializeToString()
    as_json = _to_otlp_json(req)  # link trace ids upper case, as some writers send them
    for result in (decode_protobuf(data), decode_request_message(req), decode_json(json.dumps(as_json)),
                   decode_json(json.dumps(snake_case(as_json)))):
        by_name = _by_name(result)
        assert result.rejected == 0
        assert by_name["process batch"].links == expected
        assert by_name["publish image batch"].links == []
        for ln in by_name["process batch"].links:
            assert re.fullmatch(r"[0-9a-f]{32}", ln["trace_id"]) and re.fullmatch(r"[0-9a-f]{16}", ln["span_id"])
    # Records never share a link list (the writer and the tagger may hold them at once).
    a, b = decode_protobuf(data), decode_protobuf(data)
    assert _by_name(a)["process batch"].links is not _by_name(b)["process batch"].links


def _link(trace_id: bytes, span_id: bytes, **attrs):
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

    link = PbSpan.Link(trace_id=trace_id, span_id=span_id)
    for k, v in attrs.items():
        link.attributes.add(key=k).value.string_value = v
    return link


def test_protobuf_bad_link_ids_reject_their_span_only():
    req = _request(
        _span(name="ok", links=[_link(TID, SID, kind="follows")]),
        _span(name="short link trace", links=[_link(TID, SID), _link(TID[:15], SID)]),
        _span(name="long link span", links=[_link(TID, SID + b"\x01")]),
        _span(name="empty link ids kept", links=[_link(b"", b"", note="no context")]),
    )
    for result in (decode_protobuf(req.SerializeToString()), decode_request_message(req)):
        assert [r.name for r in result.spans] == ["ok", "empty link ids kept"]
        assert result.spans[0].links == [{"trace_id": TID.hex(), "span_id": SID.hex(), "attributes": {"kind": "follows"}}]
        assert result.spans[1].links == [{"trace_id": "0" * 32, "span_id": "0" * 16,
                                          "attributes": {"note": "no context"}}]
        assert result.rejected == 2
        assert sorted(result.errors) == [otlp_common._ERR_LINK_SPAN_ID, otlp_common._ERR_LINK_TRACE_ID]
        assert "link trace id" in otlp_common._ERR_LINK_TRACE_ID and "link span id" in otlp_common._ERR_LINK_SPAN_ID


def test_json_bad_link_ids_reject_their_span_only():
    b64_trace = base64.b64encode(bytes.fromhex(JTID)).decode()
    b64_span = base64.b64encode(bytes.fromhex(JROOT)).decode()
    good = {"traceId": JTID, "spanId": JROOT, "name": "good",
            "links": [{"traceId": JTID, "spanId": JCHILD, "attributes": [{"key": "k", "value": {"stringValue": "v"}}]},
                      {"attributes": [{"key": "why", "value": {"stringValue": "no context"}}]}]}
    body = _json_request(
        good,
        {"traceId": JTID, "spanId": JCHILD, "name": "not hex", "links": [{"traceId": "zz" * 16, "spanId": JROOT}]},
        {"traceId": JTID, "spanId": JCHILD, "name": "short", "links": [{"traceId": JTID, "spanId": JROOT[:15]}]},
        {"traceId": JTID, "spanId": JCHILD, "name": "b64 trace", "links": [{"traceId": b64_trace, "spanId": JROOT}]},
        {"traceId": JTID, "spanId": JCHILD, "name": "b64 span", "links": [{"traceId": JTID, "spanId": b64_span}]},
        {"traceId": JTID, "spanId": JCHILD, "name": "number", "links": [{"traceId": 7, "spanId": JROOT}]},
        {"traceId": JTID, "spanId": JCHILD, "name": "not a list", "links": {"traceId": JTID}},
        {"traceId": JTID, "spanId": JCHILD, "name": "not objects", "links": ["x"]},
    )
    result = decode_json(json.dumps(body))
    assert [r.name for r in result.spans] == ["good"]
    assert result.spans[0].links == [
        {"trace_id": JTID.lower(), "span_id": JCHILD, "attributes": {"k": "v"}},
        {"trace_id": "0" * 32, "span_id": "0" * 16, "attributes": {"why": "no context"}},
    ]
    assert result.rejected == 7
    hinted = [e for e in result.errors if "looks like base64; OTLP/JSON wants hex" in e]
    assert len(hinted) == 2 and any("link trace id" in e for e in hinted) and any("link span id" in e for e in hinted)
    assert otlp_common._ERR_LINK_TRACE_ID in result.errors and otlp_common._ERR_LINK_SPAN_ID in result.errors
    assert otlp_common._ERR_LINKS in result.errors


def test_base64_ids_get_a_hint_and_other_bad_ids_do_not():
    """protobuf's json_format writes ids as base64: the error says so, once per kind of id."""
    sdk_json = json_format.MessageToDict(encode_spans(list(_sdk_spans().values())))
    result = decode_json(json.dumps(sdk_json))
    assert result.spans == [] and result.rejected == 3
    assert result.errors == [otlp_common._ERR_TRACE_ID + "; it looks like base64; OTLP/JSON wants hex"]

    tid_b64 = base64.urlsafe_b64encode(b"\xfb" * 16).decode()  # URL-safe alphabet too
    body = _json_request(
        {"traceId": JTID, "spanId": base64.b64encode(b"\x01" * 8).decode(), "name": "b64 span"},
        {"traceId": JTID, "spanId": JCHILD, "parentSpanId": base64.b64encode(b"\x02" * 8).decode(), "name": "b64 parent"},
        {"traceId": tid_b64, "spanId": JCHILD, "name": "urlsafe b64 trace"},
        {"traceId": "A" * 24, "spanId": JCHILD, "name": "24 chars, 18 bytes"},
        {"traceId": JTID[:31], "spanId": JCHILD, "name": "short hex"},
    )
    result = decode_json(json.dumps(body))
    assert result.rejected == 5
    hint = "; it looks like base64; OTLP/JSON wants hex"
    assert sorted(result.errors) == sorted([otlp_common._ERR_SPAN_ID + hint, otlp_common._ERR_PARENT_ID + hint,
                                            otlp_common._ERR_TRACE_ID + hint, otlp_common._ERR_TRACE_ID])


def test_snake_case_json_decodes_as_camel_case(sdk_request):
    camel = _to_otlp_json(sdk_request)
    snake = snake_case(camel)
    text = json.dumps(snake)
    for word in ("resource_spans", "scope_spans", "trace_id", "span_id", "parent_span_id", "start_time_unix_nano",
                 "string_value", "int_value", "array_value", "kvlist_value", "bytes_value", "time_unix_nano"):
        assert f'"{word}"' in text, word
    assert "traceId" not in text and "stringValue" not in text
    assert decode_json(text) == decode_json(json.dumps(camel)) == decode_request_message(sdk_request)
    # Attribute keys are values, never renamed: a key spelled like a field name stays.
    body = snake_case(_json_request({"traceId": JTID, "spanId": JROOT,
                                     "attributes": [{"key": "startTimeUnixNano", "value": {"intValue": "3"}}]}))
    assert decode_json(body).spans[0].attributes == {"startTimeUnixNano": 3}


def test_keyvalue_without_key_is_kept_with_an_empty_key():
    """proto3 JSON leaves an empty string out, so the Collector writes an empty key as no key."""
    body = _json_request(
        {"traceId": JTID, "spanId": JROOT,
         "attributes": [{"value": {"stringValue": "no key"}}, {"key": "k", "value": {"intValue": "1"}},
                        {"key": "m", "value": {"kvlistValue": {"values": [{"value": {"boolValue": True}}]}}}],
         "links": [{"traceId": JTID, "spanId": JCHILD, "attributes": [{"value": {"doubleValue": 0.5}}]}],
         "events": [{"name": "e", "attributes": [{"value": {"stringValue": "ev"}}]}]},
        resource_attrs=[{"key": "service.name", "value": {"stringValue": "svc"}}, {"value": {"stringValue": "r"}}],
    )
    (rec,) = decode_json(json.dumps(body)).spans
    assert rec.attributes == {"": "no key", "k": 1, "m": {"": True}}
    assert rec.links[0]["attributes"] == {"": 0.5}
    assert rec.events[0]["attributes"] == {"": "ev"}
    assert rec.resource == {"service.name": "svc", "": "r"}
    # The same request in protobuf: an empty key is not on the wire at all.
    req = _request(_span(name="pb"))
    req.resource_spans[0].scope_spans[0].spans[0].attributes.add().value.string_value = "no key"
    assert decode_protobuf(req.SerializeToString()).spans[0].attributes == {"": "no key"}
    # A key that is there but not a string is still an error.
    bad = _json_request({"traceId": JTID, "spanId": JROOT, "attributes": [{"key": 5, "value": {"stringValue": "x"}}]})
    assert decode_json(bad).rejected == 1


@pytest.mark.parametrize("body, signal", [
    (logs_request_json(), "logs"),
    (metrics_request_json(), "metrics"),
    (snake_case(logs_request_json()), "logs"),
    (snake_case(metrics_request_json()), "metrics"),
])
def test_logs_and_metrics_requests_are_not_traces(body, signal):
    with pytest.raises(NotTracesError, match=f"OTLP {signal}, not traces") as err:
        decode_json(json.dumps(body))
    assert isinstance(err.value, DecodeError) and "\n" not in str(err.value)
    # An empty request is still an empty traces request, not an error.
    assert decode_json(b"{}") == DecodeResult([], 0, [])


def test_oldest_start_ns_reads_only_start_times(sdk_request):
    data = sdk_request.SerializeToString()
    starts = [s.start_time_unix_nano for rs in sdk_request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert otlp.oldest_start_ns(data) == min(starts)
    assert otlp.oldest_start_ns(b"") is None
    # Spans under the removed instrumentation_library_spans (field 1000) count too.
    scope = ScopeSpans()
    scope.spans.add(trace_id=TID, span_id=SID, start_time_unix_nano=12345)
    body = scope.SerializeToString()
    rs = b"\xc2\x3e" + _varint(len(body)) + body
    legacy = b"\x0a" + _varint(len(rs)) + rs
    assert decode_protobuf(legacy).spans[0].start_ns == 12345
    assert otlp.oldest_start_ns(legacy) == 12345
    with pytest.raises(DecodeError):
        otlp.oldest_start_ns(b"\xff\xff\xff\xff not protobuf")


@pytest.mark.parametrize("where", ["startTimeUnixNano", "intValue"])
def test_a_number_too_long_for_python_is_a_decode_error_not_a_crash(where):
    digits = "9" * 5000
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x",
            "startTimeUnixNano": "1", "endTimeUnixNano": "2",
            "attributes": [{"key": "k", "value": {"intValue": "1"}}]}
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    body = body.replace('"1"', digits, 1) if where == "startTimeUnixNano" else body.replace('{"intValue": "1"}', '{"intValue": %s}' % digits)
    assert digits in body
    with pytest.raises(DecodeError, match="4300 digits"):
        decode_json(body.encode())
