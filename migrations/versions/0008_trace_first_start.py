"""traces know their earliest span start: a pair's exemplar search skips pending traces

``traces.first_start_ns`` is the earliest start of any span stored for the trace, kept by
the receivers' writes. A pair's exemplar search reads the calls of traces still pending
through the span index from the earliest of them on, and skips traces that begin after the
window, instead of reading every span of every pending trace. Rows stored before stay NULL
(not known: their spans are read as before), except pending traces, filled here from their
spans (few: receivers are stopped for an upgrade).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 21:00:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0008'
down_revision: Union[str, None] = '0007'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.add_column(sa.Column('first_start_ns', sa.BigInteger(), nullable=True))
    op.execute("UPDATE traces SET first_start_ns = (SELECT min(spans.start_ns) FROM spans "
               "WHERE spans.trace_id = traces.trace_id) WHERE pending")


def downgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.drop_column('first_start_ns')
