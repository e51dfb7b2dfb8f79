"""Hostile traffic against `modalscope ingest otlp` (no ingest token), with a well-behaved
OpenTelemetry SDK exporter sending small batches meanwhile:

* ``arrays-http`` / ``arrays-grpc``: ``--parallel`` legal 16 MiB requests at once, each one
  span with a four-million-element array (sent ``--rounds`` times);
* ``stalled-grpc``: twice the receiving slots of gRPC calls that announce a message and never
  send it;
* ``held-heads``: as many HTTP connections as the cap, each holding a request head open.

For each: the receiver process's RSS at start and its peak (VmHWM), and the exporter's export
latencies (median, max) and failures. Usage::

    .venv/bin/python bench/hostile_ingest_bench.py [--parallel 8] [--rounds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402
import requests  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExportResult  # noqa: E402

from bench.benchlib import machine_info  # noqa: E402
from modalscope.ingest.otlp_grpc import FULL_METHOD, MAX_RECEIVING  # noqa: E402
from modalscope.ingest.otlp_http import MAX_CONNECTIONS  # noqa: E402
from modalscope.models.schema import ensure_schema  # noqa: E402
from tests.faults.helpers import Processes, grpc_exporter, http_exporter, make_traces, rss_mb, start_ingest  # noqa: E402
from tests.faults.test_hostile_ingest import huge_array_request  # noqa: E402


class Exporter(threading.Thread):
    """Exports small batches back to back until stopped, timing each export."""

    def __init__(self, exporter, seed: int) -> None:
        super().__init__(daemon=True)
        self.exporter = exporter
        self.batches = [[s for t in make_traces(3, seed=seed + i) for s in t] for i in range(400)]
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        for batch in self.batches:
            if self.stop.is_set():
                break
            t0 = time.monotonic()
            ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
            self.latencies.append(time.monotonic() - t0)
            self.failures += not ok
            time.sleep(0.05)


def _scenario(name: str, db_url: str, work: Path, attack, exporter_kind: str) -> dict:
    procs = Processes(work)
    try:
        ingest, http_port, grpc_port = start_ingest(procs, db_url, name=name)
        start_mb, _ = rss_mb(ingest.pid)
        make = http_exporter if exporter_kind == "http" else grpc_exporter
        client = Exporter(make(http_port if exporter_kind == "http" else grpc_port, timeout=10.0), seed=len(name))
        client.start()
        t0 = time.monotonic()
        outcome = attack(http_port, grpc_port)
        attack_s = time.monotonic() - t0
        client.stop.set()
        client.join(60)
        _, peak_mb = rss_mb(ingest.pid)
        lat = sorted(client.latencies)
        return {"scenario": name, "rss_start_mb": round(start_mb), "rss_peak_mb": round(peak_mb),
                "attack_s": round(attack_s, 1), "outcome": outcome, "exports": len(lat),
                "export_p50_s": round(statistics.median(lat), 3) if lat else None,
                "export_max_s": round(lat[-1], 3) if lat else None, "export_failures": client.failures}
    finally:
        procs.close()


def arrays_over_http(parallel: int, rounds: int):
    bodies = [huge_array_request(bytes([i + 1]) * 16) for i in range(parallel)]

    def send(body):
        statuses = []
        for _ in range(rounds):
            for _ in range(60):
                r = requests.post(attack.url, data=body, headers={"Content-Type": "application/x-protobuf"}, timeout=120)
                if r.status_code not in (429, 503):
                    break
                time.sleep(float(r.headers.get("Retry-After", "1")))
            statuses.append(r.status_code)
        return statuses

    def attack(http_port, grpc_port):
        attack.url = f"http://127.0.0.1:{http_port}/v1/traces"
        with ThreadPoolExecutor(parallel) as pool:
            return sorted(set(s for ss in pool.map(send, bodies) for s in ss))

    return attack


def arrays_over_grpc(parallel: int, rounds: int):
    bodies = [huge_array_request(bytes([i + 101]) * 16) for i in range(parallel)]

    def send(body):
        codes = []
        # a connection each (grpc shares one between channels to a target by default)
        with grpc.insecure_channel(attack.target, options=[("grpc.max_send_message_length", 32 * 2**20),
                                                           ("grpc.use_local_subchannel_pool", 1)]) as ch:
            call = ch.unary_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
            for _ in range(rounds):
                for _ in range(60):
                    try:
                        call(body, timeout=120)
                        code = "OK"
                        break
                    except grpc.RpcError as exc:
                        code = exc.code().name
                        if exc.code() != grpc.StatusCode.UNAVAILABLE:
                            break
                        time.sleep(1)
                codes.append(code)
        return codes

    def attack(http_port, grpc_port):
        attack.target = f"127.0.0.1:{grpc_port}"
        with ThreadPoolExecutor(parallel) as pool:
            return sorted(set(c for cs in pool.map(send, bodies) for c in cs))

    return attack


def stalled_grpc(hold_s: float):
    def attack(http_port, grpc_port):
        never = threading.Event()

        def headers_only():
            never.wait(hold_s)
            return
            yield  # noqa: unreachable

        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            stalled = ch.stream_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
            calls = [stalled.future(headers_only(), timeout=hold_s + 30) for _ in range(2 * MAX_RECEIVING)]
            time.sleep(hold_s)
            never.set()
            return sorted(set(c.exception().code().name if c.exception() else "OK" for c in calls))

    return attack


def held_heads(hold_s: float):
    def attack(http_port, grpc_port):
        socks = []
        for _ in range(MAX_CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", http_port), timeout=30)
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        time.sleep(hold_s)
        for s in socks:
            s.close()
        return [f"{len(socks)} connections"]

    return attack


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parallel", type=int, default=8, help="huge requests sent at once (default 8)")
    ap.add_argument("--rounds", type=int, default=2, help="times each huge request is sent (default 2)")
    ap.add_argument("--hold", type=float, default=15.0, help="seconds the stalled calls and held heads last")
    ap.add_argument("--only", action="append", choices=["arrays-http", "arrays-grpc", "stalled-grpc", "held-heads"],
                    help="run only this scenario (repeatable)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    print(json.dumps(machine_info(), indent=1))
    work = Path(tempfile.mkdtemp(prefix="modalscope-hostile-"))
    results = []
    scenarios = [
        ("arrays-http", arrays_over_http(args.parallel, args.rounds), "http"),
        ("arrays-grpc", arrays_over_grpc(args.parallel, args.rounds), "grpc"),
        ("stalled-grpc", stalled_grpc(args.hold), "grpc"),
        ("held-heads", held_heads(args.hold), "http"),
    ]
    for name, attack, exporter_kind in scenarios:
        if args.only and name not in args.only:
            continue
        db = work / f"{name}.db"
        ensure_schema(f"sqlite:///{db}", create=True)
        result = _scenario(name, f"sqlite:///{db}", work, attack, exporter_kind)
        results.append(result)
        print(json.dumps(result), flush=True)
    print("\n| scenario | receiver RSS start → peak | attack outcome | exporter p50 / max | exporter failures |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['scenario']} | {r['rss_start_mb']} → {r['rss_peak_mb']} MB | {', '.join(map(str, r['outcome']))} "
              f"| {r['export_p50_s']} s / {r['export_max_s']} s | {r['export_failures']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
