"""Scale-out: several `modalscope ingest otlp` processes behind a (simulated) load balancer
write one store. Traces are split across receivers and part of the traffic is resent to
another receiver (a client retrying elsewhere); the store ends exactly as one process
would have left it: every span once, every trace settled once, the same rollups."""

from __future__ import annotations

import os
import time

import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import func, select

from modalscope.app import queries
from modalscope.app.params import Window
from modalscope.ingest import demo
from modalscope.ingest.settle import settle
from modalscope.models import Span, Trace
from modalscope.models.engine import make_engine
from modalscope.models.reader import Filters, StoreReader
from modalscope.models.schema import ensure_schema
from tests.ingest.test_receivers import free_port
from tests.test_e2e import _start, _stop, _wait_http

RECEIVERS = 3
# Six minutes of demo traffic, anchored in the past so "now" never moves under us.
CONFIG = demo.DemoConfig(now_ns=(time.time_ns() // 60_000_000_000 - 30) * 60_000_000_000, seed=11,
                         hours=0.1, rate=1.5, spans_per_request=400)


def _split(payload: bytes, parts: int) -> list[bytes]:
    """One request's spans dealt round-robin into ``parts`` requests (each keeps its
    resource and scope), so every trace is spread over several receivers."""
    req = ExportTraceServiceRequest.FromString(payload)
    outs = [ExportTraceServiceRequest() for _ in range(parts)]
    i = 0
    for rs in req.resource_spans:
        targets = [None] * parts
        for ss in rs.scope_spans:
            scopes = [None] * parts
            for span in ss.spans:
                k = i % parts
                i += 1
                if targets[k] is None:
                    targets[k] = outs[k].resource_spans.add()
                    targets[k].resource.CopyFrom(rs.resource)
                if scopes[k] is None:
                    scopes[k] = targets[k].scope_spans.add()
                    scopes[k].scope.CopyFrom(ss.scope)
                scopes[k].spans.add().CopyFrom(span)
    return [o.SerializeToString() for o in outs if o.resource_spans]


def _post(port: int, body: bytes) -> None:
    for attempt in range(50):  # retry as an OTLP exporter does on 429/503
        r = requests.post(f"http://127.0.0.1:{port}/v1/traces", data=body,
                          headers={"Content-Type": "application/x-protobuf"}, timeout=30)
        if r.status_code == 200:
            return
        assert r.status_code in (429, 503), r.text
        time.sleep(float(r.headers.get("Retry-After", "0.2")))
    raise AssertionError("receiver never accepted the request")


def _answers(reader: StoreReader) -> dict:
    w = Window(CONFIG.start_ns - 60_000_000_000, CONFIG.end_ns + 600_000_000_000)
    pairs = queries.pairs(reader, w, Filters())
    assert [p["count"] for p in pairs] == sorted((p["count"] for p in pairs), reverse=True)
    # Pairs with equal call counts come in the order their series were first stored, which
    # differs between stores filled concurrently; compared by name within a count.
    pairs.sort(key=lambda p: (-p["count"], p["caller"], p["callee"]))
    return {"pairs": pairs, "input_types": queries.input_types(reader, w, Filters()),
            "stages": queries.stages(reader, w, Filters())}


def _receiver_env(monkeypatch, db_url: str, **ports: int) -> dict:
    """The environment of a `modalscope ingest otlp` under test: no OTEL_ or MODALSCOPE_
    settings from outside, this store, quick settling, and ``http``/``grpc`` ports if given."""
    for k in list(os.environ):
        if k.startswith("OTEL_"):
            monkeypatch.delenv(k)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env.update({"MODALSCOPE_DATABASE_URL": db_url, "MODALSCOPE_SETTLE_SECONDS": "0.3"})
    if "http" in ports:
        env["MODALSCOPE_OTLP_HTTP_PORT"] = str(ports["http"])
    if "grpc" in ports:
        env["MODALSCOPE_OTLP_GRPC_PORT"] = str(ports["grpc"])
    return env


def _spans_in(payloads: list[bytes]) -> int:
    return sum(len(ss.spans) for p in payloads for rs in ExportTraceServiceRequest.FromString(p).resource_spans
               for ss in rs.scope_spans)


def _stored_counts(engine) -> tuple[int, int, int, int]:
    """(span rows, distinct (trace, span) ids, trace rows, traces still pending) in a store."""
    with engine.connect() as conn:
        spans = conn.execute(select(func.count()).select_from(Span)).scalar_one()
        distinct = conn.execute(select(func.count()).select_from(
            select(Span.trace_id, Span.span_id).distinct().subquery())).scalar_one()
        traces = conn.execute(select(func.count()).select_from(Trace)).scalar_one()
        pending = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
    return spans, distinct, traces, pending


def test_several_receivers_one_store_lose_and_duplicate_nothing(db_url, tmp_path, monkeypatch):
    env = _receiver_env(monkeypatch, db_url)
    procs, ports = [], []
    try:
        for _ in range(RECEIVERS):
            port = free_port()
            e = dict(env, MODALSCOPE_OTLP_HTTP_PORT=str(port), MODALSCOPE_OTLP_GRPC_PORT=str(free_port()))
            procs.append(_start(["ingest", "otlp"], e))
            ports.append(port)
        for port, proc in zip(ports, procs):
            _wait_http(f"http://127.0.0.1:{port}/", proc)

        sent = 0
        for n, payload in enumerate(demo.export_requests(CONFIG)):
            for k, part in enumerate(_split(payload, RECEIVERS)):
                _post(ports[(n + k) % RECEIVERS], part)
                if (n + k) % 4 == 0:  # a retry that went to another receiver
                    _post(ports[(n + k + 1) % RECEIVERS], part)
                sent += 1
        assert sent > 20

        for proc in procs:  # Ctrl-C: each writes what it acknowledged and settles what is due
            code, _, err = _stop(proc)
            assert code == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    engine = make_engine(db_url, write=True)
    try:
        settle(engine, force=True)  # whatever was not yet due when the receivers stopped
        spans, distinct, traces, pending = _stored_counts(engine)
        got = _answers(StoreReader(engine))
    finally:
        engine.dispose()

    # The same traffic through one process into a fresh SQLite store: the reference.
    ref_url = f"sqlite:///{tmp_path / 'reference.db'}"
    ensure_schema(ref_url)
    ref = make_engine(ref_url, write=True)
    try:
        filled = demo.fill(ref, CONFIG)
        settle(ref, force=True)
        expected = _answers(StoreReader(ref))
    finally:
        ref.dispose()

    assert spans == distinct == filled.spans
    assert traces == filled.traces and pending == 0
    assert got == expected
    assert sum(r["count"] for r in got["input_types"]) == filled.traces


# -- receiver processes sharing one port (--processes) -------------------------------------
def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                kids = [int(k) for k in fh.read().split()]
        except OSError:
            kids = []
        out.extend(kids)
        todo.extend(kids)
    return out


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                f = line.split()
                if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f[9])
    return inodes


def _owners(pids: list[int], inodes: set[str]) -> set[int]:
    owners = set()
    for p in pids:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.add(p)
    return owners


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_receiver_processes_share_both_ports_and_store_everything_once(db_url, tmp_path, monkeypatch):
    """`ingest otlp --processes 2`: two processes listen on each port, both take requests
    (the kernel spreads connections), every span is stored once, and Ctrl-C stops them all."""
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    http_port, grpc_port = free_port(), free_port()
    env = _receiver_env(monkeypatch, db_url, http=http_port, grpc=grpc_port)
    proc = _start(["ingest", "otlp", "--processes", "2"], env)
    try:
        ready = proc.stdout.readline()  # printed once every process listens
        assert "(2 processes)" in ready, ready + proc.stderr.read()
        family = [proc.pid, *_descendants(proc.pid)]
        http_owners = _owners(family, _listening_inodes(http_port))
        grpc_owners = _owners(family, _listening_inodes(grpc_port))
        assert len(http_owners) == 2 and http_owners == grpc_owners and proc.pid in http_owners
        before = {p: _cpu_ticks(p) for p in http_owners}

        payloads = list(demo.export_requests(CONFIG))
        assert len(payloads) > 20
        for n, payload in enumerate(payloads):
            if n % 2:  # a fresh connection each time, so the kernel picks a process each time
                _post(http_port, payload)
            else:
                with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                    TraceServiceStub(channel).Export(ExportTraceServiceRequest.FromString(payload), timeout=30)
        busy = {p: _cpu_ticks(p) - before[p] for p in http_owners}
        # Each process decoded and wrote part of the traffic (an idle one gains a tick or two).
        assert all(ticks >= 5 for ticks in busy.values()), busy

        code, _, err = _stop(proc)
        assert code == 0, err
        assert "Traceback" not in err
        assert not [p for p in http_owners - {proc.pid} if os.path.exists(f"/proc/{p}")], \
            "a receiver process outlived the command"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    engine = make_engine(db_url, write=True)
    try:
        settle(engine, force=True)
        spans, distinct, traces, _ = _stored_counts(engine)
    finally:
        engine.dispose()
    assert spans == distinct == _spans_in(payloads)
    assert traces == len({s.trace_id for p in payloads for rs in ExportTraceServiceRequest.FromString(p).resource_spans
                          for ss in rs.scope_spans for s in ss.spans})


def test_receiver_processes_refuse_a_bad_count(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env["MODALSCOPE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'x.db'}"
    proc = _start(["ingest", "otlp", "--processes", "0"], env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines()[-1] == "modalscope: error: --processes 0: need at least 1"


def test_a_receiver_process_that_dies_is_replaced(tmp_path, monkeypatch):
    """Killing one of `--processes 2`'s receivers (SIGKILL: no drain) loses nothing it had
    acknowledged; another process takes over both ports, and traffic after it is stored."""
    import signal

    url = f"sqlite:///{tmp_path / 'store.db'}"
    http_port, grpc_port = free_port(), free_port()
    env = _receiver_env(monkeypatch, url, http=http_port, grpc=grpc_port)
    proc = _start(["ingest", "otlp", "--processes", "2"], env)
    payloads = list(demo.export_requests(CONFIG))
    try:
        assert "(2 processes)" in proc.stdout.readline()
        owners = _owners([proc.pid, *_descendants(proc.pid)], _listening_inodes(http_port))
        (child,) = owners - {proc.pid}
        half = len(payloads) // 2
        for payload in payloads[:half]:
            _post(http_port, payload)
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            family = [proc.pid, *_descendants(proc.pid)]
            http_owners = _owners(family, _listening_inodes(http_port))
            grpc_owners = _owners(family, _listening_inodes(grpc_port))
            if len(http_owners) == 2 and child not in http_owners and http_owners == grpc_owners:
                break
            assert time.monotonic() < deadline, f"no replacement: {http_owners} {grpc_owners}"
            time.sleep(0.2)
        for payload in payloads[half:]:
            _post(http_port, payload)
        code, _, err = _stop(proc)
        assert code == 0, err
        assert "starting another" in err and "took over" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    engine = make_engine(url, write=True)
    try:
        spans = _stored_counts(engine)[0]
    finally:
        engine.dispose()
    assert spans == _spans_in(payloads)
