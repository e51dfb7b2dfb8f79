"""the traces duration index also holds input_type and start_ns

The Stages page finds each input type's P99 tail in the traces table; through the
``duration_ns`` index it read the tail of every input type from the lowest of their
thresholds and dropped the others' rows at the table (139 k rows for 7.8 k wanted over a
day at 11.8 M spans). ``(duration_ns, input_type, start_ns)`` replaces that index: the same
walks slowest first, and an input type's tail with its window checked in the index. (Led
by duration, not by input type: an index led by input type drew SQLite's planner to read
every trace of an input type for a short window's exemplars.)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 17:30:00
"""
from typing import Sequence, Union

from alembic import op


revision: str = '0015'
down_revision: Union[str, None] = '0014'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.create_index('ix_traces_duration_tail', ['duration_ns', 'input_type', 'start_ns'], unique=False)
        batch_op.drop_index(batch_op.f('ix_traces_duration_ns'))


def downgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_traces_duration_ns'), ['duration_ns'], unique=False)
        batch_op.drop_index('ix_traces_duration_tail')
