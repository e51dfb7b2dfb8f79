"""The demo generator (ingest/demo/) and `modalscope demo`.

The numbers are checked where a user sees them: through /api/v1 (rollups built by the real
decode -> tag -> write -> settle path), and through the stored spans for what the API
does not cover yet (cache hits, batch sizes, instances). Two SQLite stores are filled once
per test session and shared between xdist workers: a clean one with an even input-type mix
(~2,000 traces a type, for stable P95s) and the default 3-hour run with every pattern
injected (at a low rate, so it fills in seconds). On PostgreSQL (too slow to fill those in
a unit test) a small run checks determinism and the service graph through the API.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from sqlalchemy import delete, select

from modalscope.app import create_app
from modalscope.ingest import demo
from modalscope.ingest.otlp import decode_protobuf
from modalscope.core.spans import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, STATUS_ERROR
from modalscope.ingest.settle import settle
from modalscope.ingest.rules_file import default_rules
from modalscope.ingest.traces import effective_stages, input_type_of, trace_calls
from modalscope.models import HourlyRollup, QuarterRollup, Rollup, Series, Span, Trace
from modalscope.models.engine import make_engine
from modalscope.settings import Settings
from tests.test_cli import run

from tests.demo_stores import MIN, NOW, PATTERNS


def _pattern(kind: str) -> demo.InjectedPattern:
    (p,) = [p for p in demo.injected_patterns(PATTERNS) if p.kind == kind]
    return p


def _iso(ns: int) -> float:
    return ns / 1e9


# --------------------------------------------------------------------------------------
# Generation: deterministic, real OTLP, the right stages and pairs (no database)
# --------------------------------------------------------------------------------------

SMALL = demo.DemoConfig(now_ns=NOW, hours=0.1, rate=3.0)


def _digest(payloads) -> str:
    h = hashlib.sha256()
    for p in payloads:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()


def test_same_seed_gives_byte_identical_requests():
    first = list(demo.export_requests(SMALL))
    assert len(first) >= 2
    assert _digest(first) == _digest(demo.export_requests(SMALL))
    assert _digest(first) != _digest(demo.export_requests(demo.DemoConfig(now_ns=NOW, hours=0.1, rate=3.0, seed=43)))
    # The injection plan is data, the same for the same config.
    assert demo.injected_patterns(SMALL) == demo.injected_patterns(SMALL)


def test_cli_defaults_match_the_generator():
    from modalscope import demo_cmd

    assert (demo_cmd.DEFAULT_SEED, demo_cmd.DEFAULT_HOURS, demo_cmd.DEFAULT_RATE) == (
        demo.DEFAULT_SEED, demo.DEFAULT_HOURS, demo.DEFAULT_RATE)


def _decoded(config):
    rules = default_rules()
    traces = collections.defaultdict(list)
    n_traces = 0
    for payload, nt, ns in demo.iter_requests(config):
        result = decode_protobuf(payload)
        assert result.rejected == 0, result.errors
        assert len(result.spans) == ns
        rules.tag(result.spans)
        n_traces += nt
        for s in result.spans:
            traces[s.trace_id].append(s)
    assert len(traces) == n_traces
    return traces


# (service, span name) -> stage, for every span the generator emits (after the transport
# spans under a model call took its stage).
EXPECTED_STAGES = {
    ("gateway", "POST /v1/chat/completions"): "other",
    ("gateway", "auth.v1.Auth/Verify"): "network",
    ("gateway", "SELECT sessions"): "network",
    ("gateway", "GET profile"): "network",
    ("gateway", "SELECT user_profile"): "network",
    ("gateway", "SELECT quota"): "network",
    ("gateway", "preprocess.v1.Preprocessor/Preprocess"): "preprocessing",
    ("gateway", "vision.v1.VisionEncoder/Encode"): "encoder",
    ("gateway", "text.v1.TextEncoder/Encode"): "encoder",
    ("gateway", "audio.v1.AudioEncoder/Encode"): "encoder",
    ("gateway", "fusion.v1.Fusion/Fuse"): "fusion",
    ("gateway", "chat mm-llm-7b"): "inference",
    ("gateway", "generate_content gemini-2.0-flash"): "inference",
    ("gateway", "POST"): "inference",  # the Gemini SDK's HTTP request: waiting for the model
    ("gateway", "billing.v1.Billing/RecordUsage"): "network",
    ("gateway", "send usage-events"): "network",
    ("auth", "auth.v1.Auth/Verify"): "other",
    ("billing", "billing.v1.Billing/RecordUsage"): "other",
    ("preprocessor", "preprocess.v1.Preprocessor/Preprocess"): "preprocessing",
    ("preprocessor", "text.tokenize"): "preprocessing",
    ("preprocessor", "image.fetch"): "preprocessing",
    ("preprocessor", "HTTP GET"): "preprocessing",
    ("preprocessor", "audio.decode"): "preprocessing",
    ("preprocessor", "audio.resample"): "preprocessing",
    ("vision-encoder", "vision.v1.VisionEncoder/Encode"): "encoder",
    ("vision-encoder", "image.decode"): "preprocessing",
    ("vision-encoder", "image.resize"): "preprocessing",
    ("vision-encoder", "image.normalize"): "preprocessing",
    ("vision-encoder", "vit.forward"): "encoder",
    ("vision-encoder", "vit.patch_embed"): "encoder",
    ("vision-encoder", "vit.attention"): "encoder",
    ("vision-encoder", "vit.mlp"): "encoder",
    ("text-encoder", "text.v1.TextEncoder/Encode"): "encoder",
    ("text-encoder", "text_encoder.forward"): "encoder",
    ("audio-encoder", "audio.v1.AudioEncoder/Encode"): "encoder",
    ("audio-encoder", "audio_encoder.forward"): "encoder",
    ("fusion", "fusion.v1.Fusion/Fuse"): "fusion",
    ("fusion", "fusion.sync_wait"): "fusion",
    ("fusion", "fusion.align"): "fusion",
    ("fusion", "fusion.cross_attn"): "fusion",
    ("fusion", "fusion.memcpy"): "fusion",
    ("llm", "POST /v1/chat/completions"): "inference",
    ("llm", "llm.prefill"): "inference",
    ("llm", "llm.generate"): "inference",
    ("metering", "process usage-events"): "other",
    ("metering", "INSERT usage_events"): "network",
}
# Instrumented callees by their service, uninstrumented ones by peer.service, address and
# port or URL, the hosted model by its provider, the queue by the consumer's service.
EXPECTED_PAIRS = {
    ("gateway", callee) for callee in (
        "auth", "userdb", "profile-cache", "preprocessor", "vision-encoder", "text-encoder",
        "audio-encoder", "fusion", "llm", "gemini", "billing", "metering")
} | {("preprocessor", "objstore.internal:9000"), ("metering", "usagedb.internal:5432")}
MODEL_OF = {("gateway", "llm"): "mm-llm-7b", ("gateway", "gemini"): "gemini-2.0-flash"}
REQUEST_TYPES = {"text", "image", "multi_image", "audio"}


def _calls(traces):
    """(trace id, Call) of every call, hand-offs resolved through links across traces."""
    linked = {(s.trace_id, s.span_id): s for spans in traces.values() for s in spans}
    return [(tid, c) for tid, spans in traces.items() for c in trace_calls(spans, linked).values()]


@pytest.mark.slow
def test_spans_land_in_their_stages_and_pairs():
    traces = _decoded(demo.DemoConfig(now_ns=NOW, hours=0.25, rate=3.0))
    seen_stages = collections.defaultdict(set)
    types = collections.Counter()
    for spans in traces.values():
        types[input_type_of(spans)] += 1
        stages = effective_stages(spans)
        for s in spans:
            seen_stages[(s.service, s.name)].add(stages[s.span_id])
            assert s.resource["service.instance.id"].startswith("pod-")
        # Children lie inside their parents (stage time is self time).
        by_id = {s.span_id: s for s in spans}
        for s in spans:
            parent = by_id.get(s.parent_span_id)
            if parent is not None:
                assert parent.start_ns <= s.start_ns and s.end_ns <= parent.end_ns, (parent.name, s.name)
    assert seen_stages == {k: {v} for k, v in EXPECTED_STAGES.items()}
    calls = _calls(traces)
    pairs = collections.Counter((c.caller, c.callee) for _, c in calls)
    assert set(pairs) == EXPECTED_PAIRS
    # The model is the model calls' facet, and only theirs.
    assert {(c.caller, c.callee, c.model) for _, c in calls if c.model} == {(*k, m) for k, m in MODEL_OF.items()}
    # userdb is the busiest callee (session + quota on every request, the profile on a miss).
    assert pairs[("gateway", "userdb")] > 2 * pairs[("gateway", "llm")]
    # Every request has a type; the usage consumers' traces have none.
    requests = sum(n for t, n in types.items() if t != "unknown")
    assert set(types) == REQUEST_TYPES | {"unknown"}
    assert types["unknown"] == pairs[("gateway", "metering")] > 0.97 * requests


def _strip_mm(span):
    return dataclasses.replace(span, attributes={k: v for k, v in span.attributes.items()
                                                 if not k.startswith("mm.")}, signals=None)


@pytest.mark.slow
def test_model_calls_follow_the_genai_conventions_and_carry_the_input_type():
    traces = _decoded(demo.DemoConfig(now_ns=NOW, hours=0.25, rate=3.0))
    model_calls = hosted = text_requests = 0
    for spans in traces.values():
        assert not any("mm.input_type" in s.attributes for s in spans)
        calls = [s for s in spans if "gen_ai.operation.name" in s.attributes]
        for s in spans:  # no GenAI attribute outside the model calls
            assert s in calls or not any(k.startswith("gen_ai.") for k in s.attributes), (s.service, s.name)
        for s in calls:
            a = s.attributes
            model_calls += 1
            assert s.kind == KIND_CLIENT and s.service == "gateway"
            assert s.name == f"{a['gen_ai.operation.name']} {a['gen_ai.request.model']}"
            assert a["gen_ai.provider.name"] == a["gen_ai.system"] == {"chat": "vllm", "generate_content": "gemini"}[
                a["gen_ai.operation.name"]]
            assert json.loads(a["gen_ai.input.messages"])[0]["role"] == "user"
            if s.status != STATUS_ERROR:
                assert a["gen_ai.response.model"].startswith(a["gen_ai.request.model"])
                per_modality = sum(v for k, v in a.items() if k.startswith("gen_ai.usage.") and k.count(".") == 3)
                assert a["gen_ai.usage.input_tokens"] == per_modality > 0 and a["gen_ai.usage.output_tokens"] > 0
            kids = [k for k in spans if k.parent_span_id == s.span_id]
            if a["gen_ai.provider.name"] == "gemini":  # hosted: only the SDK's HTTP request under it
                hosted += 1
                (http,) = kids
                assert http.kind == KIND_CLIENT and http.attributes["url.full"].startswith("https://")
                assert http.attributes["server.port"] == 443 and "http.url" not in http.attributes
            else:  # self-hosted and instrumented: its server span, on the old HTTP conventions
                (server,) = kids
                assert (server.service, server.kind) == ("llm", KIND_SERVER)
                assert server.attributes["http.method"] == "POST" and "http.request.method" not in server.attributes
        root = next(s for s in spans if s.parent_span_id is None)
        if root.service != "gateway":
            continue
        # The input type comes from the conventions alone; mm.* extras only agree with them.
        with_mm = input_type_of(spans)
        if calls:
            bare = [_strip_mm(s) for s in spans]
            default_rules().tag(bare)
            assert input_type_of(bare) == with_mm, [s.name for s in spans]
        text_requests += with_mm == "text"
    assert model_calls > 0.98 * sum(any(s.service == "gateway" for s in sp) for sp in traces.values())
    assert hosted == pytest.approx(demo.GEMINI_SHARE * text_requests, rel=0.25)


def test_http_and_rpc_spans_use_one_generation_of_the_conventions_each():
    stable = {"http.request.method", "url.full", "server.address", "server.port", "http.response.status_code"}
    old = {"http.method", "http.url", "net.peer.name", "net.peer.port", "http.status_code"}
    seen = collections.defaultdict(set)
    for spans in _decoded(demo.DemoConfig(now_ns=NOW, hours=0.05, rate=3.0)).values():
        for s in spans:
            keys = set(s.attributes)
            if keys & {"http.request.method", "http.method"}:
                generation = "stable" if "http.request.method" in keys else "old"
                assert not keys & (old if generation == "stable" else {"http.request.method", "url.full",
                                                                       "http.response.status_code"}), s.name
                seen[generation].add((s.service, s.kind))
            if "rpc.system" in keys:
                assert {"rpc.service", "rpc.method"} <= keys and s.name == f"{s.attributes['rpc.service']}/" \
                    f"{s.attributes['rpc.method']}"
                seen["grpc"].add(s.service)
            if s.kind == KIND_CLIENT and s.name == "HTTP GET":  # the object store: by URL only
                assert old <= keys and "peer.service" not in keys
            if s.name == "INSERT usage_events":  # the usage database: address and port only
                assert {"db.system", "server.address", "server.port"} <= keys and "peer.service" not in keys
    assert {("gateway", KIND_SERVER), ("gateway", KIND_CLIENT)} <= seen["stable"]
    assert {("llm", KIND_SERVER), ("preprocessor", KIND_CLIENT)} <= seen["old"]
    assert {"auth", "billing", "preprocessor", "vision-encoder", "text-encoder", "fusion"} <= seen["grpc"]


def test_usage_events_cross_a_queue_into_linked_traces():
    traces = _decoded(demo.DemoConfig(now_ns=NOW, hours=0.1, rate=3.0))
    producers = {(s.trace_id, s.span_id): s for spans in traces.values() for s in spans if s.kind == KIND_PRODUCER}
    delays = []
    for spans in traces.values():
        consumers = [s for s in spans if s.kind == KIND_CONSUMER]
        if not consumers:
            continue
        (c,) = consumers
        assert c.parent_span_id is None and c.service == "metering"  # a trace of its own
        (link,) = c.links
        p = producers.pop((link["trace_id"], link["span_id"]))
        assert p.service == "gateway" and p.attributes["messaging.destination.name"] == \
            c.attributes["messaging.destination.name"]
        (root,) = [s for s in traces[p.trace_id] if s.parent_span_id is None]
        assert root.status != STATUS_ERROR  # only answered requests publish usage
        delays.append((c.start_ns - p.end_ns) / 1e6)
    assert not producers  # every published event is consumed once
    assert min(delays) > 0 and 25 < np.median(delays) < 80 and np.percentile(delays, 99) < 400
    # The hand-off counts the time in the queue.
    handoffs = [c for _, c in _calls(traces) if (c.caller, c.callee) == ("gateway", "metering")]
    assert len(handoffs) == len(delays)
    assert np.median([c.duration_ns / 1e6 for c in handoffs]) > np.median(delays)


@pytest.mark.slow
def test_clean_run_injects_nothing():
    cfg = demo.DemoConfig(now_ns=NOW, hours=3.0, rate=0.3, clean=True)
    assert demo.injected_patterns(cfg) == []
    traces = _decoded(cfg)
    generate = [s for spans in traces.values() for s in spans if s.name == "llm.generate"]
    fallback = sum(s.attributes["gpu.cuda_graph"] == "fallback" for s in generate)
    assert fallback <= 3 * demo.BASELINE_FALLBACK_RATE * len(generate) + 2
    roots = [s for spans in traces.values() for s in spans if s.parent_span_id is None]
    assert max(s.duration_ns for s in roots) < 20e9  # nothing near the 30 s LB timeout
    vit = [s.attributes["batch.size"] for spans in traces.values() for s in spans if s.name == "vit.forward"]
    assert min(vit) >= 2  # dynamic batching works
    requests = [spans for spans in traces.values() if any(s.service == "gateway" for s in spans)]
    assert len(requests) == demo.expected_traces(cfg)
    errors = sum(any(s.status == STATUS_ERROR for s in spans) for spans in requests)
    assert 0.004 < errors / len(requests) < 0.025


def test_default_run_plans_every_pattern_in_its_window():
    patterns = demo.injected_patterns(PATTERNS)
    assert [p.kind for p in patterns] == list(demo.PATTERN_KINDS)
    for p in patterns:
        assert PATTERNS.start_ns <= p.start_ns < p.end_ns <= PATTERNS.end_ns, p.kind
        assert p.start_ns % MIN == 0 and p.end_ns % MIN == 0
        assert p.subject and p.description
    band = _pattern("p99_band_break")
    assert band.end_ns - band.start_ns >= 10 * MIN and band.start_ns - PATTERNS.start_ns >= 30 * MIN


# --------------------------------------------------------------------------------------
# The seed's table, through /api/v1 (clean run, even mix)
# --------------------------------------------------------------------------------------


def test_input_type_percentiles_match_the_seed(clean_store):
    rows = {r["input_type"]: r for r in clean_store.get("input-types")}
    assert set(rows) == REQUEST_TYPES | {"unknown"}
    for it, profile in demo.PROFILES.items():
        row = rows[it]
        assert row["count"] >= 1900, (it, row["count"])
        assert row["p50_ms"] == pytest.approx(profile.p50_s * 1000, rel=0.10), (it, row)
        assert row["p95_ms"] == pytest.approx(profile.p95_s * 1000, rel=0.10), (it, row)
        assert row["bottleneck_stage"] == demo.BOTTLENECK_STAGE[it], (it, row)
        assert 0.004 < row["error_rate"] < 0.03
    # "unknown": the usage events' consumer traces, nothing else (and quick).
    (handoff,) = clean_store.get("pairs", caller="gateway", callee="metering")
    assert rows["unknown"]["count"] == handoff["count"] and rows["unknown"]["p95_ms"] < 50


# Mean input tokens a request, per modality, from the model calls' usage: 258 an image,
# 320 for the recording, a quarter of the prompt's characters.
EXPECTED_TOKENS = {
    "text": {"text": 209},
    "image": {"image": 258},
    "multi_image": {"image": 258 * (0.80 * 2 + 0.15 * 3 + 0.05 * 4)},
    "audio": {"audio": 320, "image": 0.2 * 258},
}


def test_input_types_report_the_model_calls_tokens(clean_store):
    rows = {r["input_type"]: r for r in clean_store.get("input-types")}
    for it, expected in EXPECTED_TOKENS.items():
        tokens = rows[it]["tokens"]
        assert tokens is not None and tokens["output"] > 0, (it, tokens)
        for modality, mean in expected.items():
            assert tokens["input"][modality] == pytest.approx(mean, rel=0.1), (it, modality, tokens)
        assert set(tokens["input"]) - {"total", "text"} <= set(expected), (it, tokens)
    assert rows["unknown"]["tokens"] is None  # no model call in the consumers' traces


def test_stage_shares_follow_the_bottleneck_column(clean_store):
    rows = clean_store.get("stages", group_by="input_type")
    shares = collections.defaultdict(dict)
    for r in rows:
        shares[r["input_type"]][r["stage"]] = r["share"]
    for it, expected in demo.STAGE_SHARES.items():
        got = shares[it]
        for stage, want in expected.items():
            assert got.get(stage, 0.0) == pytest.approx(want, rel=0.10, abs=0.01), (it, stage, got)
        # The stages the seed names hold the bulk of the time.
        assert sum(got[s] for s in demo.BOTTLENECK_STAGES[it]) >= 0.35, (it, got)
    # Two images: fusion grows (cross-modal attention scheduling + memory copies).
    assert shares["multi_image"]["fusion"] > 3 * shares["image"]["fusion"]


def test_seed_pair_latencies(clean_store):
    pairs = {(r["caller"], r["callee"]): r for r in clean_store.get("pairs")}
    userdb, billing = pairs[("gateway", "userdb")], pairs[("gateway", "billing")]
    # The seed: api->billing 12 / 87 ms, api->userdb 8 / 43 ms (P50 / P90).
    assert billing["p50_ms"] == pytest.approx(12, rel=0.2) and billing["p90_ms"] == pytest.approx(87, rel=0.2)
    assert userdb["p50_ms"] == pytest.approx(8, rel=0.2) and userdb["p90_ms"] == pytest.approx(43, rel=0.25)
    assert userdb["count"] / billing["count"] == pytest.approx(326_502 / 142_891, rel=0.1)


# --------------------------------------------------------------------------------------
# Each injected pattern is in the stored data (default 3-hour run, low rate)
# --------------------------------------------------------------------------------------


def _in(p: demo.InjectedPattern, ns: int) -> bool:
    return p.start_ns <= ns < p.end_ns


def test_hot_spot(pattern_store):
    p = _pattern("hot_spot")
    rows = pattern_store.get("pairs", start=_iso(p.start_ns), end=_iso(p.end_ns))
    by = {(r["caller"], r["callee"]): r for r in rows}
    hot = by[(p.subject["caller"], p.subject["callee"])]
    p99s = sorted((r["p99_ms"] for r in rows), reverse=True)
    counts = sorted((r["count"] for r in rows), reverse=True)
    quartile = max(1, len(rows) // 4)
    assert hot["count"] == counts[0]
    assert hot["p99_ms"] >= p99s[quartile - 1], (hot, p99s)
    before = {(r["caller"], r["callee"]): r for r in pattern_store.get(
        "pairs", start=_iso(p.start_ns - 45 * MIN), end=_iso(p.start_ns - 15 * MIN))}
    assert hot["p99_ms"] > 10 * before[("gateway", "userdb")]["p99_ms"]


def test_p99_band_break(pattern_store):
    p = _pattern("p99_band_break")
    q = {"caller": p.subject["caller"], "callee": p.subject["callee"]}
    (win,) = pattern_store.get("pairs", start=_iso(p.start_ns), end=_iso(p.end_ns), **q)
    (base,) = pattern_store.get("pairs", start=_iso(p.start_ns - 30 * MIN), end=_iso(p.start_ns), **q)
    assert win["p99_ms"] >= 3 * base["p99_ms"], (win, base)
    assert win["p50_ms"] == pytest.approx(base["p50_ms"], rel=0.2)


def test_cache_penetration(pattern_store):
    p = _pattern("cache_penetration")
    lookups = pattern_store.spans(Span.name == "GET profile")
    starts = pattern_store.trace_start()
    stats = collections.defaultdict(lambda: [0, 0])  # (inside, tier) -> [hits, total]
    for s in lookups:
        a = s["attributes"]
        assert a["cache.name"] == p.subject["cache"]
        k = (_in(p, starts[s["trace_id"]]), a["user_tier"])
        stats[k][0] += bool(a["cache.hit"])
        stats[k][1] += 1
    rate = {k: h / n for k, (h, n) in stats.items()}
    assert rate[(False, "bronze")] > 0.75 and rate[(True, "bronze")] < 0.2
    assert rate[(True, "gold")] > 0.8 and rate[(False, "gold")] > 0.8  # the other tag holds
    inside = sum(n for (i, _), (_, n) in stats.items() if i)
    assert stats[(True, "gold")][1] / inside > 0.5  # gold dominates the volume


def test_fusion_sync_wait(pattern_store):
    p = _pattern("fusion_sync_wait")
    encoders = pattern_store.spans(Span.kind == KIND_SERVER,
                                   Span.service.in_(("vision-encoder", "text-encoder", "audio-encoder")),
                                   attrs=False)
    ends = collections.defaultdict(list)
    start = pattern_store.trace_start()
    for s in encoders:
        ends[s["trace_id"]].append(s["start_ns"] + s["duration_ns"])
    spread = {True: [], False: []}
    for tid, e in ends.items():
        if len(e) >= 2:
            spread[_in(p, start[tid])].append((max(e) - min(e)) / 1e6)
    assert np.median(spread[True]) > 100 and np.median(spread[False]) < 25
    waits = pattern_store.spans(Span.name == "fusion.sync_wait", attrs=False)
    inside = [w["duration_ns"] / 1e6 for w in waits if _in(p, start[w["trace_id"]])]
    outside = [w["duration_ns"] / 1e6 for w in waits if not _in(p, start[w["trace_id"]])]
    assert np.median(inside) > 5 * np.median(outside)


def test_preprocessing_bound(pattern_store):
    p = _pattern("preprocessing_bound")
    it = p.subject["input_type"]

    def share(**window):
        rows = pattern_store.get("stages", group_by="input_type", input_type=it, **window)
        return {r["stage"]: r["share"] for r in rows}["preprocessing"]

    inside = share(start=_iso(p.start_ns), end=_iso(p.end_ns))
    before = share(start=_iso(p.start_ns - 40 * MIN), end=_iso(p.start_ns))
    assert inside > 1.6 * before and inside > 0.3, (inside, before)
    # The slow decodes concentrate on one pod.
    decodes = pattern_store.spans(Span.name == "image.decode", Span.start_ns >= p.start_ns,
                                  Span.start_ns < p.end_ns + 5 * MIN, attrs=False)
    starts = pattern_store.trace_start()
    by_pod = collections.defaultdict(list)
    for s in decodes:
        if _in(p, starts[s["trace_id"]]):
            by_pod[s["instance"]].append(s["duration_ns"])
    slow = p.details["instance"]
    others = [d for pod, ds in by_pod.items() if pod != slow for d in ds]
    assert np.median(by_pod[slow]) > 1.5 * np.median(others)


def test_batching_failure(pattern_store):
    p = _pattern("batching_failure")
    vit = pattern_store.spans(Span.name == "vit.forward")
    starts = pattern_store.trace_start()
    inside = [s["attributes"]["batch.size"] for s in vit if _in(p, starts[s["trace_id"]])]
    outside = [s["attributes"]["batch.size"] for s in vit if not _in(p, starts[s["trace_id"]])]
    assert inside and set(inside) == {1}
    assert np.mean(outside) > 3 and sum(b == 1 for b in outside) == 0
    # ... while the load is high: more requests a minute than in the hour before.
    roots = pattern_store.spans(Span.parent_span_id.is_(None), attrs=False)
    per_min_in = sum(_in(p, r["start_ns"]) for r in roots) / ((p.end_ns - p.start_ns) / MIN)
    per_min_out = sum(r["start_ns"] < p.start_ns for r in roots) / ((p.start_ns - PATTERNS.start_ns) / MIN)
    assert per_min_in > 1.3 * per_min_out


def test_cuda_graph_fallback(pattern_store):
    p = _pattern("cuda_graph_fallback")
    gens = pattern_store.spans(Span.name == "llm.generate")
    starts = pattern_store.trace_start()
    inside = [s for s in gens if _in(p, starts[s["trace_id"]])]
    fb_in = [s for s in inside if s["attributes"]["gpu.cuda_graph"] == "fallback"]
    fb_out = [s for s in gens if not _in(p, starts[s["trace_id"]]) and s["attributes"]["gpu.cuda_graph"] == "fallback"]
    assert {s["instance"] for s in fb_in} >= {p.details["instance"]}
    assert len(fb_in) / len(inside) > 0.2
    assert len(fb_out) / (len(gens) - len(inside)) < 3 * demo.BASELINE_FALLBACK_RATE + 0.002
    # Extra latency: per output token (the model call's usage), fallback generate steps are
    # slower than captured ones.
    tokens = {s["trace_id"]: s["attributes"].get("gen_ai.usage.output_tokens")
              for s in pattern_store.spans(Span.name == "chat mm-llm-7b")}

    def per_token(spans):
        return np.median([s["duration_ns"] / tokens[s["trace_id"]] for s in spans if tokens[s["trace_id"]]])

    captured = [s for s in inside if s["attributes"]["gpu.cuda_graph"] == "captured"]
    assert per_token(fb_in) > 1.3 * per_token(captured)


def test_lb_timeout_truncation(pattern_store):
    p = _pattern("lb_timeout_truncation")
    ceiling = p.details["ceiling_s"] * 1e9
    with pattern_store.engine.connect() as conn:
        rows = conn.execute(select(Trace.start_ns, Trace.duration_ns, Trace.error, Trace.input_type)).all()
    near = [r for r in rows if 0.98 * ceiling <= r.duration_ns < ceiling]
    assert len(near) >= 5
    assert all(r.error and r.input_type == p.subject["input_type"] and _in(p, r.start_ns) for r in near)
    assert max(r.duration_ns for r in rows) < ceiling  # piled up just under it, none past
    assert not [r for r in rows if 0.6 * ceiling < r.duration_ns < 0.98 * ceiling and not _in(p, r.start_ns)]


def test_cold_start(pattern_store):
    p = _pattern("cold_start")
    pod = p.subject["attribute"]["value"]
    servers = pattern_store.spans(Span.service == "llm", Span.kind == KIND_SERVER, attrs=False)
    mine = [s for s in servers if s["instance"] == pod]
    assert mine and all(s["start_ns"] >= p.start_ns for s in mine)  # a new instance
    first = [s["duration_ns"] for s in mine if s["start_ns"] < p.start_ns + 2 * MIN]
    steady = [s["duration_ns"] for s in mine if s["start_ns"] >= p.end_ns + 10 * MIN]
    assert len(first) >= 5 and len(steady) >= 50
    assert np.median(first) > 5 * np.median(steady)


def test_baseline_regression(pattern_store):
    p = _pattern("baseline_regression")
    it = p.subject["input_type"]
    (inside,) = pattern_store.get("input-types", input_type=it, start=_iso(p.start_ns), end=_iso(p.end_ns))
    # A quiet stretch of the same run (between the cold start and the band break) holds the SLO.
    quiet_start, quiet_end = _pattern("cold_start").end_ns, _pattern("p99_band_break").start_ns
    (quiet,) = pattern_store.get("input-types", input_type=it, start=_iso(quiet_start), end=_iso(quiet_end))
    slo = p.details["slo_p95_ms"]
    assert inside["p95_ms"] > 1.1 * slo and quiet["p95_ms"] < 1.1 * slo, (inside, quiet)


# --------------------------------------------------------------------------------------
# Storage: SQLite and PostgreSQL (small)
# --------------------------------------------------------------------------------------

TINY = demo.DemoConfig(now_ns=NOW, hours=0.02, rate=1.0)


def _store_digest(engine) -> str:
    h = hashlib.sha256()
    cols = [c for c in Span.__table__.columns if c.key != "id"]
    with engine.connect() as conn:
        for row in conn.execute(select(*cols).order_by(Span.trace_id, Span.span_id)):
            h.update(repr(tuple(row)).encode())
        for row in conn.execute(select(Trace.trace_id, Trace.root_service, Trace.root_name, Trace.start_ns,
                                       Trace.duration_ns, Trace.span_count, Trace.error, Trace.input_type)
                                .order_by(Trace.trace_id)):
            h.update(repr(tuple(row)).encode())
        for row in conn.execute(select(Series.key_hash, Rollup.minute, Rollup.count, Rollup.error_count,
                                       Rollup.sum_ns, Rollup.sketch).join(Series, Series.id == Rollup.series_id)
                                .order_by(Series.key_hash, Rollup.minute)):
            h.update(repr(tuple(row)).encode())
    return h.hexdigest()


def test_two_runs_with_one_seed_store_identical_data(engine, db_url):
    first = demo.fill(engine, TINY)
    settle(engine, force=True)
    digest = _store_digest(engine)
    assert first.traces > 50 and first.inserted == first.spans
    # The service graph, as the API reads it on this engine.
    app = create_app(Settings(database_url=db_url))
    try:
        rows = app.test_client().get("/api/v1/pairs", query_string={
            "start": TINY.start_ns / 1e9, "end": TINY.end_ns / 1e9 + 120}).get_json()
    finally:
        app.extensions["modalscope"]["engine"].dispose()
    assert {(r["caller"], r["callee"]) for r in rows} == EXPECTED_PAIRS
    with engine.begin() as conn:
        for table in (Rollup, QuarterRollup, HourlyRollup, Trace, Span):  # series ids stay (the settler caches them)
            conn.execute(delete(table))
    # (generated in a child process this time, as large fills are: the same data)
    second = demo.fill(engine, TINY, background=True)
    settle(engine, force=True)
    assert (second.traces, second.spans, second.user_requests) == (first.traces, first.spans, first.user_requests)
    assert _store_digest(engine) == digest
    # A resent run stores nothing twice.
    assert demo.fill(engine, TINY).inserted == 0


class _Collecting:
    def __init__(self):
        self.spans = []

    def accept(self, records):
        self.spans.extend(records)


def test_live_traffic_sends_traces_once_they_have_ended():
    sink = _Collecting()
    live = demo.LiveTraffic(sink, demo.DemoConfig(now_ns=NOW, hours=1.0), rate=20.0)
    live.step(NOW, NOW + 5 * 1_000_000_000)
    early = len(sink.spans)
    live.step(NOW + 5 * 1_000_000_000, NOW + 60 * 1_000_000_000)
    assert live.sent_traces > 50 and len(sink.spans) > early
    assert all(s.end_ns <= NOW + 60 * 1_000_000_000 for s in sink.spans)
    assert all(NOW <= s.start_ns for s in sink.spans)


# --------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_demo_generate_only_fills_a_fresh_sqlite_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    r = run(["demo", "--generate-only", "--hours", "0.2"], {"MODALSCOPE_DATABASE_URL": url}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "injected patterns" in r.stdout
    engine = make_engine(url)
    with engine.connect() as conn:
        traces = conn.execute(select(Trace.pending)).scalars().all()
        spans = conn.execute(select(Span.id).limit(1)).first()
    engine.dispose()
    assert spans is not None and len(traces) > 1000 and not any(traces)
    # A second run finds the spans and generates nothing.
    r2 = run(["demo", "--generate-only", "--hours", "0.2"], {"MODALSCOPE_DATABASE_URL": url}, cwd=tmp_path)
    assert r2.returncode == 0 and "already holds spans" in r2.stdout


@pytest.mark.slow
def test_demo_clean_command_gives_the_seed_table(tmp_path):
    """What a newcomer runs (`modalscope demo --clean`, the default mix and rate), read back
    through /api/v1/input-types: P50 and P95 per input type within 15% of the seed's."""
    url = f"sqlite:///{tmp_path / 'clean.db'}"
    r = run(["demo", "--clean", "--generate-only", "--hours", "1"], {"MODALSCOPE_DATABASE_URL": url}, cwd=tmp_path)
    assert r.returncode == 0 and "no patterns injected" in r.stdout, r.stderr
    app = create_app(Settings(database_url=url))
    try:
        rows = app.test_client().get("/api/v1/input-types", query_string={"range": "24h"}).get_json()
    finally:
        app.extensions["modalscope"]["engine"].dispose()
    rows = {row["input_type"]: row for row in rows}
    for it, profile in demo.PROFILES.items():
        assert rows[it]["count"] >= 500, rows[it]
        assert rows[it]["p50_ms"] == pytest.approx(profile.p50_s * 1000, rel=0.15), rows[it]
        assert rows[it]["p95_ms"] == pytest.approx(profile.p95_s * 1000, rel=0.15), rows[it]


def test_demo_taken_port_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = run(["demo", "--port", str(port), "--hours", "0.05"],
                {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'd.db'}"}, cwd=tmp_path)
        grpc = run(["demo", "--port", str(_free_port()), "--otlp-http-port", str(_free_port()),
                    "--otlp-grpc-port", str(port), "--hours", "0.05"],
                   {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}"}, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and str(port) in r.stderr and "in use" in r.stderr, r.stderr
    assert grpc.returncode == 2 and grpc.stderr.strip().count("\n") == 0, grpc.stderr
    assert str(port) in grpc.stderr and "OTLP/gRPC" in grpc.stderr and "in use" in grpc.stderr, grpc.stderr
    assert not (tmp_path / "g.db").exists()  # refused before filling anything
    bad = run(["demo", "--otlp-http-port", "http"], {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'b.db'}"},
              cwd=tmp_path)
    assert bad.returncode == 2 and "--otlp-http-port" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_demo_serves_and_stops_cleanly(tmp_path):
    import queue
    import threading

    import requests

    port, http_port, grpc_port = _free_port(), _free_port(), _free_port()
    taken = socket.socket()  # where the environment points the receivers: the flags win
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env.update({"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'd.db'}",
                "MODALSCOPE_OTLP_HTTP_PORT": str(taken.getsockname()[1]),
                "MODALSCOPE_OTLP_GRPC_PORT": str(taken.getsockname()[1]), "MODALSCOPE_SETTLE_SECONDS": "1"})
    stderr = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "modalscope", "demo", "--hours", "0.05", "--port", str(port),
                             "--otlp-http-port", str(http_port), "--otlp-grpc-port", str(grpc_port)],
                            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=tmp_path)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "http://" not in line and time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                pass
        assert f"http://127.0.0.1:{port}/" in line, (line, proc.poll())
        assert f"OTLP/HTTP :{http_port}" in line and f"OTLP/gRPC :{grpc_port}" in line, line
        health = requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=5)
        assert health.status_code == 200
        # The receivers are up too.
        r = requests.post(f"http://127.0.0.1:{http_port}/v1/traces", data=b"",
                          headers={"Content-Type": "application/x-protobuf"}, timeout=5)
        assert r.status_code == 200
        time.sleep(2.5)  # live traffic flows (a trace is sent once it has ended)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        stderr.seek(0)
        err = stderr.read()
        stderr.close()
        taken.close()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    engine = make_engine(env["MODALSCOPE_DATABASE_URL"])
    with engine.connect() as conn:
        newest = conn.execute(select(Span.start_ns).order_by(Span.start_ns.desc()).limit(1)).scalar_one()
    engine.dispose()
    assert newest > time.time_ns() - 60 * 1_000_000_000  # live spans arrived

