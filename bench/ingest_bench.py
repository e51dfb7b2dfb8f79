"""Ingest throughput: OTLP protobuf over HTTP into SQLite, whole pipeline vs a bare loop.

    .venv/bin/python bench/ingest_bench.py [--requests 120] [--spans-per-request 5000]

Both sides get the same pre-serialised ExportTraceServiceRequest payloads in the same run:

* **bare**: one thread — protobuf parse, flatten to rows, one ``executemany`` a request into
  an indexed SQLite table (unique (trace_id, span_id), index on start), commit a request.
* **pipeline**: ``modalscope ingest otlp`` in its own process on a fresh SQLite file; client
  threads POST the payloads to ``/v1/traces``. Throughput counts spans acknowledged (200 =
  committed) per second of wall time; "settled" is when every trace has also been folded
  into the rollups. Peak RSS of the ingest process is read from /proc (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

SERVICES = {
    "gateway": ["POST /v1/chat", "auth.Check", "vision.Encode", "fusion.align", "llm.generate"],
    "vision-encoder": ["VisionEncoder/Encode", "image.decode", "image.resize", "vit.forward", "vit.mlp"],
    "llm": ["llm.prefill", "llm.decode_step", "kv_cache.read"],
}


def make_payloads(n_requests: int, spans_per_request: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    now = time.time_ns() - 3_600_000_000_000
    payloads = []
    for r in range(n_requests):
        req = ExportTraceServiceRequest()
        by_service = {}
        for svc in SERVICES:
            rs = req.resource_spans.add()
            rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=svc)))
            rs.resource.attributes.append(KeyValue(key="service.instance.id", value=AnyValue(string_value=f"{svc}-{r % 4}")))
            by_service[svc] = rs.scope_spans.add()
        made = 0
        while made < spans_per_request:
            tid = rng.getrandbits(128).to_bytes(16, "big")
            start = now + r * 1_000_000_000 + rng.randrange(1_000_000_000)
            root = rng.getrandbits(64).to_bytes(8, "big")
            n = min(16, spans_per_request - made)
            for i in range(n):
                svc = list(SERVICES)[i % 3]
                s = by_service[svc].spans.add()
                s.trace_id = tid
                s.span_id = root if i == 0 else rng.getrandbits(64).to_bytes(8, "big")
                if i:
                    s.parent_span_id = root
                s.name = SERVICES[svc][i % len(SERVICES[svc])]
                s.kind = 2 if i == 0 else (3 if i % 5 == 1 else 1)
                s.start_time_unix_nano = start + i * 1_000_000
                s.end_time_unix_nano = start + i * 1_000_000 + rng.randrange(1_000_000, 900_000_000)
                for k, v in (("mm.image_count", 1), ("batch.size", rng.randrange(1, 9)), ("rpc.system", "grpc"),
                             ("gpu.cuda_graph", "captured"), ("user_tier", "gold")):
                    s.attributes.append(KeyValue(key=k, value=AnyValue(int_value=v) if isinstance(v, int) else AnyValue(string_value=v)))
            made += n
        payloads.append(req.SerializeToString())
    return payloads


def _any(v):
    w = v.WhichOneof("value")
    return getattr(v, w) if w else None


def bare_loop(payloads: list[bytes], path: str) -> tuple[int, float]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("""CREATE TABLE spans (id INTEGER PRIMARY KEY, trace_id TEXT, span_id TEXT, parent_span_id TEXT,
        service TEXT, name TEXT, kind INTEGER, start_ns INTEGER, duration_ns INTEGER, status INTEGER,
        attributes TEXT, UNIQUE(trace_id, span_id))""")
    conn.execute("CREATE INDEX ix_start ON spans(start_ns)")
    n = 0
    t0 = time.perf_counter()
    for data in payloads:
        req = ExportTraceServiceRequest.FromString(data)
        rows = []
        for rs in req.resource_spans:
            service = next((_any(a.value) for a in rs.resource.attributes if a.key == "service.name"), "unknown")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    rows.append((s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex() or None, service, s.name,
                                 s.kind, s.start_time_unix_nano, s.end_time_unix_nano - s.start_time_unix_nano,
                                 s.status.code, orjson.dumps({a.key: _any(a.value) for a in s.attributes}).decode()))
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO spans (trace_id, span_id, parent_span_id, service, name, kind, start_ns, "
                         "duration_ns, status, attributes) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
        conn.execute("COMMIT")
        n += len(rows)
    elapsed = time.perf_counter() - t0
    conn.close()
    return n, elapsed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pipeline(payloads: list[bytes], workdir: str, clients: int) -> dict:
    db = os.path.join(workdir, "pipeline.db")
    http_port, grpc_port = _free_port(), _free_port()
    env = {**os.environ, "MODALSCOPE_DATABASE_URL": f"sqlite:///{db}", "MODALSCOPE_OTLP_HTTP_PORT": str(http_port),
           "MODALSCOPE_OTLP_GRPC_PORT": str(grpc_port),
           "MODALSCOPE_SETTLE_SECONDS": os.environ.get("BENCH_SETTLE_SECONDS", "1")}
    cmd = [sys.executable, "-m", "modalscope", "ingest", "otlp"]
    if os.environ.get("BENCH_PYSPY"):  # profile the receiver: BENCH_PYSPY=out.txt
        cmd = ["py-spy", "record", "--format", "raw", "-o", os.environ["BENCH_PYSPY"], "--", *cmd]
    proc = subprocess.Popen(cmd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{http_port}/v1/traces"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                requests.post(url, data=b"", headers={"Content-Type": "application/x-protobuf"}, timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.2)
        local = threading.local()
        retries = [0]

        def send(data: bytes) -> None:
            session = getattr(local, "s", None) or requests.Session()
            local.s = session
            while True:
                r = session.post(url, data=data, headers={"Content-Type": "application/x-protobuf"}, timeout=120)
                if r.status_code == 200:
                    return
                if r.status_code in (429, 503):
                    retries[0] += 1
                    time.sleep(float(r.headers.get("Retry-After", "1")))
                    continue
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")

        n = sum(len(ExportTraceServiceRequest.FromString(p).resource_spans[0].scope_spans[0].spans) for p in payloads[:0])
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(send, payloads))
        acked = time.perf_counter() - t0
        # Wait until every trace is settled (rollups complete).
        conn = sqlite3.connect(db)
        while not os.environ.get("BENCH_ACK_ONLY"):
            pending = conn.execute("SELECT count(*) FROM traces WHERE pending").fetchone()[0]
            if pending == 0:
                break
            time.sleep(0.2)
        settled = time.perf_counter() - t0
        spans = conn.execute("SELECT count(*) FROM spans").fetchone()[0]
        conn.close()
        rss = _peak_rss_mb(proc.pid)
        del n
        return {"spans": spans, "acked_s": acked, "settled_s": settled, "peak_rss_mb": rss, "retries": retries[0]}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--spans-per-request", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    payloads = make_payloads(args.requests, args.spans_per_request)
    total = args.requests * args.spans_per_request
    with tempfile.TemporaryDirectory() as d:
        n, bare_s = bare_loop(payloads, os.path.join(d, "bare.db"))
        res = pipeline(payloads, d, args.clients)
    bare_rate = n / bare_s
    acked_rate = res["spans"] / res["acked_s"]
    settled_rate = res["spans"] / res["settled_s"]
    print(f"spans: {total} in {args.requests} requests of {args.spans_per_request}; {os.cpu_count()} cores")
    print("| measure | spans/s | vs bare |")
    print("|---|---|---|")
    print(f"| bare loop (parse + flatten + executemany, 1 thread) | {bare_rate:,.0f} | 1.00x |")
    print(f"| pipeline, acknowledged (HTTP 200 = committed) | {acked_rate:,.0f} | {acked_rate / bare_rate:.2f}x |")
    print(f"| pipeline, settled (traces + rollups complete) | {settled_rate:,.0f} | {settled_rate / bare_rate:.2f}x |")
    print(f"ingest process peak RSS: {res['peak_rss_mb']:.0f} MB; 429/503 retries: {res['retries']}; stored spans {res['spans']}")


if __name__ == "__main__":
    main()
