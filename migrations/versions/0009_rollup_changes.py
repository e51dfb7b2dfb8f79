"""rollup_changes: which minutes each write to the rollups touched, and when

Findings over an absolute window take seconds to compute over a day at ten million spans and
do not change unless the rollups they were computed from do. The settler (each batch), the
retention pass and ``modalscope retag`` now log the minutes they wrote, so findings cached for
an absolute window (``finding_evaluations`` rows with ``range_s`` 0) are reused exactly while
nothing newer touched their minutes. Nothing to fill: a store upgraded starts with no cached
absolute findings.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 00:20:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0009'
down_revision: Union[str, None] = '0008'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('rollup_changes',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('first_minute', sa.BigInteger(), nullable=False),
    sa.Column('last_minute', sa.BigInteger(), nullable=False),
    sa.Column('changed_ns', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rollup_changes'))
    )
    with op.batch_alter_table('rollup_changes', schema=None) as batch_op:
        batch_op.create_index('ix_rollup_changes_changed_ns', ['changed_ns'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('rollup_changes', schema=None) as batch_op:
        batch_op.drop_index('ix_rollup_changes_changed_ns')
    op.drop_table('rollup_changes')
