"""link_waits: CONSUMER spans waiting for the PRODUCER span their link names

A consumer's trace settled before the producer's span was stored makes no hand-off call;
this row lets settling the producer's trace re-open the consumer's, so the call is counted
whichever trace arrives first.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 12:30:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0014'
down_revision: Union[str, None] = '0013'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('link_waits',
                    sa.Column('consumer_trace_id', sa.String(length=32), nullable=False),
                    sa.Column('target_trace_id', sa.String(length=32), nullable=False),
                    sa.Column('target_span_id', sa.String(length=16), nullable=False),
                    sa.Column('since_ns', sa.BigInteger(), nullable=False),
                    sa.PrimaryKeyConstraint('consumer_trace_id', 'target_trace_id', 'target_span_id',
                                            name=op.f('pk_link_waits')))
    op.create_index('ix_link_waits_target', 'link_waits', ['target_trace_id'], unique=False)
    op.create_index('ix_link_waits_since_ns', 'link_waits', ['since_ns'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_link_waits_since_ns', table_name='link_waits')
    op.drop_index('ix_link_waits_target', table_name='link_waits')
    op.drop_table('link_waits')
