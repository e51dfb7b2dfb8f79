"""Demo stores shared by the whole test session (a pytest plugin, see tests/conftest.py).

Two SQLite stores are filled once per session and shared between xdist workers: a clean one
with an even input-type mix (~2,000 traces a type, for stable P95s) and the default 3-hour
run with every pattern injected. Fixtures: ``clean_store``, ``pattern_store``;
``shared_file`` builds anything else once a run (the page tests' demo store).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from sqlalchemy import select

from modalscope.app import create_app
from modalscope.ingest import demo
from modalscope.ingest.settle import settle
from modalscope.models import Span, Trace
from modalscope.models.engine import make_engine
from modalscope.models.migrate import upgrade
from modalscope.settings import Settings

MIN = 60_000_000_000
# A fixed "now" (2025-11-30 12:00:30 UTC): the stores are the same in every run.
NOW = 1_764_504_030 * 1_000_000_000
EVEN_MIX = (("text", 1.0), ("image", 1.0), ("multi_image", 1.0), ("audio", 1.0))

CLEAN = demo.DemoConfig(now_ns=NOW, hours=1.0, rate=2.3, clean=True, mix=EVEN_MIX)
PATTERNS = demo.DemoConfig(now_ns=NOW, hours=3.0, rate=1.0)


# --------------------------------------------------------------------------------------
# Stores shared by the whole session (and by xdist workers: built once, under a lock)
# --------------------------------------------------------------------------------------


def _build(path, config: demo.DemoConfig) -> None:
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = make_engine(url, write=True)
    try:
        demo.fill(engine, config)
        settle(engine, force=True)
    finally:
        engine.dispose()


def shared_file(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """What ``build(path)`` makes at ``path`` (a file or a folder), made once a test run: the
    first xdist worker to ask builds it under a lock while any other waits, then all share it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by this pytest run's xdist workers
    path = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker builds, the other waits
        if not path.exists():
            building = root / f"building-{name}"
            shutil.rmtree(building, ignore_errors=True)
            building.unlink(missing_ok=True)
            build(building)
            os.replace(building, path)
    return path


def _shared_store(tmp_path_factory, name: str, config: demo.DemoConfig) -> str:
    return f"sqlite:///{shared_file(tmp_path_factory, f'demo-{name}.db', lambda path: _build(path, config))}"


class Store:
    def __init__(self, url: str, config: demo.DemoConfig) -> None:
        self.url = url
        self.config = config
        # many fixed windows from one client: the per-client budget is tested on its own
        self.app = create_app(Settings(database_url=url, new_windows_per_hour=0))
        self.client = self.app.test_client()
        self.engine = self.app.extensions["modalscope"]["engine"]

    def get(self, path: str, **params):
        params.setdefault("start", self.config.start_ns / 1e9)
        params.setdefault("end", self.config.end_ns / 1e9 + 120)
        r = self.client.get(f"/api/v1/{path}", query_string=params)
        assert r.status_code == 200, r.get_json()
        return r.get_json()

    def spans(self, *where, attrs: bool = True):
        cols = [Span.trace_id, Span.span_id, Span.parent_span_id, Span.service, Span.name, Span.kind,
                Span.start_ns, Span.duration_ns, Span.status, Span.instance, Span.stage]
        if attrs:
            cols.append(Span.attributes)
        with self.engine.connect() as conn:
            rows = conn.execute(select(*cols).where(*where).order_by(Span.start_ns)).all()
        out = []
        for r in rows:
            d = dict(r._mapping)
            if attrs:
                d["attributes"] = json.loads(d["attributes"])
            out.append(d)
        return out

    def trace_start(self) -> dict[str, int]:
        """trace id -> the trace's start: windows hold whole traces, by when they started."""
        if not hasattr(self, "_starts"):
            with self.engine.connect() as conn:
                self._starts = dict(conn.execute(select(Trace.trace_id, Trace.start_ns)).all())
        return self._starts

    def close(self):
        self.engine.dispose()


@pytest.fixture(scope="session")
def clean_store(tmp_path_factory):
    store = Store(_shared_store(tmp_path_factory, "clean", CLEAN), CLEAN)
    yield store
    store.close()


@pytest.fixture(scope="session")
def pattern_store(tmp_path_factory):
    store = Store(_shared_store(tmp_path_factory, "patterns", PATTERNS), PATTERNS)
    yield store
    store.close()
