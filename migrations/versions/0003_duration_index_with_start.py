"""the spans duration index also holds start_ns

An exemplar search over a window walks a service's spans slowest first and keeps those in
the window; with ``start_ns`` in the index, spans outside the window are skipped without a
table read (at 10M spans a one-hour search read ~5,000 rows it then dropped).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 08:30:00
"""
from typing import Sequence, Union

from alembic import op


revision: str = '0003'
down_revision: Union[str, None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_spans_service_spans_duration_ns'))
        batch_op.create_index(batch_op.f('ix_spans_service_spans_duration_ns_spans_start_ns'),
                              ['service', 'duration_ns', 'start_ns'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_spans_service_spans_duration_ns_spans_start_ns'))
        batch_op.create_index(batch_op.f('ix_spans_service_spans_duration_ns'), ['service', 'duration_ns'],
                              unique=False)
