"""finding evaluations: the anomaly catalog's findings over the last hour / day, kept for minutes

The worker evaluates the detectors once a minute over the standard relative ranges and
stores what they found, so a request for "the last 24 h" of findings reads one row
instead of running every detector (seconds over 24 h on a large store).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 10:40:09.902535
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0004'
down_revision: Union[str, None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('finding_evaluations',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('range_s', sa.BigInteger(), nullable=False),
    sa.Column('thresholds_key', sa.String(length=64), nullable=False),
    sa.Column('start_ns', sa.BigInteger(), nullable=False),
    sa.Column('end_ns', sa.BigInteger(), nullable=False),
    sa.Column('evaluated_ns', sa.BigInteger(), nullable=False),
    sa.Column('findings', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_finding_evaluations'))
    )
    with op.batch_alter_table('finding_evaluations', schema=None) as batch_op:
        batch_op.create_index('ix_finding_evaluations_lookup', ['range_s', 'thresholds_key', 'end_ns'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('finding_evaluations', schema=None) as batch_op:
        batch_op.drop_index('ix_finding_evaluations_lookup')

    op.drop_table('finding_evaluations')
