"""rollup_packs: an hour of a series kind's minute rollups in one blob

The anomaly detectors read every ``pair``, ``trace`` and convention minute rollup of their
window: a day at ten million spans is ~80,000 rows, most of an absolute window's first
request. The settler now packs each closed hour of those kinds into one row (``models/packs.py``), which
the detectors read instead of the hour's minute rows; a write to the rollups deletes the
packs of the hours it touches. Nothing to fill: the settler packs an upgraded store's hours.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 06:10:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0010'
down_revision: Union[str, None] = '0009'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('rollup_packs',
    sa.Column('hour', sa.BigInteger(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('built_ns', sa.BigInteger(), nullable=False),
    sa.Column('verified', sa.Boolean(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint('hour', 'kind', name=op.f('pk_rollup_packs'))
    )


def downgrade() -> None:
    op.drop_table('rollup_packs')
