"""Load: the JSON API under concurrent clients while ingest runs, all on loopback.

    .venv/bin/python bench/load_bench.py [--requests 3000] [--duration 120] [--concurrency 8]
        [--server gunicorn|serve] [--workers 2] [--ingest-rate 2000] [--seed-traces 3000]
        [--database-url URL] [--json]

On a fresh SQLite store (or ``--database-url``, which must be empty or migrated) it starts
``modalscope ingest otlp`` and the API (``modalscope serve``, or gunicorn with
``modalscope.gunicorn_conf`` and ``--workers`` workers), posts ``--seed-traces`` multimodal
traces spread over the last hour and waits for them to settle. Then, at the same time:

* a generator posts new traces to ``/v1/traces`` at ``--ingest-rate`` spans a second,
  retrying 429/503 after ``Retry-After`` and connection errors after a second (as OTLP
  clients do);
* ``--concurrency`` client threads GET a fixed mix of ``/api/v1`` URLs (what the dashboard
  pages ask for) until ``--requests`` are answered or ``--duration`` seconds pass.

It reports requests a second, P50/P99 latency, errors (non-2xx; 5xx counted apart) overall
and per endpoint, and whether every span the generator got a 200 for is in the store.
``--json`` prints the same as one JSON object on the last line. Exit status 1 on any 5xx
or lost span.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

MS = 1_000_000
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- traffic ------------------------------------------------------------------------------------

def _kv(key: str, value) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def make_request(rng: random.Random, n_traces: int, start_ns: int, spread_ns: int) -> tuple[bytes, int, list[str]]:
    """An ExportTraceServiceRequest of ``n_traces`` 7-span multimodal traces starting in
    [start_ns, start_ns + spread_ns): (payload, span count, trace ids)."""
    req = ExportTraceServiceRequest()
    scopes = {}
    for service, instance in (("gateway", "gw-1"), ("vision-encoder", "pod-7")):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend([_kv("service.name", service), _kv("service.instance.id", instance)])
        scopes[service] = rs.scope_spans.add()
    trace_ids = []
    for _ in range(n_traces):
        tid = rng.getrandbits(128) | 1
        trace_ids.append(f"{tid:032x}")
        t0 = start_ns + rng.randrange(max(1, spread_ns))
        images = rng.choice((0, 1, 1, 2))
        slow = rng.random() < 0.05
        ids = [(rng.getrandbits(64) | 1).to_bytes(8, "big") for _ in range(7)]
        decode_ms = (30 + rng.random() * 40) * (images or 0.1) * (4 if slow else 1)
        vit_ms = 80 + rng.random() * 60 if images else 5
        llm_ms = 250 + rng.random() * 150
        enc_end = 20 + decode_ms + vit_ms
        total = enc_end + 40 + llm_ms
        tier = rng.choice(("gold", "silver", "bronze"))
        spans = [  # (index, parent, service, name, kind, start ms, end ms, attributes)
            (0, None, "gateway", "POST /v1/chat", 2, 0, total,
             {"mm.image_count": images, "mm.prompt_chars": rng.randrange(50, 900), "user_tier": tier}),
            (1, 0, "gateway", "vision.Encode", 3, 5, enc_end + 5, {"peer.service": "vision-encoder"}),
            (2, 1, "vision-encoder", "vision.Encode", 2, 8, enc_end, {}),
            (3, 2, "vision-encoder", "image.decode", 1, 10, 10 + decode_ms, {}),
            (4, 2, "vision-encoder", "vit.forward", 1, 12 + decode_ms, 12 + decode_ms + vit_ms,
             {"mm.modality": "vision", "gpu.cuda_graph": "fallback" if slow else "captured"}),
            (5, 0, "gateway", "cache.lookup", 1, enc_end + 8, enc_end + 12,
             {"cache.name": "prompt", "cache.hit": tier != "bronze" or rng.random() < 0.3, "user_tier": tier}),
            (6, 0, "gateway", "llm.generate", 1, enc_end + 15, total - 2, {"batch.size": rng.randrange(1, 9)}),
        ]
        for i, parent, service, name, kind, start, end, attributes in spans:
            sp = scopes[service].spans.add()
            sp.trace_id = tid.to_bytes(16, "big")
            sp.span_id = ids[i]
            if parent is not None:
                sp.parent_span_id = ids[parent]
            sp.name = name
            sp.kind = kind
            sp.start_time_unix_nano = t0 + int(start * MS)
            sp.end_time_unix_nano = t0 + int(end * MS)
            sp.attributes.extend(_kv(k, v) for k, v in attributes.items())
    return req.SerializeToString(), 7 * n_traces, trace_ids


def post_until_acked(url: str, payload: bytes, stop_after: float, session: requests.Session) -> bool:
    """POST as an OTLP client does: retry 429/503 after Retry-After, connection errors after 1 s."""
    while time.monotonic() < stop_after:
        try:
            resp = session.post(url, data=payload, headers=PROTOBUF, timeout=60)
        except requests.RequestException:
            time.sleep(1.0)
            continue
        if resp.status_code == 200:
            return True
        if resp.status_code in (429, 502, 503, 504):
            time.sleep(min(float(resp.headers.get("Retry-After", "1") or 1), 10.0))
            continue
        raise RuntimeError(f"ingest refused a good request: {resp.status_code} {resp.text[:200]}")
    return False


# -- processes ----------------------------------------------------------------------------------

class Stack:
    """`modalscope ingest otlp` and the API server, in process groups of their own."""

    def __init__(self, workdir: Path, database_url: str, server: str, workers: int) -> None:
        self.workdir = workdir
        self.http_port, self.grpc_port, self.web_port = free_port(), free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MODALSCOPE_", "OTEL_"))}
        env.update(MODALSCOPE_DATABASE_URL=database_url, MODALSCOPE_OTLP_HTTP_PORT=str(self.http_port),
                   MODALSCOPE_OTLP_GRPC_PORT=str(self.grpc_port), MODALSCOPE_PORT=str(self.web_port),
                   MODALSCOPE_SETTLE_SECONDS="1", WEB_CONCURRENCY=str(workers))
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        try:
            self._start("ingest", [sys.executable, "-m", "modalscope", "ingest", "otlp"])
            self._wait(self.http_port, "ingest")
            if server == "gunicorn":
                cmd = [sys.executable, "-m", "gunicorn", "-c", "python:modalscope.gunicorn_conf",
                       "--access-logfile", "/dev/null", "modalscope.app:create_app()"]
            else:
                cmd = [sys.executable, "-m", "modalscope", "serve"]
            self._start("web", cmd)
            self._wait(self.web_port, "web")
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, cmd: list[str]) -> None:
        with open(self.workdir / f"{name}.err", "wb") as err:
            self.procs[name] = subprocess.Popen(cmd, env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def _wait(self, port: int, name: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited: {(self.workdir / f'{name}.err').read_text()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not listen on {port}")

    @property
    def ingest_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def rss_mb(self, name: str) -> float:
        """Peak RSS (VmHWM) of the process (gunicorn: its largest worker)."""
        pids = [self.procs[name].pid]
        children = Path(f"/proc/{pids[0]}/task/{pids[0]}/children")
        if children.exists():
            pids += [int(p) for p in children.read_text().split()]
        peak = 0.0
        for pid in pids:
            try:
                for line in open(f"/proc/{pid}/status"):
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) / 1024)
            except OSError:
                pass
        return peak

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


# -- the run ------------------------------------------------------------------------------------

def _store_counts(database_url: str) -> tuple[int, int]:
    from sqlalchemy import func, select

    from modalscope.models import Span, Trace
    from modalscope.models.engine import make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            spans = conn.execute(select(func.count()).select_from(Span)).scalar_one()
            pending = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
    finally:
        engine.dispose()
    return spans, pending


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def api_urls(web: str, trace_ids: list[str]) -> list[tuple[str, str]]:
    """The mix the dashboard's pages ask for: (endpoint label, URL)."""
    return [
        ("pairs", f"{web}/api/v1/pairs?range=1h"),
        ("stages", f"{web}/api/v1/stages?range=1h&group_by=input_type"),
        ("input-types", f"{web}/api/v1/input-types?range=1h"),
        ("traces", f"{web}/api/v1/traces?range=1h&limit=20"),
        ("traces?pair", f"{web}/api/v1/traces?range=1h&caller=gateway&callee=vision-encoder&min_ms=100"),
        ("traces/<id>", None),  # one of the seeded traces, picked per request
        ("cache", f"{web}/api/v1/cache?range=1h&group_by=user_tier"),
        ("compare", f"{web}/api/v1/compare?range=15m"),
        ("anomalies", f"{web}/api/v1/anomalies?range=1h"),
        ("health", f"{web}/api/v1/health"),
    ]


def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="modalscope-load-"))
    database_url = args.database_url or f"sqlite:///{workdir / 'load.db'}"
    if not args.database_url:
        subprocess.run([sys.executable, "-m", "modalscope", "db", "upgrade"], check=True, capture_output=True,
                       env={**os.environ, "MODALSCOPE_DATABASE_URL": database_url})
    rng = random.Random(args.seed)
    try:
        stack = Stack(workdir, database_url, args.server, args.workers)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    try:
        # Seed: the last hour of traffic, then wait until it has settled.
        t_seed = time.monotonic()
        seeded_spans, seeded_ids = 0, []
        session = requests.Session()
        hour_ago = time.time_ns() - 3600 * 10**9
        per_request = 50
        for i in range(0, args.seed_traces, per_request):
            n = min(per_request, args.seed_traces - i)
            payload, spans, ids = make_request(rng, n, hour_ago + i * (3500 * 10**9 // max(1, args.seed_traces)),
                                               3500 * 10**9 * n // max(1, args.seed_traces))
            if not post_until_acked(stack.ingest_url, payload, time.monotonic() + 120, session):
                raise RuntimeError("seeding the store timed out")
            seeded_spans += spans
            seeded_ids += ids
        deadline = time.monotonic() + 300
        while _store_counts(database_url) != (seeded_spans, 0):
            if time.monotonic() > deadline:
                raise RuntimeError(f"seeded traces did not settle: {_store_counts(database_url)}")
            time.sleep(0.5)
        seed_seconds = time.monotonic() - t_seed

        # Load and ingest at once.
        stop = threading.Event()
        acked_spans = [0]
        generator_errors: list[str] = []

        def generate() -> None:
            gen_session = requests.Session()
            per = 20  # traces a request: 140 spans
            interval = 7 * per / max(1.0, args.ingest_rate)
            next_at = time.monotonic()
            while not stop.is_set():
                payload, spans, _ = make_request(rng, per, time.time_ns() - 2 * 10**9, 10**9)
                try:
                    if post_until_acked(stack.ingest_url, payload, time.monotonic() + 60, gen_session):
                        acked_spans[0] += spans
                except RuntimeError as exc:
                    generator_errors.append(str(exc))
                    return
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

        urls = api_urls(stack.web, seeded_ids)
        latencies: dict[str, list[float]] = defaultdict(list)
        statuses: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        failures: dict[str, int] = defaultdict(int)
        lock = threading.Lock()
        issued = [0]
        load_deadline = time.monotonic() + args.duration

        def client(k: int) -> None:
            client_rng = random.Random(args.seed * 1000 + k)
            s = requests.Session()
            while True:
                with lock:
                    if issued[0] >= args.requests or time.monotonic() > load_deadline:
                        return
                    n = issued[0]
                    issued[0] += 1
                label, url = urls[n % len(urls)]
                if url is None:
                    url = f"{stack.web}/api/v1/traces/{client_rng.choice(seeded_ids)}"
                t0 = time.perf_counter()
                try:
                    resp = s.get(url, timeout=60)
                    code = resp.status_code
                except requests.RequestException as exc:
                    with lock:
                        failures[f"{label}: {exc.__class__.__name__}"] += 1
                    continue
                elapsed = (time.perf_counter() - t0) * 1000
                with lock:
                    latencies[label].append(elapsed)
                    statuses[label][code] += 1

        gen = threading.Thread(target=generate, daemon=True)
        gen.start()
        clients = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.concurrency)]
        t_load = time.perf_counter()
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        load_seconds = time.perf_counter() - t_load
        stop.set()
        gen.join(90)

        # Every span the generator got a 200 for must be stored.
        expected = seeded_spans + acked_spans[0]
        deadline = time.monotonic() + 120
        while (stored := _store_counts(database_url)[0]) < expected and time.monotonic() < deadline:
            time.sleep(0.5)

        all_latencies = sorted(v for vs in latencies.values() for v in vs)
        answered = len(all_latencies)
        non_2xx = sum(n for st in statuses.values() for code, n in st.items() if not 200 <= code < 300)
        five_xx = sum(n for st in statuses.values() for code, n in st.items() if code >= 500)
        result = {
            "server": args.server, "workers": args.workers if args.server == "gunicorn" else 1,
            "concurrency": args.concurrency, "requests": answered, "seconds": round(load_seconds, 2),
            "requests_per_s": round(answered / load_seconds, 1) if load_seconds else 0.0,
            "p50_ms": round(_percentile(all_latencies, 50), 1), "p99_ms": round(_percentile(all_latencies, 99), 1),
            "errors": non_2xx + sum(failures.values()), "errors_5xx": five_xx,
            "connection_errors": dict(failures),
            "per_endpoint": {label: {"n": len(v), "p50_ms": round(_percentile(sorted(v), 50), 1),
                                     "p99_ms": round(_percentile(sorted(v), 99), 1),
                                     "statuses": dict(statuses[label])}
                             for label, v in latencies.items()},
            "seed_traces": args.seed_traces, "seed_seconds": round(seed_seconds, 1),
            "ingested_spans_acked": acked_spans[0],
            "ingest_rate_spans_per_s": round(acked_spans[0] / load_seconds, 1) if load_seconds else 0.0,
            "spans_expected": expected, "spans_stored": stored, "all_ingested_spans_landed": stored == expected,
            "generator_errors": generator_errors,
            "ingest_peak_rss_mb": round(stack.rss_mb("ingest"), 1), "web_peak_rss_mb": round(stack.rss_mb("web"), 1),
            "database": "sqlite" if database_url.startswith("sqlite") else "postgresql",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                       f"load average {os.getloadavg()[0]:.2f}",
        }
        return result
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000, help="API requests to answer (default 3000)")
    p.add_argument("--duration", type=float, default=120.0, help="stop the load after this many seconds")
    p.add_argument("--concurrency", type=int, default=8, help="API client threads (default 8)")
    p.add_argument("--server", choices=("gunicorn", "serve"), default="gunicorn")
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers (WEB_CONCURRENCY, default 2)")
    p.add_argument("--ingest-rate", type=float, default=2000.0, help="spans a second posted while loading")
    p.add_argument("--seed-traces", type=int, default=3000, help="traces stored before the load (last hour)")
    p.add_argument("--database-url", default="", help="default: a fresh SQLite file in a temporary directory")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object (last line)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (store, server logs)")
    args = p.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['server']} ({result['workers']} worker(s)), {result['concurrency']} clients, "
              f"{result['database']}; {result['machine']}")
        print(f"  {result['requests']} requests in {result['seconds']} s: {result['requests_per_s']} req/s, "
              f"P50 {result['p50_ms']} ms, P99 {result['p99_ms']} ms, errors {result['errors']} "
              f"(5xx {result['errors_5xx']})")
        for label, row in result["per_endpoint"].items():
            print(f"    {label:14s} n={row['n']:5d}  P50 {row['p50_ms']:8.1f} ms  P99 {row['p99_ms']:8.1f} ms  "
                  f"{row['statuses']}")
        print(f"  ingest during the load: {result['ingested_spans_acked']} spans acknowledged "
              f"({result['ingest_rate_spans_per_s']} spans/s); all landed: {result['all_ingested_spans_landed']} "
              f"({result['spans_stored']}/{result['spans_expected']} stored)")
        print(f"  peak RSS: ingest {result['ingest_peak_rss_mb']} MB, web {result['web_peak_rss_mb']} MB; "
              f"seeding {result['seed_traces']} traces took {result['seed_seconds']} s")
    ok = result["errors_5xx"] == 0 and result["all_ingested_spans_landed"] and not result["generator_errors"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
