"""A stage's slowest spans over a long window: the walk bounded by the rollups (each
service's top, a floor under the wanted rows) gives what a full sort of the window gives,
with ragged window edges, spans of traces still pending and late spans."""

from __future__ import annotations

import dataclasses
import random
import time

from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models import Span
from modalscope.models.reader import SPAN_WALK_SHARE, SpanQuery, StoreReader
from modalscope.models.reader import walks
from tests.factories import multimodal_trace

SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


def _slowed(trace, factor: float, service: str | None = None):
    return [dataclasses.replace(s, end_ns=s.start_ns + int((s.end_ns - s.start_ns) * factor))
            if service in (None, s.service) else s for s in trace]


def _store(engine):
    """Six hours of settled traces, a window with ragged edges, and around its edges and
    after settling: very slow traces just outside it (in its edge minutes), just inside it,
    pending inside it, and a late span of a settled trace."""
    rng = random.Random(5)
    base = (time.time_ns() // MINUTE - 6 * 60) * MINUTE
    w0, w1 = base + HOUR + 17 * SECOND, base + 6 * HOUR - 23 * SECOND
    settled = [multimodal_trace(rng, base + i * 6 * HOUR // 120, images=1 + i % 3) for i in range(120)]
    # More very slow traces outside the window, in its edge minutes, than a page holds.
    settled += [_slowed(multimodal_trace(rng, w0 - (9 + i) * SECOND, images=3), 40) for i in range(8)]
    settled += [_slowed(multimodal_trace(rng, w1 + (1 + i) * SECOND, images=2), 50) for i in range(8)]
    settled.append(_slowed(multimodal_trace(rng, w0 + 9 * SECOND, images=3), 30))  # inside, edge minute
    write_spans(engine, [s for t in settled for s in t])
    settle(engine, force=True)
    # The vision encoder's slowest spans are pending ones; the gateway's are settled.
    pending = [_slowed(multimodal_trace(rng, w0 + HOUR + i * MINUTE, images=2), 200 + 20 * i, "vision-encoder")
               for i in range(3)]
    late = dataclasses.replace(settled[7][-1], span_id="00000000000000ff", name="late.step",
                               end_ns=settled[7][-1].start_ns + 90 * SECOND)
    write_spans(engine, [s for t in pending for s in t] + [late])
    return w0, w1


def _keys(rows):
    return [(r["trace_id"], r["span_id"], r["duration_ns"], r["start_ns"]) for r in rows]


def test_a_stages_slowest_spans_walked_within_rollup_bounds_equal_the_sorted_window(engine):
    w0, w1 = _store(engine)
    reader = StoreReader(engine)
    assert walks.long_window(reader.context, Span, w0, w1, SPAN_WALK_SHARE)
    with engine.connect() as conn:
        stored = conn.execute(Span.__table__.select().where(Span.start_ns >= w0, Span.start_ns < w1)).mappings().all()
    services = tuple(sorted({r["service"] for r in stored}))
    stages = sorted({r["stage"] or "other" for r in stored})
    assert len(stages) >= 3
    floors = 0
    for stage in stages:
        for input_type, band in ((None, (None, None)), (None, (40_000_000, None)), ("image", (None, None)),
                                 (None, (None, 2_000_000_000))):
            for limit in (5, 40):
                q = SpanQuery(w0, w1, stage=stage, input_type=input_type, min_ns=band[0], max_ns=band[1],
                              limit=limit, services=services)
                bounds = reader.spans._stage_bounds(q, list(services))
                assert bounds is not None  # (three traces pending: the rollups bound the walk)
                floors += bounds[1] > 0
                for offset in (0, limit):
                    paged = dataclasses.replace(q, offset=offset)
                    assert _keys(reader.spans.slowest(paged)) == _keys(reader.spans._slowest_in_window(paged)), \
                        (stage, input_type, band, limit, offset)
    assert floors > 0  # some walks stopped at a floor the rollups gave


def test_too_many_pending_traces_walk_from_the_top(engine, monkeypatch):
    from modalscope.models.reader import spans as spans_module

    w0, w1 = _store(engine)
    reader = StoreReader(engine)
    monkeypatch.setattr(spans_module, "STAGE_CEILING_PENDING_AT_MOST", 2)
    q = SpanQuery(w0, w1, stage="encoder", limit=10, services=("gateway", "vision-encoder"))
    assert reader.spans._stage_bounds(q, list(q.services)) is None
    assert _keys(reader.spans.slowest(q)) == _keys(reader.spans._slowest_in_window(q))
