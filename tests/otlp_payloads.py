"""OTLP payloads built from SpanRecords, as exporters would send them (for tests)."""

from __future__ import annotations

import json
import re
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
            if s.links:
                span["links"] = [{"traceId": ln["trace_id"], "spanId": ln["span_id"],
                                  "attributes": _attrs_json(ln["attributes"])} for ln in s.links]
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
            for ln in s.links:
                link = p.links.add(trace_id=bytes.fromhex(ln["trace_id"]), span_id=bytes.fromhex(ln["span_id"]))
                for k, v in ln["attributes"].items():
                    link.attributes.append(KeyValue(key=k, value=anyv(v)))
    return req.SerializeToString()


def json_line(spans) -> str:
    return json.dumps(request_json(spans))


_CAMEL_WORD = re.compile(r"(?<=[a-z])([A-Z])")


def snake_case(obj):
    """An OTLP/JSON request with protobuf's field names (``resource_spans``, ``trace_id``,
    ``string_value``), as some proto-JSON converters write it. Keys inside attributes are
    values of ``key`` and stay as they are."""
    if isinstance(obj, dict):
        return {_CAMEL_WORD.sub(lambda m: "_" + m.group(1).lower(), k): snake_case(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snake_case(v) for v in obj]
    return obj


def logs_request_json(n: int = 2, service: str = "gateway") -> dict:
    """An OTLP/JSON logs request, as a Collector file exporter with a logs pipeline writes it."""
    records = [{"timeUnixNano": str(1_700_000_000_000_000_000 + i), "severityNumber": 9, "severityText": "INFO",
                "body": {"stringValue": f"request {i} done"},
                "attributes": [{"key": "http.route", "value": {"stringValue": "/v1/chat"}}]} for i in range(n)]
    return {"resourceLogs": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
                              "scopeLogs": [{"scope": {"name": "app"}, "logRecords": records}]}]}


def metrics_request_json(start_ns: int = 1_000_000_000, service: str = "gateway") -> dict:
    """An OTLP/JSON metrics request (a cumulative sum: its points have start times, too)."""
    point = {"startTimeUnixNano": str(start_ns), "timeUnixNano": str(start_ns + 60_000_000_000), "asInt": "42"}
    metric = {"name": "requests", "sum": {"dataPoints": [point], "aggregationTemporality": 2, "isMonotonic": True}}
    return {"resourceMetrics": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
                                 "scopeMetrics": [{"scope": {"name": "app"}, "metrics": [metric]}]}]}
