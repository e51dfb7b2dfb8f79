"""Backpressure: while the store cannot take writes (its write lock held from another
connection), `modalscope ingest otlp` refuses what it cannot hold — 429 with Retry-After over
HTTP, UNAVAILABLE with RetryInfo over gRPC — instead of buffering without bound; its memory
stays bounded under a flood that ignores the hints; and once the store is back, the clients'
retries land everything, once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import requests
from google.rpc import error_details_pb2, status_pb2

from modalscope.ingest.otlp_grpc import FULL_METHOD
from tests.faults.helpers import (
    StreamingClient,
    assert_exactly_once,
    batches_of,
    grpc_exporter,
    http_exporter,
    make_traces,
    pb_payload,
    rss_mb,
    span_keys,
    start_ingest,
    stored_keys,
    wait_settled,
    write_lock,
)

PROTOBUF = {"Content-Type": "application/x-protobuf"}
#: The design's target for the ingest process under load (docs/design.md, Targets: memory).
RSS_LIMIT_MB = 300


def _grpc_export(port: int, payload: bytes, timeout: float = 10.0):
    """One raw Export call: (status code, trailing metadata dict)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
        try:
            call(payload, timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code(), dict(exc.trailing_metadata() or ())
        return grpc.StatusCode.OK, {}


def test_full_writer_refuses_with_retry_hints_and_retries_land_everything(db_url, procs, store):
    # Room for five requests of 35 spans (175 of 200); the sixth does not fit.
    ingest, http_port, grpc_port = start_ingest(procs, db_url, MODALSCOPE_MAX_QUEUE_SPANS="200")
    url = f"http://127.0.0.1:{http_port}/v1/traces"
    traces = make_traces(120, seed=7)
    raw = batches_of(traces[:40], 5)  # 8 requests of 35 spans
    streams = [batches_of(traces[40:80], 8), batches_of(traces[80:], 8)]

    pool = ThreadPoolExecutor(5)
    with write_lock(db_url):
        taken = [pool.submit(requests.post, url, data=pb_payload(b), headers=PROTOBUF, timeout=60) for b in raw[:5]]
        time.sleep(1.0)  # taken, and hanging: no commit while the lock is held
        assert not any(f.done() for f in taken)
        refused = [requests.post(url, data=pb_payload(b), headers=PROTOBUF, timeout=10) for b in raw[5:]]
        for resp in refused:
            assert resp.status_code == 429, resp.content
            assert int(resp.headers["Retry-After"]) >= 1
            status = status_pb2.Status.FromString(resp.content)
            assert status.code == 14 and "full" in status.message
        code, trailers = _grpc_export(grpc_port, pb_payload(raw[5]))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"]).retry_delay.seconds >= 1

        # Real exporters meet the full writer too, and back off as told.
        clients = [StreamingClient(http_exporter(http_port, timeout=60), streams[0], name="http"),
                   StreamingClient(grpc_exporter(grpc_port, timeout=60), streams[1], name="grpc")]
        for client in clients:
            client.start()
        time.sleep(1.5)
        assert not any(c.acked for c in clients)
        assert not any(f.done() for f in taken)  # nothing answered while nothing is committed
        assert sum(stored_keys(store).values()) == 0

    # The store is back: the requests taken are answered 200, the exporters' retries land.
    assert [f.result(timeout=60).status_code for f in taken] == [200] * 5
    pool.shutdown()
    for client in clients:
        client.join(90)
        assert not client.is_alive() and not client.failed and len(client.acked) == 5, client.name
    expected = set().union(*(span_keys(b) for b in raw[:5]), *(c.all_keys() for c in clients))
    wait_settled(store, 25 + 80)
    # The refused requests left nothing behind; everything acknowledged is stored once.
    assert_exactly_once(store, expected)


def test_flood_ignoring_retry_hints_keeps_receiver_memory_bounded(db_url, procs, store, record_property):
    ingest, http_port, grpc_port = start_ingest(procs, db_url)  # the default queue: 50,000 spans
    url = f"http://127.0.0.1:{http_port}/v1/traces"
    traces = make_traces(8 * 300, seed=9)
    batches = batches_of(traces, 300)  # 8 requests of 2,100 spans (~0.5 MB each), sent again and again
    payloads = [pb_payload(b) for b in batches]
    acked: set[int] = set()
    outcomes: dict[str, int] = {}
    lock = threading.Lock()
    flooding = threading.Event()
    flooding.set()

    def note(key: str, index: int | None = None) -> None:
        with lock:
            outcomes[key] = outcomes.get(key, 0) + 1
            if index is not None:
                acked.add(index)

    def http_flood(k: int) -> None:
        session = requests.Session()
        i = k
        while flooding.is_set():
            try:  # a hostile client: no back-off, whatever Retry-After says
                resp = session.post(url, data=payloads[i % 8], headers=PROTOBUF, timeout=90)
                note(str(resp.status_code), i % 8 if resp.status_code == 200 else None)
            except requests.RequestException as exc:
                note(exc.__class__.__name__)
            i += 1

    def grpc_flood(k: int) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            call = channel.unary_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
            i = k
            while flooding.is_set():
                try:
                    call(payloads[i % 8], timeout=90)
                    note("grpc OK", i % 8)
                except grpc.RpcError as exc:
                    note(f"grpc {exc.code().name}")
                i += 1

    idle_rss, _ = rss_mb(ingest.pid)
    samples = []
    threads = [threading.Thread(target=http_flood, args=(k,), daemon=True) for k in range(96)]
    threads += [threading.Thread(target=grpc_flood, args=(k,), daemon=True) for k in range(24)]
    with write_lock(db_url):
        for t in threads:
            t.start()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            samples.append(rss_mb(ingest.pid)[0])
            time.sleep(0.1)
        refused_while_locked = dict(outcomes)
    # Released: the backlog is written while the flood goes on a little longer.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        samples.append(rss_mb(ingest.pid)[0])
        time.sleep(0.1)
    flooding.clear()
    for t in threads:
        t.join(120)
    _, peak = rss_mb(ingest.pid)
    record_property("ingest_idle_rss_mb", round(idle_rss, 1))
    record_property("ingest_peak_rss_mb", round(peak, 1))
    print(f"\ningest RSS under a flood with the store locked: idle {idle_rss:.0f} MB, "
          f"peak {peak:.0f} MB (VmHWM), outcomes {outcomes}")

    assert refused_while_locked.get("429", 0) > 0 and refused_while_locked.get("grpc UNAVAILABLE", 0) > 0
    assert "200" not in refused_while_locked and "grpc OK" not in refused_while_locked
    assert peak < RSS_LIMIT_MB, f"ingest peaked at {peak:.0f} MB"
    assert ingest.poll() is None
    # Everything acknowledged is stored, once, and settles.
    expected = set().union(*(span_keys(batches[i]) for i in acked))
    assert acked and len(expected) == 2100 * len(acked)
    wait_settled(store, 300 * len(acked))
    assert_exactly_once(store, expected)
