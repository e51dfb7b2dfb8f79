"""Building the OTLP protobuf messages: attribute values (shared where they recur) and
one ``ExportTraceServiceRequest`` with its spans grouped by service instance."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from .profiles import NAMESPACE, SCOPE_NAME

_KV_CACHE: dict[tuple[str, Any], KeyValue] = {}


def _any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def _kv(key: str, value: Any) -> KeyValue:
    """A KeyValue, shared for recurring (key, value) pairs (appending copies it)."""
    ck = (key, type(value), value)
    kv = _KV_CACHE.get(ck)
    if kv is None:
        kv = KeyValue(key=key, value=_any(value))
        if len(_KV_CACHE) < 50_000:
            _KV_CACHE[ck] = kv
    return kv


def _int_kv(key: str, value: int) -> KeyValue:
    """A KeyValue for a value too varied to share (token counts, sizes)."""
    return KeyValue(key=key, value=AnyValue(int_value=value))


def _str_kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


class _Request:
    """One ExportTraceServiceRequest being built; spans grouped by (service, instance)."""

    __slots__ = ("msg", "_containers", "n_spans", "n_traces", "n_requests", "last_end_ns")

    def __init__(self) -> None:
        self.msg = ExportTraceServiceRequest()
        self._containers: dict[tuple[str, str], Any] = {}
        self.n_spans = 0
        self.n_traces = 0  # every trace, the usage consumers' included
        self.n_requests = 0  # the users' requests (one trace each)
        self.last_end_ns = 0

    def container(self, service: str, instance: str):
        key = (service, instance)
        c = self._containers.get(key)
        if c is None:
            rs = self.msg.resource_spans.add()
            rs.resource.attributes.extend((
                _kv("service.name", service), _kv("service.instance.id", instance),
                _kv("service.namespace", NAMESPACE), _kv("deployment.environment.name", "demo"),
            ))
            ss = rs.scope_spans.add()
            ss.scope.name = SCOPE_NAME
            c = self._containers[key] = ss.spans
        return c

    def serialize(self) -> bytes:
        return self.msg.SerializeToString()


# One span of a trace under construction, times in seconds from the trace's start:
# [service, span_id, parent_id, name, kind, start, end, attrs(list of KeyValue), status, message]
_SVC, _SID, _PARENT, _NAME, _KIND, _START, _END, _ATTRS, _STATUS, _MSG = range(10)
