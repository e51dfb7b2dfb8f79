"""What the fault tests share: real `modalscope` processes in their own process groups
(killed in finalizers), real OpenTelemetry SDK exporters as the retrying clients, write
locks held from another connection, and exact checks of what the store holds."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from modalscope.models import Rollup, Series, Span, Trace

SPANS_PER_TRACE = 7


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any modalscope/OTel/Google setting, plus ``settings``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MODALSCOPE_", "OTEL_")) and k != "GOOGLE_CLOUD_PROJECT"}
    env.update(settings)
    return env


# --------------------------------------------------------------------------- processes


class Proc:
    """A `modalscope` command in a process group of its own, output in files (a full pipe
    would block a chatty process)."""

    def __init__(self, args: list[str], env: dict[str, str], workdir: Path, name: str,
                 entry: list[str] | None = None) -> None:
        self.name = name
        self.out_path = workdir / f"{name}.out"
        self.err_path = workdir / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen([sys.executable, *(entry or ["-m", "modalscope"]), *args], env=env, cwd=workdir,
                                          stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        self.pid = self.popen.pid

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group (the settler child too), as a container runtime or the OOM
        killer would, and reap it."""
        self.signal_group(signal.SIGKILL)
        self.popen.wait(30)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)


class Processes:
    """Every process a test starts; :meth:`close` (a finalizer) kills what still runs."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []

    def start(self, args: list[str], env: dict[str, str], name: str | None = None,
              entry: list[str] | None = None) -> Proc:
        """``entry``: what runs instead of ``-m modalscope`` (a script that tunes it first)."""
        proc = Proc(args, env, self.workdir, name or f"{args[0]}-{len(self.procs)}", entry)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            proc.signal_group(signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.popen.wait(30)


def wait_listening(proc: Proc, *ports: int, timeout: float = 60.0) -> None:
    """Until every port takes a TCP connection; fails at once if the process exits."""
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.name} exited with {proc.poll()}: {proc.stderr[-3000:]}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"{proc.name} is not listening on {port}: {proc.stderr[-3000:]}")
            time.sleep(0.05)


def start_ingest(procs: Processes, db_url: str, name: str = "ingest", **settings: str):
    """`modalscope ingest otlp` on fresh ports; returns (proc, http_port, grpc_port) once both listen."""
    http_port, grpc_port = free_port(), free_port()
    env = clean_env(MODALSCOPE_DATABASE_URL=db_url, MODALSCOPE_OTLP_HTTP_PORT=str(http_port),
                    MODALSCOPE_OTLP_GRPC_PORT=str(grpc_port), MODALSCOPE_SETTLE_SECONDS="0.5", **settings)
    proc = procs.start(["ingest", "otlp"], env, name)
    wait_listening(proc, http_port, grpc_port)
    return proc, http_port, grpc_port


def restart_ingest(procs: Processes, db_url: str, http_port: int, grpc_port: int, name: str, **settings: str):
    env = clean_env(MODALSCOPE_DATABASE_URL=db_url, MODALSCOPE_OTLP_HTTP_PORT=str(http_port),
                    MODALSCOPE_OTLP_GRPC_PORT=str(grpc_port), MODALSCOPE_SETTLE_SECONDS="0.5", **settings)
    proc = procs.start(["ingest", "otlp"], env, name)
    wait_listening(proc, http_port, grpc_port)
    return proc


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB, from /proc."""
    values = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


# --------------------------------------------------------------------------- spans


def make_traces(n: int, seed: int = 0, end_ns: int | None = None) -> list[list]:
    """``n`` multimodal traces of SPANS_PER_TRACE OTel SDK spans each: gateway SERVER root ->
    CLIENT vision.Encode -> vision-encoder SERVER -> image.decode, vit.forward; fusion.align
    and llm.generate in the gateway. Ids are random (``seed``), times end before ``end_ns``."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

    rng = random.Random(seed)
    gateway = Resource.create({"service.name": "gateway"})
    encoder = Resource.create({"service.name": "vision-encoder", "service.instance.id": "pod-7"})
    scope = InstrumentationScope("modalscope.faults", "1")
    end_ns = end_ns or time.time_ns()
    ms = 1_000_000
    traces = []
    for i in range(n):
        trace_id = rng.getrandbits(128) | 1
        t0 = end_ns - (n - i) * 10 * ms - 2_000 * ms
        ids = [rng.getrandbits(64) | 1 for _ in range(SPANS_PER_TRACE)]
        ctx = [SpanContext(trace_id, sid, is_remote=False, trace_flags=TraceFlags(1)) for sid in ids]

        def span(k, name, kind, resource, parent, start, end, attributes=None):
            return ReadableSpan(name=name, context=ctx[k], parent=None if parent is None else ctx[parent],
                                resource=resource, attributes=attributes or {}, kind=kind,
                                start_time=t0 + start * ms, end_time=t0 + end * ms, instrumentation_scope=scope)

        traces.append([
            span(0, "POST /v1/chat", SpanKind.SERVER, gateway, None, 0, 900,
                 {"mm.image_count": 1, "mm.prompt_chars": 40 + i % 50}),
            span(1, "vision.Encode", SpanKind.CLIENT, gateway, 0, 10, 500, {"peer.service": "vision-encoder"}),
            span(2, "vision.Encode", SpanKind.SERVER, encoder, 1, 20, 490),
            span(3, "image.decode", SpanKind.INTERNAL, encoder, 2, 25, 200),
            span(4, "vit.forward", SpanKind.INTERNAL, encoder, 2, 210, 480, {"mm.modality": "vision"}),
            span(5, "fusion.align", SpanKind.INTERNAL, gateway, 0, 510, 540),
            span(6, "llm.generate", SpanKind.INTERNAL, gateway, 0, 550, 890),
        ])
    return traces


def otlp_json_request(spans) -> dict:
    """OTLP/JSON of SDK spans, as the Collector's file exporter writes a line: hex ids, int64
    as strings, one resourceSpans entry a resource."""
    by_resource: dict[int, tuple] = {}
    for s in spans:
        entry = by_resource.setdefault(id(s.resource), (s.resource, []))
        entry[1].append(s)

    def value(v):
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        return {"stringValue": str(v)}

    def attrs(mapping):
        return [{"key": k, "value": value(v)} for k, v in mapping.items()]

    out = []
    for resource, members in by_resource.values():
        items = []
        for s in members:
            item = {"traceId": format(s.context.trace_id, "032x"), "spanId": format(s.context.span_id, "016x"),
                    "name": s.name, "kind": s.kind.value + 1, "startTimeUnixNano": str(s.start_time),
                    "endTimeUnixNano": str(s.end_time), "attributes": attrs(s.attributes or {}), "status": {}}
            if s.parent is not None:
                item["parentSpanId"] = format(s.parent.span_id, "016x")
            items.append(item)
        out.append({"resource": {"attributes": attrs(resource.attributes)},
                    "scopeSpans": [{"scope": {"name": "modalscope.faults"}, "spans": items}]})
    return {"resourceSpans": out}


def pb_payload(spans) -> bytes:
    """A serialized ExportTraceServiceRequest of SDK spans, as the SDK exporters build it."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans).SerializeToString()


def batches_of(traces: list[list], traces_per_batch: int) -> list[list]:
    return [[s for t in traces[i:i + traces_per_batch] for s in t]
            for i in range(0, len(traces), traces_per_batch)]


def span_keys(spans) -> set[tuple[str, str]]:
    return {(format(s.context.trace_id, "032x"), format(s.context.span_id, "016x")) for s in spans}


def http_exporter(port: int, timeout: float = 30.0):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=timeout)


def grpc_exporter(port: int, timeout: float = 30.0):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=timeout)


class StreamingClient(threading.Thread):
    """Exports ``batches`` one after another through a real OTel SDK exporter, which retries
    connection errors, 429/503 (honouring Retry-After) and UNAVAILABLE (honouring RetryInfo)
    by itself. A batch the exporter gives up on is exported again, as an application with a
    retrying queue would, until ``deadline`` — or not at all once ``give_up`` is set.

    ``acked`` lists the batches the receiver answered with success; ``sending`` is the
    batch in flight and ``sending_since`` when it left.
    """

    def __init__(self, exporter, batches: list[list], *, pause: float = 0.0, deadline: float = 120.0,
                 name: str = "client") -> None:
        super().__init__(name=name, daemon=True)
        self.exporter = exporter
        self.batches = batches
        self.pause = pause
        self.deadline = time.monotonic() + deadline
        self.acked: list[int] = []
        self.failed: list[int] = []
        self.resends = 0
        self.sending: int | None = None
        self.sending_since = 0.0
        self.give_up = threading.Event()
        self.stop_sending = threading.Event()

    def run(self) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            for i, batch in enumerate(self.batches):
                if self.stop_sending.is_set():
                    break
                self.sending, self.sending_since = i, time.monotonic()
                while True:
                    if self.exporter.export(batch) == SpanExportResult.SUCCESS:
                        self.acked.append(i)
                        break
                    if self.give_up.is_set() or time.monotonic() > self.deadline:
                        self.failed.append(i)
                        break
                    self.resends += 1
                    time.sleep(0.2)
                self.sending = None
                if self.pause:
                    time.sleep(self.pause)
        finally:
            self.exporter.shutdown()

    def acked_keys(self) -> set[tuple[str, str]]:
        return {k for i in self.acked for k in span_keys(self.batches[i])}

    def all_keys(self) -> set[tuple[str, str]]:
        return {k for b in self.batches for k in span_keys(b)}


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- locks


@contextlib.contextmanager
def write_lock(db_url: str):
    """Hold the store's write lock from another connection: SQLite's (BEGIN EXCLUSIVE), or
    an EXCLUSIVE lock on PostgreSQL's spans table (reads go on, writes wait)."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        import sqlite3

        conn = sqlite3.connect(url.database, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    import psycopg

    conn = psycopg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        conn.execute("LOCK TABLE spans IN EXCLUSIVE MODE")
        yield
    finally:
        conn.rollback()
        conn.close()


# --------------------------------------------------------------------------- store checks


def stored_keys(engine) -> Counter:
    """(trace_id, span_id) -> how many rows the store holds for it."""
    with engine.connect() as conn:
        return Counter(tuple(r) for r in conn.execute(select(Span.trace_id, Span.span_id)).all())


def pending_traces(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()


def wait_settled(engine, expected_traces: int, timeout: float = 60.0) -> None:
    def settled():
        with engine.connect() as conn:
            total = conn.execute(select(func.count()).select_from(Trace)).scalar_one()
        return total == expected_traces and pending_traces(engine) == 0

    wait_until(settled, timeout, f"{expected_traces} settled traces", interval=0.2)


def assert_exactly_once(engine, expected: set[tuple[str, str]], *, spans_per_trace: int = SPANS_PER_TRACE,
                        input_type: str = "image") -> None:
    """Every expected span is stored once and nothing else is; every trace is settled with
    all its spans, and the rollups count each span and each trace exactly once."""
    stored = stored_keys(engine)
    duplicates = {k: n for k, n in stored.items() if n != 1}
    assert not duplicates, f"{len(duplicates)} spans stored more than once"
    missing = expected - set(stored)
    extra = set(stored) - expected
    assert not missing and not extra, f"{len(missing)} spans missing, {len(extra)} unexpected"
    trace_ids = {t for t, _ in expected}
    with engine.connect() as conn:
        rows = conn.execute(select(Trace.trace_id, Trace.pending, Trace.span_count, Trace.input_type)).all()
        op_count = conn.execute(select(func.coalesce(func.sum(Rollup.count), 0))
                                .join(Series, Series.id == Rollup.series_id).where(Series.kind == "op")).scalar_one()
        trace_count = conn.execute(select(func.coalesce(func.sum(Rollup.count), 0))
                                   .join(Series, Series.id == Rollup.series_id)
                                   .where(Series.kind == "trace")).scalar_one()
    assert {r.trace_id for r in rows} == trace_ids
    assert not [r for r in rows if r.pending], "traces left unsettled"
    assert {r.span_count for r in rows} == {spans_per_trace}
    assert {r.input_type for r in rows} == {input_type}
    assert op_count == len(expected), f"rollups count {op_count} spans, {len(expected)} stored"
    assert trace_count == len(trace_ids), f"rollups count {trace_count} traces, {len(trace_ids)} stored"
