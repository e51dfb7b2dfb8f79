"""Engine and session setup: SQLite (WAL) embedded, PostgreSQL through psycopg 3.

psycopg is imported only for a PostgreSQL engine.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import sessionmaker


class DatabaseURLError(ValueError):
    """The database URL cannot be used; the message is one line for the user."""


def normalize_url(url: str) -> str:
    """Accept the URLs people paste: ``postgres://`` and ``postgresql://`` mean psycopg 3."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DatabaseURLError(f"cannot parse database URL {url!r}") from None
    backend = parsed.get_backend_name()
    if backend in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend != "sqlite":
        raise DatabaseURLError(
            f"unsupported database {backend!r} in {url!r}: use sqlite:///path.db or postgresql://..."
        )
    return parsed.render_as_string(hide_password=False)


def sqlite_path(url: str) -> str | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    return parsed.database or ":memory:"


def is_sqlite(engine_or_url) -> bool:
    url = engine_or_url.url if hasattr(engine_or_url, "url") else make_url(engine_or_url)
    return url.get_backend_name() == "sqlite"


READ_CACHE_MIB = 64
WRITE_CACHE_MIB = 16


def make_engine(url: str, *, write: bool = False, pool_size: int = 5) -> Engine:
    """An engine for ``url``.

    SQLite: WAL, ``synchronous=NORMAL`` (durable at checkpoints, safe against corruption),
    a 30 s busy timeout, and — for ``write=True`` engines — ``BEGIN IMMEDIATE`` so a
    read-then-write transaction never fails to upgrade its lock under a concurrent writer.
    A connection's page cache is ``READ_CACHE_MIB`` for readers (the dashboard's windows
    reread the same index pages) and ``WRITE_CACHE_MIB`` for the ingest processes (their
    reads are of just-written pages, which the operating system caches anyway; a settler
    holds two connections, and every MiB counts against the ingest memory target).
    A missing directory is an error, never created silently.
    """
    url = normalize_url(url)
    if is_sqlite(url):
        path = sqlite_path(url)
        if path not in (":memory:", "") and not path.startswith("file:"):
            parent = Path(path).expanduser().resolve().parent
            if not parent.is_dir():
                raise DatabaseURLError(f"database directory {str(parent)!r} does not exist")
            _check_writable(Path(path).expanduser(), parent)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
        )
        _configure_sqlite(engine, immediate=write, cache_mib=WRITE_CACHE_MIB if write else READ_CACHE_MIB)
        return engine
    # pool_pre_ping: a connection the server dropped (a restart, a failover) is replaced at
    # checkout instead of failing the next write; connect_timeout: an unreachable server is
    # an error in seconds, not a hang.
    connect_args = {} if "connect_timeout" in make_url(url).query else {"connect_timeout": 10}
    engine = create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=pool_size,
                           connect_args=connect_args)
    _configure_binary_results(engine)
    _configure_session_settings(engine)
    return engine


#: Settings of this project's PostgreSQL sessions; a URL whose ``options`` name one keeps its own.
#: - ``parallel_setup_cost`` (the server's default is 1000): starting parallel workers cost
#:   more here than the short reads the planner chose them for: the Stages view's hour of
#:   rollups was slower with two workers than without (docs/benchmarks.md). At this cost
#:   only plans that are large by the planner's estimate run in parallel.
SESSION_SETTINGS = {"parallel_setup_cost": "10000"}


def _configure_session_settings(engine: Engine) -> None:
    own = str(engine.url.query.get("options", ""))
    statements = [f"SET {name} = {value}" for name, value in SESSION_SETTINGS.items() if name not in own]
    if not statements:
        return

    @event.listens_for(engine, "connect")
    def _set(dbapi_connection, connection_record):
        # (session settings: committed so that they outlive this first transaction)
        with dbapi_connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
        dbapi_connection.commit()


#: Execution option: fetch this statement's rows in PostgreSQL's binary format (psycopg).
BINARY_RESULTS = "modalscope_binary_results"


def _configure_binary_results(engine: Engine) -> None:
    """A statement executed with ``BINARY_RESULTS`` gets its rows in the binary format: psycopg
    otherwise receives ``bytea`` (every rollup's sketch) as hex text and decodes it, a large
    share of a long read such as the Stages page's. Only for rows read straight from the
    cursor (``plain_rows``): ints, strings and bytes load the same either way."""
    if engine.dialect.driver != "psycopg":
        return
    from psycopg.pq import Format

    @event.listens_for(engine, "before_cursor_execute")
    def _binary(conn, cursor, statement, parameters, context, executemany):
        if context is not None and context.execution_options.get(BINARY_RESULTS):
            cursor.format = Format.BINARY


def plain_rows(conn: Connection, stmt, params: dict | None = None) -> list[tuple]:
    """All rows of ``stmt`` as plain tuples, straight from the DB-API cursor: for reads of
    a few hundred thousand rows, where per-row ``Row`` objects cost more than the query.
    Only for columns that need no result processing: ints, strings and bytes (which
    PostgreSQL sends in its binary format, ``BINARY_RESULTS``)."""
    result = conn.execute(stmt, params, execution_options={BINARY_RESULTS: True})
    try:
        return [tuple(r) for r in result.cursor.fetchall()] if result.cursor is not None else []
    finally:
        result.close()


def dict_rows(result) -> list[dict]:
    """A result's rows as plain dicts keyed by its column names: ``dict(row)`` of each
    ``RowMapping`` builds a keys view a row, a cost a Compare or an exemplar read pays
    thousands of times."""
    keys = list(result.keys())
    return [dict(zip(keys, r)) for r in result.all()]  # (one fetch: iterating fetches a row at a time)


def check_writable(engine: Engine) -> None:
    """Refuse, in one line, a PostgreSQL store that takes no writes (a hot standby, or
    ``default_transaction_read_only``) before a command starts instead of failing every
    write later. SQLite's file and directory are checked by :func:`make_engine`."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as conn:
        read_only = conn.exec_driver_sql("SHOW transaction_read_only").scalar()
    if str(read_only).lower() == "on":
        raise DatabaseURLError(f"database {engine.url.render_as_string(hide_password=True)} is read-only "
                               "(a hot standby, or default_transaction_read_only is on): writing needs a "
                               "writable primary")


def _check_writable(path: Path, parent: Path) -> None:
    """A SQLite store needs its file and its directory writable (WAL keeps ``-wal`` and
    ``-shm`` files beside it): say which is not, and why, before anything runs."""
    if path.exists():
        try:
            os.close(os.open(path, os.O_RDWR))
        except OSError as exc:
            raise DatabaseURLError(f"database file {str(path)!r} is not writable: {exc.strerror}") from None
    beside = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    if not all(p.exists() for p in beside) and not os.access(parent, os.W_OK | os.X_OK):
        reason = "read-only file system" if _read_only_fs(parent) else "permission denied"
        raise DatabaseURLError(f"database directory {str(parent)!r} is not writable ({reason}); SQLite keeps "
                               "its -wal and -shm files beside the database")


def _read_only_fs(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _configure_sqlite(engine: Engine, *, immediate: bool, cache_mib: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Take transaction control from the driver (SQLAlchemy's documented pysqlite recipe).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA cache_size=-{cache_mib * 1024}")  # in KiB when negative
        cur.execute("PRAGMA temp_store=MEMORY")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # A write engine's connection may still ask for a read-only (deferred) transaction.
        deferred = conn.get_execution_options().get("modalscope_deferred", False)
        if immediate and not deferred:
            begin_immediate(conn)
        else:
            conn.exec_driver_sql("BEGIN")


#: How long a statement waits for a lock another connection holds, in milliseconds.
BUSY_TIMEOUT_MS = 30_000
#: Seconds between two tries of ``BEGIN IMMEDIATE`` while another connection writes.
WRITE_LOCK_POLL_S = 0.001


def begin_immediate(conn: Connection) -> None:
    """``BEGIN IMMEDIATE``, trying again every ``WRITE_LOCK_POLL_S`` while another process
    holds the write lock (for at most ``BUSY_TIMEOUT_MS``). SQLite's own busy handler backs
    off to 100 ms sleeps: the settler, waiting for the lock between a receiver's writes,
    slept through the gaps and settled a burst later (docs/benchmarks.md)."""
    dbapi_conn = conn.connection.dbapi_connection
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    dbapi_conn.execute("PRAGMA busy_timeout=0")
    try:
        while True:
            try:
                dbapi_conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if busy and time.monotonic() < deadline:
                    time.sleep(WRITE_LOCK_POLL_S)
                    continue
            # Out of time, or another error: once more through SQLAlchemy, which raises it as
            # it raises every statement's (callers retry on its DBAPIError).
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            return
    finally:
        dbapi_conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
