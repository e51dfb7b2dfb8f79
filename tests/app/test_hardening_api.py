"""/api/v1 against hostile input, on SQLite and PostgreSQL: SQL-looking values in every
parameter of every endpoint do nothing (the same answer as any unknown value, or a 400 naming
the parameter; the tables intact), and hostile span text (markup, ``javascript:`` URLs,
control and bidi characters, 1 MiB values) comes back as exactly the JSON string stored,
ASCII-escaped. (The pages' side of it is in tests/app/test_browser.py.)"""

from __future__ import annotations

import json
import random
import time
from urllib.parse import quote, urlencode

import pytest
from sqlalchemy import func, inspect, select

from modalscope.app import create_app
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models import Span
from modalscope.settings import Settings
from tests.factories import multimodal_trace, rules

MIN = 60_000_000_000
MS = 1_000_000
SQL_PAYLOADS = ["' OR 1=1 --", '"; DROP TABLE spans; --', "1; DELETE FROM spans", "x') OR ('1'='1",
                "%' OR '%'='", "\\'; DROP TABLE traces; --", "gateway' UNION SELECT trace_id FROM spans --"]
UNKNOWN = "no-such-value-anywhere"

HOSTILE_SERVICE = "<script>alert('svc')</script>"
HOSTILE_CALLEE = "javascript:alert(document.cookie)//"
HOSTILE_NAME = '"><img src=x onerror=alert(1)></script>'
BIG = "B" * (1 << 20)
HOSTILE_ATTRIBUTES = {
    "mm.image_count": 1,
    "<b>key</b>": "<i>value</i>",
    "javascript:alert(1)": "javascript:alert(2)",
    "url.full": "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "control": "a\x01b\x1b[31mc\x7fd\te\nf\rg",
    "bidi": "abc\u202eexe.txt\u2066\u2069",
    "separators": "line\u2028para\u2029end",  # raw in a <script> they would end a JS string
    "quote": "</script><script>alert(3)</script>",
    "emoji": "\U0001F600 \u4e2d\u6587",
    "big": BIG,
    "nested": {"<k>": ["<v>", 1, True, None]},
}

# Every GET endpoint of /api/v1 and the parameters it reads, besides the window (start, end,
# range) and the filters. A new endpoint fails test_every_endpoint_is_covered until listed.
FILTERS = ("service", "caller", "callee", "stage", "input_type")
ENDPOINTS = {
    "/api/v1/pairs": (),
    "/api/v1/input-types": (),
    "/api/v1/stages": ("group_by",),
    "/api/v1/traces": ("min_ms", "max_ms", "limit"),
    "/api/v1/anomalies": (),
    "/api/v1/incidents": (),
    "/api/v1/cache": ("group_by", "cache"),
    "/api/v1/compare": ("baseline_start", "baseline_end"),
    "/api/v1/share": ("panel", "ttl"),
}
# (the last two: JSON 404/405 for unknown API paths)
NOT_QUERY_ENDPOINTS = {"/api/v1/health", "/api/v1/traces/<trace_id>", "/api/v1/", "/api/v1/<path:rest>"}


def hostile_trace(start_ns: int) -> list[SpanRecord]:
    tid = "5ec0de" * 5 + "01"
    res = {"service.name": HOSTILE_SERVICE}
    spans = [
        SpanRecord(tid, "0000000000000c01", None, HOSTILE_SERVICE, HOSTILE_NAME, KIND_SERVER, start_ns,
                   start_ns + 800 * MS, 0, attributes=dict(HOSTILE_ATTRIBUTES), resource=res),
        SpanRecord(tid, "0000000000000c02", "0000000000000c01", HOSTILE_SERVICE, "db.query", KIND_CLIENT,
                   start_ns + 5 * MS, start_ns + 300 * MS, 0, attributes={"peer.service": HOSTILE_CALLEE},
                   resource=res),
        SpanRecord(tid, "0000000000000c03", "0000000000000c01", HOSTILE_SERVICE, "image.decode", KIND_INTERNAL,
                   start_ns + 300 * MS, start_ns + 700 * MS, 0, resource=res),
    ]
    rules().tag(spans)
    return spans


@pytest.fixture
def hostile_store(engine, db_url):
    rng = random.Random(5)
    base = (time.time_ns() // MIN - 40) * MIN
    traces = [multimodal_trace(rng, base + i * 30_000_000_000, images=1 + i % 2) for i in range(20)]
    hostile = hostile_trace(base + 10 * MIN)
    write_spans(engine, [s for t in traces for s in t] + hostile)
    settle(engine, force=True)
    app = create_app(Settings(database_url=db_url, secret_key="hardening-key"))
    yield app, engine, hostile[0].trace_id
    app.extensions["modalscope"]["engine"].dispose()


def _span_count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Span)).scalar_one()


def test_every_endpoint_is_covered(hostile_store):
    app, _, _ = hostile_store
    rules_ = {r.rule for r in app.url_map.iter_rules() if r.rule.startswith("/api/v1/") and "GET" in r.methods}
    assert rules_ == set(ENDPOINTS) | NOT_QUERY_ENDPOINTS


def _base_query(path: str, param: str, now: float) -> dict:
    # An absolute window (answers compare equal), or none when the window itself is tested.
    q = {} if param == "range" else {"start": f"{now - 7200:.0f}", "end": f"{now + 60:.0f}"}
    if param == "baseline_end":
        q["baseline_start"] = f"{now - 14400:.0f}"  # an end needs its start
    if path.endswith("/share"):
        q["panel"] = "pair-heatmap"
    return q


def test_sql_in_any_parameter_does_nothing(hostile_store):
    app, engine, trace_id = hostile_store
    client = app.test_client()
    spans_before = _span_count(engine)
    tables_before = set(inspect(engine).get_table_names())
    checked = 0
    now = time.time() // 60 * 60
    for path, extra in ENDPOINTS.items():
        for param in (*FILTERS, *extra, "start", "end", "range"):
            innocuous = client.get(f"{path}?{urlencode({**_base_query(path, param, now), param: UNKNOWN})}")
            for payload in SQL_PAYLOADS:
                resp = client.get(f"{path}?{urlencode({**_base_query(path, param, now), param: payload})}")
                where = (path, param, payload)
                assert resp.status_code in (200, 400), where
                body = resp.get_json()
                if resp.status_code == 400:
                    assert body["parameter"] == param and body["error"], where
                elif path.endswith("/share"):
                    # A link is made with the value percent-encoded, never run.
                    assert quote(payload, safe="") in body["link"] or param in ("panel", "ttl"), where
                else:
                    # Exactly what any value that matches nothing gives.
                    assert innocuous.status_code == 200 and body == innocuous.get_json(), where
                checked += 1
    # A malformed trace id in the path is a 400, never a query.
    for payload in SQL_PAYLOADS:
        resp = client.get("/api/v1/traces/" + quote(payload, safe=""))
        assert resp.status_code in (400, 404) and resp.get_json()["error"]
    assert checked > 300
    assert _span_count(engine) == spans_before
    assert set(inspect(engine).get_table_names()) == tables_before
    # And the data still answers normally.
    assert client.get(f"/api/v1/traces/{trace_id}").status_code == 200
    assert client.get("/api/v1/pairs?range=2h").get_json()


def test_hostile_span_text_comes_back_as_plain_json_strings(hostile_store):
    app, _, trace_id = hostile_store
    client = app.test_client()
    started = time.monotonic()
    resp = client.get(f"/api/v1/traces/{trace_id}")
    elapsed = time.monotonic() - started
    assert resp.status_code == 200 and elapsed < 10
    raw = resp.get_data()
    assert resp.mimetype == "application/json" and resp.headers["X-Content-Type-Options"] == "nosniff"
    assert raw.isascii()  # bidi, separators, emoji and control characters \u-escaped
    for needle in (b"\xe2\x80\xae", b"\xe2\x80\xa8", b"\x1b", b"\x01", b"\x7f"):
        assert needle not in raw
    doc = json.loads(raw)
    root = next(s for s in doc["spans"] if s["parent_span_id"] is None)
    assert root["service"] == HOSTILE_SERVICE and root["name"] == HOSTILE_NAME
    for key, value in HOSTILE_ATTRIBUTES.items():
        assert root["attributes"][key] == value, key
    client_span = next(s for s in doc["spans"] if s["kind"] == "CLIENT")
    assert client_span["attributes"]["peer.service"] == HOSTILE_CALLEE
    # The lists name the hostile service and pair verbatim, escaped the same way.
    pairs = client.get(f"/api/v1/pairs?range=2h&service={quote(HOSTILE_SERVICE)}")
    assert pairs.get_data().isascii()
    assert [(p["caller"], p["callee"]) for p in pairs.get_json()] == [(HOSTILE_SERVICE, HOSTILE_CALLEE)]
    listed = client.get(f"/api/v1/traces?range=2h&service={quote(HOSTILE_SERVICE)}").get_json()
    assert listed and {r["trace_id"] for r in listed} == {trace_id}
    assert {(r.get("root_service"), r.get("root_name")) for r in listed} == {(HOSTILE_SERVICE, HOSTILE_NAME)}
    # A filter value over the length cap is a 400 naming it, not a slow query.
    resp = client.get(f"/api/v1/pairs?service={'x' * 5000}")
    assert resp.status_code == 400 and resp.get_json()["parameter"] == "service"
