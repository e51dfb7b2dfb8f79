"""Dashboard reads while ingest runs flat out: page and API latency idle vs under load, same SQLite store.

Run from the repository root:

    .venv/bin/python bench/read_under_load.py --spans 200000 --runs 3        # a quick look
    .venv/bin/python bench/read_under_load.py --spans 1000000 --json load-1m.json
    .venv/bin/python bench/read_under_load.py --spans 10000000 --windows 1h,24h --json load-10m.json

1. The store: ``dashboard_bench.py``'s demo store of ``--spans`` (filled if missing, kept at
   ``/tmp/modalscope-bench/store-<spans>.db``), copied to a scratch file (SQLite backup API),
   so the kept store never changes; the scratch copy is removed at the end.
2. **idle**: in this process, acting as a dashboard worker (``create_app`` on the scratch
   store), every API call, page callback and query function of ``dashboard_bench.py`` for
   each window (``--windows``, default 1h and 24h ending at the newest span's minute),
   median of ``--runs`` after one warm-up.
3. **under load**: ``modalscope ingest otlp`` started on the same scratch store, and a client
   process (``--clients`` threads, ``--transport`` http or grpc) sending the ingest bench's
   requests as fast as they are acknowledged (fresh trace ids each round, so every span is a
   new row to write and settle). After ``--ramp-seconds`` the same calls are timed again.
   The ingested spans are stamped an hour after the measured windows: the reads answer the
   same question idle and under load, so what differs is contention (two cores shared by the
   receiver, its settler, the client and the reader; SQLite's write lock and WAL).
   ``--load live`` sends demo traffic instead (the store's services and pairs), 15 s of it
   a round, the first stamped from the store's newest minute on and each round as much
   later as the clock has moved; the windows then end 15 minutes after the store's newest
   minute (back to the first round's time should the load last that long): every trace
   waiting to settle lies inside the windows read and, as in live traffic, nothing stored
   is newer than the traffic arriving, as when an incident is watched while it happens
   (the answers then grow with the load).
4. Report: per call and window, idle ms, loaded ms and the ratio; the ingest rate
   acknowledged while the reads ran, traces still waiting to settle when they ended, and the
   receiver's and settler's peak RSS. ``--json FILE`` writes everything.

Ctrl-C stops the receiver and the client and removes the scratch copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402
import dashboard_bench as db  # noqa: E402

HOUR_NS = 3_600_000_000_000
MINUTE_NS = 60_000_000_000
# --load live: the windows end this long after the store's newest minute; the live traffic
# fills that stretch (nothing else is in it, as nothing is stored later than now)
LIVE_SPAN_NS = 15 * MINUTE_NS


# -- the load client (a subprocess of this script) -------------------------------------------
def run_client(args) -> int:
    """Send the ingest bench's requests flat out until stdin closes; print a JSON summary."""
    import ingest_bench as ib

    prefix = os.urandom(8)
    if args.load == "live":
        pool = live_payloads(args.pool_requests * args.spans_per_request, args.spans_per_request, args.base_ns,
                             prefix)
        offsets = [time_offsets(p) for p in pool]
        started = time.time_ns()
    else:
        pool = ib.make_payloads(args.pool_requests, args.spans_per_request, seed=11, base_ns=args.base_ns,
                                trace_prefix=prefix)
    spans_per = [ib.count_spans(p) for p in pool]
    sender = ib.HttpSender(args.client) if args.transport == "http" else ib.GrpcSender(args.client)
    stop = threading.Event()
    lock = threading.Lock()
    state = {"next": 0, "round_prefix": prefix, "round_shift": 0, "acked": 0, "requests": 0, "error": None}

    def next_payload() -> tuple[bytes, int]:
        with lock:
            i = state["next"] % len(pool)
            if i == 0 and state["next"]:
                state["round_prefix"] = os.urandom(8)  # a new round: new trace ids
                if args.load == "live":  # and its spans stamped as late as the clock has moved,
                    # back to the first round's time once they would reach the windows' end
                    state["round_shift"] = (time.time_ns() - started) % (LIVE_SPAN_NS - LIVE_POOL_SECONDS * 10**9)
            state["next"] += 1
            new, shift = state["round_prefix"], state["round_shift"]
        if shift:
            return shifted(pool[i], offsets[i], prefix, new, shift), spans_per[i]
        data = pool[i] if new == prefix else ib.restamp(pool[i], prefix, new)
        return data, spans_per[i]

    def worker() -> None:
        try:
            while not stop.is_set():
                data, n = next_payload()
                sender.send(data)
                with lock:
                    state["acked"] += n
                    state["requests"] += 1
        except Exception as exc:  # noqa: BLE001 - reported in the summary
            state["error"] = f"{exc.__class__.__name__}: {exc}"
            stop.set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.clients)]
    print("sending", flush=True)
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    try:
        sys.stdin.read()  # the parent closes our stdin to stop us
    except KeyboardInterrupt:
        pass
    stop.set()
    for t in threads:
        t.join(300)
    elapsed = time.perf_counter() - t0
    sender.close()
    print(json.dumps({"acked_spans": state["acked"], "requests": state["requests"], "seconds": elapsed,
                      "retries": sender.retries, "error": state["error"]}), flush=True)
    return 0 if state["error"] is None else 1


LIVE_POOL_SECONDS = 15


def live_payloads(spans: int, spans_per_request: int, start_ns: int, prefix: bytes) -> list[bytes]:
    """About ``spans`` spans of demo traffic (the store's services, pairs and latencies) over
    the ``LIVE_POOL_SECONDS`` after ``start_ns``, in requests of about ``spans_per_request``
    spans, every trace id starting with ``prefix``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from modalscope.ingest import demo

    rate = spans / db.SPANS_PER_TRACE / LIVE_POOL_SECONDS
    start_ns = start_ns // MINUTE_NS * MINUTE_NS  # the demo's history starts at a whole minute
    config = demo.DemoConfig(now_ns=start_ns + LIVE_POOL_SECONDS * 1_000_000_000, seed=13,
                             hours=LIVE_POOL_SECONDS / 3600, rate=rate, spans_per_request=spans_per_request)
    pool: list[bytes] = []
    merged, in_merged = ExportTraceServiceRequest(), 0
    for payload in demo.export_requests(config):  # whole traces a request; merged up to the size asked
        req = ExportTraceServiceRequest.FromString(payload)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    span.trace_id = prefix + span.trace_id[8:]
                    in_merged += 1
        merged.MergeFrom(req)
        if in_merged >= spans_per_request:
            pool.append(merged.SerializeToString())
            merged, in_merged = ExportTraceServiceRequest(), 0
    if in_merged:
        pool.append(merged.SerializeToString())
    return pool


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """The protobuf varint at buf[i] and the offset after it."""
    value = shift = 0
    while True:
        c = buf[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def _fields(buf: bytes, start: int, end: int):
    """(field number, wire type, value start, value end) of the protobuf message in buf[start:end]."""
    i = start
    while i < end:
        tag, i = _varint(buf, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, j = _varint(buf, i)
        elif wire == 1:
            j = i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            j = i + n
        elif wire == 5:
            j = i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, i, j
        i = j


def time_offsets(payload: bytes):
    """Byte offsets of every span's start and end time and every event's time (fixed64) in
    a serialized ExportTraceServiceRequest: a round's shift is then one numpy addition."""
    import numpy as np

    offsets = []
    for n1, _, s1, e1 in _fields(payload, 0, len(payload)):  # resource_spans
        if n1 != 1:
            continue
        for n2, _, s2, e2 in _fields(payload, s1, e1):  # scope_spans
            if n2 != 2:
                continue
            for n3, _, s3, e3 in _fields(payload, s2, e2):  # spans
                if n3 != 2:
                    continue
                for n4, w4, s4, e4 in _fields(payload, s3, e3):
                    if n4 in (7, 8) and w4 == 1:  # start_time_unix_nano, end_time_unix_nano
                        offsets.append(s4)
                    elif n4 == 11:  # events: time_unix_nano
                        offsets.extend(s5 for n5, w5, s5, _ in _fields(payload, s4, e4) if n5 == 1 and w5 == 1)
    return np.asarray(offsets, dtype=np.int64)


def shifted(payload: bytes, offsets, old_prefix: bytes, new_prefix: bytes, shift_ns: int) -> bytes:
    """The request with fresh trace ids and every span ``shift_ns`` later (a new round of
    live traffic: its spans start as late as the clock has moved since the first)."""
    import numpy as np

    buf = np.frombuffer(bytearray(payload.replace(old_prefix, new_prefix)), dtype=np.uint8)
    at = offsets[:, None] + np.arange(8)
    times = buf[at].copy().view("<u8").reshape(-1) + np.uint64(shift_ns)
    buf[at] = times.view(np.uint8).reshape(-1, 8)
    return buf.tobytes()


class LoadClient:
    def __init__(self, target: str, args, base_ns: int) -> None:
        cmd = [sys.executable, os.path.abspath(__file__), "--client", target, "--transport", args.transport,
               "--clients", str(args.clients), "--pool-requests", str(args.pool_requests),
               "--spans-per-request", str(args.spans_per_request), "--base-ns", str(base_ns), "--load", args.load]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def wait_sending(self) -> None:
        """Block until the client has its requests ready and starts sending."""
        line = self.proc.stdout.readline()
        if line.strip() != "sending":
            raise RuntimeError(f"the load client did not start (exit {self.proc.poll()}): {line!r}")

    def stop(self) -> dict | None:
        """Close the client's stdin (it stops sending and prints its summary) and read the summary."""
        try:
            out, _ = self.proc.communicate(timeout=330)  # closes stdin first
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return None
        lines = [ln for ln in (out or "").splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else None


# -- the reader ----------------------------------------------------------------------------------
def copy_store(src: str, dst: str) -> float:
    from tqdm import tqdm

    t0 = time.perf_counter()
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    target = sqlite3.connect(dst)
    pages = source.execute("PRAGMA page_count").fetchone()[0]
    with tqdm(total=pages, desc="copying the store", unit=" pages", unit_scale=True, file=sys.stderr,
              mininterval=1) as bar:
        done = [0]

        def progress(status, remaining, total):
            bar.total = total
            bar.update(total - remaining - done[0])
            done[0] = total - remaining

        source.backup(target, pages=16384, progress=progress)
    target.close()
    source.close()
    return time.perf_counter() - t0


def time_calls(calls_by_window, runs: int, phase: str) -> dict[tuple[str, str], dict]:
    out = {}
    for label, calls in calls_by_window:
        for i, call in enumerate(calls, 1):
            bl.log(f"[{phase} {label}] {i}/{len(calls)} {call.group}: {call.name}")
            ms, samples, _, error = bl.timed_call(call.name, call.fn, runs)
            if error is not None:
                out[(label, call.name)] = {"group": call.group, "ms": None, "samples_ms": [], "error": error}
                continue
            out[(label, call.name)] = {"group": call.group, "ms": round(ms, 2), "samples_ms": [round(s, 2) for s in samples]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--spans", type=int, default=1_000_000, help="size of the store (default 1,000,000)")
    ap.add_argument("--hours", type=float, default=24, help="hours of traffic in the store (default 24)")
    ap.add_argument("--db", default=None, help="the kept SQLite store (default /tmp/modalscope-bench/store-<spans>.db)")
    ap.add_argument("--windows", default="1h,24h", help="windows to read, of 1h,24h,7d (default 1h,24h)")
    ap.add_argument("--runs", type=int, default=5, help="timed calls after one warm-up, per phase (default 5)")
    ap.add_argument("--groups", default="api,page,query",
                    help="which calls: api (/api/v1), page (page callbacks), query (query functions); default all")
    ap.add_argument("--transport", default="http", choices=("http", "grpc"), help="how the load is sent (default http)")
    ap.add_argument("--clients", type=int, default=4, help="client threads sending the load (default 4)")
    ap.add_argument("--spans-per-request", type=int, default=5000)
    ap.add_argument("--pool-requests", type=int, default=60,
                    help="distinct requests the client prepares, resent with fresh trace ids (default 60)")
    ap.add_argument("--ramp-seconds", type=float, default=5, help="load before the timing starts (default 5)")
    ap.add_argument("--load", default="after", choices=("after", "live"),
                    help="what is sent: the ingest bench's traces stamped an hour after the windows (default), "
                         "or demo traffic of the store's services stamped from its newest minute on, moving with "
                         "the clock, the windows ending 15 minutes later: every trace waiting to settle is inside "
                         "the windows read (an incident being watched live)")
    ap.add_argument("--pending-walk", default="on", choices=("on", "off"),
                    help="off: a pair's exemplar search reads every pending trace one by one, as before schema "
                         "0008 (for a before/after comparison on one machine)")
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--client", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--base-ns", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    bl.sigterm_as_interrupt()
    if args.client:
        return run_client(args)
    args.groups = db.parse_groups(ap, args.groups)
    wanted = [w.strip() for w in args.windows.split(",") if w.strip()]
    known = {label for label, _ in db.WINDOWS}
    if not wanted or any(w not in known for w in wanted):
        ap.error(f"--windows: choose from {', '.join(sorted(known))}")
    machine = bl.machine_info()
    pristine = args.db or db.default_db(args.spans)
    fill = db.fill_sqlite(pristine, args.spans, args.hours)
    db.pack_store(f"sqlite:///{pristine}")  # (as the settler would have: models/packs.py)
    workdir = tempfile.mkdtemp(prefix="modalscope-load-bench-", dir=bl.TMP_ROOT)
    try:
        scratch = os.path.join(workdir, "store.db")
        copy_s = copy_store(pristine, scratch)
        url = f"sqlite:///{scratch}"
        data = measure_under_load(url, args, wanted)
        data.update({"machine": machine, "store": pristine, "fill": fill, "copy_s": round(copy_s, 1),
                     "args": {k: v for k, v in vars(args).items() if k not in ("client", "base_ns")}})
    except KeyboardInterrupt:
        bl.log("interrupted: receiver and client stopped, scratch copy removed")
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_report(data)
    bl.write_json(args.json, data)
    return 0


def measure_under_load(url: str, args, wanted: list[str]) -> dict:
    from modalscope.app import create_app
    from modalscope.settings import Settings

    if args.pending_walk == "off":
        from modalscope.models.reader import calls as reader_module

        reader_module.PENDING_WALK_AFTER = 1 << 62
    app = create_app(Settings(database_url=url))
    try:
        return _measure(app, url, args, wanted)
    finally:
        app.extensions["modalscope"]["engine"].dispose()


def _measure(app, url: str, args, wanted: list[str]) -> dict:
    from sqlalchemy import func, select, text

    from modalscope.app.params import Window
    from modalscope.models import Span

    client = app.test_client()
    client.get("/")
    reader = app.extensions["modalscope"]["reader"]
    with reader.engine.connect() as conn:
        n_spans = conn.execute(select(func.count()).select_from(Span)).scalar_one()
        first, last = conn.execute(select(func.min(Span.start_ns), func.max(Span.start_ns))).one()
    end = (last // MINUTE_NS + 1) * MINUTE_NS
    newest = end
    if args.load == "live":
        end += LIVE_SPAN_NS
    hours = dict(db.WINDOWS)
    calls_by_window = []
    for label in wanted:
        w = Window(end - hours[label] * HOUR_NS, end)
        calls = db.build_calls(app, client, reader, w, db.pick_subject(reader, w))
        calls_by_window.append((label, [c for c in calls if c.group in args.groups]))
    idle = time_calls(calls_by_window, args.runs, "idle")
    # Load: the receiver on the same store; spans stamped an hour after the windows, or
    # (--load live) demo traffic from the store's newest minute on, moving with the clock.
    env = {"MODALSCOPE_RETENTION_DAYS": "0", "MODALSCOPE_MINUTE_ROLLUP_DAYS": "0",
           "MODALSCOPE_ROLLUP_RETENTION_DAYS": "0"}  # never prune the copied store's history
    before = n_spans
    with bl.Receiver(url, settle_seconds=1, env=env) as rx:
        target = rx.http_url if args.transport == "http" else rx.grpc_target
        load = LoadClient(target, args, base_ns=end + HOUR_NS if args.load == "after" else newest)
        summary = None
        try:
            load.wait_sending()
            time.sleep(args.ramp_seconds)
            t0 = time.perf_counter()
            loaded = time_calls(calls_by_window, args.runs, "under load")
            read_s = time.perf_counter() - t0
        finally:
            summary = load.stop()
        with reader.engine.connect() as conn:
            after = conn.execute(select(func.count()).select_from(Span)).scalar_one()
            pending = conn.execute(text("SELECT count(*) FROM traces WHERE pending")).scalar_one()
        rss = rx.peak_rss()
    if summary is None or summary.get("error"):
        raise RuntimeError(f"the load client failed: {summary}")
    rows = []
    for (label, name), r in idle.items():
        lr = loaded[(label, name)]
        rows.append({"window": label, "group": r["group"], "call": name, "idle_ms": r["ms"], "load_ms": lr["ms"],
                     "ratio": round(lr["ms"] / r["ms"], 2) if r["ms"] and lr["ms"] is not None else None,
                     "error": r.get("error") or lr.get("error"),
                     "idle_samples_ms": r["samples_ms"], "load_samples_ms": lr["samples_ms"]})
    return {"spans": n_spans, "windows": wanted, "rows": rows, "read_phase_s": round(read_s, 1),
            "ingest": {**summary, "spans_per_s": round(summary["acked_spans"] / summary["seconds"]),
                       "stored_during_run": after - before, "pending_traces_at_end": pending},
            "receiver_peak_mb": rss["receiver_mb"], "settler_peak_mb": rss["settler_mb"],
            "reader_rss_mb": _self_rss_mb()}


def _self_rss_mb() -> int:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def print_report(data: dict) -> None:
    ing = data["ingest"]
    print(f"store: {data['spans']:,} spans (copy of {data['store']}); reads per phase: median of "
          f"{data['args']['runs']} after a warm-up")
    print(bl.machine_line(data["machine"]))
    labels = data["windows"]
    by_call: dict[tuple[str, str], dict] = {}
    for r in data["rows"]:
        by_call.setdefault((r["group"], r["call"]), {})[r["window"]] = r
    headers = ["call"] + [h for w in labels for h in (f"{w} idle ms", f"{w} loaded ms", f"{w} ×")]
    order = {"api": 0, "page": 1, "query": 2}
    lines = []
    for (group, call), per in sorted(by_call.items(), key=lambda kv: order[kv[0][0]]):
        cells = [call if group != "query" else f"query {call}"]
        for w in labels:
            r = per.get(w)
            cells += ([bl.fmt_ms(r["idle_ms"]), bl.fmt_ms(r["load_ms"]), f"{r['ratio']:.1f}×" if r["ratio"] else "—"]
                      if r else ["—", "—", "—"])
        lines.append(cells)
    print(bl.md_table(headers, lines))
    print(f"ingest meanwhile ({data['args']['transport']}, {data['args']['clients']} client threads): "
          f"{ing['spans_per_s']:,} spans/s acknowledged over {ing['seconds']:.0f} s ({ing['acked_spans']:,} spans, "
          f"{ing['retries']} retries); {ing['pending_traces_at_end']:,} traces waiting to settle when the reads ended; "
          f"receiver peak RSS {bl.fmt_int(data['receiver_peak_mb'])} MB, settler {bl.fmt_int(data['settler_peak_mb'])} MB")


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        bl.log("interrupted")
        raise SystemExit(130) from None
