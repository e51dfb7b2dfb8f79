"""Cache analytics (/api/v1/cache) and triage compare (/api/v1/compare): the pure parts on
small hand-made inputs, the cache penetration on the demo's pattern store, and Compare
naming the injected attribute first on a constructed spike (SQLite and PostgreSQL)."""

from __future__ import annotations

import random
import time

import orjson
import pytest

from modalscope.app import create_app, queries
from modalscope.app.queries import comparison
from modalscope.app.params import Window, rfc3339
from modalscope.ingest import demo
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models.sketch import Histogram
from modalscope.settings import Settings
from tests.factories import rules, settled_copy
from tests.demo_stores import PATTERNS

MIN = 60_000_000_000
MS = 1_000_000


# -- pure: cache -----------------------------------------------------------------------
def _row(t, cache, hit, **attrs):
    return (t, orjson.dumps({"cache.name": cache, "cache.hit": hit, **attrs}).decode(), "{}")


def test_cache_events_groups_by_span_then_resource_attribute():
    rows = [_row(1, "profile", True, user_tier="gold"), _row(2, "profile", "false", user_tier="bronze"),
            _row(3, "profile", "maybe", user_tier="gold"),  # neither hit nor miss: dropped
            (4, orjson.dumps({"cache.name": "kv", "cache.hit": 0}).decode(), '{"user_tier": "silver"}'),
            (5, "not json", "{}")]
    events = queries.cache_events(rows, "user_tier")
    assert events == [(1, "profile", "gold", True), (2, "profile", "bronze", False), (4, "kv", "silver", False)]
    assert [e[2] for e in queries.cache_events(rows, None)] == [None, None, None]


def test_cache_table_and_buckets():
    ev = [(0, "p", "gold", True), (1, "p", "gold", True), (2, "p", "bronze", False), (3, "p", None, True),
          (MIN + 5, "p", "bronze", True)]
    table = queries.cache_table(ev)
    assert [(r["group"], r["hits"], r["misses"]) for r in table] == [("bronze", 1, 1), ("gold", 2, 0), (None, 1, 0)]
    assert table[0]["hit_rate"] == 0.5 and table[1]["share"] == pytest.approx(0.4)
    buckets = queries.cache_buckets(ev, 0, 1)
    assert [(r["t_ns"], r["group"], r["hit_rate"]) for r in buckets] == [
        (0, "bronze", 0.0), (0, "gold", 1.0), (0, None, 1.0), (MIN, "bronze", 1.0)]


@pytest.mark.parametrize("value,ok", [("user_tier", True), ("k8s.pod/name:x-1", True), ("", False),
                                      ("a b", False), ("x" * 129, False), ("<b>", False)])
def test_valid_group_by(value, ok):
    assert queries.valid_group_by(value) is ok


# -- the demo's cache penetration ------------------------------------------------------
def test_bronze_hit_rate_falls_in_the_penetration_window_while_gold_holds(pattern_store):  # noqa: F811
    (p,) = [p for p in demo.injected_patterns(PATTERNS) if p.kind == "cache_penetration"]
    inside = pattern_store.get("cache", group_by="user_tier", start=p.start_ns / 1e9, end=p.end_ns / 1e9)
    before = pattern_store.get("cache", group_by="user_tier", start=(p.start_ns - 40 * MIN) / 1e9,
                               end=(p.start_ns - 5 * MIN) / 1e9)
    rate = {(r["cache"], r["group"]): r for r in inside}
    base = {(r["cache"], r["group"]): r for r in before}
    assert set(inside[0]) == {"cache", "group", "hits", "misses", "hit_rate"}
    assert rate[("profile", "bronze")]["hit_rate"] < 0.25 < 0.75 < base[("profile", "bronze")]["hit_rate"]
    assert rate[("profile", "gold")]["hit_rate"] > 0.8 and base[("profile", "gold")]["hit_rate"] > 0.8
    assert all(r["hits"] + r["misses"] > 0 and 0 <= r["hit_rate"] <= 1 for r in inside)
    # Over time: the bronze series dips inside the window only.
    reader = pattern_store.app.extensions["modalscope"]["reader"]
    series = queries.cache_series(reader, Window(p.start_ns - 40 * MIN, p.end_ns), "user_tier", "profile", 5)
    bronze = [r for r in series if r["group"] == "bronze" and r["hits"] + r["misses"] >= 10]
    low = [r for r in bronze if r["hit_rate"] < 0.4]
    assert low and all(p.start_ns - 5 * MIN <= r["t_ns"] < p.end_ns for r in low)
    assert any(r["hit_rate"] > 0.7 for r in bronze if r["t_ns"] < p.start_ns - 5 * MIN)


def test_cache_bad_group_by_is_a_400_naming_it(pattern_store):  # noqa: F811
    r = pattern_store.client.get("/api/v1/cache", query_string={"group_by": "<script>"})
    assert r.status_code == 400 and r.get_json()["parameter"] == "group_by"
    r = pattern_store.client.get("/api/v1/cache", query_string={"group_by": ""})
    assert r.status_code == 400 and r.get_json()["parameter"] == "group_by"


# -- pure: compare ---------------------------------------------------------------------
def test_span_facets_drop_ids_timestamps_and_structures():
    row = {"attributes": orjson.dumps({"user_tier": "gold", "request.id": "abc", "event.timestamp": 5,
                                       "cache.hit": False, "nested": {"a": 1}, "batch.size": 4}).decode(),
           "resource": orjson.dumps({"service.name": "enc", "service.instance.id": "pod-7",
                                     "user_tier": "res"}).decode(),
           "instance": "pod-7", "input_type": "image"}
    assert queries.span_facets(row) == {"service.name": "enc", "service.instance.id": "pod-7", "user_tier": "gold",
                                        "cache.hit": "false", "batch.size": "4", "input_type": "image"}
    # A resource or attribute set seen before is taken from ``blobs``, unchanged by the spans
    # that use it, and a span's own values still win.
    blobs: dict = {}
    assert queries.span_facets(row, blobs) == queries.span_facets(row)
    other = {**row, "attributes": orjson.dumps({"user_tier": "bronze"}).decode()}
    assert queries.span_facets(other, blobs)["user_tier"] == "bronze"
    assert queries.span_facets(row, blobs) == queries.span_facets(row)
    assert blobs[row["resource"]] == {"service.name": "enc", "service.instance.id": "pod-7", "user_tier": "res"}
    assert blobs[other["attributes"]] == {"user_tier": "bronze"} and len(blobs) == 3


def test_attribute_lift_ranks_skips_high_cardinality_and_needs_counts():
    base = [{"pod": f"pod-{i % 8}", "uid": str(i), "zone": "a" if i % 2 else "b"} for i in range(400)]
    sel = [{"pod": "pod-7" if i % 2 else f"pod-{i % 7}", "uid": f"s{i}", "zone": "a" if i % 2 else "b"}
           for i in range(40)]
    sel += [{"pod": "pod-rare", "uid": "x", "zone": "a"}] * 2  # under the minimum count
    rows = queries.attribute_lift(sel, base)
    assert rows[0]["key"] == "pod" and rows[0]["value"] == "pod-7"
    assert rows[0]["lift"] == pytest.approx((20 / 42) / (50 / 400), rel=1e-3)
    assert rows[0]["selection_count"] == 20 and rows[0]["baseline_count"] == 50
    assert all(r["key"] != "uid" for r in rows) and all(r["value"] != "pod-rare" for r in rows)
    assert all(r["lift"] > 1 for r in rows) and len(rows) <= 10
    assert queries.attribute_lift([], base) == [] and queries.attribute_lift(sel, []) == []


def _hist(*values_ms):
    return Histogram.from_values([v * MS for v in values_ms])


def test_stage_deltas_share_of_added_time():
    sel = {"preprocessing": (10, 10 * 500 * MS, _hist(*[500] * 10)), "encoder": (10, 10 * 120 * MS, _hist(*[120] * 10))}
    base = {"preprocessing": (10, 10 * 100 * MS, _hist(*[100] * 10)), "encoder": (10, 10 * 20 * MS, _hist(*[20] * 10)),
            "fusion": (10, 10 * 30 * MS, _hist(*[30] * 10))}
    rows = {r["stage"]: r for r in queries.stage_deltas(sel, base, 10, 10)}
    assert rows["preprocessing"]["share_of_added_time"] == pytest.approx(0.8)
    assert rows["encoder"]["share_of_added_time"] == pytest.approx(0.2)
    assert rows["fusion"]["share_of_added_time"] == 0 and rows["fusion"]["selection_p50_ms"] is None
    assert rows["preprocessing"]["delta_p50_ms"] == pytest.approx(400, rel=0.02)


def test_default_baseline_is_the_same_length_just_before():
    assert queries.default_baseline(Window(100, 160)) == Window(40, 100)


# -- compare on a constructed spike ----------------------------------------------------
def _encode_trace(rng: random.Random, t: int, pod: int, slow: bool) -> list[SpanRecord]:
    tid = f"{rng.getrandbits(128):032x}"
    sid = iter(f"{rng.getrandbits(64) | 1:016x}" for _ in range(8))
    root, client, server, decode, vit = (next(sid) for _ in range(5))
    decode_ms = (1500 if slow else 60) * (1 + 0.2 * rng.random())
    vit_ms = 100 * (1 + 0.2 * rng.random())
    enc_ms = decode_ms + vit_ms + 4
    total = enc_ms + 60
    gw = {"service.name": "gateway", "service.instance.id": "gw-0"}
    enc = {"service.name": "vision-encoder", "service.instance.id": f"pod-{pod}", "host.name": f"node-{pod % 2}"}
    attrs = {"mm.image_count": 1, "request.id": tid[:12], "region": rng.choice(["eu", "us"])}
    spans = [
        SpanRecord(tid, root, None, "gateway", "POST /chat", KIND_SERVER, t, t + int(total * MS), 0,
                   attributes=attrs, resource=gw),
        SpanRecord(tid, client, root, "gateway", "vision.Encode", KIND_CLIENT, t + 5 * MS,
                   t + int((enc_ms + 9) * MS), 0, attributes={"peer.service": "vision-encoder"}, resource=gw),
        SpanRecord(tid, server, client, "vision-encoder", "VisionEncoder/Encode", KIND_SERVER, t + 7 * MS,
                   t + int((enc_ms + 7) * MS), 0, attributes={"region": attrs["region"]}, resource=enc),
        SpanRecord(tid, decode, server, "vision-encoder", "image.decode", KIND_INTERNAL, t + 8 * MS,
                   t + int((8 + decode_ms) * MS), 0, resource=enc),
        SpanRecord(tid, vit, server, "vision-encoder", "vit.forward", KIND_INTERNAL, t + int((9 + decode_ms) * MS),
                   t + int((9 + decode_ms + vit_ms) * MS), 0, resource=enc),
    ]
    rules().tag(spans)
    return spans


@pytest.fixture
def spike(engine, db_url, small_templates):
    """30 minutes of even traffic over pods 0-7, then 30 minutes where pod-7 turns slow half
    the time (others: 4 %): slow spans in the spike are on pod-7 about 4-5x more often."""
    rng = random.Random(11)
    base = (time.time_ns() // MIN - 90) * MIN
    spans = []
    for i in range(60 * 16):  # one trace every ~1.9 s over an hour
        t = base + i * (60 * MIN // (60 * 16))
        pod = i % 8
        in_spike = i >= 30 * 16
        slow = rng.random() < (0.5 if pod == 7 else 0.04) if in_spike else rng.random() < 0.04
        spans += _encode_trace(rng, t, pod, slow)
    settled_copy(small_templates, engine, db_url, f"spike-{base}", spans)
    app = create_app(Settings(database_url=db_url))
    yield app.test_client(), base
    app.extensions["modalscope"]["engine"].dispose()


def test_compare_names_the_injected_attribute_first(spike):
    client, base = spike
    q = {"start": rfc3339(base + 30 * MIN), "end": rfc3339(base + 60 * MIN),
         "caller": "gateway", "callee": "vision-encoder"}
    r = client.get("/api/v1/compare", query_string=q)
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    top = body["attributes"][0]
    assert (top["key"], top["value"]) == ("service.instance.id", "pod-7"), body["attributes"]
    assert top["lift"] >= 3 and top["selection_count"] >= 5
    assert set(top) >= {"key", "value", "selection_share", "baseline_share", "lift", "selection_count",
                        "baseline_count"}
    assert all(a["key"] not in ("request.id",) for a in body["attributes"])
    stages = {s["stage"]: s for s in body["stages"]}
    assert set(body["stages"][0]) >= {"stage", "selection_p50_ms", "baseline_p50_ms", "selection_p99_ms",
                                      "baseline_p99_ms", "delta_p50_ms", "delta_p99_ms", "share_of_added_time"}
    assert stages["preprocessing"]["share_of_added_time"] > 0.8
    assert stages["preprocessing"]["delta_p99_ms"] > 0
    # The end-to-end subject (root spans, whole traces) finds it too: the trace's own spans
    # don't carry the pod, but the default baseline (the 30 minutes before) is the same.
    explicit = client.get("/api/v1/compare", query_string={
        **q, "baseline_start": rfc3339(base), "baseline_end": rfc3339(base + 30 * MIN)}).get_json()
    assert explicit["attributes"] == body["attributes"]


def test_compare_bad_baseline_is_a_400(spike):
    client, base = spike
    r = client.get("/api/v1/compare", query_string={"range": "1h", "baseline_start": "nope"})
    assert r.status_code == 400 and r.get_json()["parameter"] == "baseline_start"
    r = client.get("/api/v1/compare", query_string={"range": "1h", "baseline_start": rfc3339(base),
                                                     "baseline_end": rfc3339(base - MIN)})
    assert r.status_code == 400 and r.get_json()["parameter"] == "baseline_end"


def test_subject_spans_sample_spreads_over_the_window_and_reads_only_long_enough_spans(spike, engine):
    """More spans than the limit: a sample from all over the window, not its newest minutes;
    ``min_ns``: only spans at least that long, whole traces through the traces table too."""
    from modalscope.models.reader import StoreReader

    _, base = spike
    reader = StoreReader(engine)
    end = base + 60 * MIN
    every = reader.attributes.subjects(base, end, kind=KIND_SERVER, service="vision-encoder", limit=10_000)
    assert len(every) == 960
    sample = reader.attributes.subjects(base, end, kind=KIND_SERVER, service="vision-encoder", limit=96, expected=960)
    assert 48 <= len(sample) <= 96
    starts = sorted(r["start_ns"] for r in sample)
    assert starts[0] < base + 5 * MIN and starts[-1] >= end - 5 * MIN  # both ends of the hour
    assert len({(s - base) // (5 * MIN) for s in starts}) == 12  # and every 5 minutes between
    assert [r["start_ns"] for r in sample] == sorted((r["start_ns"] for r in sample), reverse=True)

    slow_ns = 1000 * MS
    long_ones = reader.attributes.subjects(base, end, kind=KIND_SERVER, service="vision-encoder", min_ns=slow_ns)
    assert long_ones and all(r["duration_ns"] >= slow_ns for r in long_ones)
    assert len(long_ones) == sum(r["duration_ns"] >= slow_ns for r in every)
    roots = reader.attributes.subjects(base, end, root_only=True, min_ns=slow_ns)
    assert {r["trace_id"] for r in roots} == {r["trace_id"] for r in long_ones}  # a slow encode, a slow trace
    assert all(r["duration_ns"] >= slow_ns for r in roots)
    spread = reader.attributes.subjects(base, end, root_only=True, limit=48, expected=960)
    assert 24 <= len(spread) <= 48 and max(r["start_ns"] for r in spread) - min(r["start_ns"] for r in spread) > 50 * MIN


@pytest.mark.parametrize("by_duration", [0, 10**6], ids=["by-start", "by-duration"])
def test_slow_whole_traces_are_the_same_through_either_index(spike, engine, monkeypatch, by_duration):
    """The slow traces of a stretch, newest first and cut at the limit, whether read along
    start times or (SQLite, when the store holds few traces that slow) the duration index's
    tail; the choice itself goes both ways."""
    from sqlalchemy import select

    from modalscope.models import Trace
    from modalscope.models.reader import StoreReader
    from modalscope.models.reader import attributes as reader_module

    _, base = spike
    end = base + 60 * MIN
    with engine.connect() as conn:
        traces = conn.execute(select(Trace.trace_id, Trace.start_ns, Trace.duration_ns)
                              .where(Trace.start_ns >= base, Trace.start_ns < end)).all()
        assert reader_module._few_that_slow(conn, base, end, 10**15)  # none that slow
        assert not reader_module._few_that_slow(conn, base, base + MIN, 0)  # every trace, one minute
    slow_ns = sorted(d for _, _, d in traces)[len(traces) * 3 // 4]
    newest = sorted(((s, t) for t, s, d in traces if d >= slow_ns), reverse=True)[:25]
    monkeypatch.setattr(reader_module, "SLOW_TRACES_BY_DURATION", by_duration)
    rows = StoreReader(engine).attributes.subjects(base, end, root_only=True, min_ns=slow_ns, limit=25)
    assert len(newest) == 25 and [(r["start_ns"], r["trace_id"]) for r in rows] == newest


@pytest.mark.parametrize("walk_services", [8, 1], ids=["walked", "scanned"])
def test_stage_subject_spans_walk_the_stages_services_and_match_a_plain_scan(spike, engine, monkeypatch,
                                                                              walk_services):
    """A stage without a service: its spans read through the span index of each service that
    has the stage (three here; with more than ``STAGE_WALK_SERVICES``, through start_ns), the
    same rows a scan of the window filtered by stage gives: all of them, only the long ones,
    and a sample spread over the window from every one of those services."""
    from sqlalchemy import select

    from modalscope.models import Span
    from modalscope.models.reader import attributes as reader_module
    from modalscope.models.reader import Filters, StoreReader

    monkeypatch.setattr(reader_module, "STAGE_WALK_SERVICES", walk_services)

    _, base = spike
    rng = random.Random(5)
    audio = []
    for i in range(360):  # an audio encoder beside the vision one, every 10 s
        t = base + i * MIN // 6 + 3 * MS
        tid = f"{rng.getrandbits(128):032x}"
        audio.append(SpanRecord(tid, f"{rng.getrandbits(64) | 1:016x}", None, "audio-encoder", "AudioEncoder/Encode",
                                KIND_SERVER, t, t + int(rng.uniform(20, 2000) * MS), 0,
                                resource={"service.name": "audio-encoder"}))
    rules().tag(audio)
    assert {s.stage for s in audio} == {"encoder"}
    write_spans(engine, audio)
    settle(engine, force=True)
    reader = StoreReader(engine)
    end = base + 60 * MIN
    with engine.connect() as conn:
        scan = conn.execute(select(Span.trace_id, Span.service, Span.start_ns, Span.duration_ns).where(
            Span.start_ns >= base, Span.start_ns < end, Span.stage == "encoder")).all()
    # The gateway's CLIENT span "vision.Encode" is encoder time (span-name patterns come
    # before CLIENT -> network), so the gateway is one of the stage's services too.
    stage_services = {"gateway", "vision-encoder", "audio-encoder"}
    assert {r.service for r in scan} == stage_services
    # The walk takes the services of the stage's op series: all three, so walk_services=8
    # walks their span indexes and walk_services=1 falls back to the scan.
    assert reader.rollups.services_of("op", Filters(stage="encoder")) == sorted(stage_services)

    every = reader.attributes.subjects(base, end, stage="encoder", limit=100_000)
    assert sorted((r["trace_id"], r["start_ns"]) for r in every) == sorted((r.trace_id, r.start_ns) for r in scan)
    assert [r["start_ns"] for r in every] == sorted((r["start_ns"] for r in every), reverse=True)
    slow_ns = 500 * MS
    long_ones = reader.attributes.subjects(base, end, stage="encoder", min_ns=slow_ns)
    assert sorted((r["trace_id"], r["start_ns"]) for r in long_ones) == \
        sorted((r.trace_id, r.start_ns) for r in scan if r.duration_ns >= slow_ns)
    sample = reader.attributes.subjects(base, end, stage="encoder", limit=120, expected=len(scan))
    assert 60 <= len(sample) <= 120
    # (a vision trace has two encoder spans, the gateway's and the encoder's: keyed by start too)
    services = {(r.trace_id, r.start_ns): r.service for r in scan}
    assert {services[r["trace_id"], r["start_ns"]] for r in sample} == stage_services
    assert len({(r["start_ns"] - base) // (5 * MIN) for r in sample}) == 12  # every 5 minutes of the hour
    assert reader.attributes.subjects(base, end, stage="fusion") == []  # no service has the stage


def test_whole_trace_subject_spans_are_each_traces_own_root(engine):
    """Whole traces' spans are their root spans, found by the trace's start: a child starting
    with its root is no root, a second root later in the trace is not the trace's, two traces
    whose roots start in the same nanosecond each get their own, a trace without a root gives
    none, and ``min_ns`` holds on the root's own duration."""
    from modalscope.models.reader import StoreReader

    base = (time.time_ns() // MIN - 30) * MIN
    t = base + 5 * MIN
    res = {"service.name": "gateway"}

    def span(tid, sid, parent, start, ms, name="POST /chat"):
        return SpanRecord(tid, sid, parent, "gateway", name, KIND_SERVER, start, start + ms * MS, 0,
                          attributes={"which": f"{tid[:2]}-{sid[:2]}"}, resource=res)

    a, b, c, d = (f"{n:02x}" * 16 for n in (0xa1, 0xb2, 0xc3, 0xd4))
    spans = [
        span(a, "a1" * 8, None, t, 900), span(a, "a2" * 8, "a1" * 8, t, 800, "child"),  # child at the root's start
        span(a, "a3" * 8, None, t + 2 * MIN, 50, "late-root"),  # a second, later root
        span(b, "b1" * 8, None, t, 100), span(b, "b2" * 8, "b1" * 8, t + MS, 90, "child"),  # same start as a's root
        span(c, "c2" * 8, "c9" * 8, t + 3 * MIN, 700, "orphan"),  # its parent never arrives: no root
        span(d, "d1" * 8, None, t + 4 * MIN, 300),
    ]
    rules().tag(spans)
    write_spans(engine, spans)
    settle(engine, force=True)
    reader = StoreReader(engine)
    rows = reader.attributes.subjects(base, base + 30 * MIN, root_only=True)
    got = {(r["trace_id"][:2], orjson.loads(r["attributes"])["which"]) for r in rows}
    assert got == {("a1", "a1-a1"), ("b2", "b2-b1"), ("d4", "d4-d1")}
    order = [r["trace_id"][:2] for r in rows]
    assert order[0] == "d4" and sorted(order[1:]) == ["a1", "b2"]  # newest trace first (a and b start together)
    slow = reader.attributes.subjects(base, base + 30 * MIN, root_only=True, min_ns=250 * MS)
    assert sorted(r["trace_id"][:2] for r in slow) == ["a1", "d4"]
    assert {r["duration_ns"] for r in slow} == {900 * MS, 300 * MS}


def test_compare_on_a_sample_still_names_the_injected_attribute_first(spike, monkeypatch):
    """With far fewer spans read than the windows hold, Compare ranks the same value first."""
    client, base = spike
    monkeypatch.setattr(comparison, "COMPARE_MAX_SPANS", 60)
    q = {"start": rfc3339(base + 30 * MIN), "end": rfc3339(base + 60 * MIN),
         "caller": "gateway", "callee": "vision-encoder"}
    body = client.get("/api/v1/compare", query_string=q).get_json()
    top = body["attributes"][0]
    assert (top["key"], top["value"]) == ("service.instance.id", "pod-7"), body["attributes"]
    assert top["lift"] >= 3
