"""A small, exactly known store for the query and API tests (SQLite and PostgreSQL)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import pytest

from modalscope.app import create_app
from modalscope.app.params import Window
from modalscope.core.spans import KIND_CLIENT, KIND_SERVER, SpanRecord
from modalscope.models.reader import StoreReader
from modalscope.settings import Settings
from tests.factories import multimodal_trace, rules, settled_copy

MIN = 60_000_000_000
MS = 1_000_000


def side_calls_trace(rng: random.Random, start_ns: int, db_ms: float, llm_ms: float) -> list[SpanRecord]:
    """gateway -> userdb (uninstrumented, named by server.address) and gateway -> llm, whose
    client span's peer.service is wrong: the child SERVER span's service wins."""
    tid = f"{rng.getrandbits(128):032x}"
    sid = iter(f"{rng.getrandbits(64) | 1:016x}" for _ in range(8))
    root, db, llm_c, llm_s = next(sid), next(sid), next(sid), next(sid)
    total = db_ms + llm_ms + 20
    res = {"service.name": "gateway"}
    spans = [
        SpanRecord(tid, root, None, "gateway", "POST /chat", KIND_SERVER, start_ns, start_ns + int(total * MS), 0,
                   attributes={"mm.prompt_chars": 120}, resource=res),
        SpanRecord(tid, db, root, "gateway", "SELECT users", KIND_CLIENT, start_ns + 2 * MS,
                   start_ns + int((2 + db_ms) * MS), 0, attributes={"server.address": "userdb"}, resource=res),
        SpanRecord(tid, llm_c, root, "gateway", "llm.Generate", KIND_CLIENT, start_ns + int((5 + db_ms) * MS),
                   start_ns + int((5 + db_ms + llm_ms) * MS), 0, attributes={"peer.service": "wrong-name"},
                   resource=res),
        SpanRecord(tid, llm_s, llm_c, "llm", "llm.generate", KIND_SERVER, start_ns + int((6 + db_ms) * MS),
                   start_ns + int((4 + db_ms + llm_ms) * MS), 0, resource={"service.name": "llm"}),
    ]
    rules().tag(spans)
    return spans


@dataclass
class Store:
    url: str
    reader: StoreReader
    window: Window
    images: list[list[SpanRecord]]  # gateway -> vision-encoder traces (factories)
    side: list[list[SpanRecord]]  # text traces: gateway -> userdb, gateway -> llm
    client: object

    def spans(self, name: str) -> list[SpanRecord]:
        return [s for t in self.images + self.side for s in t if s.name == name]


@pytest.fixture
def store(engine, db_url, small_templates):
    rng = random.Random(7)
    base = (time.time_ns() // MIN - 45) * MIN
    images = [multimodal_trace(rng, base + i * 4_000_000_000, images=1 + i % 2, error=(i % 9 == 0)) for i in range(40)]
    side = [side_calls_trace(rng, base + i * 5_000_000_000 + 1_000_000, db_ms=2 + (i * 7) % 40 + rng.random(),
                             llm_ms=150 + (i * 13) % 200 + rng.random()) for i in range(30)]
    settled_copy(small_templates, engine, db_url, f"app-store-{base}", [s for t in images + side for s in t])
    app = create_app(Settings(database_url=db_url))
    reader = app.extensions["modalscope"]["reader"]
    window = Window(base - 5 * MIN, base + 60 * MIN)
    yield Store(db_url, reader, window, images, side, app.test_client())
    app.extensions["modalscope"]["engine"].dispose()


# -- the browser (tests/app/browser.py): a copy of one demo store, a server and Chromium per module
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from tests.app.browser import running_site, shared_demo_store

    demo = shared_demo_store(tmp_path_factory, tmp_path_factory.mktemp("browser"))
    app = create_app(Settings(database_url=demo.url))
    try:
        with running_site(app, demo) as s:
            yield s
    finally:
        app.extensions["modalscope"]["engine"].dispose()


@pytest.fixture
def clean_log(site):
    site.driver.get_log("browser")  # drop what earlier tests left
    yield
    assert site.severe() == []
