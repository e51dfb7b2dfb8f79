"""Whole-trace facts: input type, root, duration, self times, service pairs, critical path."""

from __future__ import annotations

from collections import defaultdict

import pytest

from modalscope.core.spans import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_PRODUCER,
    KIND_SERVER,
    STATUS_ERROR,
    STATUS_OK,
    SpanRecord,
)
from modalscope.ingest.rules_file import load_rules
from modalscope.ingest.traces import (
    critical_path,
    critical_path_segments,
    find_root,
    input_type_of,
    self_times,
    service_pairs,
    trace_duration_ns,
    trace_error,
)

MS = 1_000_000


def sp(
    span_id: str,
    parent: str | None,
    start_ms: float,
    end_ms: float,
    *,
    service: str = "gateway",
    name: str = "op",
    kind: int = KIND_INTERNAL,
    status: int = STATUS_OK,
    **attributes,
) -> SpanRecord:
    return SpanRecord(
        trace_id="0" * 31 + "1",
        span_id=span_id,
        parent_span_id=parent,
        service=service,
        name=name,
        kind=kind,
        start_ns=int(start_ms * MS),
        end_ns=int(end_ms * MS),
        status=status,
        attributes=attributes,
    )


def root(**attributes) -> SpanRecord:
    return sp("r", None, 0, 100, kind=KIND_SERVER, **attributes)


# -- input type -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attributes, expected",
    [
        ({"mm.image_count": 0}, "text"),
        ({"mm.image_count": 1}, "image"),
        ({"mm.image_count": 2}, "multi_image"),
        ({"mm.image_count": 5, "mm.audio_count": 0}, "multi_image"),
        ({"mm.audio_count": 1}, "audio"),
        ({"mm.audio_count": 1, "mm.image_count": 2}, "audio"),
        ({"mm.video_count": 1, "mm.audio_count": 1}, "video"),
        ({"mm.image_count": 0, "mm.audio_count": 0}, "text"),
        ({"mm.audio_count": 0}, "text"),
        ({"mm.image_count": "2"}, "multi_image"),  # numbers may arrive as strings
        ({"mm.image_count": "1"}, "image"),
        ({"mm.audio_count": "3"}, "audio"),
        ({"mm.image_count": 1.0}, "image"),
        ({"mm.prompt_chars": 812}, "text"),
        ({"gen_ai.operation.name": "chat", "gen_ai.request.model": "llava"}, "text"),  # a model call
        ({"http.route": "/v1/chat"}, "unknown"),
        ({}, "unknown"),
        ({"mm.image_count": "many"}, "unknown"),  # junk counts are ignored
        ({"mm.image_count": "many", "mm.prompt_chars": 3}, "text"),
    ],
)
def test_input_type_from_one_span(attributes, expected):
    """Spans stored without signals have them read from their attributes; on the root or on
    any other span alike."""
    assert input_type_of([root(**attributes), sp("a", "r", 10, 20)]) == expected
    assert input_type_of([root(), sp("a", "r", 10, 20, **attributes)]) == expected


def test_counts_take_the_largest_per_medium_over_the_spans():
    spans = [root(**{"mm.image_count": 1}), sp("a", "r", 10, 20, **{"mm.image_count": 3})]
    assert input_type_of(spans) == "multi_image"
    spans = [root(**{"mm.image_count": 2}), sp("a", "r", 10, 20, **{"mm.audio_count": 1})]
    assert input_type_of(spans) == "audio"


def test_stored_signals_are_used_and_attributes_only_without_them():
    """The tagger's signals (read from whole attribute values) win; a span without any has
    them read from its attributes, as stored before the column existed."""
    r = root(**{"mm.image_count": 1})
    r.signals = {"mm": {"image": 2.0}}
    assert input_type_of([r]) == "multi_image"
    call = sp("a", "r", 10, 20, kind=KIND_CLIENT)
    call.signals = {"call": 1, "text": 1, "usage": ["video"]}
    assert input_type_of([root(), call]) == "video"
    assert input_type_of([root(**{"mm.prompt_chars": 3}), sp("b", "r", 1, 2)]) == "text"


def test_explicit_input_type_on_any_span_wins():
    spans = [root(**{"mm.image_count": 0}), sp("a", "r", 10, 20, **{"mm.input_type": "audio"})]
    assert input_type_of(spans) == "audio"
    # ... the root's before the others', then the earliest
    spans = [sp("b", "r", 5, 20, **{"mm.input_type": "image"}), root(**{"mm.input_type": "video"}),
             sp("a", "r", 1, 20, **{"mm.input_type": "audio"})]
    assert input_type_of(spans) == "video"
    assert input_type_of(spans[:1] + spans[2:]) == "audio"
    # ... even without a root
    assert input_type_of([sp("a", "gone", 10, 20, **{"mm.input_type": "image"})]) == "image"


def test_bad_explicit_input_type_is_ignored():
    spans = [root(**{"mm.image_count": 2}), sp("a", "r", 10, 20, **{"mm.input_type": "bogus"})]
    assert input_type_of(spans) == "multi_image"
    spans = [root(**{"mm.image_count": 2}), sp("a", "r", 10, 20, **{"mm.input_type": "video"})]
    assert input_type_of(spans) == "video"  # a type of its own now


def test_input_type_without_root_comes_from_any_span():
    assert input_type_of([sp("a", "missing", 0, 10, **{"mm.image_count": 1})]) == "image"
    assert input_type_of([sp("a", "missing", 0, 10)]) == "unknown"
    assert input_type_of([]) == "unknown"


# -- root, duration, error ----------------------------------------------------------------


def test_find_root_and_duration():
    spans = [sp("a", "r", 5, 150), sp("r", None, 0, 100), sp("r2", None, 10, 20)]
    assert find_root(spans).span_id == "r"  # the earliest of two parentless spans
    assert trace_duration_ns(spans) == 100 * MS  # the root's, although a child runs past it


def test_duration_without_root_is_first_start_to_last_end():
    spans = [sp("a", "gone", 20, 50), sp("b", "a", 30, 80), sp("c", "gone", 25, 25)]
    assert find_root(spans) is None
    assert trace_duration_ns(spans) == 60 * MS
    assert trace_duration_ns([]) == 0


def test_trace_error():
    assert not trace_error([root(), sp("a", "r", 1, 2)])
    assert trace_error([root(), sp("a", "r", 1, 2, status=STATUS_ERROR)])


def test_duplicate_span_ids_keep_the_first():
    spans = [root(), sp("a", "r", 10, 20), sp("a", "r", 0, 100, status=STATUS_ERROR)]
    assert self_times(spans) == {"r": 90 * MS, "a": 10 * MS}
    assert not trace_error(spans)


# -- self time ----------------------------------------------------------------------------


def test_self_time_subtracts_the_union_of_overlapping_children():
    spans = [
        sp("r", None, 0, 100),
        sp("a", "r", 10, 50),
        sp("b", "r", 30, 70),  # overlaps a: union is 10..70, not 40 + 40
        sp("c", "r", 80, 90),
        sp("a1", "a", 20, 30),
    ]
    st = self_times(spans)
    assert st["r"] == (100 - 60 - 10) * MS
    assert st["a"] == 30 * MS
    assert st["b"] == 40 * MS
    assert st["c"] == 10 * MS
    assert st["a1"] == 10 * MS


def test_children_beyond_their_parent_are_clipped():
    spans = [
        sp("r", None, 0, 100),
        sp("a", "r", 90, 130),  # runs 30 ms past the root
        sp("b", "r", -20, 10),  # started 20 ms before it
    ]
    st = self_times(spans)
    assert st["r"] == 80 * MS
    assert st["a"] == 40 * MS and st["b"] == 30 * MS


def test_self_time_with_zero_durations_orphans_and_reversed_times():
    spans = [
        sp("r", None, 0, 0),
        sp("z", "r", 0, 0),
        sp("o", "missing", 5, 15),
        sp("bad", "o", 12, 8),  # end before start: zero length
        sp("self", "self", 0, 10),  # its own parent: not its own child
    ]
    assert self_times(spans) == {"r": 0, "z": 0, "o": 10 * MS, "bad": 0, "self": 10 * MS}


def gateway_trace() -> list[SpanRecord]:
    """gateway -> preprocess -> vision encoder -> fusion -> llm, as one request runs it."""
    return [
        sp("g0", None, 0, 1000, kind=KIND_SERVER, name="POST /v1/chat", **{"mm.image_count": 1}),
        sp("g1", "g0", 10, 200, kind=KIND_CLIENT, name="preprocess", **{"peer.service": "preprocess"}),
        sp("p0", "g1", 15, 195, kind=KIND_SERVER, service="preprocess", name="handle"),
        sp("p1", "p0", 20, 150, service="preprocess", name="image.decode"),
        sp("p2", "p0", 150, 190, service="preprocess", name="image.resize"),
        sp("g2", "g0", 200, 500, kind=KIND_CLIENT, name="encode", **{"server.address": "vision-encoder"}),
        sp("v0", "g2", 205, 495, kind=KIND_SERVER, service="vision-encoder", name="Encode"),
        sp("v1", "v0", 210, 480, service="vision-encoder", name="VisionEncoder/ViT"),
        sp("v2", "v1", 220, 300, service="vision-encoder", name="ViTLayer", **{"mm.layer": "attention"}),
        sp("v3", "v1", 300, 470, service="vision-encoder", name="ViTLayer", **{"mm.layer": "mlp"}),
        sp("g3", "g0", 500, 560, kind=KIND_CLIENT, name="fuse"),
        sp("f0", "g3", 505, 555, kind=KIND_SERVER, service="fusion", name="fusion.cross_attn"),
        sp("g4", "g0", 560, 990, kind=KIND_CLIENT, name="generate"),
        sp("l0", "g4", 565, 985, kind=KIND_SERVER, service="llm", name="chat", **{"gen_ai.system": "vllm"}),
        sp("l1", "l0", 570, 700, service="llm", name="llm.prefill"),
        sp("l2", "l0", 700, 980, service="llm", name="llm.decode_step"),
    ]


def stage_totals(spans, times) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for s in spans:
        totals[s.stage] += times[s.span_id]
    return dict(totals)


def test_stage_self_times_add_up_to_the_trace_duration():
    spans = gateway_trace()
    load_rules(None).tag(spans)
    st = self_times(spans)
    totals = stage_totals(spans, st)
    assert sum(totals.values()) == trace_duration_ns(spans) == 1000 * MS
    # A CLIENT span whose name says a stage counts there (name patterns come before the
    # span-kind rule): only "fuse" is network time.
    assert totals == {
        "other": 20 * MS,  # the gateway handler's own time
        "network": 10 * MS,  # the fuse CLIENT span around its SERVER span
        "preprocessing": (10 + 10 + 130 + 40) * MS,  # preprocess, "handle" by service name, decode, resize
        "encoder": (10 + 20 + 20 + 80 + 170) * MS,
        "fusion": 50 * MS,
        "inference": (10 + 10 + 130 + 280) * MS,
    }
    assert input_type_of(spans) == "image"


# -- service pairs ------------------------------------------------------------------------


def test_pairs_via_child_server_span():
    spans = gateway_trace()
    pairs = service_pairs(spans)
    assert pairs["g1"] == ("gateway", "preprocess")
    assert pairs["g2"] == ("gateway", "vision-encoder")  # child beats server.address
    assert pairs["g3"] == ("gateway", "fusion")
    assert pairs["g4"] == ("gateway", "llm")
    assert set(pairs) == {"g1", "g2", "g3", "g4"}  # only CLIENT spans


def test_pairs_without_an_instrumented_callee():
    spans = [
        root(),
        sp("a", "r", 1, 2, kind=KIND_CLIENT, **{"peer.service": "billing"}),
        sp("b", "r", 1, 2, kind=KIND_CLIENT, **{"server.address": "userdb.internal"}),
        sp("c", "r", 1, 2, kind=KIND_CLIENT, **{"peer.service": "userdb", "server.address": "10.0.0.7"}),
        sp("d", "r", 1, 2, kind=KIND_CLIENT),  # nothing names the callee: no pair
        sp("e", "r", 1, 2, kind=KIND_PRODUCER, **{"peer.service": "queue"}),  # not a call
        sp("f", "r", 1, 2, kind=KIND_CLIENT, **{"peer.service": ""}),
    ]
    assert service_pairs(spans) == {
        "a": ("gateway", "billing"),
        "b": ("gateway", "userdb.internal"),
        "c": ("gateway", "userdb"),  # peer.service beats server.address
    }


def test_pairs_same_service_and_consumer_children():
    spans = [
        root(),
        # a child SERVER span in the same service: used only when nothing else names the callee
        sp("a", "r", 1, 9, kind=KIND_CLIENT),
        sp("a1", "a", 2, 8, kind=KIND_SERVER),
        sp("b", "r", 1, 9, kind=KIND_CLIENT, **{"peer.service": "cache"}),
        sp("b1", "b", 2, 8, kind=KIND_SERVER),
        # a CONSUMER child in another service counts as the callee
        sp("c", "r", 1, 9, kind=KIND_CLIENT),
        sp("c1", "c", 2, 8, kind=KIND_CONSUMER, service="worker"),
        # an INTERNAL child does not
        sp("d", "r", 1, 9, kind=KIND_CLIENT),
        sp("d1", "d", 2, 8, kind=KIND_INTERNAL, service="other"),
    ]
    assert service_pairs(spans) == {
        "a": ("gateway", "gateway"),
        "b": ("gateway", "cache"),
        "c": ("gateway", "worker"),
    }


# -- critical path ------------------------------------------------------------------------


def test_critical_path_follows_the_last_finishing_child():
    spans = [
        sp("r", None, 0, 100),
        sp("vision", "r", 10, 60),  # the slower encoder: fusion waits for it
        sp("text", "r", 10, 30),
        sp("fusion", "r", 60, 70),
        sp("llm", "r", 70, 95),
        sp("llm1", "llm", 72, 90),
    ]
    assert critical_path(spans) == ["r", "vision", "fusion", "llm", "llm1"]
    segments = critical_path_segments(spans)
    assert sum(end - start for _, start, end in segments) == 100 * MS
    assert [s for s, _, _ in segments] == ["r", "vision", "fusion", "llm", "llm1", "llm", "r"]


def test_critical_path_clips_children_and_handles_no_root():
    spans = [sp("r", None, 0, 100), sp("a", "r", 50, 150), sp("b", "r", 0, 40)]
    assert critical_path(spans) == ["r", "b", "a"]
    assert sum(e - s for _, s, e in critical_path_segments(spans)) == 100 * MS
    assert critical_path([sp("a", "gone", 0, 10)]) == []
    assert critical_path_segments([]) == []


def test_critical_path_segments_tile_the_realistic_trace():
    spans = gateway_trace()
    segments = critical_path_segments(spans)
    assert segments[0][1] == 0 and segments[-1][2] == 1000 * MS
    assert all(a[2] == b[1] for a, b in zip(segments, segments[1:]))  # no gaps, no overlap
    assert "l2" in critical_path(spans)


# -- critical path under clock skew and overlapping hand-offs ----------------------------


def tiles(spans, total_ms: float = 100) -> list[tuple[str, int, int]]:
    """The segments, checked to tile the root exactly (no gap, no overlap)."""
    segments = critical_path_segments(spans)
    assert segments[0][1] == 0 and segments[-1][2] == int(total_ms * MS)
    assert all(a[2] == b[1] for a, b in zip(segments, segments[1:]))
    assert sum(e - s for _, s, e in segments) == int(total_ms * MS)
    return segments


def test_a_child_ending_3ms_after_the_next_step_starts_is_still_waited_for():
    spans = [
        sp("r", None, 0, 100),
        sp("enc", "r", 10, 60),
        sp("enc1", "enc", 11, 59.5),  # the callee's span, past the resume point too
        sp("fusion", "r", 57, 90),  # its host's clock runs 3 ms early
    ]
    assert critical_path(spans) == ["r", "enc", "enc1", "fusion"]
    segments = tiles(spans)
    # The overlap stays with the step after it: enc is cut at fusion's start.
    assert segments == [("r", 0, 10 * MS), ("enc", 10 * MS, 11 * MS), ("enc1", 11 * MS, 57 * MS),
                        ("fusion", 57 * MS, 90 * MS), ("r", 90 * MS, 100 * MS)]


def test_a_child_ending_well_before_the_next_step_keeps_the_usual_path():
    spans = [sp("r", None, 0, 100), sp("enc", "r", 10, 40), sp("fusion", "r", 57, 90)]
    assert critical_path(spans) == ["r", "enc", "fusion"]
    assert tiles(spans) == [("r", 0, 10 * MS), ("enc", 10 * MS, 40 * MS), ("r", 40 * MS, 57 * MS),
                            ("fusion", 57 * MS, 90 * MS), ("r", 90 * MS, 100 * MS)]


@pytest.mark.parametrize("fusion_start", [57, 49])  # clock skew; fusion launched as text returns
def test_parallel_encoders_the_slower_one_is_critical(fusion_start):
    spans = [
        sp("r", None, 0, 100),
        sp("vision", "r", 10, 60),
        sp("text", "r", 10, 48),
        sp("fusion", "r", fusion_start, 80),
    ]
    path = critical_path(spans)
    assert path == ["r", "vision", "fusion"] and "text" not in path
    segments = tiles(spans)
    assert ("vision", 10 * MS, fusion_start * MS) in segments
    # Launched before text returned, the faster encoder stays off the path too.
    spans[2] = sp("text", "r", 12, 48)
    assert "text" not in critical_path(spans)


def test_a_sibling_running_alongside_is_not_taken_for_the_one_waited_for():
    # text started first and ran mostly beside vision: vision did not wait for it.
    spans = [sp("r", None, 0, 100), sp("text", "r", 5, 30), sp("vision", "r", 10, 60)]
    assert critical_path(spans) == ["r", "vision"]
    assert tiles(spans) == [("r", 0, 10 * MS), ("vision", 10 * MS, 60 * MS), ("r", 60 * MS, 100 * MS)]


@pytest.mark.parametrize("child", [
    (10, 60),  # ends 40 ms into a 50 ms step: most of the step ran beside it
    (45, 61),  # 9 ms of its 16 ms beside the step
])
def test_an_overlap_far_past_the_tolerance_keeps_jaegers_rule(child):
    spans = [sp("r", None, 0, 100), sp("prep", "r", 2, 8), sp("c", "r", *child),
             sp("step", "r", 20 if child[0] < 20 else 52, 70)]
    path = critical_path(spans)
    assert "c" not in path and "step" in path
    tiles(spans)


def test_skewed_stage_segments_still_add_up_to_the_trace_duration():
    spans = gateway_trace()
    # The fusion host's clock runs 4 ms early, the llm host's 2 ms early.
    spans = [sp("g3", "g0", 496, 560, kind=KIND_CLIENT, name="fuse") if s.span_id == "g3" else
             sp("g4", "g0", 558, 990, kind=KIND_CLIENT, name="generate") if s.span_id == "g4" else s
             for s in spans]
    load_rules(None).tag(spans)
    path = critical_path(spans)
    assert {"g2", "v0", "v1", "v3", "g3", "f0", "g4", "l0", "l2"} <= set(path)
    segments = tiles(spans, 1000)
    stage = {s.span_id: s.stage for s in spans}
    totals: dict[str, int] = defaultdict(int)
    for sid, s, e in segments:
        totals[stage[sid]] += e - s
    assert sum(totals.values()) == trace_duration_ns(spans)
    assert totals["encoder"] == (496 - 200) * MS  # the encoder call, cut where fusion starts


def test_demo_image_traces_keep_the_vision_encoder_on_the_critical_path(clean_store):
    from sqlalchemy import select

    from modalscope.models import Span, Trace

    with clean_store.engine.connect() as conn:
        image = select(Trace.trace_id).where(Trace.input_type == "image")
        rows = conn.execute(select(Span.trace_id, Span.span_id, Span.parent_span_id, Span.service, Span.name,
                                   Span.kind, Span.start_ns, Span.duration_ns)
                            .where(Span.trace_id.in_(image))).all()
    traces: dict[str, list[SpanRecord]] = defaultdict(list)
    for r in rows:
        traces[r.trace_id].append(SpanRecord(r.trace_id, r.span_id, r.parent_span_id, r.service, r.name, r.kind,
                                             r.start_ns, r.start_ns + r.duration_ns, 0))
    assert len(traces) > 100
    fused = overlapped = 0
    for spans in traces.values():
        path = set(critical_path(spans))
        call = [s for s in spans if s.service == "gateway" and s.kind == KIND_CLIENT and "Vision" in s.name]
        encode = [s for s in spans if call and s.parent_span_id == call[0].span_id]
        fusion = [s for s in spans if s.service == "gateway" and "Fusion" in s.name]
        assert len(call) == len(encode) == 1
        assert call[0].span_id in path and encode[0].span_id in path
        if fusion:  # none when the encoder failed and the request was cut
            fused += 1
            overlapped += fusion[0].start_ns < call[0].end_ns
        segments = critical_path_segments(spans)
        root = find_root(spans)
        assert sum(e - s for _, s, e in segments) == root.duration_ns
    # Fusion starts before the encoder returns in every trace that got that far.
    assert overlapped == fused > 0.9 * len(traces)
