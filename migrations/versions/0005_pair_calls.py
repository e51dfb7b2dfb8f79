"""pair calls: each settled CLIENT span with its pair series, for a pair's slowest calls

An exemplar search for a pair walked the caller's CLIENT spans slowest first and checked
each one's callee: for a pair whose calls are fast next to the caller's other calls
(gateway -> auth) that read most of a day's spans. The settler now
writes one row per call; the search walks ``(series_id, duration_ns, start_ns)``.

A store that already holds spans gets no rows for them here (that would be a full
re-settle): the cursor ``pair_calls:complete_from`` records from which span start the
table is complete, and earlier windows are searched as before. ``modalscope retag``
re-settles everything and fills it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 13:30:00
"""
import time
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0005'
down_revision: Union[str, None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

CURSOR = "pair_calls:complete_from"


def upgrade() -> None:
    op.create_table('pair_calls',
    sa.Column('span_row', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=False, nullable=False),
    sa.Column('series_id', sa.Integer(), nullable=False),
    sa.Column('start_ns', sa.BigInteger(), nullable=False),
    sa.Column('duration_ns', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('span_row', name=op.f('pk_pair_calls'))
    )
    with op.batch_alter_table('pair_calls', schema=None) as batch_op:
        batch_op.create_index('ix_pair_calls_walk',
                              ['series_id', 'duration_ns', 'start_ns'], unique=False)
    conn = op.get_bind()
    newest = conn.execute(sa.text("SELECT max(start_ns) FROM spans")).scalar()
    if newest is not None:
        conn.execute(sa.text("INSERT INTO cursors (name, position, holder, lease_expires_ns, updated_ns, info) "
                             "VALUES (:name, :position, NULL, 0, :now, NULL)"),
                     {"name": CURSOR, "position": int(newest) + 1, "now": time.time_ns()})


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM cursors WHERE name = :name").bindparams(name=CURSOR))
    with op.batch_alter_table('pair_calls', schema=None) as batch_op:
        batch_op.drop_index('ix_pair_calls_walk')
    op.drop_table('pair_calls')
