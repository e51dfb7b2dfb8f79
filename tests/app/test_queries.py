"""Dashboard query functions against a known store, on SQLite and PostgreSQL.

Percentiles come from rollups (checked against numpy within the sketch's error), exemplars
from raw spans; a heatmap cell and the exemplars of its band must agree exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from modalscope.app import queries
from modalscope.app.params import Window
from modalscope.ingest.writer import write_spans
from modalscope.models.reader import Filters
from tests.app.conftest import MIN, MS, side_calls_trace

REL = 0.011  # the sketch's relative error (0.5 %) plus numpy's interpolation between buckets


def _ms(spans):
    return [(s.end_ns - s.start_ns) / MS for s in spans]


def test_pair_heatmap_orders_by_volume_and_counts_every_call(store):
    heat = queries.pair_heatmap(store.reader, store.window)
    names = [(p["caller"], p["callee"]) for p in heat["pairs"]]
    # 40 vision calls, 30 userdb calls, 30 llm calls (the child SERVER span's service wins
    # over the client's wrong peer.service); quietest first, busiest on the right.
    assert set(names) == {("gateway", "vision-encoder"), ("gateway", "userdb"), ("gateway", "llm")}
    assert names[-1] == ("gateway", "vision-encoder")
    assert [p["count"] for p in heat["pairs"]] == sorted(p["count"] for p in heat["pairs"])
    for p in heat["pairs"]:
        assert sum(p["counts"]) == p["count"]
        assert len(p["counts"]) == len(heat["bins"])
    edges = [b["lo_ms"] for b in heat["bins"]] + [heat["bins"][-1]["hi_ms"]]
    assert edges == sorted(edges)
    llm = next(p for p in heat["pairs"] if p["callee"] == "llm")
    assert llm["p50_ms"] == pytest.approx(np.percentile(_ms(store.spans("llm.Generate")), 50), rel=REL)
    assert llm["p99_ms"] == pytest.approx(np.percentile(_ms(store.spans("llm.Generate")), 99), rel=REL)
    # Filters narrow it; a non-network stage has no pairs.
    assert [p["callee"] for p in queries.pair_heatmap(store.reader, store.window, Filters(callee="llm"))["pairs"]] == ["llm"]
    # a pair's stage is its calling span's: the gateway's vision.Encode call is encoder time
    encoder = queries.pair_heatmap(store.reader, store.window, Filters(stage="encoder"))["pairs"]
    assert [(p["caller"], p["callee"]) for p in encoder] == [("gateway", "vision-encoder")]
    assert queries.pair_heatmap(store.reader, store.window, Filters(stage="fusion")) == {"pairs": [], "bins": []}


def test_heatmap_cells_and_exemplar_bands_agree_exactly(store):
    """Every span the rollups count in a cell is found by the exemplar query for its band."""
    heat = queries.pair_heatmap(store.reader, store.window)
    for p in heat["pairs"]:
        f = Filters(caller=p["caller"], callee=p["callee"])
        for count, b in zip(p["counts"], heat["bins"]):
            rows = queries.exemplar_traces(store.reader, store.window, f, b["min_ms"], b["max_ms"], limit=1000)
            assert len(rows) == count, (p["callee"], b)
            assert all(b["min_ms"] <= r["span_ms"] <= b["max_ms"] for r in rows)


def test_exemplars_slowest_first_with_the_api_fields(store):
    rows = queries.exemplar_traces(store.reader, store.window, Filters(caller="gateway", callee="llm"), limit=5)
    assert len(rows) == 5
    assert [r["span_ms"] for r in rows] == sorted((r["span_ms"] for r in rows), reverse=True)
    slowest = max(_ms(store.spans("llm.Generate")))
    assert rows[0]["span_ms"] == pytest.approx(slowest, abs=0.001)
    assert rows[0]["span_name"] == "llm.Generate" and rows[0]["span_service"] == "gateway"
    assert set(rows[0]) >= {"trace_id", "start_unix_nano", "duration_ms", "root_service", "root_name",
                            "input_type", "span_count", "error"}
    assert rows[0]["input_type"] == "text" and rows[0]["span_count"] == 4
    # The client's peer.service is not the callee when an instrumented server answered.
    assert queries.exemplar_traces(store.reader, store.window, Filters(callee="wrong-name")) == []
    # server.address names an uninstrumented callee.
    db = queries.exemplar_traces(store.reader, store.window, Filters(callee="userdb"), limit=100)
    assert len(db) == 30
    # caller + service that is neither end: nothing.
    assert queries.exemplar_traces(store.reader, store.window, Filters(callee="llm", service="billing")) == []


def test_exemplars_for_stages_services_and_traces(store):
    decode = queries.exemplar_traces(store.reader, store.window, Filters(stage="preprocessing"), limit=3)
    assert [r["span_name"] for r in decode] == ["image.decode"] * 3
    assert decode[0]["span_ms"] == pytest.approx(max(_ms(store.spans("image.decode"))), abs=0.001)
    svc = queries.exemplar_traces(store.reader, store.window, Filters(service="llm"), limit=100)
    assert len(svc) == 30 and {r["span_service"] for r in svc} == {"llm"}
    # No span-level filter: whole traces, by their duration, narrowed by input type and band.
    durs = sorted((t[0].end_ns - t[0].start_ns) / MS for t in store.images if t[0].attributes["mm.image_count"] == 2)
    rows = queries.exemplar_traces(store.reader, store.window, Filters(input_type="multi_image"), limit=100)
    assert [r["duration_ms"] for r in rows] == pytest.approx(sorted(durs, reverse=True), abs=0.001)
    assert all("span_id" not in r for r in rows)
    lo, hi = durs[3], durs[10]
    banded = queries.exemplar_traces(store.reader, store.window, Filters(input_type="multi_image"), lo, hi, 100)
    assert len(banded) == 8 and all(lo <= r["duration_ms"] <= hi for r in banded)
    # Input type narrows span-level exemplars through the trace.
    assert queries.exemplar_traces(store.reader, store.window, Filters(callee="llm", input_type="image")) == []


def test_unsettled_traces_are_exemplars_too(store, engine):
    import random

    late = side_calls_trace(random.Random(99), store.window.start_ns + 30 * MIN, db_ms=500, llm_ms=100)
    write_spans(engine, late)  # not settled: the raw spans are readable at once
    rows = queries.exemplar_traces(store.reader, store.window, Filters(callee="userdb"), limit=1)
    assert rows[0]["trace_id"] == late[0].trace_id
    assert rows[0]["duration_ms"] == pytest.approx(620, abs=0.01) and rows[0]["input_type"] == "text"


def test_latency_distribution_and_series(store):
    f = Filters(caller="gateway", callee="vision-encoder")
    dist = queries.latency_distribution(store.reader, store.window, f)
    calls = _ms(store.spans("vision.Encode"))
    assert dist["subject"] == "pair" and dist["count"] == len(calls)
    for key, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99)):
        assert dist[key] == pytest.approx(np.percentile(calls, q), rel=REL)
    assert sum(b["count"] for b in dist["bins"]) == len(calls)
    cdf = [b["cdf"] for b in dist["bins"]]
    assert cdf == sorted(cdf) and cdf[-1] == pytest.approx(1.0)
    assert dist["error_rate"] == 0.0
    series = queries.percentile_series(store.reader, store.window, f, step_minutes=5)
    assert sum(r["count"] for r in series) == len(calls)
    assert [r["t"] for r in series] == sorted(r["t"] for r in series)
    assert all(r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] for r in series)
    # Other subjects: a stage's spans, a service's spans, an input type's traces.
    assert queries.latency_distribution(store.reader, store.window, Filters(stage="preprocessing"))["count"] == 40
    assert queries.latency_distribution(store.reader, store.window, Filters(service="llm"))["count"] == 30
    text = queries.latency_distribution(store.reader, store.window, Filters(input_type="text"))
    assert text["subject"] == "trace" and text["count"] == 30
    empty = queries.latency_distribution(store.reader, Window(0, MIN), f)
    assert empty["count"] == 0 and empty["bins"] == [] and empty["p50_ms"] is None


def test_overview_marks_regressions_against_the_baseline(store):
    rows = {r["input_type"]: r for r in queries.overview_rows(store.reader, store.window)}
    # The seed's input types are always listed, with their baseline.
    assert {"text", "image", "multi_image"} <= set(rows)
    assert rows["image"]["baseline_p95_ms"] == 2100 and rows["image"]["count"] == 20
    assert rows["image"]["regression"] is False  # ~0.7-1.4 s against 2.1 s
    strict = queries.parse_baseline("image:100:200")
    marked = {r["input_type"]: r for r in queries.overview_rows(store.reader, store.window, baseline=strict)}
    assert marked["image"]["regression"] is True and marked["image"]["p95_change"] > 1
    assert marked["text"]["baseline_p95_ms"] == 410  # unnamed types keep the seed's figures
    lenient = queries.overview_rows(store.reader, store.window, baseline=strict, margin=100.0)
    assert not any(r["regression"] for r in lenient)
    audio_less = {r["input_type"] for r in queries.overview_rows(store.reader, store.window)}
    assert "audio" not in audio_less  # no baseline and no traffic: not listed
    for bad in ("image:1", "image:a:b", "image:-1:5"):
        with pytest.raises(ValueError, match="baseline entry"):
            queries.parse_baseline(bad)


def test_traffic_series(store):
    rows = queries.traffic_series(store.reader, store.window, step_minutes=10)
    assert sum(r["count"] for r in rows) == 70
    assert {r["input_type"] for r in rows} == {"text", "image", "multi_image"}
    assert all(r["rate_per_min"] == pytest.approx(r["count"] / 10) for r in rows)


def test_stage_breakdown_series_and_vit_layers(store):
    bd = queries.stage_breakdown(store.reader, store.window)
    stages = {(r["input_type"], r["stage"]) for r in bd["stages"]}
    assert ("image", "encoder") in stages and ("text", "network") in stages
    e2e = {r["input_type"]: r for r in queries.input_types(store.reader, store.window)}
    assert bd["traces"]["image"]["p50_ms"] == e2e["image"]["p50_ms"]
    for r in bd["stages"]:
        assert r["p50_ms"] <= r["p99_ms"] and r["traces"] > 0
    series = queries.stage_series(store.reader, store.window, step_minutes=15)
    assert {r["stage"] for r in series} >= {"encoder", "preprocessing", "network"}
    # vit.forward carries mm.layer=attention in the factory traces.
    layers = queries.vit_layers(store.reader, store.window)
    assert [r["layer"] for r in layers] == ["attention"]
    vit = _ms(store.spans("vit.forward"))
    assert layers[0]["count"] == len(vit) and layers[0]["operations"] == ["vit.forward"]
    assert layers[0]["total_ms"] == pytest.approx(sum(vit), rel=1e-6)
    assert 0 < layers[0]["share"] < 1
    assert queries.vit_layers(store.reader, store.window, Filters(service="llm")) == []


def test_vit_layers_from_layer_rollups_equal_the_raw_span_reading(store, monkeypatch):
    """The ``layer`` rollups give what the older reading (layer operations from raw spans,
    numbers from ``op`` rollups) gives, for every filter the Stages page passes."""
    cases = [Filters(), Filters(input_type="image"), Filters(input_type="multi_image"),
             Filters(service="vision-encoder"), Filters(service="llm")]
    from_rollups = [queries.vit_layers(store.reader, store.window, f) for f in cases]
    assert store.reader.rollups.series_ids("layer")
    real = store.reader.rollups.series_ids
    monkeypatch.setattr(store.reader.rollups, "series_ids", lambda kind: {} if kind == "layer" else real(kind))
    assert [queries.vit_layers(store.reader, store.window, f) for f in cases] == from_rollups
    assert from_rollups[0] and from_rollups[1] and from_rollups[-1] == []


def test_trace_view_depth_critical_path_and_ranks(store):
    t = store.images[0]
    view = queries.trace_view(store.reader, t[0].trace_id, store.window)
    spans = view["spans"]
    assert spans[0]["parent_span_id"] is None and spans[0]["depth"] == 0
    by_name = {s["name"]: s for s in spans}
    assert by_name["VisionEncoder/Encode"]["depth"] == 2 and by_name["image.decode"]["depth"] == 3
    # Depth-first: each span comes after its parent.
    seen = set()
    for s in spans:
        assert s["parent_span_id"] is None or s["parent_span_id"] in seen
        seen.add(s["span_id"])
    assert spans[0]["critical"] and by_name["llm.generate"]["critical"]
    # Ranks against the operation's own spans in the window (all 40 traces).
    decode = _ms(store.spans("image.decode"))
    mine = by_name["image.decode"]["duration_ms"]
    assert by_name["image.decode"]["rank"] == pytest.approx(np.mean(np.array(decode) <= mine), abs=0.05)
    assert by_name["image.decode"]["op_count"] == 40
    assert view["in_window"] is True
    elsewhere = queries.trace_view(store.reader, t[0].trace_id, Window(0, MIN))
    assert elsewhere["in_window"] is False and all(s["rank"] is None for s in elsewhere["spans"])
    assert queries.trace_view(store.reader, "ab" * 16, store.window) is None


def test_filter_options(store):
    opts = queries.filter_options(store.reader)
    assert {"gateway", "vision-encoder", "llm", "userdb"} <= set(opts["services"])
    assert ["gateway", "userdb"] in [list(p) for p in opts["pairs"]]
    assert opts["stages"][:5] == ["preprocessing", "encoder", "fusion", "inference", "network"]
    assert opts["input_types"][:3] == ["text", "image", "multi_image"]
    json.dumps(opts)


def test_traces_api(store):
    c = store.client
    rows = c.get(f"/api/v1/traces?start={store.window.start_ns / 1e9}&end={store.window.end_ns / 1e9}"
                 "&caller=gateway&callee=llm&limit=3").get_json()
    assert len(rows) == 3 and rows[0]["span_ms"] >= rows[1]["span_ms"] >= rows[2]["span_ms"]
    assert set(rows[0]) >= {"trace_id", "start_unix_nano", "duration_ms", "root_service", "root_name",
                            "input_type", "span_count", "error"}
    assert isinstance(rows[0]["start_unix_nano"], int)
    r = c.get("/api/v1/traces?range=2h&input_type=image&min_ms=0&max_ms=100000&limit=1000").get_json()
    assert len(r) == 20 and all(x["input_type"] == "image" for x in r)
    for url, param in (("/api/v1/traces?min_ms=abc", "min_ms"), ("/api/v1/traces?max_ms=-1", "max_ms"),
                       ("/api/v1/traces?min_ms=5&max_ms=1", "max_ms"), ("/api/v1/traces?limit=0", "limit"),
                       ("/api/v1/traces?limit=x", "limit"), ("/api/v1/traces?range=zz", "range")):
        resp = c.get(url)
        assert resp.status_code == 400 and resp.get_json()["parameter"] == param, url


def test_a_stage_filter_keeps_the_pairs_whose_calling_span_is_in_it(store, engine):
    """A pair's series carries its calling span's stage (a model call or a call named for
    generation: inference); pairs stored before it (stage '') count as network."""
    from sqlalchemy import update

    from modalscope.models import Series

    def callees(stage):
        got = {p["callee"] for p in queries.pairs(store.reader, store.window, Filters(stage=stage))}
        assert got == {p["callee"] for p in queries.pair_heatmap(store.reader, store.window,
                                                                 Filters(stage=stage))["pairs"]}
        return got

    assert callees("network") == {"userdb"}
    assert callees("inference") == {"llm"}
    assert callees("encoder") == {"vision-encoder"}
    assert callees("fusion") == set()
    rows = queries.exemplar_traces(store.reader, store.window, Filters(caller="gateway", stage="inference"), limit=50)
    assert rows and {r["span_name"] for r in rows} == {"llm.Generate"}
    with engine.begin() as conn:
        conn.execute(update(Series).where(Series.kind == "pair").values(stage=""))
    assert callees("network") == {"vision-encoder", "userdb", "llm"}
    assert callees("inference") == set()


def test_pairs_list_no_models_for_calls_without_one(store):
    rows = queries.pairs(store.reader, store.window)
    assert rows and all(r["models"] == [] for r in rows)
    assert queries.pairs(store.reader, store.window, Filters(model="mm-llm-7b")) == []
    assert queries.exemplar_traces(store.reader, store.window, Filters(caller="gateway", model="mm-llm-7b")) == []


def test_trace_view_shows_a_consumers_wait_in_the_queue(engine):
    """A CONSUMER span's queue wait: from its PRODUCER parent's end, or from the producer its
    span link names in another trace, to its own start."""
    import time

    from modalscope.core.spans import KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, SpanRecord
    from modalscope.models.reader import StoreReader

    base = (time.time_ns() // MIN - 10) * MIN
    pub_trace, sub_trace = "a1" * 16, "b2" * 16
    spans = [
        SpanRecord(pub_trace, "1" * 16, None, "gateway", "POST /v1/chat", KIND_SERVER, base, base + 900 * MS),
        SpanRecord(pub_trace, "2" * 16, "1" * 16, "gateway", "send usage", KIND_PRODUCER, base + 800 * MS,
                   base + 810 * MS),
        # a consumer in the same trace (parented), 40 ms after the publish ended
        SpanRecord(pub_trace, "3" * 16, "2" * 16, "audit", "process usage", KIND_CONSUMER, base + 850 * MS,
                   base + 860 * MS),
        # a consumer in its own trace, linked to the producer, 65 ms after it ended
        SpanRecord(sub_trace, "4" * 16, None, "metering", "process usage", KIND_CONSUMER, base + 875 * MS,
                   base + 900 * MS, links=[{"trace_id": pub_trace, "span_id": "2" * 16, "attributes": {}}]),
        SpanRecord(sub_trace, "5" * 16, None, "metering", "orphan", KIND_CONSUMER, base + 880 * MS,
                   base + 890 * MS, links=[{"trace_id": "c3" * 16, "span_id": "6" * 16, "attributes": {}}]),
    ]
    write_spans(engine, spans)
    reader = StoreReader(engine)
    window = Window(base - MIN, base + 2 * MIN)
    pub = {s["span_id"]: s for s in queries.trace_view(reader, pub_trace, window)["spans"]}
    assert pub["3" * 16]["queued_ms"] == 40.0 and pub["3" * 16]["producer_service"] == "gateway"
    assert "queued_ms" not in pub["1" * 16] and "queued_ms" not in pub["2" * 16]
    sub = {s["span_id"]: s for s in queries.trace_view(reader, sub_trace, window)["spans"]}
    assert sub["4" * 16]["queued_ms"] == 65.0 and sub["4" * 16]["producer_service"] == "gateway"
    assert "queued_ms" not in sub["5" * 16]  # its producer was never stored
    # and the trace page says it, in the span's facts
    from modalscope.app import create_app
    from modalscope.settings import Settings

    app = create_app(Settings(database_url=str(engine.url.render_as_string(hide_password=False))))
    try:
        from modalscope.app.pages import trace as trace_page

        view = queries.trace_view(reader, sub_trace, window)
        detail = trace_page.span_detail(view, next(s for s in view["spans"] if s["span_id"] == "4" * 16), {})
        assert "65 ms after gateway published it" in str(detail)
    finally:
        app.extensions["modalscope"]["engine"].dispose()
