"""Long windows find their slowest spans and traces through the duration indexes, with the
same answer a full sort of the window gives."""

from __future__ import annotations

import random
import time

import pytest
from modalscope.app import queries
from modalscope.app.params import Window
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models.reader import SPAN_WALK_SHARE, Filters, SpanQuery, StoreReader
from modalscope.models.reader import walks
from modalscope.models import Span
from modalscope.models.buckets import duration_bucket
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
    assert walks.long_window(reader.context, Span, w0, end, SPAN_WALK_SHARE)
    services = tuple(sorted({s.service for s in spans}))
    for kind, band in ((None, (None, None)), (3, (None, None)), (None, (20_000_000, 400_000_000))):
        expected = sorted((s for s in spans if w0 <= s.start_ns < end and (kind is None or s.kind == kind)
                           and (band[0] is None or band[0] <= s.end_ns - s.start_ns <= band[1])),
                          key=lambda s: (-(s.end_ns - s.start_ns), s.start_ns))
        got = []
        for offset in (0, 7, 14, 21):
            got += reader.spans.slowest(SpanQuery(w0, end, kind=kind, min_ns=band[0], max_ns=band[1], limit=7,
                                                  offset=offset, services=services))
        assert [_key(r) for r in got] == [(s.trace_id, s.span_id) for s in expected[:28]]
        assert all("_id" not in r for r in got)
        # One named service: its spans only, in the same order.
        svc = "vision-encoder"
        mine = [s for s in expected if s.service == svc][:10]
        assert [_key(r) for r in reader.spans.slowest(SpanQuery(w0, end, kind=kind, service=svc, min_ns=band[0],
                                                                max_ns=band[1], limit=10))] == \
            [(s.trace_id, s.span_id) for s in mine]


def test_traces_waiting_to_settle_do_not_make_long_windows_look_short(engine):
    """A trace row is written when its first span arrives and starts at 0 until the trace
    settles: those rows must not stretch the stored range, or every long window (with ingest
    running, always) would be sorted instead of walked."""
    from modalscope.models import Trace
    from modalscope.models.reader import TRACE_WALK_SHARE

    start, end, _ = _store(engine)
    reader = StoreReader(engine)
    assert walks.long_window(reader.context, Trace, end - 5 * HOUR, end, TRACE_WALK_SHARE)
    rng = random.Random(3)
    write_spans(engine, multimodal_trace(rng, end + HOUR // 2, images=1))  # not settled
    with engine.connect() as conn:
        assert conn.execute(Trace.__table__.select().where(Trace.pending.is_(True), Trace.start_ns == 0)).first()
    assert walks.long_window(reader.context, Trace, end - 5 * HOUR, end, TRACE_WALK_SHARE)
    assert not walks.long_window(reader.context, Trace, end - HOUR // 40, end, TRACE_WALK_SHARE)


@pytest.mark.slow
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
            piece = Window(t, min(t + HOUR // 40, long_window.end_ns))
            assert not walks.long_window(reader.context, Span, piece.start_ns, piece.end_ns,
                                         SPAN_WALK_SHARE)
            pieces += queries.exemplar_traces(reader, piece, filters, limit=15)
            t += HOUR // 40
        measure = "span_ms" if "span_ms" in (long_rows[0] if long_rows else {}) else "duration_ms"
        best = {}
        for r in pieces:
            if r["trace_id"] not in best or r[measure] > best[r["trace_id"]][measure]:
                best[r["trace_id"]] = r
        expected = sorted(best.values(), key=lambda r: (-r[measure], r["start_unix_nano"]))[:15]
        assert len(long_rows) == len(expected) > 0, filters
        assert [r[measure] for r in long_rows] == [r[measure] for r in expected], filters


def test_pair_exemplars_skip_a_busy_callers_other_calls(engine):
    """A caller whose slowest calls all go elsewhere: the pair's exemplars are its calls to
    the callee only (child server span or peer attribute), found without paging through
    the others, in both the short- and the long-window paths."""
    from modalscope.core.spans import SpanRecord

    base = time.time_ns() - 2 * HOUR
    spans, expected = [], {"fast": [], "db": []}
    for i in range(400):
        tid = f"{i + 1:032x}"
        t0 = base + i * 10_000_000_000
        root = SpanRecord(tid, f"{1:016x}", None, "gw", "POST /x", 2, t0, t0 + 3_000_000_000, 0)
        spans.append(root)
        # slow calls to "slow" (child server spans) in every trace
        spans.append(SpanRecord(tid, f"{2:016x}", root.span_id, "gw", "call slow", 3, t0, t0 + 2_000_000_000, 0))
        spans.append(SpanRecord(tid, f"{3:016x}", f"{2:016x}", "slow", "serve", 2, t0, t0 + 1_900_000_000, 0))
        if i % 20 == 0:  # a few fast calls to "fast"
            d = 1_000_000 + i
            spans.append(SpanRecord(tid, f"{4:016x}", root.span_id, "gw", "call fast", 3, t0, t0 + d, 0))
            spans.append(SpanRecord(tid, f"{5:016x}", f"{4:016x}", "fast", "serve", 2, t0, t0 + d - 1, 0))
            expected["fast"].append((tid, d))
        if i % 25 == 0:  # calls to an uninstrumented database, named by peer.service
            d = 500_000 + i
            spans.append(SpanRecord(tid, f"{6:016x}", root.span_id, "gw", "query", 3, t0, t0 + d, 0,
                                    attributes={"peer.service": "db"}))
            expected["db"].append((tid, d))
    write_spans(engine, spans)
    settle(engine, force=True)
    reader = StoreReader(engine)
    end = base + 400 * 10_000_000_000
    for w in (Window(base, end), Window(end - 600_000_000_000, end)):  # long and short against the store
        for callee, want in expected.items():
            want = sorted((x for x in want if w.start_ns <= base + (int(x[0], 16) - 1) * 10_000_000_000 < w.end_ns),
                          key=lambda x: -x[1])[:5]
            got = queries.exemplar_traces(reader, w, Filters(caller="gw", callee=callee), limit=5)
            assert [r["trace_id"] for r in got] == [t for t, _ in want], (callee, w)
            assert all(r["span_service"] == "gw" for r in got)


def test_the_bucket_walk_equals_a_sort_for_ties_band_edges_and_filters(engine):
    """Durations crowded into few buckets, with ties and bands whose edges fall inside a
    bucket: the walk's pages equal a full sort of the window, for every filter combination."""
    from modalscope.models.buckets import bucket_floor_ns, duration_bucket

    rng = random.Random(77)
    base = time.time_ns() - 6 * HOUR
    spans = []
    for i in range(60):
        t = multimodal_trace(rng, base + i * 6 * HOUR // 60, images=1 + i % 2)
        for s in t:  # a handful of durations: many share a bucket, some are equal
            s.end_ns = s.start_ns + rng.choice([1_000_000, 1_000_001, 1_050_000, 1_100_000, 1_100_000,
                                                 7_900_000, 8_000_000, 8_000_000, 250_000_000])
        spans += t
    write_spans(engine, spans)
    settle(engine, force=True)
    reader = StoreReader(engine)
    w0, end = base + HOUR, base + 6 * HOUR
    assert walks.long_window(reader.context, Span, w0, end, SPAN_WALK_SHARE)
    services = tuple(sorted({s.service for s in spans}))
    inner = bucket_floor_ns(duration_bucket(1_050_000)) + 1  # inside a bucket, not on its edge
    for stage, kind, band in ((None, None, (None, None)), ("encoder", None, (None, None)),
                              (None, 3, (None, 8_000_000)), (None, None, (inner, 8_000_000)),
                              (None, None, (1_000_001, 1_100_000)), (None, None, (7_900_001, None))):
        expected = sorted((s for s in spans if w0 <= s.start_ns < end and (stage is None or s.stage == stage)
                           and (kind is None or s.kind == kind)
                           and (band[0] is None or band[0] <= s.end_ns - s.start_ns)
                           and (band[1] is None or s.end_ns - s.start_ns <= band[1])),
                          key=lambda s: (-(s.end_ns - s.start_ns), s.start_ns))
        got = []
        for offset in range(0, 60, 12):
            got += reader.spans.slowest(SpanQuery(w0, end, kind=kind, stage=stage, min_ns=band[0], max_ns=band[1],
                                                  limit=12, offset=offset, services=services))
        keys = [_key(r) for r in got]
        assert len(keys) == min(60, len(expected))
        # equal durations and starts may come in either span order; everything else is fixed
        assert [(r["duration_ns"], r["start_ns"]) for r in got] == \
            [(s.end_ns - s.start_ns, s.start_ns) for s in expected[:60]]
        assert set(keys) <= {(s.trace_id, s.span_id) for s in expected}
        assert len(set(keys)) == len(keys)


def _busy_window(engine, n: int = 200_000, every: int = 20) -> int:
    """``n`` SERVER spans 10 ms apart, one in ``every`` of service ``svc`` (the rest of seven
    others), written by one INSERT ... SELECT; returns the first span's start."""
    from sqlalchemy import text

    base = 1_790_000_000_000_000_000
    bucket = {d: duration_bucket(d) for d in range(1_000_000, 11_000_000, 1_000_000)}
    duration = "(1000000 + (i % 10) * 1000000)"
    bucket_of = "CASE " + " ".join(f"WHEN {duration} = {d} THEN {b}" for d, b in bucket.items()) + " END"
    hex_id = "lower(printf('%032x', i))" if engine.dialect.name == "sqlite" else "lpad(to_hex(i), 32, '0')"
    with engine.begin() as conn:
        conn.execute(text(f"""
            WITH RECURSIVE n(i) AS (SELECT CAST(0 AS BIGINT) UNION ALL SELECT i + 1 FROM n WHERE i < {n - 1})
            INSERT INTO spans (trace_id, span_id, parent_span_id, service, name, kind, stage, start_ns,
                               duration_ns, duration_bucket, status, status_message, source, instance, scope,
                               attributes, resource, events)
            SELECT {hex_id}, '0000000000000001', NULL,
                   CASE WHEN i % {every} = 0 THEN 'svc' ELSE 'other' || (i % 7) END, 'op', 2, 'inference',
                   {base} + i * 10000000, {duration}, {bucket_of}, 0, '', 'otlp', 'pod-' || (i % 3), '',
                   '{{}}', '{{}}', NULL
            FROM n"""))
        if engine.dialect.name == "postgresql":  # (autovacuum's statistics; SQLite stores keep none)
            conn.execute(text("ANALYZE spans"))
    return base


def test_one_services_spans_of_a_busy_window_are_its_spans_in_start_order(engine):
    """``reader.attributes.spans`` with a service whose spans are a twentieth of a busy
    window's: exactly that service's spans of the window, in start order, narrowed by stage
    when asked; the planner setting its read takes lasts only the reading transaction. (Which
    index the read takes: ``bench/query_plans.py``.)"""
    base = _busy_window(engine)
    start, end = base + 500 * 10**9, base + 1500 * 10**9  # 100,000 spans, 5,000 of svc
    rows = StoreReader(engine).attributes.spans(start, end, (), kinds=(2, 5), service="svc")
    first = -(-(start - base) // 10**7)
    expected = [base + i * 10**7 for i in range(first, (end - base) // 10**7) if i % 20 == 0]
    assert [r[5] for r in rows] == expected and {r[1] for r in rows} == {"svc"}
    # Narrowed to stages: only spans of those stages (every span here is "inference").
    reader = StoreReader(engine)
    assert reader.attributes.spans(start, end, (), kinds=(2, 5), service="svc", stages=("inference", "x")) == rows
    assert reader.attributes.spans(start, end, (), kinds=(2, 5), service="svc", stages=("fusion",)) == []
    assert len(reader.attributes.spans(start, end, (), kinds=(2, 5), stages=("inference",))) == 100_000
    with engine.connect() as conn:  # the setting lasted only the reading transaction
        if engine.dialect.name == "postgresql":
            assert conn.exec_driver_sql("SHOW enable_indexscan").scalar_one() == "on"


def test_the_walk_or_sort_choice_follows_the_stored_time_range(engine):
    """An hour is short against six hours of spans and long once the older spans are gone
    (retention): the choice reads the stored range each time, so it follows at once."""
    start, end, spans = _store(engine)
    reader = StoreReader(engine)
    short = (end - HOUR, end)
    assert not walks.long_window(reader.context, Span, *short, 4)
    with engine.begin() as conn:
        conn.execute(Span.__table__.delete().where(Span.start_ns < end - HOUR))
    assert walks.long_window(reader.context, Span, *short, 4)


def test_raw_reads_come_in_postgresqls_binary_format_with_the_same_rows(engine):
    """``plain_rows`` (rollups with their sketches, raw spans) asks psycopg for binary rows
    (hex-decoding every sketch cost ~40 % of a sketch-heavy read); the rows are those a
    plain SQLAlchemy read gives, sketches byte for byte."""
    from sqlalchemy import event, select

    from modalscope.models import Rollup, Series
    from modalscope.models.reader import minute_range

    start, end, spans = _store(engine)
    first, last = minute_range(start, end)
    formats: list[str] = []
    event.listen(engine, "after_cursor_execute", lambda conn, cur, stmt, params, ctx, many: formats.append(
        getattr(getattr(cur, "format", None), "name", "sqlite")) if "FROM rollups" in stmt else None)
    rows = StoreReader(engine).rollups.rows("pair", start, end, ("caller", "callee"))
    assert formats and set(formats) == ({"BINARY"} if engine.dialect.name == "postgresql" else {"sqlite"})
    with engine.connect() as conn:
        plain = conn.execute(select(Rollup.minute, Rollup.count, Rollup.error_count, Rollup.sum_ns, Rollup.sketch,
                                    Series.caller, Series.callee).join(Series, Series.id == Rollup.series_id)
                             .where(Series.kind == "pair", Rollup.minute >= first, Rollup.minute < last)).all()
    assert len(rows) > 20 and sorted(rows) == sorted((*r[:4], bytes(r[4]), *r[5:]) for r in plain)
    assert all(isinstance(r[4], bytes) and isinstance(r[0], int) and isinstance(r[5], str) for r in rows)


def test_two_windows_slowest_traces_in_one_read_equal_each_read_alone(engine):
    """``slowest_traces_from`` (a regression's first minute and first five, one statement)
    gives what ``slowest_traces`` gives for each window: short windows, long ones (walked)
    and a pair of one short and one long, with and without a bound and an input type."""
    start, end, _ = _store(engine)
    reader = StoreReader(engine)
    durations = sorted(r["duration_ns"] for r in reader.calls.slowest_traces(start, end, limit=1000))
    median = durations[len(durations) // 2]
    compared = 0
    for a, ends in ((start + HOUR, (start + HOUR + HOUR // 6, start + 2 * HOUR)),
                    (start, (end - HOUR, end)),
                    (start, (start + HOUR // 6, end))):
        for kw in ({}, {"input_type": "image"}, {"min_ns": median}, {"input_type": "image", "min_ns": median}):
            for limit in (3, 40):
                both = reader.calls.slowest_traces_from(a, ends, limit=limit, **kw)
                alone = tuple(reader.calls.slowest_traces(a, e, limit=limit, **kw) for e in ends)
                assert both == alone, (a, ends, kw, limit)
                compared += sum(len(rows) for rows in alone)
    assert compared > 100
