"""Hour packs (models/packs.py), on SQLite and PostgreSQL: a pack reads as the minute rows of
its hour, the detectors find the same with and without them, a write to a packed hour
deletes its pack, a pack is read only once verified, and the settler's schedule packs closed
hours only, a bounded number a tick."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from sqlalchemy import select, update

from modalscope.app import findings
from modalscope.app.detectors import Thresholds
from modalscope.app.params import Window
from modalscope.ingest import demo
from modalscope.ingest.settle import settle
from modalscope.models import RollupChange, RollupPack, changes, packs
from modalscope.models.reader import Filters, StoreReader
from modalscope.models.reader import rollups as reader_rollups

S = 1_000_000_000
MIN = 60 * S
HOUR = 3600 * S


_FILLED_AT: dict[str, int] = {}  # backend -> the ``now`` its filled template was built for


@pytest.fixture
def store(engine, db_url, filled_templates):
    """Three hours of demo traffic (every pattern injected) ending two minutes before the
    module's first test, settled, its writes logged ten minutes before that (as a store
    settled a while back); built once a backend and copied for each test."""

    def build(eng):
        now = time.time_ns() // MIN * MIN - 2 * MIN
        demo.fill(eng, demo.DemoConfig(now_ns=now, hours=3.0, rate=0.12, seed=11))
        settle(eng, force=True)
        with eng.begin() as conn:
            conn.execute(update(RollupChange).values(changed_ns=RollupChange.changed_ns - 600 * S))
        _FILLED_AT[eng.dialect.name] = now

    filled_templates.fill_like(engine, db_url, "packs-demo", build)
    return engine, _FILLED_AT[engine.dialect.name]


def _as_rows(cols: packs.Columns, dims_of: dict) -> list[tuple]:
    """(dims..., minute, count, errors, sum, entries) rows, sorted."""
    ends = np.cumsum(cols.lengths)
    starts = ends - cols.lengths
    return sorted((*dims_of[s], m, c, e, t, tuple(zip(cols.keys[a:b].tolist(), cols.counts[a:b].tolist())))
                  for s, m, c, e, t, a, b in zip(cols.series_id.tolist(), cols.minute.tolist(), cols.count.tolist(),
                                                 cols.errors.tolist(), cols.sum_ns.tolist(), starts.tolist(),
                                                 ends.tolist()))


def _minute_rows(reader: StoreReader, kind: str, start: int, end: int, dims, filters=None) -> list[tuple]:
    """The same rows straight from the minute rollups (``reader.rollups.rows``)."""
    out = []
    for minute, count, errors, sum_ns, blob, *d in reader.rollups.rows(kind, start, end, dims, filters):
        entries = np.frombuffer(bytes(blob or b""), dtype="<i4").reshape(-1, 2)
        out.append((*d, minute, count, errors, sum_ns, tuple(map(tuple, entries.tolist()))))
    return sorted(out)


def _packed_hours(engine) -> set[tuple[str, int, bool]]:
    with engine.connect() as conn:
        return set(conn.execute(select(RollupPack.kind, RollupPack.hour, RollupPack.verified)).all())


def test_packs_read_as_the_minute_rows_and_the_detectors_find_the_same(store, monkeypatch):
    engine, now = store
    reader, th = StoreReader(engine), Thresholds()
    # Windows that start and end inside hours: packs for the whole hours, minute rows for the
    # edges (each over two hours long, so it holds a whole hour whatever the clock says).
    windows = [Window(now - 3 * HOUR + 7 * MIN + 13 * S, now - 11 * S), Window(now - 3 * HOUR + 1 * MIN, now - 50 * MIN)]
    before = [findings.find(reader, w, Filters(), th) for w in windows]
    assert any(before), "the demo's patterns are found"
    assert packs.pack_everything(engine) >= 2 * 3
    hours = {h for _, h, verified in _packed_hours(engine) if verified}
    assert hours and all(verified for _, _, verified in _packed_hours(engine))
    minute_reads = []
    real = reader_rollups.series_rows
    monkeypatch.setattr(reader_rollups, "series_rows",
                        lambda conn, where, cols, tiers, **k: minute_reads.extend((t[1], t[2]) for t in tiers)
                        or real(conn, where, cols, tiers, **k))
    for w in windows:
        for kind, dims, filters in (("pair", ("caller", "callee"), None), ("trace", ("input_type",), None),
                                    ("pair", ("caller", "callee"), Filters(service="llm"))):
            minute_reads.clear()
            cols, dims_of = reader.rollups.columns(kind, w.start_ns, w.end_ns, dims, filters)
            assert len(cols) and minute_reads, "some rows come from packs, the edges from minute rows"
            # Minute rows only for the minutes outside the packed hours the window holds whole.
            first, last = -(-w.start_ns // MIN), -(-w.end_ns // MIN)
            whole = {h for h in hours if h * 60 >= first and h * 60 + 60 <= last}
            assert len(whole) >= 1
            assert not any(a < h * 60 + 60 and h * 60 < b for a, b in minute_reads for h in whole)
            assert _as_rows(cols, dims_of) == _minute_rows(reader, kind, w.start_ns, w.end_ns, dims, filters)
            # ordered by series, then minute
            assert (np.diff(cols.series_id) >= 0).all()
            same = np.diff(cols.series_id) == 0
            assert (np.diff(cols.minute)[same] > 0).all()
        # Kinds packed without sketches: read from packs when no sketches are asked for (the
        # rows' counts and sums as the minute rows'), from minute rows otherwise.
        dims = ("service", "name", "caller", "callee")
        minute_reads.clear()
        with_sketches, dims_of = reader.rollups.columns("cache", w.start_ns, w.end_ns, dims)
        assert len(with_sketches.keys) and {(a, b) for a, b in minute_reads} == {(first, last)}
        assert _as_rows(with_sketches, dims_of) == _minute_rows(reader, "cache", w.start_ns, w.end_ns, dims)
        minute_reads.clear()
        bare, dims_of = reader.rollups.columns("cache", w.start_ns, w.end_ns, dims, sketches=False)
        assert not len(bare.keys) and not bare.lengths.any()
        assert not any(a < h * 60 + 60 and h * 60 < b for a, b in minute_reads for h in whole)
        assert _as_rows(bare, dims_of) == [r[:-1] + ((),) for r in _as_rows(with_sketches, dims_of)]
    with engine.connect() as conn:  # (stored so: a day of cache packs, 9.9 MB with sketches, is ~0.5 MB)
        assert packs.read(conn, "cache", min(hours), max(hours) + 1) and all(
            not len(cols.keys) for cols in packs.read(conn, "cache", min(hours), max(hours) + 1).values())
    assert [findings.find(reader, w, Filters(), th) for w in windows] == before


def test_a_write_to_a_packed_hour_deletes_its_pack(store):
    from tests.app.conftest import side_calls_trace
    from modalscope.ingest.writer import write_spans

    engine, now = store
    reader = StoreReader(engine)
    packs.pack_everything(engine)
    packed = {h for k, h, _ in _packed_hours(engine) if k == "pair"}
    late_hour = (now - 2 * HOUR) // HOUR
    assert late_hour in packed
    write_spans(engine, side_calls_trace(random.Random(5), late_hour * HOUR + 10 * MIN, db_ms=900, llm_ms=4000))
    settle(engine, force=True)
    left = {h for k, h, _ in _packed_hours(engine) if k == "pair"}
    assert late_hour not in left and left == packed - {late_hour}
    # The late trace is in what the detectors read (from that hour's minute rows).
    w = Window(now - 3 * HOUR, now)
    cols, dims_of = reader.rollups.columns("pair", w.start_ns, w.end_ns, ("caller", "callee"))
    assert _as_rows(cols, dims_of) == _minute_rows(reader, "pair", w.start_ns, w.end_ns, ("caller", "callee"))
    # Retention and retag log their writes too: every pack goes with a change over all minutes.
    with engine.begin() as conn:
        changes.record_everything(conn)
    assert _packed_hours(engine) == set()


def test_a_reader_keeps_decoded_packs_and_fetches_only_new_versions(store, monkeypatch):
    """A reader fetches each pack's data once (``PackCache``); a pack deleted by a write is not
    served from its memory, and one built again (a new version) is fetched again; what it
    reads always equals the minute rows."""
    from tests.app.conftest import side_calls_trace
    from modalscope.ingest.writer import write_spans

    engine, now = store
    packs.pack_everything(engine)
    reader = StoreReader(engine)
    fetched: list[int] = []  # (packs decoded: one a pack fetched)
    real_decode = packs.decode
    monkeypatch.setattr(packs, "decode", lambda blob: fetched.append(1) or real_decode(blob))
    w, dims = Window(now - 3 * HOUR, now), ("caller", "callee")

    def read_pairs():
        fetched.clear()
        cols, dims_of = reader.rollups.columns("pair", w.start_ns, w.end_ns, dims)
        assert _as_rows(cols, dims_of) == _minute_rows(reader, "pair", w.start_ns, w.end_ns, dims)
        return len(fetched)

    whole = {h for k, h, v in _packed_hours(engine)
             if k == "pair" and v and h * HOUR >= w.start_ns and (h + 1) * HOUR <= w.end_ns}
    assert len(whole) >= 2 and read_pairs() == len(whole)
    assert {h for (kind, h) in reader.context.pack_cache._entries if kind == "pair"} == whole
    assert read_pairs() == 0
    # A late trace in a packed hour: its pack goes; the reader reads that hour's minute rows.
    late_hour = (now - 2 * HOUR) // HOUR
    write_spans(engine, side_calls_trace(random.Random(5), late_hour * HOUR + 10 * MIN, db_ms=900, llm_ms=4000))
    settle(engine, force=True)
    assert read_pairs() == 0
    # Built again (with the late trace): that pack is fetched again, the others are not.
    with engine.begin() as conn:
        conn.execute(update(RollupChange).values(changed_ns=RollupChange.changed_ns - 600 * S))
    packs.build(engine, "pair", late_hour)
    packs.verify(engine, now_ns=time.time_ns() + 10 * packs.VERIFY_AFTER_S * S)
    assert read_pairs() == 1
    assert read_pairs() == 0
    # A budget smaller than a pack keeps none; one pack's worth keeps the newest only.
    sizes = {h: v[2] for (kind, h), v in reader.context.pack_cache._entries.items() if kind == "pair"}
    reader.context.pack_cache = packs.PackCache(max_bytes=1)
    assert read_pairs() == len(whole) and read_pairs() == len(whole) and reader.context.pack_cache.bytes == 0
    reader.context.pack_cache = packs.PackCache(max_bytes=max(sizes.values()))
    assert read_pairs() == len(whole)
    assert 0 < reader.context.pack_cache.bytes <= max(sizes.values()) and len(reader.context.pack_cache._entries) == 1


def test_a_pack_is_read_only_once_verified_and_dropped_if_a_write_raced_its_build(store):
    engine, now = store
    reader = StoreReader(engine)
    hour = (now - 2 * HOUR) // HOUR
    other = hour - 1
    packs.build(engine, "pair", hour)
    packs.build(engine, "pair", other)
    with engine.connect() as conn:
        assert packs.read(conn, "pair", other, hour + 1) == {}  # not verified yet
    assert packs.verify(engine, after_s=packs.VERIFY_AFTER_S) == (0, 0)  # too soon
    # A settle batch that was in flight while ``hour`` was packed (logged just before the
    # build, committed after it): that pack goes; the other is verified.
    with engine.begin() as conn:
        conn.execute(RollupChange.__table__.insert().values(
            first_minute=hour * 60 + 5, last_minute=hour * 60 + 5, changed_ns=time.time_ns() - 30 * S))
    assert packs.verify(engine, after_s=0) == (1, 1)
    assert _packed_hours(engine) == {("pair", other, True)}
    with engine.connect() as conn:
        got = packs.read(conn, "pair", other, hour + 1)
    assert list(got) == [other]
    w = Window(other * HOUR, (other + 1) * HOUR)
    assert _as_rows(got[other], _pair_dims(engine)) == _minute_rows(reader, "pair", w.start_ns, w.end_ns,
                                                                     ("caller", "callee"))


def _pair_dims(engine) -> dict[int, tuple]:
    from modalscope.models import Series

    with engine.connect() as conn:
        return {i: (c, e) for i, c, e in conn.execute(select(Series.id, Series.caller, Series.callee)
                                                      .where(Series.kind == "pair"))}


def test_the_schedule_packs_closed_hours_newest_first_a_bounded_number_a_tick(store, monkeypatch):
    engine, now = store
    monkeypatch.setattr(packs, "PACKS_PER_TICK", 1)
    schedule = packs.PackSchedule(engine, every_s=60)
    wall = time.time_ns()  # one clock for the whole test (an hour may close meanwhile)
    newest_closed = (wall - int(packs.LAG_S * S)) // HOUR - 1
    data_hours = list(range(newest_closed, (now - 3 * HOUR) // HOUR - 1, -1))
    assert len(data_hours) >= 2
    built, clock = [], 1000.0
    while True:
        before = _packed_hours(engine)
        n = schedule.maybe_run(now=clock, now_ns=wall)
        assert schedule.maybe_run(now=clock + 30, now_ns=wall) == 0  # not due again yet
        if not n:
            break
        assert n == 1
        (new,) = _packed_hours(engine) - before
        built.append(new[:2])
        clock += 61
    # Closed hours only (not the current one, not the last LAG_S), newest first, both kinds.
    assert built == [(kind, h) for h in data_hours for kind in packs.PACK_KINDS]


def test_packs_past_the_horizon_are_deleted(store):
    engine, now = store
    old_hour = (time.time_ns() - int(packs.HORIZON_S * S)) // HOUR - 1
    with engine.begin() as conn:
        conn.execute(RollupPack.__table__.insert().values(hour=old_hour, kind="pair", built_ns=time.time_ns(),
                                                          verified=True, data=packs.encode(packs.empty_columns())))
    packs.refresh(engine, limit=1)
    assert (("pair", old_hour, True)) not in _packed_hours(engine)
    assert len(_packed_hours(engine)) == 1  # and the newest closed hour was packed


def test_rows_of_a_series_created_meanwhile_are_left_out(store, monkeypatch):
    """On PostgreSQL the minute rows' own read of the series may see one created after the
    series were named (each statement sees what was committed before it): its rows are not
    in the columns (they would have no names)."""
    engine, now = store
    reader = StoreReader(engine)
    w = Window(now - 30 * MIN, now)
    expected = _minute_rows(reader, "pair", w.start_ns, w.end_ns, ("caller", "callee"))
    real = reader_rollups.series_rows
    monkeypatch.setattr(reader_rollups, "series_rows", lambda *a, **k: real(*a, **k) + [
        (now // MIN - 1, 3, 0, 300, np.asarray([[5, 3]], dtype="<i4").tobytes(), 10**9)])
    cols, dims_of = reader.rollups.columns("pair", w.start_ns, w.end_ns, ("caller", "callee"))
    assert 10**9 not in set(cols.series_id.tolist())
    assert _as_rows(cols, dims_of) == expected


def test_a_late_trace_settled_with_live_ones_drops_only_its_own_hours_packs(store):
    """One settle batch holding a trace from hours ago and a live one logs two changes, not
    one over every minute between them: the packs of the hours between stay."""
    from tests.app.conftest import side_calls_trace
    from modalscope.ingest.writer import write_spans

    engine, now = store
    packs.pack_everything(engine)
    before = _packed_hours(engine)
    # The late trace's hour is the one its start falls in: past minute 58 that is the next.
    late_ns = now - 3 * HOUR + 2 * MIN
    late_hour = late_ns // HOUR
    between = set(range(late_hour + 1, (now - 10 * MIN) // HOUR))
    assert between
    write_spans(engine, side_calls_trace(random.Random(3), late_ns, db_ms=50, llm_ms=400)
                + side_calls_trace(random.Random(4), now - 10 * MIN, db_ms=50, llm_ms=400))
    settle(engine, force=True)
    dropped = {h for _, h, _ in before - _packed_hours(engine)}
    assert late_hour in dropped and not dropped & between


def test_settlers_packing_the_same_hour_at_once_leave_one_pack(store):
    """Several receivers' settlers run the schedule: packing an hour another is packing too
    is no error, and one pack stays."""
    from concurrent.futures import ThreadPoolExecutor

    engine, now = store
    hour = (now - 2 * HOUR) // HOUR
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: packs.build(engine, "pair", hour), range(8)))
    assert {(k, h) for k, h, _ in _packed_hours(engine)} == {("pair", hour)}


def test_hours_written_in_the_last_minute_are_packed_on_a_later_tick(store):
    """A bulk fill or import writes every hour at once: packs built right after it would be
    dropped at verification, so those hours wait for a tick after the margin."""
    engine, now = store
    hour = (now - 2 * HOUR) // HOUR
    with engine.begin() as conn:
        changes.record(conn, hour * 60 + 7, hour * 60 + 7)  # just now
    assert packs.refresh(engine) > 0
    packed = {h for _, h, _ in _packed_hours(engine)}
    assert hour not in packed and packed
    with engine.begin() as conn:
        conn.execute(update(RollupChange).values(changed_ns=RollupChange.changed_ns - 600 * S))
    packs.refresh(engine)
    assert hour in {h for _, h, _ in _packed_hours(engine)}


def test_packing_everything_right_after_a_fill_leaves_verified_packs(engine):
    """The benchmarks fill, settle and pack at once: every pack is read at once, though the
    fill's writes are seconds old."""
    now = time.time_ns() // MIN * MIN - 2 * MIN
    demo.fill(engine, demo.DemoConfig(now_ns=now, hours=2.0, rate=0.05, seed=2))
    settle(engine, force=True)
    assert packs.pack_everything(engine) >= 2 * len(packs.PACK_KINDS)
    assert all(verified for _, _, verified in _packed_hours(engine))
    with engine.connect() as conn:
        assert packs.read(conn, "pair", (now - 2 * HOUR) // HOUR, now // HOUR + 1)


def test_take_copies_runs_of_rows_as_picking_them_one_by_one_does():
    """``take`` copies the entries of runs of consecutive rows a run at a time (hour packs
    put together by series) and picks them entry by entry otherwise: the same columns."""
    rng = np.random.default_rng(3)
    n = 400
    lengths = rng.integers(0, 6, n)
    e = int(lengths.sum())
    cols = packs.Columns(np.arange(n) % 7, np.arange(n), rng.integers(1, 9, n), rng.integers(0, 2, n),
                         rng.integers(1, 10**9, n), lengths, rng.integers(0, 4096, e).astype(np.int32),
                         rng.integers(1, 50, e).astype(np.int32))

    def one_by_one(order):
        starts = np.cumsum(lengths) - lengths
        idx = np.concatenate([np.arange(starts[i], starts[i] + lengths[i]) for i in order] + [np.zeros(0, int)])
        return cols.keys[idx], cols.counts[idx]

    blocks = [np.arange(a, min(n, a + 50)) for a in range(0, n, 50)]
    runs = np.concatenate([blocks[i] for i in (3, 0, 7, 1, 2, 6, 5, 4)])  # 8 runs: copied a run at a time
    shuffled = rng.permutation(n)  # picked one by one
    for order in (runs, shuffled, np.arange(n)[::-1], np.arange(0)):
        got = packs.take(cols, order)
        keys, counts = one_by_one(order)
        assert np.array_equal(got.keys, keys) and np.array_equal(got.counts, counts)
        assert np.array_equal(got.lengths, lengths[order]) and np.array_equal(got.minute, cols.minute[order])


def test_merge_equals_concatenating_and_sorting_the_parts():
    """``merge`` (the reader's hour packs and minute rows put together) gives the same columns
    as concatenating the parts, keeping the wanted series and sorting by series and minute:
    hour-like parts sorted by series, a part in no order, parts without entries, one part
    alone, and none."""
    rng = np.random.default_rng(8)

    def part(hour, n_series, shuffled=False, entries=True):
        sid = np.repeat(np.arange(n_series), 60)
        minute = np.tile(np.arange(60), n_series) + hour * 60
        keep = rng.random(len(sid)) < 0.7
        sid, minute = sid[keep], minute[keep]
        if shuffled:
            p = rng.permutation(len(sid))
            sid, minute = sid[p], minute[p]
        n = len(sid)
        lengths = rng.integers(0, 5, n) if entries else np.zeros(n, dtype=np.int64)
        e = int(lengths.sum())
        return packs.Columns(sid, minute, rng.integers(1, 9, n), rng.integers(0, 2, n), rng.integers(1, 10**9, n),
                             lengths, rng.integers(0, 4096, e).astype(np.int32), rng.integers(1, 50, e).astype(np.int32))

    def expected(parts, keep):
        parts = [packs.select_rows(p, np.isin(p.series_id, keep)) for p in parts] if keep is not None else parts
        return packs.sort_rows(packs.concat(parts))

    hours = [part(h, 6) for h in range(5)]
    for parts, keep in ((hours, None), (hours[::-1], np.array([0, 2, 5])), ([part(9, 4, shuffled=True)] + hours, None),
                        ([part(1, 3, entries=False), part(2, 3, entries=False)], None), ([hours[2]], np.array([1])),
                        ([], None), ([packs.empty_columns(), hours[0]], np.array([], dtype=np.int64))):
        got, want = packs.merge(parts, keep_series=keep), expected(parts, keep)
        for name in packs.Columns.__dataclass_fields__:
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
        assert len(got) == len(want)
