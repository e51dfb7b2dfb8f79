"""spans carry a duration bucket; the exemplar index walks buckets, not durations

``spans.duration_bucket`` is eight buckets a doubling of ``duration_ns``
(``models/buckets.py``). The index ``(service, duration_ns, start_ns)`` becomes
``(service, duration_bucket, start_ns, duration_ns)``: new spans land at the ends of a few
hundred runs instead of at random places, so a commit rewrites a few hundred index pages
instead of one a span. Stored rows get their bucket here, in SQL (one UPDATE: on a store of
10 M spans it rewrites every row once).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 19:00:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0007'
down_revision: Union[str, None] = '0006'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def _bucket_sql(column: str) -> str:
    # models/buckets.bucket_case_sql as of this revision (a migration must not change with
    # later code): 8*k + the three bits after the leading one, where 2**k <= d < 2**(k+1).
    whens = [f"WHEN {column} >= {1 << k} THEN {8 * k - 8} + {column} / {1 << (k - 3)}" for k in range(62, 2, -1)]
    return f"CASE {' '.join(whens)} WHEN {column} > 0 THEN {column} ELSE 0 END"


def upgrade() -> None:
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.add_column(sa.Column('duration_bucket', sa.SmallInteger(), nullable=True))
    op.execute(f"UPDATE spans SET duration_bucket = {_bucket_sql('duration_ns')}")
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.alter_column('duration_bucket', existing_type=sa.SmallInteger(), nullable=False)
        batch_op.drop_index(batch_op.f('ix_spans_service_spans_duration_ns_spans_start_ns'))
        batch_op.create_index('ix_spans_duration_walk', ['service', 'duration_bucket', 'start_ns', 'duration_ns'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.drop_index('ix_spans_duration_walk')
        batch_op.create_index(batch_op.f('ix_spans_service_spans_duration_ns_spans_start_ns'),
                              ['service', 'duration_ns', 'start_ns'], unique=False)
        batch_op.drop_column('duration_bucket')
