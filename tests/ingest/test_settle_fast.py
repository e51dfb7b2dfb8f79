"""The batch settler (numpy) agrees exactly with the per-trace reference on random traces."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import orjson
from sqlalchemy import select
from hypothesis import given, settings
from hypothesis import strategies as st

from modalscope.core.spans import SpanRecord
from modalscope.ingest.settle_reference import summarize_trace
from modalscope.ingest.settle_fast import ROW, _batch_sizes, convention_columns, summarize_rows
from modalscope.ingest.traces import effective_stages, model_call_spans, trace_calls

SERVICES = ["gateway", "vision-encoder", "llm", "userdb"]
NAMES = ["POST /chat", "image.decode", "vit.forward", "fusion.align", "llm.generate", "db.query"]
STAGES = ["preprocessing", "encoder", "encoder", "fusion", "inference", "network", "other"]
INSTANCES = ["pod-1", "pod-2", ""]
ADDRESSES = {
    "server.address": ["api.example.com", "10.0.0.7", "::1", ""],
    "server.port": [443, "8443", 8080.0, "x", True, 0, 70000],
    "url.full": ["https://api.example.com/v1/chat", "http://api.example.com:8080/x?q=1", "https://[::1]:9/x",
                 "not a url", "http://h:bad/", "https://user:pw@Upper.Example.com:444/p"],
    "http.url": ["http://legacy.example.com:81/a", "http://legacy.example.com/a"],
    "net.peer.name": ["old-db", ""],
    "net.peer.port": [5432, "5433", None],
}
# What spans say about their trace (ingest/signals.py): explicit types, counts, model calls
# with providers and models, transport spans that may inherit a model call's stage.
SIGNALS = [
    {"it": "video"}, {"it": "image"}, {"mm": {"image": 2.0}}, {"mm": {"image": 1.0, "audio": 0.0}},
    {"parts": {"image": 1, "video": 0}}, {"parts": {"audio": 2}}, {"usage": ["image"]}, {"text": 1},
    {"call": 1, "text": 1, "provider": "gemini", "model": "gemini-2.5-flash"},
    {"call": 1, "provider": "vertex_ai", "model": "gemini-2.5-pro"}, {"call": 1, "model": "m"}, {"call": 1},
    {"call": 1, "provider": "", "model": ["odd"]}, {"inh": "network"}, {"inh": "network"}, {"inh": "other"},
    {"call": 1, "inh": "network", "provider": "openai"},
    # token usage, in odd shapes too (only non-negative integers count), and on no model call
    {"call": 1, "text": 1, "provider": "gemini", "model": "gemini-2.5-flash",
     "tok": {"in": {"text": 12, "image": 258, "total": 270}, "out": 31}},
    {"call": 1, "provider": "vllm", "model": "mm-llm-7b", "usage": ["audio"],
     "tok": {"in": {"audio": 320, "video": 0, "total": 320}, "out": 0}},
    {"call": 1, "model": "m", "tok": {"in": {"total": 7}}}, {"call": 1, "tok": {"out": 2**60}},
    {"call": 1, "provider": "openai", "tok": {"in": {"text": -1, "image": "9", "audio": 2.5, "total": True},
                                              "out": None}},
    {"call": 1, "tok": ["odd"]}, {"call": 1, "tok": {"in": [1], "out": "3"}}, {"tok": {"in": {"text": 5}, "out": 1}},
]


def random_trace(rng: random.Random, tid: str) -> list[SpanRecord]:
    n = rng.randint(1, 14)
    ids = [f"{rng.getrandbits(64) | 1:016x}" for _ in range(n)]
    base = 1_700_000_000_000_000_000 + rng.randrange(10**12)
    spans = []
    for i, sid in enumerate(ids):
        r = rng.random()
        if i == 0 and r < 0.85 or r < 0.05:
            parent = None if rng.random() < 0.9 else ""
        elif r < 0.1:
            parent = f"{rng.getrandbits(64) | 1:016x}"  # orphan: parent never arrived
        elif r < 0.12:
            parent = sid  # a span claiming to be its own parent
        else:
            parent = ids[rng.randrange(max(i, 1))]
        start = base + rng.choice([0, rng.randrange(10**9)])
        dur = rng.choice([0, rng.randrange(10**9), rng.randrange(10**6)])
        attrs = {}
        if rng.random() < 0.3:
            attrs["mm.image_count"] = rng.choice([0, 1, 2, "2", "x"])
        if rng.random() < 0.1:
            attrs["mm.audio_count"] = rng.choice([0, 1])
        if rng.random() < 0.1:
            attrs["mm.input_type"] = rng.choice(["text", "image", "audio", "bogus"])
        if rng.random() < 0.1:
            attrs["gen_ai.system"] = "x"
        # Span conventions (the detectors' rollups): cache lookups with tags, batch sizes,
        # CUDA Graph modes, in odd shapes too.
        if rng.random() < 0.2:
            attrs["cache.name"] = rng.choice(["kv", "prefix", 7])
            if rng.random() < 0.8:
                attrs["cache.hit"] = rng.choice([True, False, "true", "false", "MISS", 0, 1, 0.0, "maybe", None])
            for key in rng.sample(["user_tier", "region", "db.system", "cache.key", "n", "long", "", "bad key",
                                   "t1", "t2", "t3", "t4", "t5", "t6", "t7"], rng.randint(0, 11)):
                attrs[key] = rng.choice(["a", "b", "", 3, "x" * 80, True, None, {"o": 1}]) if key != "n" \
                    else rng.randint(0, 9)
        if rng.random() < 0.2:
            attrs["batch.size"] = rng.choice([1, 1, 4, 2.5, "8", "x", True, 0, -3])
        if rng.random() < 0.2:
            attrs["gpu.cuda_graph"] = rng.choice(["fallback", "captured", "other"])
        if rng.random() < 0.2:  # ViT layers; only a string names one
            attrs["mm.layer"] = rng.choice(["patch_embed", "attention", "mlp", "", 3, None, ["mlp"]])
        kind = rng.choice([1, 2, 3, 3, 4, 5])
        if kind == 3 and rng.random() < 0.5:
            attrs[rng.choice(["peer.service", "server.address", "net.peer.name"])] = rng.choice(SERVICES + [""])
        if rng.random() < 0.3:  # addresses of uninstrumented callees, in odd shapes too
            for key in rng.sample(list(ADDRESSES), rng.randint(1, 3)):
                attrs[key] = rng.choice(ADDRESSES[key])
        if rng.random() < 0.1:  # spans stored before signals existed: read from these
            attrs[rng.choice(["mm.video_count", "mm.prompt_chars", "gen_ai.operation.name"])] = rng.choice([1, 0, "2"])
        service = rng.choice(SERVICES)
        signals = rng.choice(SIGNALS) if rng.random() < 0.5 else None
        if signals and "inh" in signals and parent in ids[:i] and rng.random() < 0.7:
            service = next(s.service for s in spans if s.span_id == parent)  # under its parent, often a model call
        if signals and "call" in signals and parent in ids[:i] and rng.random() < 0.5:
            service = next(s.service for s in spans if s.span_id == parent)  # two instrumentations of one call
        resource = {"service.instance.id": rng.choice(INSTANCES)} if rng.random() < 0.8 else {}
        if rng.random() < 0.3:  # resource attributes a cache breakdown could group by, in odd shapes
            for key in rng.sample(["user_tier", "region", "host.name", "cache.zone", "bad key"], rng.randint(1, 3)):
                resource[key] = rng.choice(["r", "", 5, None, [1]])
        spans.append(SpanRecord(tid, sid, parent, service, rng.choice(NAMES), kind, start,
                                start + dur, rng.choice([0, 0, 1, 2]), attributes=attrs, resource=resource,
                                stage=rng.choice(STAGES), signals=signals))
    # Stored spans are unique per (trace, span) and loaded ordered by (start, span id).
    uniq = {s.span_id: s for s in reversed(spans)}
    return sorted(uniq.values(), key=lambda s: (s.start_ns, s.span_id))


def add_links(rng: random.Random, traces: list[list[SpanRecord]], outside: list[SpanRecord]) -> None:
    """Links from CONSUMER spans to spans of any trace, of none, or outside the batch."""
    pool = [s for t in traces for s in t] + outside
    for t in traces:
        for s in t:
            if s.kind == 5 and rng.random() < 0.6:
                picks = rng.sample(pool, min(len(pool), rng.randint(1, 3)))
                s.links = [{"trace_id": p.trace_id, "span_id": p.span_id, "attributes": {}} for p in picks]
                if rng.random() < 0.2:
                    s.links.append({"trace_id": "ee" * 16, "span_id": "ff" * 8, "attributes": {}})  # never stored
                if rng.random() < 0.1:
                    s.links.append({"trace_id": 5, "span_id": None})  # malformed: ignored


def outside_producers(rng: random.Random) -> list[SpanRecord]:
    base = 1_700_000_000_000_000_000
    return [SpanRecord(f"{rng.getrandbits(128) | 1:032x}", f"{rng.getrandbits(64) | 1:016x}", None,
                       rng.choice(SERVICES), "publish", rng.choice([4, 4, 1]), base + rng.randrange(10**12),
                       base + 10**12 + 5, rng.choice([0, 2])) for _ in range(3)]


def as_rows(spans, first_row: int = 1):
    """Rows as ``load_trace_rows`` gives them (the resource only on cache lookups; row ids
    from ``first_row``)."""
    out = []
    for row_id, s in enumerate(spans, first_row):
        attrs = orjson.dumps(s.attributes).decode() if s.attributes else "{}"
        out.append((s.trace_id, s.span_id, s.parent_span_id, s.service, s.name, s.kind, s.stage, s.start_ns,
                    s.end_ns - s.start_ns, s.status, attrs, s.resource.get("service.instance.id"),
                    *convention_columns(s.attributes),
                    orjson.dumps(s.resource).decode() if '"cache.name"' in attrs else "", row_id,
                    s.attributes.get("mm.layer") if isinstance(s.attributes.get("mm.layer"), str) else None,
                    orjson.dumps(s.signals).decode() if s.signals else None,
                    orjson.dumps(s.links).decode() if s.links and s.kind == 5 else None))
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_traces=st.integers(1, 25))
def test_batch_equals_reference(seed, n_traces):
    check_batch_against_reference(random.Random(seed), n_traces)


def test_random_traces_reach_tokens_and_nested_model_calls():
    """The generator makes what the comparison must cover: token usage on model calls and
    model calls wrapping another of their service (which count once, in both paths)."""
    traces, batch = check_batch_against_reference(random.Random(11), 400)
    tokens = Counter(batch.keys[k][6] for k in batch.c_key if batch.keys[k][0] == "tokens")
    assert set(tokens) == {"text", "image", "audio", "video", "total", "output"}, tokens
    assert 2**53 in [int(v) for k, v in zip(batch.c_key, batch.c_value) if batch.keys[k][6] == "output"]
    nested = 0
    for t in traces:
        callers = {s.span_id for s in t if s.signals and s.signals.get("call") and s.kind not in (2, 5)}
        counted = {s.span_id for s in model_call_spans(t)}
        nested += len(callers - counted)
        assert not (callers - counted) & set(trace_calls(t))
    assert nested >= 10, nested


def check_batch_against_reference(rng: random.Random, n_traces: int):
    """Random traces settled by both paths: the same summaries, contributions, calls and
    corrected stages. Returns the traces and the batch summary."""
    traces = [random_trace(rng, f"{rng.getrandbits(128) | 1:032x}") for _ in range(n_traces)]
    outside = outside_producers(rng)
    add_links(rng, traces, outside)
    rows = []
    for t in sorted(traces, key=lambda t: t[0].trace_id):
        rows += as_rows(t, len(rows) + 1)
    batch = summarize_rows(rows, {(s.trace_id, s.span_id): s for s in outside})
    # Calls: exactly the pair contributions; those of CLIENT spans with their row ids.
    pair_rows = Counter((batch.keys[k], int(v)) for k, v in zip(batch.c_key, batch.c_value)
                        if batch.keys[k][0] == "pair")
    call_rows = Counter((batch.keys[k], int(d)) for k, d in zip(batch.call_key, batch.call_dur))
    assert call_rows == pair_rows
    written = [r for r in batch.call_row.tolist() if r >= 0]
    assert len(set(written)) == len(written)  # a span makes one call at most
    for r, d, st in zip(batch.call_row.tolist(), batch.call_dur.tolist(), batch.call_start.tolist()):
        if r >= 0:  # pair_calls rows: CLIENT spans' calls, with the span's own times
            assert rows[r - 1][5] == 3 and rows[r - 1][8] == d and rows[r - 1][7] == st
    assert sorted(batch.trace_ids) == sorted(t[0].trace_id for t in traces)
    everywhere = {(s.trace_id, s.span_id): s for t in traces for s in t}
    for s in outside:
        everywhere[(s.trace_id, s.span_id)] = s
    # Corrected stages: exactly the rows whose counted stage differs from the stored one.
    row_of = {(r[0], r[1]): r[ROW] for r in rows}
    want = {}
    for t in traces:
        for sid, stage in effective_stages(t).items():
            span = next(s for s in t if s.span_id == sid)
            if stage != span.stage:
                want[row_of[(span.trace_id, sid)]] = stage
    assert dict(zip(batch.restage_row.tolist(), batch.restage_stage)) == want
    client_calls = {row_of[(t[0].trace_id, sid)] for t in traces for sid, call in trace_calls(t, everywhere).items()
                    if next(s for s in t if s.span_id == sid).kind == 3}
    assert set(written) == client_calls
    for t in traces:
        ref = summarize_trace(t[0].trace_id, t, everywhere)
        i = batch.trace_ids.index(t[0].trace_id)
        got = (batch.root_service[i], batch.root_name[i], int(batch.start_ns[i]), int(batch.duration_ns[i]),
               int(batch.span_count[i]), bool(batch.error[i]), batch.input_type[i])
        assert got == (ref.root_service, ref.root_name, ref.start_ns, ref.duration_ns, ref.span_count,
                       ref.error, ref.input_type)
        mine = Counter((batch.keys[k], int(m), int(v), int(e)) for tr, k, m, v, e in
                       zip(batch.c_trace, batch.c_key, batch.c_minute, batch.c_value, batch.c_err) if tr == i)
        theirs = Counter((k, m, v, e) for k, m, v, e in ref.contributions)
        assert mine == theirs
    return traces, batch


def test_empty_batch():
    batch = summarize_rows([])
    assert batch.trace_ids == [] and len(batch.c_trace) == 0


ODD_VALUES = [1, 4, 2.5, 0, -3, 1e12, "8", " 8 ", "x", "", True, False, None, [1], {"a": 1},
              "fallback", "captured", "Fallback", 7]


def test_database_extracts_convention_columns_like_python(engine):
    """The loader's SQL (json_extract / ->>) gives what ``convention_columns`` says, on both
    databases, for odd shapes too: so the batch path and the reference agree on stored spans."""
    from modalscope.ingest.settle import load_trace_rows
    from modalscope.ingest.settle_fast import BATCH, GRAPH, LAYER, ROW
    from modalscope.ingest.writer import write_spans
    from modalscope.models import Span

    spans, expected = [], {}
    tid = "ab" * 16
    shapes = [{"batch.size": v} for v in ODD_VALUES] + [{"gpu.cuda_graph": v} for v in ODD_VALUES] + [
        {"mm.layer": v} for v in ODD_VALUES + ["mlp", "attention"]] + [
        {"batch.size": 4, "gpu.cuda_graph": "fallback", "cache.name": "kv"}, {}]
    for i, extra in enumerate(shapes):
        attrs = {"other": "y", **extra}
        sid = f"{i + 1:016x}"
        spans.append(SpanRecord(tid, sid, None if i == 0 else f"{1:016x}", "svc", "op", 1,
                                1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_100 + i, 0, attributes=attrs))
        expected[sid] = convention_columns(attrs)
    write_spans(engine, spans)
    with engine.connect() as conn:
        rows = load_trace_rows(conn, [tid])
        ids = dict(conn.execute(select(Span.span_id, Span.id)).all())
    assert len(rows) == len(spans)
    layers = {s.span_id: s.attributes.get("mm.layer") for s in spans}
    for r in rows:
        assert r[ROW] == ids[r[1]]
        assert r[LAYER] == (layers[r[1]] if isinstance(layers[r[1]], str) else None), (r[LAYER], layers[r[1]])
        want_b, want_g = expected[r[1]]
        got_size = _batch_sizes([r[BATCH]])[0]
        want_size = _batch_sizes([want_b])[0]
        assert (np.isnan(got_size) and np.isnan(want_size)) or got_size == want_size, (r[1], r[BATCH], want_b)
        assert (r[GRAPH] is None) == (want_g is None), (r[GRAPH], want_g)
        assert (r[GRAPH] == "fallback") == (want_g == "fallback"), (r[GRAPH], want_g)


# -- cache lookups: the TOTAL series, the hit rule, the cache_untagged marker ------------
def test_cache_contributions_total_tags_hit_rule_and_untagged_keys():
    from modalscope.ingest.settle_fast import CACHE_MAX_TAGS, CACHE_UNTAGGED_KIND, cache_contributions

    t, minute = 1_700_000_000_000_000_000, 1_700_000_000_000_000_000 // 60_000_000_000
    attrs = {"cache.name": "kv", "cache.hit": "false", "user_tier": "gold", "n": 3, "empty": "", "flag": True,
             "long": "x" * 65, "obj": {"a": 1}, "nul": None, "": "emptykey", "bad key": 1.5, "cache.key": "k"}
    got = cache_contributions("svc", t, 5, attrs, {"region": "eu", "user_tier": "res", "nul": "r", "host": [1]})
    keys = [c[0] for c in got]
    assert keys[0] == ("cache", "svc", "kv", "", "", "", "")  # the TOTAL series
    assert ("cache", "svc", "kv", "", "", "user_tier", "gold") in keys
    assert all(c[1:] == (minute, 5, 1) for c in got)  # "false" is a miss (the cache page's rule)
    assert not any(k[5] == "" and k[6] for k in keys if k[0] == "cache")  # an empty key is no tag
    (marker,) = [k for k in keys if k[0] == CACHE_UNTAGGED_KIND]
    # numbers, booleans, '', too long; a resource key where the span lacks the key (or has null)
    assert orjson.loads(marker[5]) == ["empty", "flag", "long", "n", "nul", "region"]
    # the hit rule: values saying neither hit nor miss make no lookup at all
    for hit, miss in ((True, 0), ("TRUE", 0), ("hit", 0), (1, 0), (2.5, 0), (False, 1), ("no", 1), (0, 1)):
        assert cache_contributions("svc", t, 5, {"cache.name": "kv", "cache.hit": hit})[0][3] == miss, hit
    for hit in (None, "maybe", "", [True], float("nan")):
        assert cache_contributions("svc", t, 5, {"cache.name": "kv", "cache.hit": hit}) == [], hit
    assert cache_contributions("svc", t, 5, {"cache.name": {"x": 1}, "cache.hit": True}) == []
    # past the first CACHE_MAX_TAGS string tags (key order): no tag, so the key is marked
    many = {"cache.name": "kv", "cache.hit": True, **{f"t{i:02d}": "v" for i in range(CACHE_MAX_TAGS + 2)}}
    got = cache_contributions("svc", t, 5, many)
    assert [k[5] for k, *_ in got if k[0] == "cache"] == [""] + [f"t{i:02d}" for i in range(CACHE_MAX_TAGS)]
    assert orjson.loads(got[-1][0][5]) == [f"t{i:02d}" for i in range(CACHE_MAX_TAGS, CACHE_MAX_TAGS + 2)]
    # fully tagged lookups without resource keys carry no marker; a huge key list becomes "*"
    assert [k[0] for k, *_ in cache_contributions("svc", t, 5, {"cache.name": "kv", "cache.hit": 1, "a": "b"})] == [
        "cache", "cache"]
    huge = {"cache.name": "kv", "cache.hit": 1, **{f"k{i:04d}": i for i in range(400)}}
    assert cache_contributions("svc", t, 5, huge)[-1][0][5] == "*"


def test_loader_gives_the_resource_of_cache_lookups_only(engine):
    from modalscope.ingest.settle import load_trace_rows
    from modalscope.ingest.settle_fast import RESOURCE
    from modalscope.ingest.writer import write_spans

    tid = "cd" * 16
    res = {"service.name": "svc", "user_tier": "gold", "n": 3}
    spans = [SpanRecord(tid, f"{i + 1:016x}", None if i == 0 else f"{1:016x}", "svc", "op", 1,
                        1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_100 + i, 0, attributes=attrs,
                        resource=res)
             for i, attrs in enumerate([{"cache.name": "kv", "cache.hit": True}, {"other": "cache"}, {}])]
    write_spans(engine, spans)
    with engine.connect() as conn:
        rows = {r[1]: r for r in load_trace_rows(conn, [tid])}
    assert orjson.loads(rows[f"{1:016x}"][RESOURCE]) == res
    assert rows[f"{2:016x}"][RESOURCE] == "" and rows[f"{3:016x}"][RESOURCE] == ""


def test_factorize_rows_is_the_multiindex_factorize():
    """Codes and distinct tuples (first appearance first) of several columns, as pandas
    factorizes a MultiIndex of them: strings with None among them, booleans, integers."""
    import numpy as np
    import pandas as pd

    from modalscope.ingest.settle_fast import _factorize_rows

    def plain(rows):
        return [tuple(None if isinstance(v, float) and v != v else (v.item() if hasattr(v, "item") else v)
                      for v in t) for t in rows]

    rng = np.random.default_rng(3)
    for n in (1, 7, 3000):
        names = np.array([f"s{i}" for i in rng.integers(0, 4, n)], dtype=object)
        maybe = np.array([None if i == 0 else f"n{i}" for i in rng.integers(0, 9, n)], dtype=object)
        flags = rng.random(n) < 0.3
        ints = rng.integers(0, 50, n)
        for cols in ((names, maybe, flags), (ints, maybe), (names, flags)):
            want_codes, want = pd.factorize(pd.MultiIndex.from_arrays(list(cols)))
            codes, got = _factorize_rows(*cols)
            assert np.array_equal(codes, want_codes) and plain(got) == plain(want), n
