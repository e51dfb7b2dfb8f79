"""Local gRPC stand-ins for Cloud Trace v1 and Cloud Monitoring v3, for the real client libraries.

Each is a ``grpc.server`` on 127.0.0.1 with generic handlers that (de)serialize with the
proto-plus types, so the clients talk to it exactly as to Google (plaintext, through
``MODALSCOPE_CLOUD_*_ENDPOINT`` or a transport on ``grpc.insecure_channel``).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent import futures

import grpc
from google.cloud import monitoring_v3, trace_v1
from google.protobuf import empty_pb2
from google.protobuf.timestamp_pb2 import Timestamp

NS = 1_000_000_000


def _ts(ns: int) -> Timestamp:
    return Timestamp(seconds=ns // NS, nanos=ns % NS)


def _ns(ts) -> int:
    pb = ts if hasattr(ts, "seconds") and hasattr(ts, "nanos") else None
    if pb is not None:
        return pb.seconds * NS + pb.nanos
    return int(ts.timestamp() * NS)  # DatetimeWithNanoseconds


def make_span(span_id: int, name: str, start_ns: int, end_ns: int, *, parent: int = 0, kind: int = 0,
              labels: dict[str, str] | None = None) -> trace_v1.TraceSpan:
    return trace_v1.TraceSpan(span_id=span_id, parent_span_id=parent, name=name, kind=kind,
                              start_time=_ts(start_ns), end_time=_ts(end_ns), labels=labels or {})


def make_trace(project: str, trace_id: str, spans: list[trace_v1.TraceSpan]) -> trace_v1.Trace:
    return trace_v1.Trace(project_id=project, trace_id=trace_id, spans=spans)


class _Server:
    def __init__(self, service: str, methods: dict) -> None:
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def start(self):
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class FakeCloudTrace(_Server):
    """``TraceService/ListTraces`` over stored traces.

    A trace is listed when its last span end lies in [start_time, end_time] (both inclusive)
    and, with a ``latency:Nms`` filter, when its root lasts at least that long; results are
    in trace-id order, ``page_size`` a page, with offset page tokens. ``errors`` is a queue of
    status codes answered (one a call) before any real answer. ``requests`` records every call.
    """

    def __init__(self) -> None:
        super().__init__("google.devtools.cloudtrace.v1.TraceService", {
            "ListTraces": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=trace_v1.ListTracesRequest.deserialize,
                response_serializer=trace_v1.ListTracesResponse.serialize),
        })
        self.traces: list[trace_v1.Trace] = []
        self.errors: deque = deque()
        self.requests: list[trace_v1.ListTracesRequest] = []
        self.call_times: list[float] = []

    def add(self, *traces: trace_v1.Trace) -> None:
        with self.lock:
            self.traces.extend(traces)

    @staticmethod
    def _latency_ns(trace: trace_v1.Trace) -> int:
        roots = [s for s in trace.spans if not s.parent_span_id] or list(trace.spans)
        return max(_ns(s.end_time) - _ns(s.start_time) for s in roots)

    def _list(self, request: trace_v1.ListTracesRequest, context) -> trace_v1.ListTracesResponse:
        import time

        with self.lock:
            self.requests.append(request)
            self.call_times.append(time.monotonic())
            if self.errors:
                code = self.errors.popleft()
                context.abort(code, f"stand-in says {code.name}")
            start = _ns(trace_v1.ListTracesRequest.pb(request).start_time)
            end = _ns(trace_v1.ListTracesRequest.pb(request).end_time)
            min_latency = 0
            for term in request.filter.split():
                if term.startswith("latency:") and term.endswith("ms"):
                    min_latency = int(term[len("latency:"):-2]) * 1_000_000
            matching = sorted(
                (t for t in self.traces
                 if start <= max(_ns(trace_v1.TraceSpan.pb(s).end_time) for s in t.spans) <= end
                 and self._latency_ns(t) >= min_latency),
                key=lambda t: t.trace_id)
            size = request.page_size or 100
            offset = int(request.page_token or 0)
            page = matching[offset : offset + size]
            token = str(offset + size) if offset + size < len(matching) else ""
            return trace_v1.ListTracesResponse(traces=page, next_page_token=token)


class FakeMonitoring(_Server):
    """``MetricService`` descriptors and ``CreateTimeSeries``, as Cloud Monitoring checks them:
    at most 200 series a request, one point a series, each series' points in time order."""

    def __init__(self) -> None:
        ms = monitoring_v3.types
        super().__init__("google.monitoring.v3.MetricService", {
            "CreateMetricDescriptor": grpc.unary_unary_rpc_method_handler(
                self._create_descriptor, request_deserializer=ms.CreateMetricDescriptorRequest.deserialize,
                response_serializer=lambda d: d.SerializeToString()),
            "CreateTimeSeries": grpc.unary_unary_rpc_method_handler(
                self._create_time_series, request_deserializer=ms.CreateTimeSeriesRequest.deserialize,
                response_serializer=lambda e: e.SerializeToString()),
        })
        self.descriptor_requests: list = []
        self.descriptors: dict[str, object] = {}
        self.series_requests: list = []
        self.points: dict[tuple, list[tuple[int, float]]] = {}  # (type, labels) -> [(end_ns, value)]
        self.errors: deque = deque()

    def _create_descriptor(self, request, context):
        from google.api import metric_pb2

        with self.lock:
            self.descriptor_requests.append(request)
            d = request.metric_descriptor
            if d.type in self.descriptors:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"{d.type} exists")
            self.descriptors[d.type] = d
            return type(request.metric_descriptor).pb(d) if not isinstance(d, metric_pb2.MetricDescriptor) else d

    def _create_time_series(self, request, context):
        with self.lock:
            if self.errors:
                code = self.errors.popleft()
                context.abort(code, f"stand-in says {code.name}")
            if len(request.time_series) > 200:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "at most 200 time series a request")
            keys = []
            for ts in request.time_series:
                if ts.resource.type != "global":
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"resource {ts.resource.type}")
                if len(ts.points) != 1:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "exactly one point a series")
                key = (ts.metric.type, tuple(sorted(ts.metric.labels.items())))
                if key in keys:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a series twice in one request")
                keys.append(key)
                p = ts.points[0]
                pb = type(p).pb(p)
                end = pb.interval.end_time.seconds * NS + pb.interval.end_time.nanos
                if pb.interval.HasField("start_time") and pb.interval.start_time != pb.interval.end_time:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "GAUGE: start must equal end")
                prev = self.points.get(key)
                if prev and prev[-1][0] >= end:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "points must be written in order")
                which = pb.value.WhichOneof("value")
                value = getattr(pb.value, which)
                self.points.setdefault(key, []).append((end, float(value)))
            self.series_requests.append(request)
            return empty_pb2.Empty()
