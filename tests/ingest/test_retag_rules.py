"""`retag` re-applies the rules through the tag path: stages and the signals they mark."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import select, update

from modalscope.ingest import retag as retag_module
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.ingest.retag import retag
from modalscope.ingest.rules_file import default_rules, parse_rules
from modalscope.ingest.writer import write_spans
from modalscope.models import Span

MS = 1_000_000
# What a user file in the older order gave: every CLIENT span network, before anything else.
KIND_FIRST = """
[[rule]]
stage = "network"
kinds = ["CLIENT", "PRODUCER"]
[[rule]]
stage = "inference"
names = ["generate"]
"""


def genai_trace(trace_id: str, t0: int) -> list[SpanRecord]:
    """agent: SERVER root -> GenAI CLIENT model call -> HTTP POST (no instrumented callee)."""
    def sp(span_id, parent, name, kind, start, end, **attributes):
        return SpanRecord(trace_id, span_id, parent, "agent", name, kind, t0 + start * MS, t0 + end * MS,
                          attributes=attributes, resource={"service.name": "agent"})

    return [
        sp("a" * 16, None, "POST /ask", KIND_SERVER, 0, 100, **{"http.request.method": "POST"}),
        sp("b" * 16, "a" * 16, "generate_content gemini-2.0-flash", KIND_CLIENT, 5, 95,
           **{"gen_ai.operation.name": "generate_content", "gen_ai.provider.name": "gcp.gemini",
              "gen_ai.request.model": "gemini-2.0-flash"}),
        sp("c" * 16, "b" * 16, "POST", KIND_CLIENT, 6, 94,
           **{"http.request.method": "POST", "url.full": "https://generativelanguage.googleapis.com/v1"}),
        sp("d" * 16, "a" * 16, "render", KIND_INTERNAL, 95, 99),
    ]


def stored(engine) -> dict[str, tuple[str, dict | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(Span.span_id, Span.stage, Span.signals)).all()
    return {sid: (stage, json.loads(sig) if sig else None) for sid, stage, sig in rows}


def test_retag_recomputes_stages_and_the_signals_rules_mark(engine):
    spans = genai_trace("1" * 32, time.time_ns() - 60_000 * MS)
    parse_rules(KIND_FIRST).tag(spans)
    assert [s.stage for s in spans] == ["other", "network", "network", "other"]
    write_spans(engine, spans)
    before = stored(engine)
    assert not (before["b" * 16][1] or {}).get("inh")

    changed, _ = retag(engine, default_rules())

    after = stored(engine)
    assert changed == 2  # the model call and the transport span under it
    call_stage, call_signals = after["b" * 16]
    assert call_stage == "inference" and call_signals["call"] == 1
    post_stage, post_signals = after["c" * 16]
    assert post_stage == "inference" and post_signals["inh"] == "network"
    assert after["a" * 16][0] == "other" and after["d" * 16][0] == "other"
    # retagging again with the same rules changes nothing
    assert retag(engine, default_rules())[0] == 0
    assert stored(engine) == after


def test_retag_drops_markers_rules_no_longer_give_and_keeps_ingest_signals(engine):
    spans = genai_trace("2" * 32, time.time_ns() - 60_000 * MS)
    default_rules().tag(spans)
    write_spans(engine, spans)
    # a signal read at ingest from attribute values the store no longer holds whole
    with engine.begin() as conn:
        conn.execute(update(Span).where(Span.span_id == "d" * 16)
                     .values(signals=json.dumps({"parts": {"image": 2}})))

    retag(engine, parse_rules(KIND_FIRST))

    after = stored(engine)
    assert after["c" * 16] == ("network", None)  # no transport rule: no "inh" left behind
    assert after["b" * 16][0] == "network"
    assert after["d" * 16] == ("other", {"parts": {"image": 2}})


@pytest.mark.parametrize("chunk", [1, 3])
def test_retag_in_small_chunks_tags_every_span(engine, monkeypatch, chunk):
    t0 = time.time_ns() - 60_000 * MS
    spans = genai_trace("3" * 32, t0) + genai_trace("4" * 32, t0 + 200 * MS)
    parse_rules(KIND_FIRST).tag(spans)
    write_spans(engine, spans)
    monkeypatch.setattr(retag_module, "CHUNK", chunk)
    seen: list[int] = []
    retag(engine, default_rules(), progress=seen.append)
    assert max(seen) <= chunk and sum(seen) == len(spans)
    with engine.connect() as conn:
        rows = conn.execute(select(Span.trace_id, Span.span_id, Span.stage, Span.signals)).all()
    by_id = {(t, s): (stage, json.loads(sig) if sig else {}) for t, s, stage, sig in rows}
    for trace_id in ("3" * 32, "4" * 32):
        assert by_id[(trace_id, "b" * 16)][0] == "inference"
        assert by_id[(trace_id, "b" * 16)][1]["call"] == 1
        # the parent may be in another chunk: the marker is there for the settler either way
        assert by_id[(trace_id, "c" * 16)][1]["inh"] == "network"
