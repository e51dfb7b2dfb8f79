"""Engine set-up on both stores: what every connection of a PostgreSQL engine is given."""

from __future__ import annotations

from urllib.parse import quote

from sqlalchemy import text

from modalscope.models import engine as engine_mod
from modalscope.models.dialect import plan_for_parameters
from modalscope.models.reader import StoreReader


def _show(conn, name: str) -> str:
    return conn.exec_driver_sql(f"SHOW {name}").scalar()


def test_postgresql_sessions_price_parallel_workers_for_large_plans_only(engine, db_url):
    """Every PostgreSQL connection, the reader's autocommit ones included, starts with the
    higher ``parallel_setup_cost`` and no transaction left open by setting it; a URL whose
    ``options`` set the cost keeps its own."""
    if engine.dialect.name != "postgresql":
        with engine.connect() as conn:  # nothing is set on SQLite, and the engine works
            assert conn.execute(text("SELECT 1")).scalar() == 1
        return
    cost = engine_mod.SESSION_SETTINGS["parallel_setup_cost"]
    with engine.connect() as conn:
        assert _show(conn, "parallel_setup_cost") == cost
    reader = StoreReader(engine)
    with reader.context.reads.connect() as conn:
        assert _show(conn, "parallel_setup_cost") == cost
        assert conn.connection.dbapi_connection.info.transaction_status.name == "IDLE"

    own = engine_mod.make_engine(f"{db_url}?options={quote('-c parallel_setup_cost=123')}")
    try:
        with own.connect() as conn:
            assert _show(conn, "parallel_setup_cost") == "123"
    finally:
        own.dispose()


def test_plan_for_parameters_holds_for_its_transaction_only(engine):
    """``plan_for_parameters``: statements of the transaction are planned for their own
    parameters; the pooled connection returns to the server's default after it."""
    with engine.connect() as conn:
        plan_for_parameters(conn)
        if engine.dialect.name != "postgresql":  # a no-op there
            assert conn.execute(text("SELECT 1")).scalar() == 1
            return
        assert _show(conn, "plan_cache_mode") == "force_custom_plan"
    with engine.connect() as conn:
        assert _show(conn, "plan_cache_mode") == "auto"


def _sqlite_writers(tmp_path):
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    holder = engine_mod.make_engine(url, write=True)
    waiter = engine_mod.make_engine(url, write=True)
    with holder.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    return holder, waiter


def test_a_sqlite_writer_takes_the_lock_once_another_commits(tmp_path):
    """A write transaction waits while another connection holds the write lock and begins
    as soon as that one commits; its connection's busy timeout is as configured after."""
    import threading

    holder, waiter = _sqlite_writers(tmp_path)
    began = threading.Event()
    failed: list[BaseException] = []

    def write() -> None:
        try:
            with waiter.begin() as conn:
                began.set()
                conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failed.append(exc)
            began.set()

    with holder.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        thread = threading.Thread(target=write)
        thread.start()
        assert not began.wait(0.3)  # still waiting on the lock
    assert began.wait(30) and not failed
    thread.join(30)
    with waiter.connect() as conn:
        assert sorted(conn.exec_driver_sql("SELECT x FROM t").scalars()) == [1, 2]
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == engine_mod.BUSY_TIMEOUT_MS
    holder.dispose()
    waiter.dispose()


def test_a_sqlite_writer_gives_up_after_the_busy_timeout(tmp_path, monkeypatch):
    """Past ``BUSY_TIMEOUT_MS`` the waiting writer fails with SQLite's "database is locked"
    (the writer's retry and the settler's retry take it from there), and nothing it meant
    to write is there."""
    import pytest
    from sqlalchemy.exc import OperationalError

    holder, waiter = _sqlite_writers(tmp_path)
    monkeypatch.setattr(engine_mod, "BUSY_TIMEOUT_MS", 50)
    with holder.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        with pytest.raises(OperationalError, match="locked"):
            with waiter.begin() as other:
                other.exec_driver_sql("INSERT INTO t VALUES (2)")
    with waiter.begin() as conn:  # the connection is usable again once the lock is free
        conn.exec_driver_sql("INSERT INTO t VALUES (3)")
        assert sorted(conn.exec_driver_sql("SELECT x FROM t").scalars()) == [1, 3]
    holder.dispose()
    waiter.dispose()
