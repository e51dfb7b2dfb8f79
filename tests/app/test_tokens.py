"""Tokens of model calls: per request on /api/v1/input-types, per model on the overview,
and the drilldown's latency against input tokens. Pure shaping without a database; the
queries on SQLite and PostgreSQL through the writer, the tagger's default rules and the
settler."""

from __future__ import annotations

import json
import time

import pytest

from modalscope.app import create_app, figures, tokens
from modalscope.app.params import Window
from modalscope.app.queries import input_types
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.ingest.settle import settle
from modalscope.ingest.rules_file import load_rules
from modalscope.ingest.writer import write_spans
from modalscope.models.reader import Filters, StoreReader
from modalscope.settings import Settings
from tests.factories import settled_copy

MS = 1_000_000
MIN = 60_000_000_000
BASE = (time.time_ns() // MIN - 40) * MIN
WINDOW = Window(BASE - 2 * MIN, BASE + 30 * MIN)


# -- pure shaping ------------------------------------------------------------------------
def test_per_request_means_modalities_total_and_output():
    assert tokens.per_request({"text": 600, "image": 516, "total": 1116, "output": 90}, 3) == {
        "input": {"text": 200.0, "image": 172.0}, "output": 30.0}  # a total beside modalities: left out
    assert tokens.per_request({"total": 300, "output": 20}, 4) == {"input": {"total": 75.0}, "output": 5.0}
    assert tokens.per_request({"image": 258}, 3) == {"input": {"image": 86.0}, "output": None}
    assert tokens.per_request({"output": 7}, 2) == {"input": {}, "output": 3.5}
    assert tokens.per_request({}, 10) is None
    assert tokens.per_request({"text": 5}, 0) is None


def test_model_table_counts_calls_and_means_per_call():
    rows = tokens.model_table([
        ("image", "mm-llm-7b", "image", 4, 1032), ("image", "mm-llm-7b", "text", 4, 80),
        ("image", "mm-llm-7b", "total", 4, 1112), ("image", "mm-llm-7b", "output", 3, 90),
        ("text", "gemini", "total", 2, 50), ("text", "gemini", "output", 2, 3),
        ("audio", "", "audio", 1, 320), ("text", "gone", "text", 0, 0),  # no calls left: no row
    ])
    assert rows == [
        {"input_type": "text", "model": "gemini", "calls": 2, "input": {"total": 25.0}, "output": 1.5},
        {"input_type": "image", "model": "mm-llm-7b", "calls": 4, "input": {"text": 20.0, "image": 258.0},
         "output": 22.5},
        {"input_type": "audio", "model": "", "calls": 1, "input": {"audio": 320.0}, "output": None},
    ]
    assert tokens.table_columns(rows) == [("input_type", "input type"), ("model", "model"), ("calls", "calls"),
                                          ("in_text", "text in"), ("in_image", "image in"),
                                          ("in_audio", "audio in"), ("in_total", "input (total)"),
                                          ("output", "output")]
    big = {"input_type": "multi_image", "model": "m", "calls": 12345, "input": {"image": 123456.4}, "output": 2.25}
    cells = tokens.table_cells(big)
    assert (cells["calls"], cells["in_image"], cells["output"], cells["in_text"]) == ("12,345", "123,456", "2.2", "—")
    assert tokens.table_cells(rows[2])["model"] == "—"


def test_scatter_points_take_the_total_else_the_modalities():
    def row(tok, dur_ms=100.0, **sig):
        return {"trace_id": "t", "span_id": "s", "duration_ns": int(dur_ms * MS),
                "signals": {"call": 1, "model": "m", "tok": tok, **sig}}

    points = tokens.scatter_points([
        row({"in": {"text": 20, "image": 258, "total": 300}, "out": 9}, 1234.5),
        row({"in": {"text": 200, "audio": 320}}),  # no total: the sum of the modalities
        row({"out": 5}),  # no input tokens: no point
        row({"in": {"image": 0, "text": "x", "total": -1}}),  # junk total; a zero image is no image
        {"trace_id": "t", "span_id": "s", "duration_ns": 5, "signals": None},
    ])
    assert [(p["x"], p["y"], p["image"], p["image_tokens"]) for p in points] == [
        (300, 1234.5, True, 258), (520, 100.0, False, 0), (0, 100.0, False, 0)]


def test_drop_wrappers_keeps_the_inner_call_of_one_service():
    rows = [{"trace_id": "t", "span_id": "a", "parent_span_id": None, "service": "gw"},
            {"trace_id": "t", "span_id": "b", "parent_span_id": "a", "service": "gw"},
            {"trace_id": "t", "span_id": "c", "parent_span_id": "b", "service": "llm"},
            {"trace_id": "u", "span_id": "a", "parent_span_id": "a", "service": "gw"}]
    assert [r["span_id"] for r in tokens.drop_wrappers(rows)] == ["b", "c", "a"]


def test_scatter_figure_colours_calls_by_image_tokens():
    points = [{"x": 300, "y": 2500.0, "image": True, "image_tokens": 258, "model": "<b>m</b>", "trace_id": "t1",
               "span_id": "s"},
              {"x": 200, "y": 800.0, "image": False, "image_tokens": 0, "model": "m", "trace_id": "t2",
               "span_id": "s"}]
    fig = figures.tokens_latency_scatter(points)
    by_name = {d.name: d for d in fig.data}
    assert set(by_name) == {"with image tokens", "no image tokens"}
    assert list(by_name["with image tokens"].x) == [300] and list(by_name["with image tokens"].y) == [2.5]
    assert list(by_name["no image tokens"].y) == [0.8]  # seconds: the slowest call is past 2 s
    assert by_name["with image tokens"].marker.color != by_name["no image tokens"].marker.color
    assert "&lt;b&gt;" in by_name["with image tokens"].text[0]  # span text is escaped
    assert fig.layout.xaxis.title.text == "input tokens" and "(s)" in fig.layout.yaxis.title.text
    empty = figures.tokens_latency_scatter([])
    assert not empty.data and "No model calls" in empty.layout.annotations[0].text


# -- stored traffic ----------------------------------------------------------------------
def rec(tid: str, sid: str, parent: str | None, service: str, name: str, kind: int, start_ms: float,
        end_ms: float, **attrs) -> SpanRecord:
    return SpanRecord(tid, sid, parent, service, name, kind, BASE + int(start_ms * MS), BASE + int(end_ms * MS),
                      attributes=attrs)


def chat(tid: str, at: float, dur: float, text: int, image: int, out: int) -> list[SpanRecord]:
    """A gateway's OTel GenAI chat call to a self-hosted model (an instrumented server)."""
    usage = {"gen_ai.usage.input_tokens": text + image, "gen_ai.usage.text.input_tokens": text,
             "gen_ai.usage.output_tokens": out}
    if image:
        usage["gen_ai.usage.image.input_tokens"] = image
    return [rec(tid, "c" * 16, "a" * 16, "gateway", "chat mm-llm-7b", KIND_CLIENT, at + 5, at + 5 + dur,
                **{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
                   "gen_ai.request.model": "mm-llm-7b", **usage}),
            rec(tid, "d" * 16, "c" * 16, "llm", "POST /v1/chat/completions", KIND_SERVER, at + 6, at + 4 + dur)]


def root(tid: str, at: float, **attrs) -> SpanRecord:
    return rec(tid, "a" * 16, None, "gateway", "POST /v1/chat", KIND_SERVER, at, at + 3000, **attrs)


def traffic() -> list[SpanRecord]:
    """Traces two minutes apart: text (three chats, one Gemini call, one with no model
    call), image (two chats with one image), multi_image (four images, the chat wrapped by
    an OpenInference span of the same call), audio (OpenInference calls reporting totals
    only) and unknown (nothing said)."""
    spans: list[SpanRecord] = []
    at = 0.0

    def tid() -> str:
        return f"{len(spans) + 1:032x}"

    for _ in range(3):
        t = tid()
        spans += [root(t, at), *chat(t, at, 400, 200, 0, 40)]
        at += 2 * MIN / MS
    t = tid()
    spans += [root(t, at), rec(t, "g" * 16, "a" * 16, "gateway", "generate_content gemini-2.0-flash", KIND_CLIENT,
                               at + 5, at + 305, **{"gen_ai.operation.name": "generate_content",
                                                    "gen_ai.provider.name": "gemini",
                                                    "gen_ai.request.model": "gemini-2.0-flash",
                                                    "gen_ai.usage.input_tokens": 200,
                                                    "gen_ai.usage.text.input_tokens": 200,
                                                    "gen_ai.usage.output_tokens": 80})]
    at += 2 * MIN / MS
    t = tid()
    spans.append(root(t, at, **{"mm.prompt_chars": 800}))  # text, but no model call
    at += 2 * MIN / MS
    for _ in range(2):
        t = tid()
        spans += [root(t, at), *chat(t, at, 1500, 20, 258, 30)]
        at += 2 * MIN / MS
    t = tid()
    inner = chat(t, at, 2600, 40, 1032, 50)
    inner[0].parent_span_id = "b" * 16
    spans += [root(t, at, **{"mm.image_count": 4}),
              rec(t, "b" * 16, "a" * 16, "gateway", "ChatCompletion", KIND_INTERNAL, at + 2, at + 2700,
                  **{"openinference.span.kind": "LLM", "llm.provider": "vllm", "llm.model_name": "mm-llm-7b",
                     "llm.token_count.prompt": 1072, "llm.token_count.prompt_details.image": 1032,
                     "llm.token_count.completion": 50}), *inner]
    at += 2 * MIN / MS
    for _ in range(2):
        t = tid()
        spans += [root(t, at, **{"mm.audio_count": 1}),
                  rec(t, "e" * 16, "a" * 16, "gateway", "ChatCompletion", KIND_INTERNAL, at + 5, at + 905,
                      **{"openinference.span.kind": "LLM", "llm.provider": "openai", "llm.model_name": "gpt-4o",
                         "llm.token_count.prompt": 100, "llm.token_count.completion": 10})]
        at += 2 * MIN / MS
    spans.append(root(tid(), at))  # unknown
    load_rules(None).tag(spans)
    return spans


@pytest.fixture
def stored(engine, db_url, small_templates):
    settled_copy(small_templates, engine, db_url, "tokens", traffic())
    app = create_app(Settings(database_url=db_url))
    yield app, StoreReader(engine)
    app.extensions["modalscope"]["engine"].dispose()


def test_input_types_carry_tokens_per_request(stored):
    app, reader = stored
    rows = {r["input_type"]: r for r in input_types(reader, WINDOW)}
    assert {it: r["count"] for it, r in rows.items()} == {"text": 5, "image": 2, "multi_image": 1, "audio": 2,
                                                          "unknown": 1}
    # Over every request of the type: (3 x 200 + 200) / 5 text tokens, (3 x 40 + 80) / 5 out.
    assert rows["text"]["tokens"] == {"input": {"text": 160.0}, "output": 40.0}
    assert rows["image"]["tokens"] == {"input": {"text": 20.0, "image": 258.0}, "output": 30.0}
    # Two instrumentations of one call count once (the inner GenAI span's usage).
    assert rows["multi_image"]["tokens"] == {"input": {"text": 40.0, "image": 1032.0}, "output": 50.0}
    assert rows["audio"]["tokens"] == {"input": {"total": 100.0}, "output": 10.0}  # only totals reported
    assert rows["unknown"]["tokens"] is None
    only = input_types(reader, WINDOW, Filters(input_type="image"))
    assert [(r["input_type"], r["tokens"]) for r in only] == [("image", rows["image"]["tokens"])]

    client = app.test_client()
    got = client.get("/api/v1/input-types", query_string={"start": WINDOW.start_ns / 1e9,
                                                           "end": WINDOW.end_ns / 1e9})
    assert got.status_code == 200
    assert {r["input_type"]: r["tokens"] for r in got.get_json()} == {it: r["tokens"] for it, r in rows.items()}
    later = client.get("/api/v1/input-types", query_string={"start": WINDOW.end_ns / 1e9,
                                                            "end": WINDOW.end_ns / 1e9 + 600})
    assert later.get_json() == []


def _table_rows(table) -> list[list[str]]:
    head, body = table.children
    rows = [[th.children for th in head.children.children]]
    for tr in body.children:  # (a one-word cell wraps its text in a no-break span)
        rows.append([getattr(td.children, "children", td.children) for td in tr.children])
    return rows


def test_overview_tokens_table_per_input_type_and_model(stored):
    app, reader = stored
    from modalscope.app.pages import overview

    state = {"start": str(WINDOW.start_ns / 1e9), "end": str(WINDOW.end_ns / 1e9)}
    with app.test_request_context():
        table = overview._tokens(state)
        empty = overview._tokens({"start": str(WINDOW.end_ns / 1e9), "end": str(WINDOW.end_ns / 1e9 + 600)})
    assert _table_rows(table) == [
        ["input type", "model", "calls", "text in", "image in", "input (total)", "output"],
        ["text", "gemini-2.0-flash", "1", "200", "—", "—", "80"],
        ["text", "mm-llm-7b", "3", "200", "—", "—", "40"],
        ["image", "mm-llm-7b", "2", "20", "258", "—", "30"],
        ["multi_image", "mm-llm-7b", "1", "40", "1,032", "—", "50"],
        ["audio", "gpt-4o", "2", "—", "—", "100", "10"],
    ]
    assert table.id == tokens.OV_TOKENS_TABLE
    assert "No token usage" in json.dumps(empty.to_plotly_json(), default=str)


def test_sampled_model_calls_of_the_selection(stored):
    app, reader = stored
    rows = tokens.sample_model_calls(reader, WINDOW)
    # One a counted call: the OpenInference span wrapping the multi-image chat is left out.
    assert sorted(r["name"] for r in rows) == ["ChatCompletion"] * 2 + ["chat mm-llm-7b"] * 6 + [
        "generate_content gemini-2.0-flash"]
    assert all(WINDOW.start_ns <= r["start_ns"] < WINDOW.end_ns for r in rows)

    def names(**kw) -> list[str]:
        model = kw.pop("model", None)
        return sorted({r["name"] for r in tokens.sample_model_calls(reader, WINDOW, Filters(**kw), model=model)})

    assert len(tokens.sample_model_calls(reader, WINDOW, Filters(input_type="image"))) == 2
    assert len(tokens.sample_model_calls(reader, WINDOW, Filters(caller="gateway", callee="llm"))) == 6
    assert names(callee="gemini") == ["generate_content gemini-2.0-flash"]  # the pair's callee: the provider
    assert names(callee="openai") == ["ChatCompletion"]  # no pair_calls row: the provider
    assert names(service="llm") == ["chat mm-llm-7b"]  # calls into the service count for it
    assert names(model="gemini-2.0-flash") == ["generate_content gemini-2.0-flash"]
    assert names(caller="billing") == [] and names(stage="network") == []
    # Bounded, and spread over the window: a quota a slice.
    calls = Window(BASE - 2 * MIN, BASE + 19 * MIN)  # the model calls start in each third
    few = tokens.sample_model_calls(reader, calls, limit=3, slices=3)
    thirds = {(r["start_ns"] - calls.start_ns) * 3 // (calls.end_ns - calls.start_ns) for r in few}
    assert len(few) == 3 and thirds == {0, 1, 2}
    assert tokens.sample_model_calls(reader, Window(WINDOW.end_ns, WINDOW.end_ns + MIN)) == []

    points = tokens.scatter_points(rows)
    assert sorted((p["x"], p["image"]) for p in points) == sorted(
        [(200, False)] * 4 + [(278, True)] * 2 + [(1072, True)] + [(100, False)] * 2)


def test_a_selection_without_settled_model_calls_reads_only_unsettled_traces(stored, engine):
    """The rollups rule out settled calls of a service or pair that never calls a model;
    a call of a trace not yet settled is still found, and found the same once settled."""
    app, reader = stored
    assert tokens.no_settled_model_calls(reader, WINDOW, Filters(caller="billing"))
    assert tokens.no_settled_model_calls(reader, WINDOW, Filters(caller="gateway", callee="userdb"))
    assert not tokens.no_settled_model_calls(reader, WINDOW, Filters(caller="gateway", callee="llm"))
    assert not tokens.no_settled_model_calls(reader, WINDOW, Filters(caller="gateway", callee="gemini"))
    assert not tokens.no_settled_model_calls(reader, WINDOW, Filters(service="llm"))  # called, with a model
    assert not tokens.no_settled_model_calls(reader, WINDOW, Filters(callee="llm"))  # no service or caller: walked
    late = "f" * 32
    spans = [root(late, 30 * MIN / MS)]
    spans += [rec(late, "9" * 16, "a" * 16, "billing", "generate_content gemini-2.0-flash", KIND_CLIENT,
                  30 * MIN / MS + 5, 30 * MIN / MS + 205,
                  **{"gen_ai.operation.name": "generate_content", "gen_ai.provider.name": "gemini",
                     "gen_ai.request.model": "gemini-2.0-flash", "gen_ai.usage.input_tokens": 90,
                     "gen_ai.usage.output_tokens": 9})]
    load_rules(None).tag(spans)
    write_spans(engine, spans)  # not settled yet
    window = Window(WINDOW.start_ns, BASE + 40 * MIN)
    assert tokens.no_settled_model_calls(reader, window, Filters(caller="billing"))
    found = tokens.sample_model_calls(reader, window, Filters(caller="billing"))
    assert [(r["service"], r["trace_id"]) for r in found] == [("billing", late)]
    settle(engine, force=True)
    assert not tokens.no_settled_model_calls(reader, window, Filters(caller="billing"))
    assert tokens.sample_model_calls(reader, window, Filters(caller="billing")) == found


def test_drilldown_draws_latency_against_input_tokens(stored):
    app, reader = stored
    from modalscope.app.pages import drilldown

    state = {"start": str(WINDOW.start_ns / 1e9), "end": str(WINDOW.end_ns / 1e9), "input_type": "image"}
    with app.test_request_context():
        fig = drilldown._tokens(state)
        panel = json.dumps(drilldown.tokens_panel().to_plotly_json(), default=str)
    (trace,) = fig.data
    assert trace.name == "with image tokens" and list(trace.x) == [278, 278]
    assert sorted(trace.y) == [1500.0, 1500.0]  # ms
    assert tokens.IMAGE_NOTE in panel and tokens.DD_TOKENS in panel


def test_token_callbacks_answer_as_the_browser_calls_them(db_url):
    """The overview's table and the drilldown's scatter through Dash's callback route, on an
    empty store: each says there is nothing, no error."""
    app = create_app(Settings(database_url=db_url))
    client = app.test_client()
    client.get("/")
    try:
        for store, out in (("overview-state", f"{tokens.OV_TOKENS}.children"),
                           ("drilldown-state", f"{tokens.DD_TOKENS}.figure")):
            body = {"output": out, "outputs": {"id": out.split(".")[0], "property": out.split(".")[1]},
                    "inputs": [{"id": store, "property": "data", "value": {"range": "1h"}}],
                    "changedPropIds": [f"{store}.data"], "state": []}
            r = client.post("/_dash-update-component", json=body)
            assert r.status_code == 200, (store, r.get_data(as_text=True)[:500])
            assert "No token usage" in r.get_data(as_text=True) or "No model calls" in r.get_data(as_text=True)
    finally:
        app.extensions["modalscope"]["engine"].dispose()
