"""rollup_packs.data stored uncompressed on PostgreSQL; cache and batch packs without sketches

PostgreSQL compressed each hour pack (pglz, ~4:1) and decompressed it on every read, a
large share of reading a day of ``pair`` packs; they are now stored as they are (``STORAGE
EXTERNAL``: out of line, not compressed). Packs already there are rewritten (``data || ''``
makes a new value, stored the new way). SQLite stores blobs as they are.

``cache`` and ``batch`` packs are now built without sketch entries, which their detectors
never read (nearly all of a ``cache`` pack's bytes). Those already there are deleted, on
both databases; the settler packs their hours again, 48 packs a minute. A week of packs at
ten million spans a day takes ~200 MB on PostgreSQL.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 08:55:00
"""
from typing import Sequence, Union

from alembic import op


revision: str = '0011'
down_revision: Union[str, None] = '0010'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.execute("DELETE FROM rollup_packs WHERE kind IN ('cache', 'batch')")
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE rollup_packs ALTER COLUMN data SET STORAGE EXTERNAL")
    op.execute("UPDATE rollup_packs SET data = data || ''::bytea")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE rollup_packs ALTER COLUMN data SET STORAGE EXTENDED")
