"""Graceful shutdown: SIGTERM to `modalscope ingest otlp` while clients stream. Requests the
receiver already took are committed and answered before it exits (exit status 0); nothing
acknowledged is lost; what it took but had not settled settles after the next start."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import requests

from modalscope.ingest.otlp_grpc import FULL_METHOD
from tests.faults.helpers import (
    StreamingClient,
    assert_exactly_once,
    batches_of,
    grpc_exporter,
    http_exporter,
    make_traces,
    pb_payload,
    restart_ingest,
    span_keys,
    start_ingest,
    stored_keys,
    wait_settled,
    wait_until,
    write_lock,
)


def _grpc_export(port: int, payload: bytes) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
        try:
            call(payload, timeout=60)
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK


def test_sigterm_drains_requests_in_flight_and_loses_nothing_acknowledged(db_url, procs, store):
    ingest, http_port, grpc_port = start_ingest(procs, db_url)
    url = f"http://127.0.0.1:{http_port}/v1/traces"
    traces = make_traces(200, seed=11)
    held = batches_of(traces[:30], 5)  # six requests in flight when SIGTERM arrives
    clients = [
        StreamingClient(http_exporter(http_port, timeout=3), batches_of(traces[30:115], 5), pause=0.05, name="http"),
        StreamingClient(grpc_exporter(grpc_port, timeout=3), batches_of(traces[115:], 5), pause=0.05, name="grpc"),
    ]
    for client in clients:
        client.start()
    wait_until(lambda: all(len(c.acked) >= 2 for c in clients), 60, "the streams under way")

    pool = ThreadPoolExecutor(6)
    with write_lock(db_url):
        # Taken by the receiver, waiting for their commit while the store is locked.
        in_flight = [pool.submit(requests.post, url, data=pb_payload(b), timeout=60,
                                 headers={"Content-Type": "application/x-protobuf"}) for b in held[:3]]
        in_flight += [pool.submit(_grpc_export, grpc_port, pb_payload(b)) for b in held[3:]]
        time.sleep(0.5)
        ingest.popen.send_signal(signal.SIGTERM)
        time.sleep(3.0)  # stopping waits for them, however long the store takes
        assert ingest.poll() is None, "exited with requests in flight"
        assert not any(f.done() for f in in_flight)
        for client in clients:  # the streams end with the receiver: no resending after it
            client.give_up.set()
            client.stop_sending.set()
    # The store is back: the taken requests are committed and answered, then it exits.
    answers = [f.result(timeout=60) for f in in_flight]
    assert [getattr(a, "status_code", a) for a in answers] == [200] * 3 + [grpc.StatusCode.OK] * 3
    assert ingest.wait(60) == 0, ingest.stderr[-3000:]
    assert "Traceback" not in ingest.stderr
    pool.shutdown()
    for client in clients:
        client.join(60)
        assert not client.is_alive()

    acked = set().union(*(span_keys(b) for b in held), *(c.acked_keys() for c in clients))
    sent = set().union(*(span_keys(b) for b in held), *(c.all_keys() for c in clients))
    stored = stored_keys(store)
    assert acked <= set(stored), f"{len(acked - set(stored))} acknowledged spans lost"
    assert set(stored) <= sent
    # Whatever was stored but not yet settled at the stop settles after the next start.
    restarted = restart_ingest(procs, db_url, http_port, grpc_port, "ingest-2")
    wait_settled(store, len({t for t, _ in stored}))
    assert_exactly_once(store, set(stored))
    restarted.popen.send_signal(signal.SIGTERM)
    assert restarted.wait(60) == 0
