"""Alembic environment: runs against the URL `modalscope db upgrade` (or alembic.ini) gives it."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import pool

from modalscope.models import Base
from modalscope.models.engine import make_engine, normalize_url

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(
        "MODALSCOPE_DATABASE_URL", "sqlite:///modalscope.db"
    )
    return normalize_url(url)


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url(), write=True)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                # A migration that rebuilds the spans table sorts every row for each index: on
                # disk, not in memory (temp_store=MEMORY took far too much memory for 0007).
                conn.exec_driver_sql("PRAGMA temp_store=FILE")
                conn.commit()
            _run(conn)
    finally:
        engine.dispose()


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # `modalscope db upgrade` reports each step as it is applied (models/migrate.upgrade)
        on_version_apply=config.attributes.get("on_version_apply") or (),
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
