"""an index on an input type's slowest traces

The Stages page finds each input type's P99 tail in the traces table; through the
``duration_ns`` index it read the tail of every input type from the lowest of their
thresholds and dropped the others' (139 k rows for 7.8 k wanted over a day at 11.8 M
spans). ``(input_type, duration_ns, start_ns)`` reads one input type's tail, its window
checked in the index.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 17:30:00
"""
from typing import Sequence, Union

from alembic import op


revision: str = '0016'
down_revision: Union[str, None] = '0015'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.create_index('ix_traces_input_type_tail', ['input_type', 'duration_ns', 'start_ns'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.drop_index('ix_traces_input_type_tail')
