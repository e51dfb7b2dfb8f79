"""revoked_sessions: dashboard sessions signed out before their cookie expires

A session cookie is signed, not stored; signing out adds its id here so every worker and
replica refuses the cookie from then on. A row is kept until the cookie would have expired.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 00:05:00
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


revision: str = '0013'
down_revision: Union[str, None] = '0012'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('revoked_sessions',
                    sa.Column('sid', sa.String(length=64), nullable=False),
                    sa.Column('expires_ns', sa.BigInteger(), nullable=False),
                    sa.PrimaryKeyConstraint('sid', name=op.f('pk_revoked_sessions')))
    op.create_index('ix_revoked_sessions_expires_ns', 'revoked_sessions', ['expires_ns'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_revoked_sessions_expires_ns', table_name='revoked_sessions')
    op.drop_table('revoked_sessions')
