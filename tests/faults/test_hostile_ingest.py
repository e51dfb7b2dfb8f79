"""Hostile traffic against `modalscope ingest otlp`, with no ingest token to stop it: gRPC
calls that announce a message and never send it, HTTP connections that hold a request head
open, and legal 16 MiB requests of one span with a four-million-element array. Meanwhile a
real OTel SDK exporter must get its answers within its own timeout, the receiver's memory
must stay under the design's 300 MB, and what is stored is cut to the value limits."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import requests
from opentelemetry.sdk.trace.export import SpanExportResult
from sqlalchemy import select

from modalscope.ingest.otlp import MAX_VALUE_ITEMS, TRUNCATED_KEY
from modalscope.ingest.otlp_grpc import FULL_METHOD, MAX_RECEIVING
from modalscope.ingest.otlp_http import MAX_CONNECTIONS
from modalscope.models import Span
from tests.ingest.test_otlp_decode import _varint
from tests.faults.helpers import (
    StreamingClient,
    batches_of,
    grpc_exporter,
    http_exporter,
    make_traces,
    rss_mb,
    span_keys,
    start_ingest,
    stored_keys,
)

#: The design's bound on the receiver under any mix of legal requests (these requests once took
#: it to gigabytes); bench/hostile_ingest_bench.py records the peaks in docs/benchmarks.md.
RSS_LIMIT_MB = 300
#: An exporter's own timeout: "its normal time".
EXPORT_TIMEOUT = 10.0


def _export_within_timeout(exporter, spans) -> float:
    started = time.monotonic()
    result = exporter.export(spans)
    elapsed = time.monotonic() - started
    assert result == SpanExportResult.SUCCESS
    assert elapsed < EXPORT_TIMEOUT, elapsed
    return elapsed


def test_grpc_calls_that_never_send_their_message_do_not_starve_an_exporter(db_url, procs, store):
    ingest, _, grpc_port = start_ingest(procs, db_url)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    never = threading.Event()

    def headers_only():  # the call's headers go out; its message never does
        never.wait(60)
        return
        yield  # noqa: unreachable - makes this a generator

    stalled = channel.stream_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
    calls = [stalled.future(headers_only(), timeout=50) for _ in range(2 * MAX_RECEIVING)]
    exporter = grpc_exporter(grpc_port, timeout=EXPORT_TIMEOUT)
    try:
        # Past the receiving slots, calls are refused at once with a retry hint.
        deadline = time.monotonic() + 20
        while sum(c.done() for c in calls) < MAX_RECEIVING and time.monotonic() < deadline:
            time.sleep(0.05)
        ended = [c.exception().code() for c in calls if c.done()]
        assert ended.count(grpc.StatusCode.UNAVAILABLE) >= MAX_RECEIVING, ended
        # The exporter is refused while the stalled calls are young, and they are cancelled
        # to make room once they have waited longer than an exporter's message ever takes.
        spans = make_traces(3, seed=11)
        flat = [s for t in spans for s in t]
        _export_within_timeout(exporter, flat)
        for call in calls:
            code = call.exception(timeout=30).code()
            assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), code
    finally:
        never.set()
        exporter.shutdown()
        channel.close()
    assert set(stored_keys(store)) == span_keys(flat)
    assert ingest.popen.poll() is None


def _held_head(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # ... and the rest never comes
    return sock


def test_http_connections_holding_their_head_do_not_starve_an_exporter(db_url, procs, store):
    ingest, http_port, _ = start_ingest(procs, db_url)
    held = [_held_head(http_port) for _ in range(MAX_CONNECTIONS)]
    extra = []
    exporter = http_exporter(http_port, timeout=EXPORT_TIMEOUT)
    try:
        # Past the cap a connection is answered 503 with Retry-After, and closed.
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", http_port), timeout=30)
            extra.append(sock)
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer:
                data = sock.recv(4096)
                if not data:
                    break
                answer += data
            head = answer.split(b"\r\n\r\n")[0].decode()
            if head.startswith("HTTP/1.1 503"):
                assert "Retry-After: 1" in head
                break
        else:
            raise AssertionError(f"no connection past the cap was refused: {head!r}")
        spans = [s for t in make_traces(3, seed=12) for s in t]
        _export_within_timeout(exporter, spans)
    finally:
        exporter.shutdown()
        for sock in held + extra:
            sock.close()
    assert set(stored_keys(store)) == span_keys(spans)
    assert ingest.popen.poll() is None


# --------------------------------------------------------------------------- huge values


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def huge_array_request(trace_id: bytes, elements: int = 4_000_000) -> bytes:
    """An ExportTraceServiceRequest of one span whose attribute ``samples`` is an array of
    ``elements`` ints, encoded by hand (building it with protobuf takes seconds)."""
    array = _field(1, b"\x18\x01") * elements  # ArrayValue.values: AnyValue{int_value: 1}
    attribute = _field(1, b"samples") + _field(2, _field(5, array))  # KeyValue{key, AnyValue{array}}
    now = time.time_ns()
    span = (_field(1, trace_id) + _field(2, b"\x07" * 8) + _field(5, b"audio.decode")
            + b"\x39" + now.to_bytes(8, "little") + b"\x41" + (now + 1_000_000).to_bytes(8, "little")
            + _field(9, attribute))
    service = _field(1, b"service.name") + _field(2, _field(1, b"audio-frontend"))
    resource = _field(1, service)
    return _field(1, _field(1, resource) + _field(2, _field(2, span)))


def test_huge_arrays_keep_the_receiver_small_while_an_exporter_is_answered(db_url, procs, store):
    ingest, http_port, grpc_port = start_ingest(procs, db_url)
    baseline_mb, _ = rss_mb(ingest.pid)
    traces = make_traces(60, seed=13)
    client = StreamingClient(http_exporter(http_port, timeout=EXPORT_TIMEOUT), batches_of(traces, 3),
                             pause=0.05, deadline=120, name="exporter")
    trace_ids = [bytes([i + 1]) * 16 for i in range(16)]
    bodies = {tid: huge_array_request(tid) for tid in trace_ids}
    assert all(len(b) > 15 * 2**20 for b in bodies.values())

    def over_http(tid: bytes) -> int:
        for _ in range(30):  # a refused request is resent, as an exporter would
            resp = requests.post(f"http://127.0.0.1:{http_port}/v1/traces", data=bodies[tid], timeout=60,
                                 headers={"Content-Type": "application/x-protobuf"})
            if resp.status_code not in (429, 503):
                return resp.status_code
            time.sleep(float(resp.headers.get("Retry-After", "1")))
        return resp.status_code

    def over_grpc(tid: bytes) -> str:
        # a connection each, as separate clients would have (grpc shares one by default)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}",
                                   options=[("grpc.max_send_message_length", 32 * 2**20),
                                            ("grpc.use_local_subchannel_pool", 1)]) as channel:
            export = channel.unary_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
            for _ in range(30):
                try:
                    export(bodies[tid], timeout=60)
                    return "OK"
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        return exc.code().name
                    time.sleep(1)
        return "UNAVAILABLE"

    peak = [0.0]
    sampling = threading.Event()

    def sample():
        while not sampling.wait(0.05):
            peak[0] = max(peak[0], rss_mb(ingest.pid)[1])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    client.start()
    with ThreadPoolExecutor(16) as pool:
        http_results = list(pool.map(over_http, trace_ids[:8]))
        grpc_results = list(pool.map(over_grpc, trace_ids[8:]))
    client.join(150)
    sampling.set()
    sampler.join()
    _, hwm_mb = rss_mb(ingest.pid)
    assert http_results == [200] * 8, http_results
    assert grpc_results == ["OK"] * 8, grpc_results
    assert not client.is_alive() and not client.failed, (client.acked, client.failed)
    assert len(client.acked) == len(client.batches)
    assert hwm_mb < RSS_LIMIT_MB, (baseline_mb, hwm_mb)
    print(f"receiver RSS {baseline_mb:.0f} MB at start, peak {hwm_mb:.0f} MB; exporter resends {client.resends}")
    with store.connect() as conn:
        rows = conn.execute(select(Span.trace_id, Span.attributes).where(Span.name == "audio.decode")).all()
    assert {r.trace_id for r in rows} == {tid.hex() for tid in trace_ids}
    for row in rows:
        attributes = json.loads(row.attributes)
        assert attributes["samples"] == [1] * MAX_VALUE_ITEMS
        assert attributes[TRUNCATED_KEY] == ["samples"]
