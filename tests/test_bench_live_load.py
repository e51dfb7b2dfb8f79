"""`bench/read_under_load.py --load live`: each round re-stamps the pooled requests by patching
their bytes (fresh trace ids, every span and event later by the clock's move): the requests
must decode to the same spans, only moved."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _spans(payload: bytes) -> list:
    req = ExportTraceServiceRequest.FromString(payload)
    return [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


def test_a_live_round_moves_every_span_and_event_and_renames_every_trace():
    sys.path.insert(0, str(BENCH))
    try:
        import read_under_load as rul
    finally:
        sys.path.remove(str(BENCH))
    old, new, shift = b"\x01" * 8, b"\x02" * 8, 37_123_456_789
    start = (time.time_ns() // rul.MINUTE_NS) * rul.MINUTE_NS
    pool = rul.live_payloads(12_000, 2_000, start, old)
    spans = [s for p in pool for s in _spans(p)]
    assert len(spans) >= 6_000 and all(s.trace_id[:8] == old for s in spans)
    assert all(start <= s.start_time_unix_nano < start + (rul.LIVE_POOL_SECONDS + 60) * 10**9 for s in spans)
    assert sum(len(s.events) for s in spans) > 0  # events are moved too: the pool must hold some
    for payload in pool:
        before = _spans(payload)
        after = _spans(rul.shifted(payload, rul.time_offsets(payload), old, new, shift))
        assert len(after) == len(before)
        for a, b in zip(before, after):
            assert b.trace_id == new + a.trace_id[8:] and b.span_id == a.span_id and b.name == a.name
            assert (b.start_time_unix_nano, b.end_time_unix_nano) == (a.start_time_unix_nano + shift,
                                                                       a.end_time_unix_nano + shift)
            assert [e.time_unix_nano for e in b.events] == [e.time_unix_nano + shift for e in a.events]
            assert list(b.attributes) == list(a.attributes)
