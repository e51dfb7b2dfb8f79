"""Helpers shared by the benchmark scripts in this folder (not part of the package).

Machine details for a report, peak RSS from /proc, the ``modalscope ingest otlp`` receiver
as a managed subprocess, throw-away PostgreSQL databases, medians and Markdown tables.
Everything a script starts is stopped in ``finally`` blocks (Ctrl-C and errors included);
SIGTERM is turned into KeyboardInterrupt so those blocks run then too.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as _dt
import json
import os
import platform
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Iterable, Iterator, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TMP_ROOT = "/tmp"
BENCH_DIR = os.path.join(TMP_ROOT, "modalscope-bench")  # stores kept between runs
DEFAULT_PG_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


# -- process hygiene ---------------------------------------------------------------------
def sigterm_as_interrupt() -> None:
    """A SIGTERM (e.g. ``timeout``) unwinds like Ctrl-C, so subprocesses and databases are cleaned up."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- memory --------------------------------------------------------------------------------
def _status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, in MB; None once it is gone."""
    kb = _status_kb(pid, "VmHWM")
    return None if kb is None else kb / 1024


def descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (children of every thread, recursively)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
            except OSError:
                continue
            for k in kids:
                if k not in out:
                    out.append(k)
                    todo.append(k)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def tree_peak_rss(pid: int, receivers: set[int] | frozenset[int] = frozenset()) -> dict:
    """Peak RSS of a receiver and its children: ``{"receiver_mb", "settler_mb", "children"}``.

    The settler is the child whose command line names ``modalscope-settler``; the extra
    receiver processes of ``--processes N`` are ``receivers``; multiprocessing's resource
    tracker (beside those) is listed but not counted. ``receiver_mb`` is the
    largest receiver process's peak, ``receivers_total_mb`` the sum over all of them.
    """
    children = []
    settler = None
    peaks = [peak_rss_mb(pid)]
    for child in descendants(pid):
        cmd = cmdline(child)
        role = ("resource tracker" if "resource_tracker" in cmd else "receiver" if child in receivers
                else "settler" if "modalscope-settler" in cmd else "child")
        mb = peak_rss_mb(child)
        children.append({"pid": child, "role": role, "peak_mb": None if mb is None else round(mb, 1)})
        if role == "settler" and mb is not None:
            settler = max(settler or 0.0, mb)
        if role == "receiver":
            peaks.append(mb)
    known = [m for m in peaks if m is not None]
    return {"receiver_mb": round(max(known), 1) if known else None,
            "receivers_total_mb": round(sum(known), 1) if known else None,
            "settler_mb": None if settler is None else round(settler, 1), "children": children}


# -- machine -------------------------------------------------------------------------------
def machine_info(database_url: str | None = None) -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kb = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_kb = int(line.split()[1])
    except OSError:
        pass
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": None if mem_kb is None else round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python_loop_ms": python_loop_ms(),
    }
    if database_url and is_postgres(database_url):
        try:
            import psycopg

            with psycopg.connect(libpq_url(database_url, "postgres"), connect_timeout=10) as conn:
                info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
        except Exception as exc:  # noqa: BLE001 - informational
            info["postgresql"] = f"unknown ({exc.__class__.__name__})"
    return info


def python_loop_ms() -> float:
    """Milliseconds CPython takes for a fixed loop (5 M additions, best of 3): how fast this
    machine runs our kind of code, so results from different machines can be compared
    (hosts differ about twofold; docs/benchmarks.md)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        total = 0
        for i in range(5_000_000):
            total += i
        best = min(best, time.perf_counter() - t)
    return round(best * 1000, 1)


def machine_line(info: dict) -> str:
    pg = f", PostgreSQL {info['postgresql']}" if info.get("postgresql") else ""
    return (f"{info['date_utc']}: {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB, "
            f"Linux {info['kernel']}, Python {info['python']}, SQLite {info['sqlite']}{pg}; "
            f"load average {info['load_average_1m']} at start; CPython reference loop "
            f"{info.get('python_loop_ms')} ms (bench/benchlib.python_loop_ms)")


# -- statistics and output -----------------------------------------------------------------
def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def timed(fn, runs: int, warmup: int = 1):
    """``(median ms, samples ms, last result)`` of ``runs`` calls after ``warmup`` calls."""
    result = None
    for _ in range(warmup):
        result = fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples), samples, result


def timed_call(name: str, fn, runs: int):
    """``timed`` for one benchmark call that must not lose the whole run when it fails:
    ``(median ms, samples ms, result, None)``, or ``(None, [], None, "Error: message")``
    after logging the failure."""
    try:
        ms, samples, result = timed(fn, runs)
    except Exception as exc:  # noqa: BLE001 - one failing call must not lose the whole run
        log(f"  FAILED {name}: {exc.__class__.__name__}: {exc}")
        return None, [], None, f"{exc.__class__.__name__}: {str(exc)[:300]}"
    return ms, samples, result, None


def md_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        lines.append("| " + " | ".join("" if v is None else str(v) for v in r) + " |")
    return "\n".join(lines)


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if v >= 100 else (f"{v:.1f}" if v >= 1 else f"{v:.2f}")


def fmt_int(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def write_json(path: str | None, data: dict) -> None:
    if not path:
        return
    with open(path, "w") as fh:
        json.dump(data, fh, indent=2, default=str)
        fh.write("\n")
    log(f"wrote {path}")


# -- databases -----------------------------------------------------------------------------
def is_postgres(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in ("postgres", "postgresql")


def libpq_url(url: str, database: str | None = None) -> str:
    """A libpq/psycopg URL for ``url`` (SQLAlchemy's ``+psycopg`` dropped), optionally another database."""
    from sqlalchemy.engine import make_url

    u = make_url(url).set(drivername="postgresql")
    if database is not None:
        u = u.set(database=database)
    return u.render_as_string(hide_password=False)


def database_name(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    return make_url(url).database or None


def unique_db_name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def create_database(server_url: str, name: str) -> None:
    import psycopg

    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(f"database name {name!r}: use lowercase letters, digits and _")
    with psycopg.connect(libpq_url(server_url, "postgres"), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def database_exists(server_url: str, name: str) -> bool:
    import psycopg

    with psycopg.connect(libpq_url(server_url, "postgres"), autocommit=True, connect_timeout=10) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def drop_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(libpq_url(server_url, "postgres"), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def temp_postgres_database(server_url: str, prefix: str = "msbench") -> Iterator[str]:
    """A uniquely named, empty PostgreSQL database on ``server_url``'s server; dropped afterwards.
    Yields its SQLAlchemy URL (``postgresql+psycopg://...``)."""
    name = unique_db_name(prefix)
    create_database(server_url, name)
    try:
        yield libpq_url(server_url, name).replace("postgresql://", "postgresql+psycopg://", 1)
    finally:
        try:
            drop_database(server_url, name)
        except Exception as exc:  # noqa: BLE001 - say so, do not mask the original error
            log(f"could not drop database {name}: {exc}")


def subject_args(doc: str, runs: int) -> argparse.ArgumentParser:
    """The arguments of the scripts that time one subject at a time on any store: ``--db``,
    ``--runs``, ``--json`` and the SUBJECTs (the script's docstring says their form)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    ap.add_argument("--db", required=True, help="database URL (sqlite:///PATH or postgresql://...)")
    ap.add_argument("--runs", type=int, default=runs, help=f"timed calls after the first (default {runs})")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write everything measured here")
    ap.add_argument("subjects", nargs="+", metavar="SUBJECT")
    return ap


def first_and_rest(call, runs: int):
    """``(result, samples_ms, median_ms)``: ``call()`` timed once and then ``runs`` more times;
    the median of those after the first (None with ``runs`` 0), the first being the cold one."""
    times, result = [], None
    for _ in range(runs + 1):
        t = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - t) * 1000)
    return result, times, (statistics.median(times[1:]) if len(times) > 1 else None)


def open_store(url: str, prog: str):
    """``(engine, newest span start ns)`` of the store at ``url``; a one-line exit when it
    cannot be read or holds no spans."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from modalscope.models import Span
    from modalscope.models.engine import DatabaseURLError, make_engine

    try:
        engine = make_engine(url)
        with engine.connect() as conn:
            last = conn.execute(select(func.max(Span.start_ns))).scalar()
    except (DatabaseURLError, SQLAlchemyError) as exc:
        raise SystemExit(f"{prog}: cannot read the spans of {url}: {str(exc).splitlines()[0]}") from None
    if last is None:
        raise SystemExit(f"{prog}: the store holds no spans")
    return engine, last


def count_rows(url: str, sql: str) -> int:
    from sqlalchemy import create_engine, text

    from modalscope.models.engine import normalize_url

    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql)).scalar_one())
    finally:
        engine.dispose()


# -- the receiver ----------------------------------------------------------------------------
class Receiver:
    """``modalscope ingest otlp`` in its own process on a store; ready once it says where it listens.

    ``stop()`` (also on ``__exit__``) sends SIGINT — the receiver drains, writes what it has
    and stops its settler — and kills it if it has not exited within ``stop_timeout``.
    """

    def __init__(self, database_url: str, *, settle_seconds: float = 1.0, env: dict | None = None,
                 pyspy: str | None = None, stop_timeout: float = 120.0, processes: int = 1) -> None:
        self.database_url = database_url
        self.processes = processes
        self.receiver_pids: set[int] = set()  # the extra receiver processes, from their log lines
        self.http_port, self.grpc_port = free_port(), free_port()
        self.settle_seconds = settle_seconds
        self.extra_env = env or {}
        self.pyspy = pyspy
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen | None = None
        self.output: collections.deque[str] = collections.deque(maxlen=200)
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())
            extra = re.search(r"otlp_http\[(\d+)\]: OTLP/HTTP listening", line)
            if extra:
                self.receiver_pids.add(int(extra.group(1)))
            if "OTLP/HTTP on" in line:
                self._ready.set()

    def start(self, timeout: float = 120.0) -> "Receiver":
        env = {**os.environ, "MODALSCOPE_DATABASE_URL": self.database_url,
               "MODALSCOPE_OTLP_HTTP_PORT": str(self.http_port), "MODALSCOPE_OTLP_GRPC_PORT": str(self.grpc_port),
               "MODALSCOPE_SETTLE_SECONDS": str(self.settle_seconds), "MODALSCOPE_BIND": "127.0.0.1",
               **self.extra_env}
        env.pop("MODALSCOPE_INGEST_TOKEN", None)
        cmd = [sys.executable, "-m", "modalscope", "ingest", "otlp", "--processes", str(self.processes)]
        if self.pyspy:
            cmd = ["py-spy", "record", "--subprocesses", "--format", "raw", "-o", self.pyspy, "--", *cmd]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=TMP_ROOT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(list(self.output)[-20:])
                self.stop()
                raise RuntimeError(f"modalscope ingest otlp did not start:\n{tail}")
        return self

    @property
    def receiver_pid(self) -> int:
        """The receiver's pid (under py-spy: py-spy's child)."""
        assert self.proc is not None
        if self.pyspy:
            for pid in descendants(self.proc.pid):
                if "modalscope" in cmdline(pid) and "spawn_main" not in cmdline(pid):
                    return pid
        return self.proc.pid

    def peak_rss(self) -> dict:
        return tree_peak_rss(self.receiver_pid, self.receiver_pids)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            log("receiver did not stop in time; killing it")
            for pid in descendants(self.proc.pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)

    def __enter__(self) -> "Receiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_settled(url: str, timeout: float = 1800.0, poll: float = 0.2) -> float:
    """Block until no trace in the store is pending; returns ``time.perf_counter()`` then."""
    from sqlalchemy import create_engine, text

    from modalscope.models.engine import normalize_url

    engine = create_engine(normalize_url(url))
    deadline = time.monotonic() + timeout
    try:
        with engine.connect() as conn:
            while True:
                pending = conn.execute(text("SELECT count(*) FROM traces WHERE pending")).scalar_one()
                conn.rollback()  # a fresh snapshot each poll (PostgreSQL keeps one per transaction)
                if not pending:
                    return time.perf_counter()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{pending} traces still pending after {timeout:.0f} s")
                time.sleep(poll)
    finally:
        engine.dispose()
