"""Crash safety: a receiver, the Cloud Trace poller and `modalscope import`, each SIGKILLed
in the middle of its work (the whole process group, as a container runtime or the OOM killer
does) and started again, end with every span stored exactly once and every trace settled,
on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from sqlalchemy import func, select

from modalscope.ingest.cursors import Lease, holder_is_dead, read_cursor
from modalscope.models import Span
from tests.cloud_standins import FakeCloudTrace, make_span, make_trace
from tests.faults.helpers import (
    StreamingClient,
    assert_exactly_once,
    batches_of,
    clean_env,
    grpc_exporter,
    http_exporter,
    make_traces,
    otlp_json_request,
    restart_ingest,
    span_keys,
    start_ingest,
    wait_settled,
    wait_until,
    write_lock,
)

NS = 1_000_000_000


def _span_count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Span)).scalar_one()


def test_receiver_killed_mid_stream_and_restarted_stores_every_span_once(db_url, procs, store):
    ingest, http_port, grpc_port = start_ingest(procs, db_url, name="ingest-1")
    traces = make_traces(160, seed=1)
    clients = [
        StreamingClient(http_exporter(http_port), batches_of(traces[:80], 8), pause=0.05, name="http"),
        StreamingClient(grpc_exporter(grpc_port), batches_of(traces[80:], 8), pause=0.05, name="grpc"),
    ]
    for client in clients:
        client.start()
    wait_until(lambda: all(len(c.acked) >= 3 for c in clients), 60, "the first batches acknowledged")

    # Hold the store's write lock, so that at the kill both clients have a request the
    # receiver took but could not commit: it must not be acknowledged, and the client's
    # retry after the restart must store it once.
    with write_lock(db_url):
        wait_until(lambda: all(c.sending is not None and time.monotonic() - c.sending_since > 0.5 for c in clients),
                   30, "a request of each client waiting for the store")
        acked_before_kill = {c.name: len(c.acked) for c in clients}
        ingest.kill()
    # Everything acknowledged was stored; the requests held at the kill were not acknowledged.
    assert _span_count(store) >= sum(n * 8 * 7 for n in acked_before_kill.values())
    assert {c.name: len(c.acked) for c in clients} == acked_before_kill

    restarted = restart_ingest(procs, db_url, http_port, grpc_port, "ingest-2")
    for client in clients:
        client.join(120)
        assert not client.is_alive() and not client.failed, client.name
        assert len(client.acked) == len(client.batches) == 10
    expected = set().union(*(c.all_keys() for c in clients))
    wait_settled(store, 160)
    assert_exactly_once(store, expected)

    restarted.signal_group(signal.SIGTERM)
    assert restarted.wait(60) == 0, restarted.stderr[-3000:]


# -- Cloud Trace ---------------------------------------------------------------------------

PROJECT = "faults-proj"


def _cloud_traces(first_index: int, n: int, last_end_ns: int) -> list:
    """``n`` three-span image traces whose ends step back from ``last_end_ns`` 100 ms apart."""
    out = []
    for k in range(n):
        i = first_index + k
        end = last_end_ns - (n - k) * NS // 10
        start = end - 400_000_000
        out.append(make_trace(PROJECT, f"{i + 1:032x}", [
            make_span(1, "Recv./generate", start, end, kind=1,
                      labels={"service.name": "gateway", "mm.image_count": "1"}),
            make_span(2, "Sent./encode", start + 1_000_000, end - 1_000_000, parent=1, kind=2,
                      labels={"service.name": "gateway"}),
            make_span(3, "vit.forward", start + 2_000_000, end - 2_000_000, parent=2, kind=1,
                      labels={"service.name": "vision-encoder"}),
        ]))
    return out


def test_cloud_trace_poller_killed_mid_pass_resumes_from_its_watermark(db_url, procs, store):
    now = time.time_ns()
    # The 1 h backfill is two 30-minute slices; the watermark moves after each. 30 traces
    # end in the first slice, 50 in the second: pages of 10, 0.25 s apart.
    older = _cloud_traces(0, 30, now - 45 * 60 * NS)
    newer = _cloud_traces(1000, 50, now - 60 * NS)
    expected = {(t.trace_id, f"{s.span_id:016x}") for t in older + newer for s in t.spans}
    args = ["ingest", "cloud-trace", "--once", "--page-size", "10", "--calls-per-minute", "240"]
    with FakeCloudTrace() as fake:
        fake.add(*older, *newer)
        env = clean_env(MODALSCOPE_DATABASE_URL=db_url, MODALSCOPE_CLOUD_TRACE_ENDPOINT=fake.endpoint,
                        GOOGLE_CLOUD_PROJECT=PROJECT)
        first = procs.start(args, env, "poller-1")
        # Three pages of the first slice, then two of the second: killed mid-slice.
        wait_until(lambda: len(fake.requests) >= 5 or first.poll() is not None, 60, "five ListTraces calls")
        first.kill()
        assert first.popen.returncode == -signal.SIGKILL

        cursor = read_cursor(store, "cloud-trace:" + PROJECT)
        window_start = fake.requests[0].start_time.timestamp() * NS
        assert abs(cursor.position - (window_start + 1800 * NS)) < 1e6  # the first slice is checkpointed
        assert cursor.holder is not None  # the dead poller's lease was never released
        stored_at_kill = _span_count(store)
        assert 90 <= stored_at_kill < len(expected)
        calls_before = len(fake.requests)

        second = procs.start(args, env, "poller-2")
        assert second.wait(90) == 0, second.stderr[-3000:]
        # It took the dead process's lease over at once and resumed at the watermark minus
        # the 2-minute overlap: nothing before it read again, nothing after it skipped.
        resumed = fake.requests[calls_before]
        assert abs(resumed.start_time.timestamp() * NS - (cursor.position - 120 * NS)) < 1e6
        assert f"({len(expected) - stored_at_kill} new)" in second.stdout, second.stdout
    assert_exactly_once(store, expected, spans_per_trace=3)
    assert read_cursor(store, "cloud-trace:" + PROJECT).holder is None


# -- import ---------------------------------------------------------------------------------

# The importer commits up to 20,000 spans at a time, more than this test's file: the first
# run commits 1,000 at a time, with 1,000 decoded ahead, so that the kill lands mid-file.
SMALL_COMMITS_IMPORT = """
import modalscope.ingest.importer as importer
importer.BATCH_SPANS = 250
importer.MAX_QUEUED_SPANS = importer.MAX_QUEUED_JSON_SPANS = 1000
from modalscope.cli import main
raise SystemExit(main())
"""


def test_interrupted_import_rerun_stores_every_span_once(db_url, procs, store, tmp_path):
    traces = make_traces(2000, seed=3)  # 14,000 spans
    path = tmp_path / "spans.jsonl"
    with open(path, "w") as fh:
        for batch in batches_of(traces, 20):
            fh.write(json.dumps(otlp_json_request(batch)) + "\n")
    expected = set().union(*(span_keys(t) for t in traces))
    env = clean_env(MODALSCOPE_DATABASE_URL=db_url)

    first = procs.start(["import", str(path)], env, "import-1", entry=["-c", SMALL_COMMITS_IMPORT])
    wait_until(lambda: _span_count(store) > 0 or first.poll() is not None, 120, "the first commit")
    # The next commit waits for the lock; the importer is killed mid-file.
    with write_lock(db_url):
        time.sleep(0.3)
        first.kill()
    stored = _span_count(store)
    assert 0 < stored < len(expected), stored

    second = procs.start(["import", str(path)], env, "import-2")
    assert second.wait(180) == 0, second.stderr[-3000:]
    assert f"imported {len(expected)} spans ({len(expected) - stored} new) in 2000 traces" in second.stdout
    assert_exactly_once(store, expected)


def test_only_a_dead_local_holder_loses_its_lease(engine):
    """The takeover behind the restart above: a holder on this host whose process is gone
    (reaped or a zombie) is dead; a live process, another host or ourselves are not."""
    host = socket.gethostname()
    reaped = subprocess.Popen([sys.executable, "-c", "pass"])
    reaped.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: open(f"/proc/{zombie.pid}/stat").read().rpartition(")")[2].split()[0] == "Z", 30,
               "the child to exit")
    try:
        assert holder_is_dead(f"{host}:{reaped.pid}:0a1b2c3d")
        assert holder_is_dead(f"{host}:{zombie.pid}:0a1b2c3d")
        assert holder_is_dead(f"{host}:{os.getpid()}:earlier", me=f"{host}:{os.getpid()}:now")  # a past run of our pid
        assert not holder_is_dead(f"{host}:{os.getppid()}:0a1b2c3d")  # alive
        assert not holder_is_dead(f"other-{host}:{reaped.pid}:0a1b2c3d")  # not ours to judge
        assert not holder_is_dead(f"{host}:{os.getpid()}:same", me=f"{host}:{os.getpid()}:same")
        assert not holder_is_dead(None) and not holder_is_dead("garbage")
        # Through the lease: the dead holder's unexpired lease is taken; a live one's is not.
        dead = Lease(engine, "cloud-trace:takeover", ttl=600, holder=f"{host}:{reaped.pid}:0a1b2c3d")
        assert dead.acquire()
        live = Lease(engine, "cloud-trace:held", ttl=600, holder=f"{host}:{os.getppid()}:0a1b2c3d")
        assert live.acquire()
        assert Lease(engine, "cloud-trace:takeover", ttl=600).acquire()
        assert not Lease(engine, "cloud-trace:held", ttl=600).acquire()
    finally:
        zombie.wait()
