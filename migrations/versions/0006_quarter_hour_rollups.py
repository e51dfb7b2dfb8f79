"""quarter-hour rollups: a day-long time chart reads 96 rows a series instead of 1,440

``rollups_15m`` holds, per series and quarter hour, the sum of its minute rollups (written
by the settler in the same transaction as the minutes and hours, so a quarter is always
the exact sum of its minutes). Filled here from the minute rollups already stored.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 15:00:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0006'
down_revision: Union[str, None] = '0005'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('rollups_15m',
    sa.Column('quarter', sa.Integer(), nullable=False),
    sa.Column('series_id', sa.Integer(), nullable=False),
    sa.Column('count', sa.BigInteger(), nullable=False),
    sa.Column('error_count', sa.BigInteger(), nullable=False),
    sa.Column('sum_ns', sa.BigInteger(), nullable=False),
    sa.Column('sketch', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['series_id'], ['series.id'], name=op.f('fk_rollups_15m_series_id_series')),
    sa.PrimaryKeyConstraint('quarter', 'series_id', name=op.f('pk_rollups_15m'))
    )
    with op.batch_alter_table('rollups_15m', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rollups_15m_series_id_rollups_15m_quarter'), ['series_id', 'quarter'],
                              unique=False)
    _backfill_quarters(op.get_bind())


def _backfill_quarters(conn) -> None:
    """One row per (series, quarter hour) of the minute rollups already stored."""
    from modalscope.models.sketch import merge_blobs

    minutes = sa.table("rollups", sa.column("minute"), sa.column("series_id"), sa.column("count"),
                       sa.column("error_count"), sa.column("sum_ns"), sa.column("sketch"))
    quarters = sa.table("rollups_15m", sa.column("quarter"), sa.column("series_id"), sa.column("count"),
                        sa.column("error_count"), sa.column("sum_ns"), sa.column("sketch"))
    series_ids = conn.execute(sa.select(minutes.c.series_id).distinct()).scalars().all()
    out = []
    for sid in series_ids:  # one series at a time: memory stays bounded on a big store
        rows = conn.execute(sa.select(minutes.c.minute, minutes.c.count, minutes.c.error_count, minutes.c.sum_ns,
                                      minutes.c.sketch).where(minutes.c.series_id == sid)
                            .order_by(minutes.c.minute)).fetchall()
        key, acc = None, None
        for minute, count, errs, total, blob in rows + [(None, 0, 0, 0, b"")]:
            k = None if minute is None else minute // 15
            if k != key:
                if acc is not None:
                    out.append({"quarter": key, "series_id": sid, "count": acc[0], "error_count": acc[1],
                                "sum_ns": acc[2], "sketch": merge_blobs(acc[3]).to_blob()})
                key, acc = k, [0, 0, 0, []]
            acc[0] += count
            acc[1] += errs
            acc[2] += total
            acc[3].append(blob)
        if len(out) >= 2000:
            conn.execute(quarters.insert(), out)
            out = []
    if out:
        conn.execute(quarters.insert(), out)


def downgrade() -> None:
    with op.batch_alter_table('rollups_15m', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rollups_15m_series_id_rollups_15m_quarter'))
    op.drop_table('rollups_15m')
