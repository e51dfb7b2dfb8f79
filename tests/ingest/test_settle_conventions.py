"""Settling real instrumented traffic: model calls, transport spans under them, callees named
by address, queue hand-offs across traces, spans stored before signals existed. On SQLite
and PostgreSQL, through the writer, the tagger's default rules and the settler."""

from __future__ import annotations

import time

from sqlalchemy import select

from modalscope.core.spans import (KIND_CLIENT, KIND_CONSUMER, KIND_INTERNAL, KIND_PRODUCER, KIND_SERVER,
                                       STATUS_ERROR, SpanRecord)
from modalscope.ingest.settle import settle
from modalscope.ingest.rules_file import load_rules
from modalscope.ingest.traces import address_callee, trace_calls
from modalscope.ingest.writer import write_spans
from modalscope.models import PairCall, Series, Span, Trace

MS = 1_000_000
MIN = 60_000_000_000
BASE = (time.time_ns() // MIN - 20) * MIN
T1, T2 = "a1" * 16, "b2" * 16


def rec(tid, sid, parent, service, name, kind, start_ms, end_ms, **attrs) -> SpanRecord:
    return SpanRecord(tid, sid * 16 if len(sid) == 1 else sid, None if parent is None else parent * 16, service, name,
                      kind, BASE + int(start_ms * MS), BASE + int(end_ms * MS), attributes=attrs)


def tagged(spans: list[SpanRecord]) -> list[SpanRecord]:
    load_rules(None).tag(spans)
    return spans


def model_call_trace() -> list[SpanRecord]:
    """A gateway calling Gemini through the SDK (a GenAI CLIENT span with the SDK's HTTP
    request under it), a self-hosted model with an instrumented server, and two APIs on one
    host that differ by port."""
    return [
        rec(T1, "1", None, "gateway", "POST /v1/chat", KIND_SERVER, 0, 1000),
        rec(T1, "2", "1", "gateway", "generate_content gemini-2.0-flash", KIND_CLIENT, 10, 400,
            **{"gen_ai.operation.name": "generate_content", "gen_ai.provider.name": "gemini",
               "gen_ai.request.model": "gemini-2.0-flash", "gen_ai.usage.input_tokens": 12,
               "gen_ai.usage.image.input_tokens": 258}),
        rec(T1, "3", "2", "gateway", "POST", KIND_CLIENT, 12, 398,
            **{"http.request.method": "POST", "server.address": "generativelanguage.googleapis.com",
               "server.port": 443, "url.full": "https://generativelanguage.googleapis.com/v1beta/models/x"}),
        rec(T1, "4", "1", "gateway", "chat mm-llm-7b", KIND_CLIENT, 400, 800,
            **{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm", "gen_ai.request.model": "mm-llm-7b"}),
        rec(T1, "5", "4", "llm", "POST /v1/chat/completions", KIND_SERVER, 405, 795),
        rec(T1, "6", "1", "gateway", "GET", KIND_CLIENT, 800, 850,
            **{"http.request.method": "GET", "url.full": "http://store.internal:9000/objects/a"}),
        rec(T1, "7", "1", "gateway", "GET", KIND_CLIENT, 850, 900,
            **{"http.method": "GET", "http.url": "http://store.internal:9001/other"}),
        rec(T1, "8", "1", "gateway", "INSERT usage", KIND_CLIENT, 900, 950,
            **{"db.system": "postgresql", "server.address": "usage-db", "server.port": "5432"}),
        rec(T1, "9", "1", "gateway", "query", KIND_CLIENT, 950, 990,
            **{"net.peer.name": "old-db", "net.peer.port": 5433}),
    ]


def stored_pairs(engine) -> dict[tuple, tuple]:
    """(caller, callee, model) -> (count, sum ms) over the minute rollups."""
    from modalscope.models import Rollup

    with engine.connect() as conn:
        rows = conn.execute(select(Series.caller, Series.callee, Series.name, Rollup.count, Rollup.sum_ns)
                            .join(Rollup, Rollup.series_id == Series.id).where(Series.kind == "pair")).all()
    out: dict[tuple, tuple] = {}
    for caller, callee, name, count, total in rows:
        c, s = out.get((caller, callee, name), (0, 0))
        out[(caller, callee, name)] = (c + count, s + total // MS)
    return out


def stored_calls(engine) -> dict[str, tuple]:
    """span id -> (caller, callee, model, start ms, duration ms) of every pair_calls row."""
    with engine.connect() as conn:
        rows = conn.execute(select(Span.span_id, Series.caller, Series.callee, Series.name, PairCall.start_ns,
                                   PairCall.duration_ns).join(Span, Span.id == PairCall.span_row)
                            .join(Series, Series.id == PairCall.series_id)).all()
    return {r[0]: (r[1], r[2], r[3], (r[4] - BASE) // MS, r[5] // MS) for r in rows}


def stages(engine, tid: str) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(Span.span_id, Span.stage).where(Span.trace_id == tid)).all())


def test_address_callee_names_hosts_with_ports():
    assert address_callee({"peer.service": "billing", "server.address": "10.0.0.1"}) == "billing"
    assert address_callee({"server.address": "api.example.com", "server.port": 8443}) == "api.example.com:8443"
    assert address_callee({"server.address": "api.example.com", "server.port": "x"}) == "api.example.com"
    assert address_callee({"url.full": "https://API.example.com:444/v1?q=1"}) == "api.example.com:444"
    assert address_callee({"url.full": "https://api.example.com/v1"}) == "api.example.com"
    assert address_callee({"url.full": "http://[::1]:8080/x"}) == "[::1]:8080"
    assert address_callee({"url.full": "not a url", "http.url": "http://legacy:81/"}) == "legacy:81"
    assert address_callee({"net.peer.name": "db", "net.peer.port": 5432}) == "db:5432"
    assert address_callee({"net.peer.name": "db"}) == "db"
    assert address_callee({"http.route": "/x"}) is None


def test_model_calls_transport_spans_and_addresses(engine):
    spans = tagged(model_call_trace())
    write_spans(engine, spans)
    settle(engine, force=True)
    pairs = stored_pairs(engine)
    assert pairs == {
        ("gateway", "gemini", "gemini-2.0-flash"): (1, 390),  # the provider: nothing instrumented below
        ("gateway", "llm", "mm-llm-7b"): (1, 400),  # an instrumented model server is the callee
        ("gateway", "store.internal:9000", ""): (1, 50),  # two APIs on one host: two callees
        ("gateway", "store.internal:9001", ""): (1, 50),
        ("gateway", "usage-db:5432", ""): (1, 50),
        ("gateway", "old-db:5433", ""): (1, 40),
    }  # the SDK's HTTP request under the Gemini call makes no pair of its own
    calls = stored_calls(engine)
    assert calls["2" * 16] == ("gateway", "gemini", "gemini-2.0-flash", 10, 390)
    assert "3" * 16 not in calls and len(calls) == 6
    # The HTTP request waits for the model: inference, on the span row as in the rollups.
    assert stages(engine, T1)["3" * 16] == "inference"
    with engine.connect() as conn:
        assert conn.execute(select(Trace.input_type).where(Trace.trace_id == T1)).scalar() == "image"


def test_transport_span_settled_before_its_model_call_arrives(engine):
    """The HTTP request arrives first and settles as a network call of its own; its model
    call arrives later: the re-settle moves its time to inference, its stored stage with it,
    and drops its call."""
    spans = tagged(model_call_trace())
    early = [s for s in spans if s.span_id != "2" * 16]
    write_spans(engine, tagged(early))
    settle(engine, force=True)
    assert stages(engine, T1)["3" * 16] == "network"
    host = "generativelanguage.googleapis.com:443"
    assert stored_calls(engine)["3" * 16][:2] == ("gateway", host)
    write_spans(engine, tagged([s for s in model_call_trace() if s.span_id == "2" * 16]))
    settle(engine, force=True)
    assert stages(engine, T1)["3" * 16] == "inference"
    assert "3" * 16 not in stored_calls(engine)
    assert stored_pairs(engine).get(("gateway", host, "")) in (None, (0, 0))
    # The API's unsettled view agrees with the settled one.
    from modalscope.ingest.traces import effective_stages

    assert effective_stages(spans)["3" * 16] == "inference"


def queue_traces(consumer_error: bool = False) -> tuple[list[SpanRecord], list[SpanRecord]]:
    """gateway publishes a usage event (PRODUCER); metering consumes it 300 ms later in a trace
    of its own, linked to the producer; and a worker consumes a job as the producer's child."""
    first = [rec(T1, "1", None, "gateway", "POST /v1/chat", KIND_SERVER, 0, 200),
             rec(T1, "2", "1", "gateway", "usage publish", KIND_PRODUCER, 150, 160,
                 **{"messaging.system": "kafka", "messaging.destination.name": "usage"}),
             rec(T1, "3", "1", "gateway", "jobs publish", KIND_PRODUCER, 160, 170),
             rec(T1, "4", "3", "worker", "jobs process", KIND_CONSUMER, 190, 260)]
    consumer = rec(T2, "5", None, "metering", "usage process", KIND_CONSUMER, 460, 500,
                   **{"messaging.system": "kafka"})
    consumer.links = [{"trace_id": T1, "span_id": "2" * 16, "attributes": {}},
                      {"trace_id": "ee" * 16, "span_id": "f" * 16, "attributes": {}}]  # never stored
    if consumer_error:
        consumer.status = STATUS_ERROR
    second = [consumer, rec(T2, "6", "5", "metering", "INSERT", KIND_CLIENT, 470, 490, **{"peer.service": "usage-db"})]
    return tagged(first), tagged(second)


def test_hand_offs_across_traces_and_to_a_child(engine):
    first, second = queue_traces(consumer_error=True)
    write_spans(engine, first)
    settle(engine, force=True)  # the producer's trace settles alone first
    write_spans(engine, second)
    settle(engine, force=True)  # the consumer's: its producer is looked up in the store
    pairs = stored_pairs(engine)
    # From the producer's start to the consumer's end: 150 -> 500 ms and 160 -> 260 ms.
    assert pairs[("gateway", "metering", "")] == (1, 350)
    assert pairs[("gateway", "worker", "")] == (1, 100)
    # pair_calls holds CLIENT spans' calls only (the exemplar search reads CLIENT spans).
    assert stored_calls(engine) == {"6" * 16: ("metering", "usage-db", "", 470, 20)}
    with engine.connect() as conn:
        from modalscope.models import Rollup

        errors = conn.execute(select(Rollup.error_count).join(Series, Series.id == Rollup.series_id)
                              .where(Series.kind == "pair", Series.callee == "metering")).scalars().all()
    assert sum(errors) == 1


def test_hand_off_settled_in_one_batch_is_the_same(engine):
    first, second = queue_traces()
    write_spans(engine, first + second)
    settle(engine, force=True)
    assert stored_pairs(engine)[("gateway", "metering", "")] == (1, 350)
    assert trace_calls(second, {(s.trace_id, s.span_id): s for s in first})["5" * 16].duration_ns == 350 * MS
    assert "5" * 16 not in trace_calls(second)  # the producer unknown: no hand-off


def test_spans_stored_without_signals_still_say_the_input_type(engine):
    """Spans stored before the signals column existed: read from the attributes at settle
    time, on any span of the trace."""
    spans = [rec(T1, "1", None, "gateway", "POST /v1/chat", KIND_SERVER, 0, 100),
             rec(T1, "2", "1", "preprocessor", "Preprocess", KIND_INTERNAL, 10, 50, **{"mm.video_count": 1}),
             rec(T2, "3", None, "gateway", "POST /v1/chat", KIND_SERVER, 0, 100),
             rec(T2, "4", "3", "gateway", "chat m", KIND_INTERNAL, 10, 90,
                 **{"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "m"})]
    write_spans(engine, spans)  # untagged: no stage, no signals stored
    with engine.connect() as conn:
        assert conn.execute(select(Span.signals).where(Span.signals.is_not(None))).all() == []
    settle(engine, force=True)
    with engine.connect() as conn:
        types = dict(conn.execute(select(Trace.trace_id, Trace.input_type)).all())
    assert types == {T1: "video", T2: "text"}
    # An INTERNAL model call (OpenInference, SDK wrappers) is a pair to its provider too.
    assert stored_pairs(engine) == {("gateway", "openai", "m"): (1, 80)}


def stored_tokens(engine) -> dict[tuple, tuple]:
    """(service, model, input type, provider, key) -> (entries, tokens) over the minute rollups."""
    from modalscope.models import Rollup

    with engine.connect() as conn:
        rows = conn.execute(select(Series.service, Series.name, Series.input_type, Series.caller, Series.callee,
                                   Series.stage, Rollup.count, Rollup.sum_ns, Rollup.error_count)
                            .join(Rollup, Rollup.series_id == Series.id).where(Series.kind == "tokens")).all()
    out: dict[tuple, tuple] = {}
    for *key, stage, count, total, errors in rows:
        assert stage == "" and errors == 0
        c, s = out.get(tuple(key), (0, 0))
        out[tuple(key)] = (c + count, s + total)
    return {k: v for k, v in out.items() if v != (0, 0)}


def test_tokens_series_one_entry_per_model_call_and_key(engine):
    write_spans(engine, tagged(model_call_trace()))
    settle(engine, force=True)
    # The Gemini call carries total and image input tokens; the self-hosted one no usage.
    assert stored_tokens(engine) == {
        ("gateway", "gemini-2.0-flash", "image", "gemini", "total"): (1, 12),
        ("gateway", "gemini-2.0-flash", "image", "gemini", "image"): (1, 258),
    }


def nested_instrumentations() -> tuple[list[SpanRecord], list[SpanRecord]]:
    """One model call seen by two instrumentations in the gateway: an OpenInference LLM span
    (INTERNAL) around the OTel GenAI CLIENT span of the SDK call, over an instrumented model
    server. Returned as (the outer span with the root, the inner call and the server)."""
    first = [rec(T1, "1", None, "gateway", "POST /v1/chat", KIND_SERVER, 0, 1000),
             rec(T1, "2", "1", "gateway", "ChatCompletion", KIND_INTERNAL, 100, 900,
                 **{"openinference.span.kind": "LLM", "llm.provider": "vllm", "llm.model_name": "mm-llm-7b",
                    "llm.token_count.prompt": 600, "llm.token_count.prompt_details.image": 516,
                    "llm.token_count.completion": 90})]
    second = [rec(T1, "3", "2", "gateway", "chat mm-llm-7b", KIND_CLIENT, 110, 890,
                  **{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
                     "gen_ai.request.model": "mm-llm-7b", "gen_ai.usage.input_tokens": 600,
                     "gen_ai.usage.text.input_tokens": 84, "gen_ai.usage.image.input_tokens": 516,
                     "gen_ai.usage.output_tokens": 90}),
              rec(T1, "4", "3", "llm", "POST /v1/chat/completions", KIND_SERVER, 115, 885)]
    return tagged(first), tagged(second)


def test_a_model_call_wrapped_by_a_second_instrumentation_counts_once(engine):
    first, second = nested_instrumentations()
    # Alone, the outer span is the model call: its pair and its tokens.
    write_spans(engine, first)
    settle(engine, force=True)
    assert stored_pairs(engine) == {("gateway", "vllm", "mm-llm-7b"): (1, 800)}
    assert stored_tokens(engine) == {
        ("gateway", "mm-llm-7b", "image", "vllm", "total"): (1, 600),
        ("gateway", "mm-llm-7b", "image", "vllm", "image"): (1, 516),
        ("gateway", "mm-llm-7b", "image", "vllm", "output"): (1, 90),
    }
    # The inner span arrives: the re-settle counts the call once, from the inner span.
    write_spans(engine, second)
    settle(engine, force=True)
    assert {k: v for k, v in stored_pairs(engine).items() if v != (0, 0)} == {
        ("gateway", "llm", "mm-llm-7b"): (1, 780)}
    assert stored_tokens(engine) == {
        ("gateway", "mm-llm-7b", "image", "vllm", "total"): (1, 600),
        ("gateway", "mm-llm-7b", "image", "vllm", "text"): (1, 84),
        ("gateway", "mm-llm-7b", "image", "vllm", "image"): (1, 516),
        ("gateway", "mm-llm-7b", "image", "vllm", "output"): (1, 90),
    }
    assert stored_calls(engine) == {"3" * 16: ("gateway", "llm", "mm-llm-7b", 110, 780)}
    spans = first + second
    assert set(trace_calls(spans)) == {"3" * 16}


def test_model_calls_nested_across_services_are_two_calls(engine):
    """An agent's model call whose server makes a model call of its own: two calls, two
    pairs, both calls' tokens."""
    first, second = nested_instrumentations()
    inner = [rec(T1, "5", "4", "llm", "generate_content gemini-2.0-flash", KIND_CLIENT, 120, 500,
                 **{"gen_ai.operation.name": "generate_content", "gen_ai.provider.name": "gemini",
                    "gen_ai.request.model": "gemini-2.0-flash", "gen_ai.usage.output_tokens": 7})]
    write_spans(engine, first + second + tagged(inner))
    settle(engine, force=True)
    assert stored_pairs(engine) == {("gateway", "llm", "mm-llm-7b"): (1, 780),
                                    ("llm", "gemini", "gemini-2.0-flash"): (1, 380)}
    tokens = stored_tokens(engine)
    assert tokens[("llm", "gemini-2.0-flash", "image", "gemini", "output")] == (1, 7)
    assert tokens[("gateway", "mm-llm-7b", "image", "vllm", "output")] == (1, 90)
