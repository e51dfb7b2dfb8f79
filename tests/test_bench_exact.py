"""The benchmark's exact answers come from the raw spans alone (bench/dashboard_bench.py):
its input-type, pair and cache.hit rules must agree with the settler's, its per-input-type
counts with the traces the settler wrote, its pairs with the pair rollups, and its cache
answer with the cache view's."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from sqlalchemy import func, select

from modalscope.app.params import Window
from modalscope.ingest import demo
from modalscope.core.spans import SpanRecord
from modalscope.ingest.signals import span_signals
from modalscope.ingest.settle import settle
from modalscope.ingest.traces import input_type_of
from modalscope.models import Trace

MIN = 60_000_000_000


def _bench():
    path = Path(__file__).resolve().parent.parent / "bench" / "dashboard_bench.py"
    spec = importlib.util.spec_from_file_location("dashboard_bench_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


BENCH = _bench()
COUNTS = st.sampled_from([None, 0, 1, 2, 3, "2", " 1 ", "x", True, 0.5, 2.5, math.inf, float("nan"), [1]])
NAMES = st.sampled_from([None, "image", " IMAGE ", "multi_image", "audio", "text", "unknown", "bogus", "", 3])


def _attrs(draw_counts, draw_name, prompt, gen_ai):
    a = {}
    for key, value in (("mm.audio_count", draw_counts[0]), ("mm.image_count", draw_counts[1]),
                       ("mm.input_type", draw_name)):
        if value is not None:
            a[key] = value
    if prompt:
        a["mm.prompt_chars"] = 10
    if gen_ai:
        a["gen_ai.operation.name"] = "chat"
        a["gen_ai.request.model"] = "m"
    return a


PARTS = st.sampled_from([None, '[{"parts":[{"modality":"image"}]}]',
                         '[{"parts":[{"modality":"image"},{"modality":"image"}]}]',
                         '[{"parts":[{"modality":"audio"}]}]', '[{"parts":[{"type":"text"}]}]'])


@settings(max_examples=400, deadline=None)
@given(root=st.none() | st.tuples(st.tuples(COUNTS, COUNTS), NAMES, st.booleans(), st.booleans()),
       others=st.lists(st.tuples(st.integers(0, 5), NAMES, PARTS, st.tuples(COUNTS, COUNTS), st.booleans()),
                       max_size=4),
       stored=st.booleans())
def test_the_benchs_input_type_rule_agrees_with_the_settlers(root, others, stored):
    """Any span may say the input type (explicit names, counts, a model request's parts);
    spans stored with signals or before signals were (read from their attributes)."""
    tid = "ab" * 16
    spans = []
    if root is not None:
        spans.append(SpanRecord(tid, "0" * 15 + "1", None, "gw", "POST", 2, 100, 900, 0, attributes=_attrs(*root)))
    for i, (start, name, parts, counts, call) in enumerate(others):
        attrs = _attrs(counts, name, False, call)
        if parts is not None:
            attrs.update({"gen_ai.operation.name": "chat", "gen_ai.input.messages": parts})
        spans.append(SpanRecord(tid, f"{i + 2:016x}", "0" * 15 + "1", "svc", "op", 3, 100 + start, 500, 0,
                                attributes=attrs))
    rows = []
    for s in spans:
        sig = span_signals(s)
        if stored:
            s.signals = sig
        rows.append((s, json.dumps(sig) if stored and sig else None, None if stored else json.dumps(s.attributes)))
    root_sig = BENCH.span_signals_of(rows[0][1], rows[0][2]) if root is not None else None
    others_in = [(s.start_ns, s.span_id, BENCH.span_signals_of(sig, attrs)) for s, sig, attrs in rows
                 if root is None or s is not spans[0]]
    assert BENCH.input_type_from_signals(root_sig, others_in) == input_type_of(spans)


@pytest.fixture
def settled_demo(engine, db_url, filled_templates) -> demo.DemoConfig:
    """A quarter hour of demo traffic, settled: filled once a backend, copied for each test."""
    config = demo.DemoConfig(now_ns=(time.time_ns() // MIN - 5) * MIN, seed=7, hours=0.25, rate=1.0)

    def build(eng) -> None:
        demo.fill(eng, config)
        settle(eng, force=True)

    filled_templates.fill_like(engine, db_url, f"bench-demo-{config.now_ns}", build)
    return config


def test_exact_input_types_from_raw_spans_count_the_settled_traces(engine, settled_demo):
    config = settled_demo
    window = Window(config.start_ns + 3 * MIN, config.end_ns - 2 * MIN)
    exact = BENCH.exact_input_types(engine, window)
    with engine.connect() as conn:
        want = dict(conn.execute(select(Trace.input_type, func.count()).where(
            Trace.start_ns >= window.start_ns, Trace.start_ns < window.end_ns).group_by(Trace.input_type)).all())
    assert {k[0]: v["count"] for k, v in exact.items()} == want
    assert len(want) >= 3


def test_exact_pairs_from_raw_spans_are_the_settled_pairs(engine, settled_demo):
    """Demo traffic (model calls with and without an instrumented server, transport spans
    under them, uninstrumented databases and object stores named by address and URL, queue
    hand-offs in linked traces): the bench's pairs from the raw spans are the rollups'
    pairs, with the same counts and error rates and percentiles within the sketch's error."""
    from modalscope.app import queries
    from modalscope.models.reader import StoreReader

    config = settled_demo
    window = Window(config.start_ns + 3 * MIN, config.end_ns - 2 * MIN)
    exact = BENCH.exact_pairs(engine, window)
    ours = {(r["caller"], r["callee"]): r for r in queries.pairs(StoreReader(engine), window)}
    assert {k: v["count"] for k, v in exact.items()} == {k: v["count"] for k, v in ours.items()}
    for key, want in exact.items():
        assert ours[key]["error_rate"] == round(want["error_rate"], 6)
        for name in ("p50_ms", "p99_ms"):
            assert abs(ours[key][name] - want[name]) <= 0.05 * want[name] + 0.01, (key, name)
    callees = {k[1] for k in exact}
    assert {"gemini", "llm", "metering"} <= callees  # a provider, a model server, a hand-off
    assert any(c.endswith(":5432") for c in callees) and any(c.endswith(":9000") for c in callees)


HITS = st.sampled_from([True, False, 0, 1, 2, -1, 0.0, 0.5, math.inf, float("nan"), "true", " HIT ", "yes", "1",
                        "false", "Miss", "no", "0", "maybe", "", None, [True], {"a": 1}])


@settings(max_examples=200, deadline=None)
@given(value=HITS)
def test_the_benchs_cache_hit_rule_agrees_with_the_settlers(value):
    from modalscope.ingest.settle_fast import cache_hit_value

    assert BENCH._cache_hit(value) == cache_hit_value(value)


def test_exact_cache_from_raw_spans_is_the_cache_views_answer(engine):
    """The bench's pandas answer for the cache view equals the view's (rollups and raw
    spans) on lookups with odd ``cache.hit`` values, the group as a span or a resource
    attribute, or missing; counts and hit rates per (cache, group)."""
    import random

    from modalscope.app import queries
    from modalscope.ingest.writer import write_spans
    from modalscope.models.reader import StoreReader

    rng = random.Random(4)
    t0 = (time.time_ns() // MIN - 30) * MIN
    spans = []
    for i in range(600):
        attrs = {"cache.name": rng.choice(["kv", "prefix", 7]),
                 "cache.hit": rng.choice([True, False, "hit", "miss", 0, 1, "maybe", None])}
        resource = {"service.name": "svc"}
        where = rng.random()
        if where < 0.5:
            attrs["user_tier"] = rng.choice(["gold", "bronze", True, 3])
        elif where < 0.8:
            resource["user_tier"] = rng.choice(["silver", "gold"])
        start = t0 + rng.randrange(20 * MIN)
        spans.append(SpanRecord(f"{i + 1:032x}", f"{i + 1:016x}", None, "svc", "cache.get", 3, start,
                                start + 1_000_000, 0, attributes=attrs, resource=resource))
    write_spans(engine, spans)
    settle(engine, force=True)
    window = Window(t0 + 2 * MIN + 7_000_000_000, t0 + 18 * MIN)
    exact = BENCH.exact_cache(engine, window)
    for rollups in (True, False):
        rows = queries.cache_rates(StoreReader(engine), window, "user_tier", rollups=rollups)
        assert {(r["cache"], r["group"]): (r["hits"] + r["misses"], round(r["hit_rate"], 6)) for r in rows} == {
            k: (v["count"], round(v["hit_rate"], 6)) for k, v in exact.items()}
    assert {g for _, g in exact} == {"gold", "bronze", "true", "3", "silver", None}
