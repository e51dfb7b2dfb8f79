"""The processes of ``ingest_bench.py``: the clients that send to a receiver, one receiver or
import run, the memory of the receiver's process tree, and the throw-away stores of a run.

The tree's memory is sampled, not only read at the end: ``VmHWM`` of each live process misses
a child that has already exited (a short-lived helper of the settler), and a sum of peaks
taken at different moments overstates what the tree held at once. ``TreeSampler`` adds up
the resident memory of the receiver and every descendant each ``interval`` seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402


# -- clients ---------------------------------------------------------------------------------
class HttpSender:
    """POSTs payloads to ``/v1/traces``, one ``requests.Session`` a thread; retries 429/503."""

    def __init__(self, url: str) -> None:
        import requests

        self.url = url
        self._requests = requests
        self._local = threading.local()
        self.retries = 0
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        session = getattr(self._local, "s", None)
        if session is None:
            session = self._local.s = self._requests.Session()
        while True:
            r = session.post(self.url, data=data, headers={"Content-Type": "application/x-protobuf"}, timeout=300)
            if r.status_code == 200:
                return
            if r.status_code in (429, 503):
                with self._lock:
                    self.retries += 1
                time.sleep(float(r.headers.get("Retry-After", "1")))
                continue
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")

    def close(self) -> None:
        pass


class GrpcSender:
    """``TraceService/Export`` through opentelemetry-proto's ``TraceServiceStub``, one channel
    a thread, each with its own connection (as separate exporters have: grpc would otherwise
    share one connection among a process's channels to the same target); retries
    UNAVAILABLE after the RetryInfo delay."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._local = threading.local()
        self._channels: list = []
        self._lock = threading.Lock()
        self.retries = 0

    def _stub(self):
        stub = getattr(self._local, "stub", None)
        if stub is None:
            import grpc
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

            channel = grpc.insecure_channel(self.target, options=[("grpc.max_send_message_length", -1),
                                                                  ("grpc.max_receive_message_length", -1),
                                                                  ("grpc.use_local_subchannel_pool", 1)])
            with self._lock:
                self._channels.append(channel)
            stub = self._local.stub = TraceServiceStub(channel)
        return stub

    def send(self, data: bytes) -> None:
        import grpc
        from google.rpc import error_details_pb2

        stub = self._stub()
        request = ExportTraceServiceRequest.FromString(data)  # what an exporter holds: a message
        while True:
            try:
                stub.Export(request, timeout=300)
                return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise RuntimeError(f"gRPC {exc.code().name}: {exc.details()}") from None
                delay = 1.0
                for key, value in exc.trailing_metadata() or ():
                    if key == "google.rpc.retryinfo-bin":
                        info = error_details_pb2.RetryInfo.FromString(value)
                        delay = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
                with self._lock:
                    self.retries += 1
                time.sleep(max(delay, 0.05))

    def close(self) -> None:
        for c in self._channels:
            c.close()


def send_all(send, payloads: list[bytes], clients: int) -> None:
    """``send`` every payload from ``clients`` threads; on an error or Ctrl-C the requests not
    yet started are cancelled (the ones in flight finish or fail with the receiver)."""
    pool = ThreadPoolExecutor(clients)
    try:
        for f in [pool.submit(send, p) for p in payloads]:
            f.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


# -- the receiver's process tree ---------------------------------------------------------------
def _rss_mb(pid: int) -> float | None:
    kb = bl._status_kb(pid, "VmRSS")  # noqa: SLF001 - benchlib's /proc reader
    return None if kb is None else kb / 1024


class TreeSampler:
    """Samples, every ``interval`` seconds, the resident memory of process ``pid`` and all its
    descendants together; ``peak_mb`` is the largest sum seen, ``peak_pids`` the processes
    then. A thread; ``stop()`` takes one last sample."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_mb = 0.0
        self.peak_pids: dict[int, float] = {}
        self.seen: dict[int, str] = {}  # every process of the tree seen, with its command line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def start(self) -> "TreeSampler":
        self._thread.start()
        return self

    def sample(self) -> None:
        sizes = {}
        for pid in [self.pid, *bl.descendants(self.pid)]:
            mb = _rss_mb(pid)
            if mb is not None:
                sizes[pid] = mb
                if pid not in self.seen:
                    self.seen[pid] = bl.cmdline(pid)
        total = sum(sizes.values())
        if total > self.peak_mb:
            self.peak_mb, self.peak_pids = total, sizes

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()


def tree_rss(rx: bl.Receiver, sampler: TreeSampler) -> dict:
    """The per-process peaks of ``bl.Receiver.peak_rss`` (read now, from live processes) and
    the sampled peak of the whole tree; ``settler_mb`` is the receiver's own spawned child
    (a process the settler starts is counted in the tree, not as the settler)."""
    rss = rx.peak_rss()
    settler = [c for c in rss["children"] if c["role"] == "settler" and c["pid"] in _children(rx.receiver_pid)]
    rss["settler_mb"] = max((c["peak_mb"] for c in settler if c["peak_mb"] is not None), default=None)
    rss["tree_mb"] = round(sampler.peak_mb, 1)
    rss["tree_at_peak"] = {str(p): round(mb, 1) for p, mb in sampler.peak_pids.items()}
    rss["tree_processes"] = len(sampler.seen)
    return rss


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as fh:
                out.update(int(x) for x in fh.read().split())
        except OSError:
            continue
    return out


# -- one transport run -------------------------------------------------------------------------
def receiver_run(transport: str, payloads: list[bytes], url: str, args) -> dict:
    from modalscope.models.schema import ensure_schema

    ensure_schema(url)  # created before the receiver starts: not part of the timing
    with bl.Receiver(url, settle_seconds=args.settle_seconds, pyspy=args.pyspy, processes=args.processes) as rx:
        sampler = TreeSampler(rx.receiver_pid).start()
        sender = HttpSender(rx.http_url) if transport == "http" else GrpcSender(rx.grpc_target)
        try:
            t0 = time.perf_counter()
            send_all(sender.send, payloads, args.clients)
            acked = time.perf_counter() - t0
        finally:
            sender.close()
        try:
            settled = None if args.ack_only else bl.wait_settled(url) - t0
        finally:
            sampler.stop()
        rss = tree_rss(rx, sampler)
    stored = bl.count_rows(url, "SELECT count(*) FROM spans")
    return {"acked_s": acked, "settled_s": settled, "stored_spans": stored, "retries": sender.retries,
            "receiver_peak_mb": rss["receiver_mb"], "settler_peak_mb": rss["settler_mb"],
            "tree_peak_mb": rss["tree_mb"], "rss_detail": rss}


def import_run(transport: str, payloads: list[bytes], url: str, workdir: str, to_json) -> dict:
    """``modalscope import`` of ``payloads`` written as protobuf files (``import-pb``) or as
    one OTLP/JSON-lines file (``import-json``; ``to_json`` converts a payload)."""
    from modalscope.models.schema import ensure_schema

    ensure_schema(url)
    if transport == "import-pb":
        files = []
        for i, p in enumerate(payloads):
            path = os.path.join(workdir, f"request-{i:05d}.pb")
            with open(path, "wb") as fh:
                fh.write(p)
            files.append(path)
    else:
        path = os.path.join(workdir, "requests.jsonl")
        with open(path, "wb") as fh:
            for p in payloads:
                fh.write(to_json(p) + b"\n")
        files = [path]
    log_path = os.path.join(workdir, f"{transport}.log")
    env = {**os.environ, "MODALSCOPE_DATABASE_URL": url}
    with open(log_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "modalscope", "import", *files], env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=bl.TMP_ROOT)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        elapsed = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    with open(log_path, "rb") as fh:
        tail = fh.read().decode(errors="replace").strip().splitlines()[-3:]
    if proc.returncode != 0:
        raise RuntimeError(f"modalscope import exited {proc.returncode}: {' | '.join(tail)}")
    for f in files:
        os.remove(f)
    stored = bl.count_rows(url, "SELECT count(*) FROM spans")
    # "acknowledged" for an import: its spans all committed (its summary says when, settling
    # still to finish); "settled": the import's exit, which waits for settling.
    m = re.search(r"written in ([0-9.]+) s, settled in ([0-9.]+) s", tail[-1] if tail else "")
    acked = elapsed - (float(m.group(2)) - float(m.group(1))) if m else elapsed
    peak = round(usage.ru_maxrss / 1024, 1)
    return {"acked_s": acked, "settled_s": elapsed, "stored_spans": stored, "retries": 0,
            "receiver_peak_mb": peak, "settler_peak_mb": None, "tree_peak_mb": peak,
            "import_summary": tail[-1] if tail else ""}


class Stores:
    """Fresh stores for one run: SQLite files in a temporary directory, or throw-away
    PostgreSQL databases (dropped by ``close``)."""

    def __init__(self, workdir: str, server_url: str | None) -> None:
        self.workdir = workdir
        self.server_url = server_url
        self._dbs: list[str] = []

    def new(self, label: str) -> str:
        if self.server_url is None:
            path = os.path.join(self.workdir, f"{label}-{len(self._dbs)}.db")
            self._dbs.append(path)
            return f"sqlite:///{path}"
        name = bl.unique_db_name("msbench")
        bl.create_database(self.server_url, name)
        self._dbs.append(name)
        return bl.libpq_url(self.server_url, name).replace("postgresql://", "postgresql+psycopg://", 1)

    def close(self) -> None:
        for db in self._dbs:
            if self.server_url is None:
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(db + suffix):
                        os.remove(db + suffix)
            else:
                try:
                    bl.drop_database(self.server_url, db)
                except Exception as exc:  # noqa: BLE001
                    bl.log(f"could not drop database {db}: {exc}")
        self._dbs.clear()
