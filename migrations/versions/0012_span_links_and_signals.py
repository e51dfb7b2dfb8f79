"""spans.links and spans.signals

``links`` keeps a span's OTLP links (JSON list of trace id, span id, attributes). ``signals``
holds what a span says about its trace, read at ingest from the whole attribute values
(media counts, model calls, tokens: ``ingest/signals.py``); spans stored before this
revision have none, and ``modalscope retag`` reads them from the stored attributes.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 21:10:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0012'
down_revision: Union[str, None] = '0011'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # Plain ADD COLUMN on both databases: no table rewrite, whatever the store's size.
    op.add_column("spans", sa.Column("links", sa.Text(), nullable=True))
    op.add_column("spans", sa.Column("signals", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("spans") as batch:
        batch.drop_column("signals")
        batch.drop_column("links")
