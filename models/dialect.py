"""The one place that knows which SQL engine is underneath.

Everything else uses SQLAlchemy Core/ORM constructs that run anywhere; these helpers pick
the dialect's spelling of "insert, ignoring duplicates" and "upsert".
"""

from __future__ import annotations

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite


def _insert_for(conn: Connection):
    name = conn.dialect.name
    if name == "postgresql":
        return postgresql.insert
    if name == "sqlite":
        return sqlite.insert
    raise NotImplementedError(f"unsupported dialect {name}")


def insert_ignore(conn: Connection, table: Table, index_elements: list[str]):
    """INSERT that skips rows colliding on ``index_elements`` (idempotent span writes)."""
    return _insert_for(conn)(table).on_conflict_do_nothing(index_elements=index_elements)


def upsert(conn: Connection, table: Table, index_elements: list[str], update_columns: list[str]):
    """INSERT ... ON CONFLICT (...) DO UPDATE SET col = excluded.col for ``update_columns``."""
    stmt = _insert_for(conn)(table)
    return stmt.on_conflict_do_update(
        index_elements=index_elements,
        set_={c: stmt.excluded[c] for c in update_columns},
    )


def supports_skip_locked(conn: Connection) -> bool:
    # SQLite serialises writers with BEGIN IMMEDIATE; row locks exist only on PostgreSQL.
    return conn.dialect.name == "postgresql"
