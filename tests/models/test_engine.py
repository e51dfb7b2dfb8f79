"""Engine set-up on both stores: what every connection of a PostgreSQL engine is given."""

from __future__ import annotations

from urllib.parse import quote

from sqlalchemy import text

from modalscope.models import engine as engine_mod
from modalscope.models.reader import StoreReader


def test_postgresql_sessions_price_parallel_workers_for_large_plans_only(engine, db_url):
    """Every PostgreSQL connection, the reader's autocommit ones included, starts with the
    higher ``parallel_setup_cost`` and no transaction left open by setting it; a URL whose
    ``options`` set the cost keeps its own value."""
    if engine.dialect.name != "postgresql":
        with engine.connect() as conn:  # nothing is set on SQLite, and the engine works
            assert conn.execute(text("SELECT 1")).scalar() == 1
        return
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW parallel_setup_cost").scalar() == str(engine_mod.PARALLEL_SETUP_COST)
    reader = StoreReader(engine)
    with reader._reads.connect() as conn:
        assert conn.exec_driver_sql("SHOW parallel_setup_cost").scalar() == str(engine_mod.PARALLEL_SETUP_COST)
        assert conn.connection.dbapi_connection.info.transaction_status.name == "IDLE"

    own = engine_mod.make_engine(f"{db_url}?options={quote('-c parallel_setup_cost=123')}")
    try:
        with own.connect() as conn:
            assert conn.exec_driver_sql("SHOW parallel_setup_cost").scalar() == "123"
    finally:
        own.dispose()
