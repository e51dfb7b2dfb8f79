"""Long windows find their slowest spans and traces through the duration indexes, with the
same answer a full sort of the window gives."""

from __future__ import annotations

import random
import time

from modalscope.app import queries
from modalscope.app.params import Window
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models.reader import Filters, SpanQuery, StoreReader
from modalscope.models import Span
from tests.factories import multimodal_trace

HOUR = 3_600_000_000_000


def _store(engine, n=90, hours=6):
    rng = random.Random(21)
    base = time.time_ns() - hours * HOUR
    traces = [multimodal_trace(rng, base + int(i * hours * HOUR / n), images=1 + i % 3, error=(i % 11 == 0))
              for i in range(n)]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    return base, base + hours * HOUR, [s for t in traces for s in t]


def _key(r):
    return (r["trace_id"], r["span_id"])


def test_long_window_pages_equal_the_sorted_window(engine):
    start, end, spans = _store(engine)
    reader = StoreReader(engine)
    # The last 5 hours of 6: long against the store, so the duration index path runs.
    w0 = end - 5 * HOUR
    assert reader._long_window(Span, w0, end)
    services = tuple(sorted({s.service for s in spans}))
    for kind, band in ((None, (None, None)), (3, (None, None)), (None, (20_000_000, 400_000_000))):
        expected = sorted((s for s in spans if w0 <= s.start_ns < end and (kind is None or s.kind == kind)
                           and (band[0] is None or band[0] <= s.end_ns - s.start_ns <= band[1])),
                          key=lambda s: (-(s.end_ns - s.start_ns), s.start_ns))
        got = []
        for offset in (0, 7, 14, 21):
            got += reader.slow_spans(SpanQuery(w0, end, kind=kind, min_ns=band[0], max_ns=band[1], limit=7,
                                               offset=offset, services=services))
        assert [_key(r) for r in got] == [(s.trace_id, s.span_id) for s in expected[:28]]
        assert all("_id" not in r for r in got)
        # One named service: its spans only, in the same order.
        svc = "vision-encoder"
        mine = [s for s in expected if s.service == svc][:10]
        assert [_key(r) for r in reader.slow_spans(SpanQuery(w0, end, kind=kind, service=svc, min_ns=band[0],
                                                             max_ns=band[1], limit=10))] == \
            [(s.trace_id, s.span_id) for s in mine]


def test_exemplar_traces_agree_between_short_and_long_windows(engine):
    start, end, _ = _store(engine)
    reader = StoreReader(engine)
    long_window = Window(end - 5 * HOUR, end)
    for filters in (Filters(caller="gateway", callee="vision-encoder"), Filters(stage="encoder"),
                    Filters(callee="vision-encoder"), Filters(input_type="image"), Filters()):
        long_rows = queries.exemplar_traces(reader, long_window, filters, limit=15)
        # The same question as a sequence of windows short against the store (sorted, not
    # walked through the duration index), merged: the slowest overall.
        pieces = []
        t = long_window.start_ns
        while t < long_window.end_ns:
            piece = Window(t, min(t + HOUR // 6, long_window.end_ns))
            assert not reader._long_window(Span, piece.start_ns, piece.end_ns)
            pieces += queries.exemplar_traces(reader, piece, filters, limit=15)
            t += HOUR // 6
        measure = "span_ms" if "span_ms" in (long_rows[0] if long_rows else {}) else "duration_ms"
        best = {}
        for r in pieces:
            if r["trace_id"] not in best or r[measure] > best[r["trace_id"]][measure]:
                best[r["trace_id"]] = r
        expected = sorted(best.values(), key=lambda r: (-r[measure], r["start_unix_nano"]))[:15]
        assert len(long_rows) == len(expected) > 0, filters
        assert [r[measure] for r in long_rows] == [r[measure] for r in expected], filters
