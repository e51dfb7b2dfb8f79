"""OTLP payloads built from SpanRecords, as exporters would send them (for tests)."""

from __future__ import annotations

import json
from itertools import groupby

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def _any_json(v):
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_any_json(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": _any_json(x)} for k, x in v.items()]}}
    return {"stringValue": str(v)}


def _attrs_json(d):
    return [{"key": k, "value": _any_json(v)} for k, v in d.items()]


def request_json(spans) -> dict:
    """One OTLP/JSON ExportTraceServiceRequest (hex ids, int64 as strings)."""
    resource_spans = []
    for service, group in groupby(sorted(spans, key=lambda s: s.service), key=lambda s: s.service):
        out = []
        for s in group:
            span = {
                "traceId": s.trace_id,
                "spanId": s.span_id,
                "name": s.name,
                "kind": s.kind,
                "startTimeUnixNano": str(s.start_ns),
                "endTimeUnixNano": str(s.end_ns),
                "attributes": _attrs_json(s.attributes),
                "status": {"code": s.status},
                "flags": 256,
            }
            if s.parent_span_id:
                span["parentSpanId"] = s.parent_span_id
            out.append(span)
        resource = {"service.name": service}
        resource_spans.append({"resource": {"attributes": _attrs_json(resource)},
                               "scopeSpans": [{"scope": {"name": "tests"}, "spans": out}]})
    return {"resourceSpans": resource_spans}


def request_protobuf(spans) -> bytes:
    """The same request as protobuf bytes."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def anyv(v):
        if isinstance(v, bool):
            return AnyValue(bool_value=v)
        if isinstance(v, int):
            return AnyValue(int_value=v)
        if isinstance(v, float):
            return AnyValue(double_value=v)
        return AnyValue(string_value=str(v))

    req = ExportTraceServiceRequest()
    for service, group in groupby(sorted(spans, key=lambda s: s.service), key=lambda s: s.service):
        rs = req.resource_spans.add()
        rs.resource.attributes.append(KeyValue(key="service.name", value=anyv(service)))
        ss = rs.scope_spans.add()
        for s in group:
            p = ss.spans.add()
            p.trace_id = bytes.fromhex(s.trace_id)
            p.span_id = bytes.fromhex(s.span_id)
            if s.parent_span_id:
                p.parent_span_id = bytes.fromhex(s.parent_span_id)
            p.name = s.name
            p.kind = s.kind
            p.start_time_unix_nano = s.start_ns
            p.end_time_unix_nano = s.end_ns
            p.status.code = s.status
            for k, v in s.attributes.items():
                p.attributes.append(KeyValue(key=k, value=anyv(v)))
    return req.SerializeToString()


def json_line(spans) -> str:
    return json.dumps(request_json(spans))
