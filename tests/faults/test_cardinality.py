"""A client sending huge or countless names cannot break the store or the dashboard.

Spans go the real way (an OTLP protobuf request, decoded, tagged, written, settled): a
64 KiB ``service.name`` and a request of 20,000 distinct services. Stored names are capped
(a prefix, ``…`` and a hash), each series kind holds at most its cap plus the ``(other)``
series the rest count in, the API and the filter pickers stay bounded, and retention
deletes series whose data it deleted. One headless Chromium check: the /stages page with
20,000 services loads, and its service picker finds one by typing.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy import func, select

from modalscope.app import create_app
from modalscope.app.components import FILTER_OPTIONS, OPTION_LABEL_CHARS, toolbar_options
from modalscope.app.params import rfc3339
from modalscope.ingest.otlp import decode_protobuf
from modalscope.core.spans import KIND_SERVER, SpanRecord
from modalscope.ingest.retention import RetentionPolicy, prune
from modalscope.ingest.series import SERIES_FIELDS, SeriesRegistry, series_hash, series_key
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models import Rollup, Series, Span
from modalscope.models.engine import make_engine
from modalscope.models.names import MARK, NAME_CHARS, OVERFLOW, SERVICE_CHARS, cap_text
from modalscope.settings import Settings
from tests.factories import rules
from tests.otlp_payloads import request_protobuf

MIN = 60_000_000_000
MS = 1_000_000
CAP = 300  # series per kind in these tests (MODALSCOPE_MAX_SERIES_PER_KIND)
MANY = 20_000


def _span(i: int, service: str, start_ns: int, name: str = "handle") -> SpanRecord:
    return SpanRecord(f"{i + 1:032x}", f"{i + 1:016x}", None, service, name, KIND_SERVER, start_ns,
                      start_ns + (5 + i % 50) * MS, 0, resource={"service.name": service})


def _ingest(engine, spans: list[SpanRecord], registry: SeriesRegistry | None = None) -> int:
    """decode -> tag -> write -> settle, as a receiver's pipeline does."""
    decoded = decode_protobuf(request_protobuf(spans))
    assert decoded.rejected == 0
    rules().tag(decoded.spans)
    write_spans(engine, decoded.spans)
    return settle(engine, force=True, registry=registry)


def _many(n: int, start_ns: int, offset: int = 10) -> list[SpanRecord]:
    return [_span(offset + i, f"svc-{i:05d}-" + "x" * 29, start_ns + i * 1000) for i in range(n)]


def test_huge_and_countless_names_stay_bounded(db_url, monkeypatch):
    monkeypatch.setenv("MODALSCOPE_MAX_SERIES_PER_KIND", str(CAP))
    engine = make_engine(db_url, write=True)
    now = time.time_ns() // MIN * MIN - 10 * MIN
    huge = "h" * (64 * 1024)
    twin = huge[:-1] + "i"  # differs in its last character only
    long_op = "op-" + "y" * 2000
    try:
        _ingest(engine, [_span(0, huge, now, long_op), _span(1, twin, now, long_op)])
        _ingest(engine, _many(MANY, now))
        with engine.connect() as conn:
            services = [s for s, in conn.execute(select(Span.service).distinct())]
            series = conn.execute(select(Series.kind, Series.service, Series.name, Series.caller,
                                         Series.callee)).all()
            op_count = conn.execute(select(func.sum(Rollup.count)).join(Series, Series.id == Rollup.series_id)
                                    .where(Series.kind == "op")).scalar()
    finally:
        engine.dispose()
    # Names: capped where spans are stored and where series are made; two long names that
    # share their prefix stay two.
    assert max(len(s) for s in services) == SERVICE_CHARS
    capped = {cap_text(huge, SERVICE_CHARS), cap_text(twin, SERVICE_CHARS)}
    assert len(capped) == 2 and capped <= set(services)
    assert all(s.startswith("h" * 100) and MARK in s for s in capped)
    assert len(services) == MANY + 2
    assert all(len(svc) <= SERVICE_CHARS and len(name) <= NAME_CHARS and len(caller) <= SERVICE_CHARS
               and len(callee) <= NAME_CHARS for _, svc, name, caller, callee in series)
    ops = {name for kind, _, name, _, _ in series if kind == "op"}
    assert cap_text(long_op[:1024], NAME_CHARS) in ops
    # Series: at most CAP a kind, the rest in the kind's (other) series; no span lost.
    per_kind = Counter(kind for kind, svc, *_ in series if svc != OVERFLOW)
    assert per_kind["op"] <= CAP and per_kind["trace"] <= CAP, per_kind
    assert ("op", OVERFLOW) in {(k, s) for k, s, *_ in series}
    assert ("trace", OVERFLOW) in {(k, s) for k, s, *_ in series}
    assert sum(1 for k, s, *_ in series if k == "op") <= CAP + 4  # (other) a stage and input type
    assert op_count == MANY + 2

    app = create_app(Settings(database_url=db_url))
    try:
        client = app.test_client()
        window = f"start={rfc3339(now - 5 * MIN)}&end={rfc3339(now + 5 * MIN)}"
        for path in (f"/api/v1/pairs?{window}", f"/api/v1/stages?{window}", f"/api/v1/input-types?{window}"):
            t0 = time.monotonic()
            r = client.get(path)
            assert r.status_code == 200, (path, r.get_data(as_text=True)[:300])
            assert time.monotonic() - t0 < 10, path  # bounded work, not a tight timing
        page = client.get(f"/stages?{window}")
        assert page.status_code == 200
        with app.app_context():
            services, pairs, stages, input_types = toolbar_options({})
            assert 0 < len(services) <= FILTER_OPTIONS
            assert all(len(o["label"]) <= OPTION_LABEL_CHARS for o in services)
            some = "svc-00042-"
            found, _, _, _ = toolbar_options({}, service_search=some.upper())
            assert [o["value"][:10] for o in found] == [some]
            # the selected service stays an option, whatever is typed
            chosen, _, _, _ = toolbar_options({"service": "svc-00007-" + "x" * 29}, service_search="svc-0004")
            assert len(chosen) <= FILTER_OPTIONS + 1 and "svc-00007-" + "x" * 29 in [o["value"] for o in chosen]
    finally:
        app.extensions["modalscope"]["engine"].dispose()


def test_retention_deletes_series_whose_data_it_deleted(db_url):
    engine = make_engine(db_url, write=True)
    now = time.time_ns() // MIN * MIN
    old = now - 3 * 86_400 * 10**9
    registry = SeriesRegistry(max_per_kind=CAP)
    try:
        _ingest(engine, [_span(0, "gone-svc", old, "old-op")], registry)
        _ingest(engine, [_span(1, "kept-svc", now - 5 * MIN, "new-op")], registry)
        with engine.connect() as conn:
            before = {s for s, in conn.execute(select(Series.service).where(Series.kind == "op"))}
        assert before == {"gone-svc", "kept-svc"}
        result = prune(engine, RetentionPolicy(1, 1, 1), now_ns=now)
        assert result.series >= 2  # gone-svc's op and trace series (at least)
        with engine.connect() as conn:
            services = {s for s, in conn.execute(select(Series.service).where(Series.service != ""))}
        assert "gone-svc" not in services and "kept-svc" in services
        # A settler that still holds the pruned ids in its cache makes the series again.
        _ingest(engine, [_span(2, "gone-svc", now - 4 * MIN, "old-op")], registry)
        with engine.connect() as conn:
            counts = conn.execute(select(Series.service, func.sum(Rollup.count))
                                  .join(Rollup, Rollup.series_id == Series.id)
                                  .where(Series.kind == "op").group_by(Series.service)).all()
        assert dict(counts) == {"gone-svc": 1, "kept-svc": 1}
    finally:
        engine.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_stages_page_with_20000_services_loads_and_searches(db_url):
    from selenium.webdriver.common.by import By

    from modalscope.app import ids
    from tests.app.browser import DemoStore, running_site, waiter

    engine = make_engine(db_url, write=True)
    now = time.time_ns() // MIN * MIN - 10 * MIN
    try:
        _ingest(engine, _many(50, now))
        # The other services' series as a settler that admitted 20,000 would leave them
        # (settling 20,000 new series takes ~20 s; test_huge_and_countless_names_stay_bounded
        # sends them the real way).
        keys = [series_key("op", f"svc-{i:05d}-" + "x" * 29, "handle", "other", "unknown") for i in range(50, MANY)]
        with engine.begin() as conn:
            conn.execute(Series.__table__.insert(),
                         [dict(zip(SERIES_FIELDS, k), key_hash=series_hash(k)) for k in keys])
    finally:
        engine.dispose()
    app = create_app(Settings(database_url=db_url))
    try:
        with running_site(app, DemoStore(db_url, now, "", "")) as site:
            t0 = time.monotonic()
            site.open(f"/stages?{site.window}")
            site.wait("#stages-table-rows", timeout=30)
            loaded_s = time.monotonic() - t0
            d = site.driver
            d.find_element(By.ID, ids.SERVICE).click()
            search = waiter(d, 10).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, ".dash-dropdown-search input, input[type=search]"))[0]
            assert "svc-00001-" in d.find_element(By.TAG_NAME, "body").text  # the first options show
            assert "svc-12345-" not in d.find_element(By.TAG_NAME, "body").text  # not among them
            search.send_keys("svc-12345")
            waiter(d, 10).until(lambda d: "svc-12345-" in d.find_element(By.TAG_NAME, "body").text)
            assert site.severe() == []
            assert loaded_s < 30
    finally:
        app.extensions["modalscope"]["engine"].dispose()
