"""Ingest throughput and memory: OTLP/HTTP, OTLP/gRPC and ``modalscope import`` against a bare loop.

Run from the repository root (every run makes fresh stores under /tmp and removes them):

    .venv/bin/python bench/ingest_bench.py                                   # all transports, SQLite, 3 runs
    .venv/bin/python bench/ingest_bench.py --transport http --repeat 1 --requests 10   # a quick look
    .venv/bin/python bench/ingest_bench.py --database-url postgresql://postgres@127.0.0.1:5432 --json pg.json

Every run sends the same pre-serialised ``ExportTraceServiceRequest`` payloads (``--requests``
of ``--spans-per-request`` spans: 16-span traces, 5 attributes a span, 3 services) to:

* **bare** — one thread: protobuf parse, flatten, ``orjson`` the attributes, one ``executemany``
  a request into an indexed table (unique ``(trace_id, span_id)``, index on start), commit.
  SQLite: a fresh file; PostgreSQL (``--database-url``): psycopg's ``executemany`` into the same
  table in a fresh database. Measured in the same run as the transports it is compared with.
* **http** — ``modalscope ingest otlp`` in its own process on a fresh store, ``--clients``
  threads POSTing ``application/x-protobuf`` to ``/v1/traces`` (200 = committed).
* **grpc** — the same receiver, ``--clients`` threads calling ``TraceService/Export``
  through opentelemetry-proto's ``TraceServiceStub``, one channel a thread.
* **import-pb** / **import-json** — the same requests written to protobuf files (one request a
  file) or one OTLP/JSON-lines file, then ``modalscope import`` run on them (settled: from
  process start to exit, decode, write and settle; acknowledged: to its last span committed,
  which its summary line gives; the schema is created beforehand).

``--transport import`` means both import formats, ``all`` everything. For each: spans/s
acknowledged (last answer received) and settled (no trace pending: rollups complete), both
against the bare loop, and peak RSS (``VmHWM`` from /proc of the receiver and of its settler
child, read just before stopping; for an import, ``ru_maxrss`` of the process), and the tree's
peak: the receiver and all its descendants together, sampled every 50 ms while the run lasts
(``ingest_procs.TreeSampler``: a helper process that has exited counts too). ``--repeat N``
prints every run and then the median of each column. ``--json FILE`` writes it all.

PostgreSQL: ``--database-url`` names the server (any database in it is ignored); each run
creates uniquely named databases ``msbench_<pid>_<hex>`` there and drops them afterwards.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time

import orjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402
from ingest_procs import GrpcSender, HttpSender, Stores, import_run, receiver_run, send_all  # noqa: E402,F401

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402

TRANSPORTS = ("http", "grpc", "import-pb", "import-json")
SERVICES = {
    "gateway": ["POST /v1/chat", "auth.Check", "vision.Encode", "fusion.align", "llm.generate"],
    "vision-encoder": ["VisionEncoder/Encode", "image.decode", "image.resize", "vit.forward", "vit.mlp"],
    "llm": ["llm.prefill", "llm.decode_step", "kv_cache.read"],
}
HOUR_NS = 3_600_000_000_000


# -- payloads ------------------------------------------------------------------------------
def make_payloads(n_requests: int, spans_per_request: int, seed: int = 1, base_ns: int | None = None,
                  trace_prefix: bytes | None = None) -> list[bytes]:
    """Serialised requests; request ``r``'s traces start within second ``r`` after ``base_ns``
    (default: an hour ago). ``trace_prefix`` (8 bytes) starts every trace id, so a copy with
    fresh ids is one ``bytes.replace`` away (``restamp``)."""
    rng = random.Random(seed)
    base = time.time_ns() - HOUR_NS if base_ns is None else base_ns
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
            if trace_prefix is None:
                tid = rng.getrandbits(128).to_bytes(16, "big")
            else:
                tid = trace_prefix + rng.getrandbits(64).to_bytes(8, "big")
            start = base + r * 1_000_000_000 + rng.randrange(1_000_000_000)
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


def restamp(payload: bytes, old_prefix: bytes, new_prefix: bytes) -> bytes:
    """The same request with every trace id's 8-byte prefix replaced (same length: still valid protobuf)."""
    return payload.replace(old_prefix, new_prefix)


def count_spans(payload: bytes) -> int:
    req = ExportTraceServiceRequest.FromString(payload)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def _any_json(v: AnyValue) -> dict:
    which = v.WhichOneof("value")
    if which == "string_value":
        return {"stringValue": v.string_value}
    if which == "int_value":
        return {"intValue": str(v.int_value)}
    if which == "bool_value":
        return {"boolValue": v.bool_value}
    if which == "double_value":
        return {"doubleValue": v.double_value}
    if which == "bytes_value":
        return {"bytesValue": base64.b64encode(v.bytes_value).decode()}
    if which == "array_value":
        return {"arrayValue": {"values": [_any_json(x) for x in v.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": [{"key": kv.key, "value": _any_json(kv.value)} for kv in v.kvlist_value.values]}}
    return {}


def otlp_json(payload: bytes) -> bytes:
    """The OTLP/JSON form of a serialised request, one line (hex ids, as exporters write it)."""
    req = ExportTraceServiceRequest.FromString(payload)
    out = []
    for rs in req.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans = []
            for s in ss.spans:
                d = {"traceId": s.trace_id.hex(), "spanId": s.span_id.hex(), "name": s.name, "kind": s.kind,
                     "startTimeUnixNano": str(s.start_time_unix_nano), "endTimeUnixNano": str(s.end_time_unix_nano),
                     "attributes": [{"key": a.key, "value": _any_json(a.value)} for a in s.attributes],
                     "status": {"code": s.status.code}}
                if s.parent_span_id:
                    d["parentSpanId"] = s.parent_span_id.hex()
                spans.append(d)
            scopes.append({"scope": {"name": ss.scope.name}, "spans": spans})
        out.append({"resource": {"attributes": [{"key": a.key, "value": _any_json(a.value)} for a in rs.resource.attributes]},
                    "scopeSpans": scopes})
    return orjson.dumps({"resourceSpans": out})


# -- the bare loop -------------------------------------------------------------------------
def _any(v):
    w = v.WhichOneof("value")
    return getattr(v, w) if w else None


def flatten(data: bytes) -> list[tuple]:
    req = ExportTraceServiceRequest.FromString(data)
    rows = []
    for rs in req.resource_spans:
        service = next((_any(a.value) for a in rs.resource.attributes if a.key == "service.name"), "unknown")
        for ss in rs.scope_spans:
            for s in ss.spans:
                rows.append((s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex() or None, service, s.name,
                             s.kind, s.start_time_unix_nano, s.end_time_unix_nano - s.start_time_unix_nano,
                             s.status.code, orjson.dumps({a.key: _any(a.value) for a in s.attributes}).decode()))
    return rows


BARE_COLUMNS = "trace_id, span_id, parent_span_id, service, name, kind, start_ns, duration_ns, status, attributes"


def bare_loop_sqlite(payloads: list[bytes], path: str) -> tuple[int, float]:
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
        rows = flatten(data)
        conn.execute("BEGIN")
        conn.executemany(f"INSERT INTO spans ({BARE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
        conn.execute("COMMIT")
        n += len(rows)
    elapsed = time.perf_counter() - t0
    conn.close()
    return n, elapsed


def bare_loop_postgres(payloads: list[bytes], url: str) -> tuple[int, float]:
    import psycopg

    with psycopg.connect(bl.libpq_url(url)) as conn:
        conn.execute("""CREATE TABLE spans (id BIGSERIAL PRIMARY KEY, trace_id TEXT, span_id TEXT,
            parent_span_id TEXT, service TEXT, name TEXT, kind SMALLINT, start_ns BIGINT, duration_ns BIGINT,
            status SMALLINT, attributes TEXT, UNIQUE (trace_id, span_id))""")
        conn.execute("CREATE INDEX ix_start ON spans (start_ns)")
        conn.commit()
        n = 0
        t0 = time.perf_counter()
        for data in payloads:
            rows = flatten(data)
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO spans ({BARE_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", rows)
            conn.commit()
            n += len(rows)
        elapsed = time.perf_counter() - t0
    return n, elapsed


def one_run(run: int, transports: list[str], payloads: list[bytes], total: int, args, workdir: str) -> list[dict]:
    stores = Stores(workdir, args.database_url)
    rows = []
    try:
        bare_url = stores.new("bare")
        if args.database_url:
            n, bare_s = bare_loop_postgres(payloads, bare_url)
        else:
            n, bare_s = bare_loop_sqlite(payloads, bare_url[len("sqlite:///"):])
        bare_rate = n / bare_s
        stores.close()
        for transport in transports:
            url = stores.new(transport)
            if transport.startswith("import"):
                res = import_run(transport, payloads, url, workdir, otlp_json)
            else:
                res = receiver_run(transport, payloads, url, args)
            stores.close()
            if res["stored_spans"] != total:
                raise RuntimeError(f"{transport}: {res['stored_spans']} spans stored, {total} sent")
            acked = total / res["acked_s"]
            settled = total / res["settled_s"] if res["settled_s"] else None
            row = {"run": run, "transport": transport, "spans": total, "bare_spans_per_s": round(bare_rate),
                   "acked_spans_per_s": round(acked), "acked_vs_bare": round(acked / bare_rate, 3),
                   "settled_spans_per_s": None if settled is None else round(settled),
                   "settled_vs_bare": None if settled is None else round(settled / bare_rate, 3),
                   **{k: v for k, v in res.items() if k not in ("acked_s", "settled_s")}}
            rows.append(row)
            print(_table_line(row), flush=True)
    finally:
        stores.close()
    return rows


HEADERS = ("run", "transport", "bare spans/s", "acknowledged spans/s", "× bare", "settled spans/s", "× bare",
           "ingest process peak MB", "settler peak MB", "tree peak MB", "retries")


def _cells(row: dict) -> list:
    return [row["run"], row["transport"], bl.fmt_int(row["bare_spans_per_s"]), bl.fmt_int(row["acked_spans_per_s"]),
            f"{row['acked_vs_bare']:.2f}×" if row["acked_vs_bare"] is not None else "—",
            bl.fmt_int(row["settled_spans_per_s"]),
            f"{row['settled_vs_bare']:.2f}×" if row["settled_vs_bare"] is not None else "—",
            bl.fmt_int(row["receiver_peak_mb"]), bl.fmt_int(row["settler_peak_mb"]), bl.fmt_int(row.get("tree_peak_mb")),
            bl.fmt_int(row["retries"])]


def _table_line(row: dict) -> str:
    return "| " + " | ".join(str(c) for c in _cells(row)) + " |"


def medians(rows: list[dict], transports: list[str]) -> list[dict]:
    out = []
    keys = ("bare_spans_per_s", "acked_spans_per_s", "acked_vs_bare", "settled_spans_per_s", "settled_vs_bare",
            "receiver_peak_mb", "settler_peak_mb", "tree_peak_mb", "retries")
    for t in transports:
        mine = [r for r in rows if r["transport"] == t]
        if mine:
            out.append({"run": "median", "transport": t, **{k: bl.median(r[k] for r in mine) for k in keys}})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--transport", default="all", choices=("http", "grpc", "import", "import-pb", "import-json", "all"),
                    help="what to measure against the bare loop (default: all)")
    ap.add_argument("--requests", type=int, default=120, help="requests a run (default 120)")
    ap.add_argument("--spans-per-request", type=int, default=5000, help="spans a request (default 5000)")
    # An OpenTelemetry Collector's exporter sends up to 10 requests at once by default
    # (exporterhelper sending_queue.num_consumers); 8 x 5,000 spans stays under one receiver
    # process's 50,000-span queue even if every connection lands on the same process.
    ap.add_argument("--clients", type=int, default=8, help="client threads for http/grpc (default 8)")
    ap.add_argument("--processes", type=int, default=1,
                    help="receiver processes sharing the ports (modalscope ingest otlp --processes; default 1)")
    ap.add_argument("--repeat", type=int, default=3, help="runs; the median of each column is printed (default 3)")
    ap.add_argument("--database-url", default=None,
                    help="a PostgreSQL server URL (postgresql://postgres@127.0.0.1:5432); default: SQLite files")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write machine details, runs and medians here")
    ap.add_argument("--settle-seconds", type=float, default=float(os.environ.get("BENCH_SETTLE_SECONDS", "1")),
                    help="MODALSCOPE_SETTLE_SECONDS of the receiver (default 1; env BENCH_SETTLE_SECONDS)")
    ap.add_argument("--ack-only", action="store_true", default=bool(os.environ.get("BENCH_ACK_ONLY")),
                    help="do not wait for settling (env BENCH_ACK_ONLY=1)")
    ap.add_argument("--pyspy", default=os.environ.get("BENCH_PYSPY"), metavar="FILE",
                    help="run the receiver under `py-spy record --subprocesses --format raw -o FILE` (its settler too; env BENCH_PYSPY)")
    args = ap.parse_args()
    if args.database_url and not bl.is_postgres(args.database_url):
        ap.error("--database-url must be a PostgreSQL URL (SQLite is the default: fresh files under /tmp)")
    transports = {"all": list(TRANSPORTS), "import": ["import-pb", "import-json"]}.get(args.transport, [args.transport])
    bl.sigterm_as_interrupt()
    machine = bl.machine_info(args.database_url)
    bl.log(f"generating {args.requests} requests of {args.spans_per_request} spans ...")
    payloads = make_payloads(args.requests, args.spans_per_request)
    total = sum(count_spans(p) for p in payloads)
    print(f"{total:,} spans in {args.requests} requests of {args.spans_per_request}, {args.clients} client threads, "
          f"store: {'PostgreSQL' if args.database_url else 'SQLite'}")
    print(bl.machine_line(machine))
    print(bl.md_table(HEADERS, []))
    rows: list[dict] = []
    workdir = tempfile.mkdtemp(prefix="modalscope-ingest-bench-", dir=bl.TMP_ROOT)
    try:
        for run in range(1, args.repeat + 1):
            rows.extend(one_run(run, transports, payloads, total, args, workdir))
    except KeyboardInterrupt:
        bl.log("interrupted: stores removed")
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    med = medians(rows, transports)
    if args.repeat > 1:
        print()
        print(f"Median of {args.repeat} runs:")
        print(bl.md_table(HEADERS[1:], [_cells(r)[1:] for r in med]))
    bl.write_json(args.json, {"machine": machine, "args": vars(args), "spans": total, "runs": rows, "median": med})
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        bl.log("interrupted")
        raise SystemExit(130) from None
