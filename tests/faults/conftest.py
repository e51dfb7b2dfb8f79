"""Fixtures of the fault tests (helpers in tests/faults/helpers.py)."""

from __future__ import annotations

import pytest

from modalscope.models.engine import make_engine
from tests.faults.helpers import Processes


@pytest.fixture
def procs(tmp_path):
    """Starts `modalscope` commands; kills every process group they made at teardown."""
    running = Processes(tmp_path)
    yield running
    running.close()


@pytest.fixture
def store(db_url):
    """A read engine on the test's store (``db_url`` runs every test on SQLite and PostgreSQL)."""
    engine = make_engine(db_url)
    yield engine
    engine.dispose()
