"""The store failing under a running ingest: PostgreSQL restarted mid-stream (a throwaway
server of our own, so the shared one other tests use is never touched), a read-only store,
and a full disk. The worker reconnects and loses nothing acknowledged; a store that cannot
be written is one clear line, never a hang or a traceback."""

from __future__ import annotations

import contextlib
import glob
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from modalscope.models.engine import make_engine
from modalscope.models.migrate import upgrade
from tests.faults.helpers import (
    StreamingClient,
    assert_exactly_once,
    batches_of,
    clean_env,
    free_port,
    grpc_exporter,
    http_exporter,
    make_traces,
    otlp_json_request,
    span_keys,
    start_ingest,
    wait_settled,
    wait_until,
)


# -- a PostgreSQL server of our own ----------------------------------------------------------

def _pg_bin() -> Path:
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    assert versions, "PostgreSQL server binaries not found under /usr/lib/postgresql"
    return Path(versions[-1]).parent


class OwnPostgres:
    """A throwaway PostgreSQL cluster in a temporary directory, on a free port, run as the
    ``postgres`` user: restarting it disturbs nobody else's tests."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        self.base = Path(tempfile.mkdtemp(prefix="modalscope-pg-"))
        self.data = self.base / "data"
        self.sockets = self.base / "sock"
        self.sockets.mkdir()
        shutil.chown(self.base, "postgres", "postgres")
        shutil.chown(self.sockets, "postgres", "postgres")
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/modalscope"

    def _run(self, *args: str, timeout: float = 60) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], cwd=self.base, check=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _pg_ctl(self, *args: str) -> None:
        options = (f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "server.log"),
                  "-o", options, "-w", "-t", "60", *args)

    def start(self) -> "OwnPostgres":
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync")
        self._pg_ctl("start")
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE modalscope")
        upgrade(self.url)
        return self

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is terminated, the server comes back."""
        self._pg_ctl("restart", "-m", "fast")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def own_postgres():
    server = OwnPostgres()
    try:
        yield server.start()
    finally:
        server.stop()


def test_postgres_restarted_while_ingesting_loses_nothing(own_postgres, procs):
    ingest, http_port, grpc_port = start_ingest(procs, own_postgres.url)
    traces = make_traces(200, seed=21)
    clients = [
        StreamingClient(http_exporter(http_port), batches_of(traces[:100], 5), pause=0.1, name="http"),
        StreamingClient(grpc_exporter(grpc_port), batches_of(traces[100:], 5), pause=0.1, name="grpc"),
    ]
    for client in clients:
        client.start()
    wait_until(lambda: all(len(c.acked) >= 3 for c in clients), 60, "the streams under way")
    own_postgres.restart()  # mid-stream: the writer's and the settler's connections die
    wait_until(lambda: all(len(c.acked) >= 6 for c in clients), 60, "the streams going on")
    own_postgres.restart()  # and once more, later in the stream
    for client in clients:
        client.join(120)
        assert not client.is_alive() and not client.failed and len(client.acked) == 20, client.name

    engine = make_engine(own_postgres.url)
    try:
        wait_settled(engine, 200)
        assert_exactly_once(engine, set().union(*(c.all_keys() for c in clients)))
    finally:
        engine.dispose()
    assert ingest.poll() is None  # the receiver rode it out
    # The writer retried its batch over the outage (one line each way, no traceback).
    log = ingest.stderr
    assert "span store unavailable, retrying" in log and "span store available again" in log


# -- a read-only store ------------------------------------------------------------------------

@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _modalscope(args: list[str], db_url: str, tmp_path: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = clean_env(MODALSCOPE_DATABASE_URL=db_url, MODALSCOPE_OTLP_HTTP_PORT=str(free_port()),
                    MODALSCOPE_OTLP_GRPC_PORT=str(free_port()), MODALSCOPE_PORT=str(free_port()))
    return subprocess.run([sys.executable, "-m", "modalscope", *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _assert_one_line(result: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and "%|" not in ln]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert lines[0].startswith("modalscope: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@contextlib.contextmanager
def _read_only_store(db_url: str, tmp_path: Path):
    """The test's store made read-only: for SQLite its directory is a read-only mount
    (permissions do not stop root; a mount does); for PostgreSQL the database defaults
    to read-only transactions, as a hot standby answers."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        with _tmpfs(tmp_path / "ro", "16m") as mount:
            shutil.copyfile(url.database, mount / "store.db")
            subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
            yield f"sqlite:///{mount / 'store.db'}", str(mount / "store.db"), "Read-only file system"
        return
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{url.database}" SET default_transaction_read_only = on')
    yield db_url, url.database, "read-only"


def test_read_only_store_is_one_clear_line_from_every_writing_command(db_url, tmp_path):
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps(otlp_json_request(make_traces(2)[0])))
    with _read_only_store(db_url, tmp_path) as (url, name, reason):
        started = time.monotonic()
        for args in (["ingest", "otlp"], ["import", str(spans)]):
            _assert_one_line(_modalscope(args, url, tmp_path), name, reason)
        assert time.monotonic() - started < 45  # refused at start, not after a busy timeout


def test_immutable_sqlite_file_or_directory_is_one_clear_line(tmp_path):
    """SQLite only: a store file or directory that may not be written (``chattr +i``: file
    modes do not stop root) is refused at start, naming which. PostgreSQL's read-only case
    is the test above."""
    url = make_url(f"sqlite:///{tmp_path / 'own.db'}")
    upgrade(url.render_as_string())
    path = Path(url.database)
    db = url.render_as_string()
    for target, fragment in ((path, f"database file {str(path)!r} is not writable"),
                             (path.parent, f"database directory {str(path.parent)!r} is not writable")):
        for leftover in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            leftover.unlink(missing_ok=True)
        subprocess.run(["chattr", "+i", str(target)], check=True)  # not even root may write it
        try:
            _assert_one_line(_modalscope(["ingest", "otlp"], db, tmp_path), fragment)
        finally:
            subprocess.run(["chattr", "-i", str(target)], check=True)


# -- a full disk ------------------------------------------------------------------------------

def _fill(mount: Path, leave_bytes: int) -> Path:
    filler = mount / "filler"
    free = shutil.disk_usage(mount).free
    with open(filler, "wb") as fh:
        fh.truncate(0)
        fh.write(b"\0" * max(0, free - leave_bytes))  # tmpfs: written bytes take the space
    return filler


def test_full_disk_refuses_with_503_then_recovers_when_space_returns(tmp_path, procs):
    """A SQLite store on a small tmpfs whose space runs out: the receiver answers 503 with
    Retry-After (the exporter retries), logs one line, and stores everything once space is
    back. SQLite only: a PostgreSQL server's full disk reaches the writer as the same
    OperationalError (the restart test above covers that path)."""
    with _tmpfs(tmp_path / "small", "8m") as mount:
        store_url = f"sqlite:///{mount / 'store.db'}"
        upgrade(store_url)
        ingest, http_port, grpc_port = start_ingest(procs, store_url)
        filler = _fill(mount, 64 * 1024)
        traces = make_traces(60, seed=31)
        client = StreamingClient(http_exporter(http_port, timeout=60), batches_of(traces, 30), name="http")
        client.start()
        wait_until(lambda: "span store unavailable, retrying" in ingest.stderr, 60, "the writer to hit the full disk")
        assert not client.acked
        filler.unlink()  # space is back: the writer's retry (or the client's) lands it
        client.join(90)
        assert not client.is_alive() and not client.failed and len(client.acked) == 2
        engine = make_engine(store_url)
        try:
            wait_settled(engine, 60)
            assert_exactly_once(engine, client.all_keys())
        finally:
            engine.dispose()
        log = ingest.stderr
        assert "database or disk is full" in log and "Traceback" not in log
        ingest.kill()


def test_import_into_a_full_disk_is_one_line_and_leaves_a_sound_store(tmp_path):
    """`modalscope import` that runs out of space stops with one line; the store stays
    sound and a re-run with space imports everything once. (SQLite: the disk is ours.)"""
    traces = make_traces(600, seed=33)
    path = tmp_path / "spans.jsonl"
    with open(path, "w") as fh:
        for batch in batches_of(traces, 20):
            fh.write(json.dumps(otlp_json_request(batch)) + "\n")
    with _tmpfs(tmp_path / "small", "16m") as mount:
        store_url = f"sqlite:///{mount / 'store.db'}"
        upgrade(store_url)
        filler = _fill(mount, 512 * 1024)
        result = _modalscope(["import", str(path)], store_url, tmp_path, timeout=120)
        _assert_one_line(result, "database or disk is full")
        with contextlib.closing(sqlite3.connect(mount / "store.db")) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        filler.unlink()
        result = _modalscope(["import", str(path)], store_url, tmp_path, timeout=120)
        assert result.returncode == 0, result.stderr
        engine = make_engine(store_url)
        try:
            assert_exactly_once(engine, set().union(*(span_keys(t) for t in traces)))
        finally:
            engine.dispose()
