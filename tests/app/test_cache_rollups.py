"""The cache page's hit rates from the ``cache`` rollups (TOTAL and tag series) equal the
raw spans' answers, and the raw path is taken wherever the rollups cannot know a group
(an overflowed key, numbers, '', long values, a key past the first tags, resource
attributes, ``cache.*`` keys, data settled before TOTAL series existed, finer steps
than an hour before the minute rollups kept). Every test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import delete, select

from modalscope.app import queries
from modalscope.app.queries import cache as cache_queries
from modalscope.app.params import Window
from modalscope.core.spans import SpanRecord
from modalscope.ingest.settle import CACHE_TAG_VALUES
from modalscope.ingest.settle_fast import CACHE_MAX_TAGS
from modalscope.models import MINUTE_BOUNDARY_CURSOR, Cursor, HourlyRollup, QuarterRollup, Rollup, Series
from modalscope.models.reader import StoreReader
from tests.factories import settled_copy

MIN = 60_000_000_000
MS = 1_000_000
T0 = 29_000_000 * MIN  # a whole minute
MINUTES = 12

HITS = [True, False, "false", "TRUE", 0, 1, "miss", "hit", 2.5, "maybe", None]  # last two: no lookup


def _span(rng: random.Random, i: int, t: int, service: str, attrs: dict, resource: dict | None = None) -> SpanRecord:
    res = {"service.name": service, "service.instance.id": f"{service}-1", **(resource or {})}
    return SpanRecord(f"{i:032x}", f"{rng.getrandbits(63) | 1:016x}", None, service, "cache.get", 3, t,
                      t + rng.randrange(1, 5_000) * MS, 0, attributes=attrs, resource=res)


def cache_spans(seed: int = 3, start: int = T0, minutes: int = MINUTES, per_minute: int = 24) -> list[SpanRecord]:
    """Several caches and services; tag keys on some lookups only; an overflowed key; keys
    with numbers, '', long values, past the first CACHE_MAX_TAGS tags, in the resource,
    mixed span / resource; odd ``cache.hit`` values; spans that are no cache lookups.
    ``per_minute`` ``kv`` lookups a minute, 10/24 as many ``prefix`` ones, 5/24 others."""
    rng = random.Random(seed)
    spans, i = [], 0
    for m in range(minutes):
        for _ in range(per_minute):
            i += 1
            t = start + m * MIN + rng.randrange(MIN)
            hit = rng.choice(HITS) if rng.random() < 0.3 else rng.random() < (0.3 if m in (5, 6) else 0.8)
            attrs = {"cache.name": "kv", "cache.hit": hit, "db.system": "redis"}
            if rng.random() < 0.85:  # some lookups lack the tag: the group None
                attrs["user_tier"] = rng.choice(["gold", "silver", "bronze"])
            if rng.random() < 0.5:
                attrs["region"] = rng.choice(["eu", "us"])
            attrs["user"] = f"u{rng.randrange(CACHE_TAG_VALUES + 12):03d}"  # overflows its value cap
            attrs["shard"] = rng.choice(["a", "b", 3])  # sometimes a number
            attrs["env"] = rng.choice(["prod", "prod", ""])  # sometimes empty
            attrs["blob"] = rng.choice(["short", "x" * 80])  # sometimes too long for a tag
            resource = {"host.name": f"node-{rng.randrange(3)}"}  # a resource attribute only
            if rng.random() < 0.5:
                attrs["zone"] = "z1"
            else:
                resource["zone"] = "z2"  # the same key from the resource where the span lacks it
            spans.append(_span(rng, i, t, "front", attrs, resource))
        for _ in range(max(1, per_minute * 10 // 24)):
            i += 1
            t = start + m * MIN + rng.randrange(MIN)
            service = rng.choice(["llm", "front"])
            attrs = {"cache.name": "prefix", "cache.hit": rng.choice(HITS) if rng.random() < 0.2 else
                     rng.random() < 0.5, "model": rng.choice(["small", "large"])}
            if rng.random() < 0.4:  # more string tags than a lookup keeps: t8 then past the cut
                attrs.update({f"t{j}": "v" for j in range(CACHE_MAX_TAGS + 1)})
            elif rng.random() < 0.5:
                attrs["t8"] = "w"
            spans.append(_span(rng, i, t, service, attrs))
        for _ in range(max(1, per_minute * 5 // 24)):
            i += 1
            spans.append(_span(rng, i, start + m * MIN + rng.randrange(MIN), "front", {"http.route": "/x"}))
    return spans


@pytest.fixture
def store(engine, db_url, small_templates):
    """The settled ``cache_spans()``: built once a backend, copied for each test."""
    settled_copy(small_templates, engine, db_url, "cache-spans", cache_spans())
    return StoreReader(engine)


ALIGNED = Window(T0, T0 + MINUTES * MIN)
RAGGED = Window(T0 + 17 * 1_000_000_000, T0 + (MINUTES - 2) * MIN + 5_123_456_789)
SHORT = Window(T0 + 3 * MIN + 5_000_000_000, T0 + 3 * MIN + 50_000_000_000)

# (group_by, cache) answered from the rollups: every group known from tag series.
FROM_ROLLUPS = [(None, None), (None, "kv"), (None, "prefix"), ("user_tier", None), ("region", "kv"),
                ("model", None), ("model", "prefix"), ("user", "prefix"), ("absent.key", None),
                ("db.system", None)]
# ... and read raw: values the tags do not show.
FROM_RAW = [("user", None), ("user", "kv"), ("shard", None), ("env", None), ("blob", "kv"), ("host.name", None),
            ("zone", None), ("zone", "kv"), ("t8", None), ("t8", "prefix"), ("service.instance.id", None),
            ("cache.hit", None), ("cache.name", None)]


class RawCalls:
    def __init__(self, reader: StoreReader, monkeypatch) -> None:
        self.windows: list[tuple[int, int]] = []
        real = reader.attributes.cache_spans

        def spy(start_ns, end_ns, limit=queries.CACHE_MAX_SPANS):
            self.windows.append((start_ns, end_ns))
            return real(start_ns, end_ns, limit=limit)

        monkeypatch.setattr(reader.attributes, "cache_spans", spy)


def _both(reader, window, group_by, cache, step=None):
    if step is None:
        return (queries.cache_rates(reader, window, group_by, cache),
                queries.cache_rates(reader, window, group_by, cache, rollups=False))
    return (queries.cache_series(reader, window, group_by, cache, step),
            queries.cache_series(reader, window, group_by, cache, step, rollups=False))


@pytest.mark.parametrize("window", [ALIGNED, RAGGED, SHORT], ids=["aligned", "ragged", "short"])
def test_rollup_answers_equal_raw_answers(store, window):
    for group_by, cache in FROM_ROLLUPS + FROM_RAW:
        ours, raw = _both(store, window, group_by, cache)
        assert ours == raw, (group_by, cache)
        for step in (1, 5):
            ours, raw = _both(store, window, group_by, cache, step)
            assert ours == raw, (group_by, cache, step)
    # the data has what the cases are about
    rows = queries.cache_rates(store, ALIGNED, "user_tier", "kv", rollups=False)
    assert {r["group"] for r in rows} == {"gold", "silver", "bronze", None}
    assert sum(r["hits"] + r["misses"] for r in rows) < 24 * MINUTES  # "maybe" and None are no lookups
    assert {r["group"] for r in queries.cache_rates(store, ALIGNED, "shard", "kv", rollups=False)} == {"a", "b", "3"}
    assert {r["group"] for r in queries.cache_rates(store, ALIGNED, "zone", "kv", rollups=False)} == {"z1", "z2"}


def test_the_pages_one_read_answers_as_the_two_functions(store):
    for group_by, cache in FROM_ROLLUPS[:4] + FROM_RAW[:3]:
        for step in (1, 5):
            rows, series = queries.cache_rates_and_series(store, RAGGED, group_by, cache, step)
            assert rows == queries.cache_rates(store, RAGGED, group_by, cache), (group_by, cache)
            assert series == queries.cache_series(store, RAGGED, group_by, cache, step), (group_by, cache, step)
            assert rows and series


@pytest.mark.parametrize("group_by,cache", FROM_ROLLUPS)
def test_rollups_answer_whole_minutes_and_raw_spans_only_the_edges(store, monkeypatch, group_by, cache):
    calls = RawCalls(store, monkeypatch)
    rows = queries.cache_rates(store, ALIGNED, group_by, cache)
    assert rows and calls.windows == []  # nothing read raw
    queries.cache_series(store, ALIGNED, group_by, cache, 3)
    assert calls.windows == []
    queries.cache_rates(store, RAGGED, group_by, cache)
    assert calls.windows == [(RAGGED.start_ns, T0 + MIN), (T0 + (MINUTES - 2) * MIN, RAGGED.end_ns)]


@pytest.mark.parametrize("group_by,cache", FROM_RAW)
def test_groups_the_tags_do_not_show_are_read_raw(store, monkeypatch, group_by, cache):
    calls = RawCalls(store, monkeypatch)
    queries.cache_rates(store, ALIGNED, group_by, cache)
    assert calls.windows == [(ALIGNED.start_ns, ALIGNED.end_ns)]


def test_the_raw_answer_differs_where_the_fallback_is_taken(store):
    """The fallback matters: the rollup cells alone would put these lookups in group None."""
    lo, hi = ALIGNED.start_ns, ALIGNED.end_ns
    rows = store.rollups.rows("cache", lo, hi, ("service", "name", "caller", "callee"))
    for group_by in ("shard", "host.name", "zone", "t8", "env"):
        naive = queries.cache_rollup_cells(rows, (), group_by)  # without the cache_untagged rows
        assert naive is not None
        raw = queries.cache_rates(store, ALIGNED, group_by, rollups=False)
        assert queries._rates_table((m * MIN, c, g, h, mi) for (m, c, g), (h, mi) in naive.items()) != raw, group_by


def test_lookups_settled_before_total_series_are_read_raw(store, monkeypatch):
    """A store settled before the TOTAL series existed (tag rows only) answers from raw spans."""
    with store.engine.begin() as conn:
        ids = select(Series.id).where(Series.kind == "cache", Series.caller == "", Series.callee == "",
                                      Series.name == "kv")
        for model in (Rollup, QuarterRollup, HourlyRollup):
            conn.execute(delete(model).where(model.series_id.in_(ids)))
    calls = RawCalls(store, monkeypatch)
    ours = queries.cache_rates(store, ALIGNED, None)
    assert calls.windows == [(ALIGNED.start_ns, ALIGNED.end_ns)]
    assert ours == queries.cache_rates(store, ALIGNED, None, rollups=False)
    calls.windows.clear()
    queries.cache_rates(store, ALIGNED, None, "prefix")  # that cache still has its TOTAL
    assert calls.windows == []


def test_pruned_minute_rollups_round_out_to_hours(store, monkeypatch):
    """Before the minute rows retention keeps, the window is rounded out to whole hours (as
    every rollup view): the table and hour steps from hourly rows, nothing read raw; steps
    finer than an hour read the raw spans."""
    with store.engine.begin() as conn:
        conn.execute(Cursor.__table__.insert().values(name=MINUTE_BOUNDARY_CURSOR, position=T0 // MIN + 2,
                                                      holder=None, lease_expires_ns=0))
    hour = Window(T0 // (60 * MIN) * 60 * MIN, (T0 // (60 * MIN) + 1) * 60 * MIN)  # the hour holding all the data
    assert hour.start_ns < RAGGED.start_ns and RAGGED.end_ns < hour.end_ns
    calls = RawCalls(store, monkeypatch)
    for group_by in ("user_tier", None):
        rates, series = (queries.cache_rates(store, RAGGED, group_by),
                         queries.cache_series(store, RAGGED, group_by, None, 60))
        assert calls.windows == []
        assert rates == queries.cache_rates(store, hour, group_by, rollups=False)
        assert rates != queries.cache_rates(store, RAGGED, group_by, rollups=False)  # rounded out indeed
        assert series == queries.cache_series(store, hour, group_by, None, 60, rollups=False)
        calls.windows.clear()
    ours = queries.cache_series(store, RAGGED, "user_tier", None, 5)
    assert calls.windows == [(RAGGED.start_ns, RAGGED.end_ns)]
    assert ours == queries.cache_series(store, RAGGED, "user_tier", None, 5, rollups=False)
    calls.windows.clear()
    later = Window(T0 + 2 * MIN, ALIGNED.end_ns)
    ours = queries.cache_rates(store, later, "user_tier")
    assert calls.windows == []  # minute rollups kept from its first minute on
    assert ours == queries.cache_rates(store, later, "user_tier", rollups=False)


def test_empty_window_answers_nothing(store):
    empty = Window(T0 - 30 * MIN, T0 - 10 * MIN)
    assert queries.cache_rates(store, empty, "user_tier") == []
    assert queries.cache_series(store, empty, None, None, 5) == []


def test_group_by_is_a_whole_key():
    assert queries.valid_group_by("user_tier") and not queries.valid_group_by("user_tier\n")
    assert not queries.valid_group_by(None) and not queries.valid_group_by("")


# A long store: 200 minutes from a whole hour, a window with ragged edges around two whole
# hours and whole quarters on each side (minutes 8..187 of the store are its whole minutes).
H0 = 483_334 * 60 * MIN
LONG = Window(H0 + 7 * MIN + 17_000_000_000, H0 + 188 * MIN + 5_123_456_789)
WHOLE = range(8, 188)


@pytest.fixture
def long_store(engine, db_url, small_templates):
    settled_copy(small_templates, engine, db_url, "long-cache-spans",
                 cache_spans(seed=5, start=H0, minutes=200, per_minute=6))
    return StoreReader(engine)


class CellRows:
    """The minutes of the rollup rows ``cache_rollup_cells`` is given (each row's first minute)."""

    def __init__(self, monkeypatch) -> None:
        self.minutes: set[int] = set()
        real = queries.cache_rollup_cells

        def spy(rows, untagged_rows, group_by, cache=None):
            rows = list(rows)
            self.minutes |= {r[0] - H0 // MIN for r in rows}
            return real(rows, untagged_rows, group_by, cache)

        monkeypatch.setattr(cache_queries, "cache_rollup_cells", spy)  # where _cache_lookups reads it


def test_long_windows_answer_as_the_raw_spans(long_store):
    for group_by, cache in FROM_ROLLUPS + FROM_RAW[:4]:
        ours, raw = _both(long_store, LONG, group_by, cache)
        assert ours == raw, (group_by, cache)
        for step in (5, 15, 30, 60, 180):
            ours, raw = _both(long_store, LONG, group_by, cache, step)
            assert ours == raw, (group_by, cache, step)
    rows = queries.cache_rates(long_store, LONG, "user_tier", "kv")
    assert {r["group"] for r in rows} == {"gold", "silver", "bronze", None}


@pytest.mark.parametrize("step,minutes", [
    (None, set(range(8, 15)) | {15, 30, 45, 60, 120} | set(range(180, 188))),  # the table: hours
    (180, set(range(8, 15)) | {15, 30, 45, 60, 120} | set(range(180, 188))),
    (30, set(range(8, 15)) | set(range(15, 180, 15)) | set(range(180, 188))),  # quarters, no hours
    (15, set(range(8, 15)) | set(range(15, 180, 15)) | set(range(180, 188))),
    (5, set(WHOLE)),  # minute rows only: a quarter would straddle two 5-minute steps
    (0, set(WHOLE)),  # (read as one minute, as the buckets read it)
])
def test_long_windows_read_the_coarsest_tier_a_step_allows(long_store, monkeypatch, step, minutes):
    cells, calls = CellRows(monkeypatch), RawCalls(long_store, monkeypatch)
    if step is None:
        rows = queries.cache_rates(long_store, LONG, "user_tier")
    else:
        rows = queries.cache_series(long_store, LONG, "user_tier", None, step)
        # steps of whole quarters lie on the clock's grid, shorter ones start at the window's minute
        origin = 0 if step and step % 15 == 0 else LONG.start_ns // MIN * MIN
        assert all((r["t_ns"] - origin) % (max(1, step) * MIN) == 0 for r in rows)
        assert min(r["t_ns"] for r in rows) <= LONG.start_ns
    assert rows and cells.minutes == minutes
    assert calls.windows == [(LONG.start_ns, H0 + 8 * MIN), (H0 + 188 * MIN, LONG.end_ns)]  # the edges only
