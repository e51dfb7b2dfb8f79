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
