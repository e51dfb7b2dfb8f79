"""drop the quarter-hour rollups: charts at 15- and 30-minute steps read minute rows

``rollups_15m`` saved a day-long chart at quarter-hour steps reading 1,440 minute rows a
series instead of 96; measured at 1 M and 10 M spans every read stays far inside its
budget without it (docs/benchmarks.md, "Cache layers"), and each settle wrote it too. The
downgrade creates it again from the minute rollups, as when it was added.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 17:20:00
"""
import importlib.util
from pathlib import Path
from typing import Sequence, Union

from alembic import op


revision: str = '0015'
down_revision: Union[str, None] = '0014'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def _added():
    """The revision that added the table (Alembic loads revisions by path, not as a package)."""
    path = Path(__file__).with_name("0006_quarter_hour_rollups.py")
    spec = importlib.util.spec_from_file_location("quarter_hour_rollups_0006", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    _added().downgrade()


def downgrade() -> None:
    _added().upgrade()
