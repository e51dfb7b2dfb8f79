"""a partial index of each input type's traces by duration, for the Stages page's tails

The Stages page finds each input type's P99 tail through ``ix_traces_duration_tail``
(duration first): for a fast input type among slow ones that read nearly every stored
trace's entry to keep a few thousand. ``(input_type, duration_ns, start_ns)`` reads that
type's tail alone (docs/benchmarks.md). It
is partial (``contributions IS NOT NULL``, which the tail reads state) so that other reads
of one input type's traces, whose window the start index serves, cannot take it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 23:20:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0016'
down_revision: Union[str, None] = '0015'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

WHERE = sa.text('contributions IS NOT NULL')


def upgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.create_index('ix_traces_input_type_tail', ['input_type', 'duration_ns', 'start_ns'], unique=False,
                              sqlite_where=WHERE, postgresql_where=WHERE)


def downgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.drop_index('ix_traces_input_type_tail')
