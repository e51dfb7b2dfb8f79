"""Whole-trace facts: input type, root, duration, self times, service pairs, critical path."""

from __future__ import annotations

from collections import defaultdict

import pytest

from modalscope.ingest.records import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_PRODUCER,
    KIND_SERVER,
    STATUS_ERROR,
    STATUS_OK,
    SpanRecord,
)
from modalscope.ingest.stages import load_rules
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
