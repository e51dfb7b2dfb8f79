"""``/api/v1/stages?at=``: the stage self time of the traces at or above an end-to-end
percentile adds up to their mean duration; hand-built traces, SQLite and PostgreSQL."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from sqlalchemy import delete

from modalscope.app import create_app, queries
from modalscope.app.queries import stage_time
from modalscope.app.params import Window
from modalscope.core.spans import KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.models import Trace
from modalscope.models.reader import Filters
from modalscope.settings import Settings
from tests.factories import rules, settled_copy

MIN = 60_000_000_000
MS = 1_000_000


def split_of(it: str, i: int) -> dict[str, int]:
    """Milliseconds per stage of trace ``i``: the slowest traces spend their extra time in
    the encoder, so their split is not the typical one; a text trace's own time shrinks as
    its inference grows, so the two stages' P99s come from different traces."""
    if it == "image":
        return {"preprocessing": 10 + i % 7, "encoder": 40 + (3 * i if i >= 195 else i % 11),
                "inference": 200 + i, "other": 5}
    return {"inference": 100 + 2 * i, "other": 60 - i // 2}


NAMES = {"preprocessing": "image.decode", "encoder": "vit.forward", "inference": "llm.generate"}


def hand_trace(rng: random.Random, it: str, i: int, start_ns: int) -> list[SpanRecord]:
    """A root span with one child a stage, back to back; the root's own time is ``other``."""
    split = split_of(it, i)
    tid = f"{rng.getrandbits(128):032x}"
    root = f"{rng.getrandbits(64) | 1:016x}"
    total = sum(split.values())
    res = {"service.name": "gateway"}
    spans = [SpanRecord(tid, root, None, "gateway", "POST /chat", KIND_SERVER, start_ns, start_ns + total * MS, 0,
                        attributes={"mm.input_type": it}, resource=res)]
    t = start_ns + split["other"] * MS
    for stage, name in NAMES.items():
        if stage in split:
            spans.append(SpanRecord(tid, f"{rng.getrandbits(64) | 1:016x}", root, "gateway", name, KIND_INTERNAL,
                                    t, t + split[stage] * MS, 0, resource=res))
            t += split[stage] * MS
    rules().tag(spans)
    return spans


COUNTS = {"image": 200, "text": 100}


@pytest.fixture
def hand(engine, db_url, small_templates):
    rng = random.Random(11)
    base = (time.time_ns() // MIN - 50) * MIN
    order = [(it, i) for it, n in COUNTS.items() for i in range(n)]
    rng.shuffle(order)  # slow and fast traces spread over the window's minutes
    spans = [s for k, (it, i) in enumerate(order) for s in hand_trace(rng, it, i, base + k * 7_000_000_000)]
    settled_copy(small_templates, engine, db_url, f"hand-{base}", spans)
    app = create_app(Settings(database_url=db_url))
    yield app, Window(base - 5 * MIN, base + 55 * MIN)
    app.extensions["modalscope"]["engine"].dispose()


def expected(it: str, q: float) -> tuple[dict[str, float], float, int]:
    """Per stage mean ms over the traces at or above the exact ``q`` percentile, their mean
    duration and their number, computed from the construction."""
    splits = [split_of(it, i) for i in range(COUNTS[it])]
    durations = np.array([sum(s.values()) for s in splits], dtype=float)
    cut = np.percentile(durations, q * 100)
    tail = [s for s, d in zip(splits, durations) if d >= cut]
    stages = {st: sum(s[st] for s in tail) / len(tail) for st in tail[0]}
    return stages, float(np.mean([sum(s.values()) for s in tail])), len(tail)


def test_stack_at_p99_is_the_mean_of_the_slowest_traces(hand, monkeypatch):
    app, window = hand
    reader = app.extensions["modalscope"]["reader"]
    bands: list[int] = []
    real_band = stage_time._band

    def band(*args, **kw):
        rows = real_band(*args, **kw)
        bands.append(len(rows))
        return rows

    monkeypatch.setattr(stage_time, "_band", band)
    got = queries.stage_time_at(reader, window, Filters(), "p99")
    assert len(bands) == 2 and max(bands) < 20  # one bounded band a group, not the window's 300 traces
    for it in COUNTS:
        want, mean_ms, count = expected(it, 0.99)
        rows = {r["stage"]: r for r in got["stages"] if r["input_type"] == it}
        assert {s: r["self_ms"] for s, r in rows.items()} == want
        assert sum(r["self_ms"] for r in rows.values()) == mean_ms == got["traces"][it]["mean_ms"]
        assert got["traces"][it]["count"] == count == {"image": 2, "text": 1}[it]
        assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0, abs=1e-5)
    # The slowest image traces' encoder time, not the typical one: 40 + 3*198, 40 + 3*199.
    assert {r["stage"]: r["self_ms"] for r in got["stages"] if r["input_type"] == "image"}["encoder"] == 635.5
    # The old stack of each stage's own P99 overshoots the end-to-end P99; this one does not.
    breakdown = queries.stage_breakdown(reader, window)
    own_p99 = sum(r["p99_ms"] for r in breakdown["stages"] if r["input_type"] == "text")
    assert own_p99 > breakdown["traces"]["text"]["p99_ms"] * 1.01
    assert got["traces"]["text"]["mean_ms"] >= got["traces"]["text"]["at_ms"]


@pytest.mark.parametrize("at", ["p50", "p99"])
def test_either_index_reads_the_same_tail(hand, monkeypatch, at):
    """The band is read through the duration index or the start index, as the tail's size
    suggests; both give the same answer."""
    app, window = hand
    reader = app.extensions["modalscope"]["reader"]
    real_band = stage_time._band
    answers, used = [], []
    for forced in (True, False):
        def band(*args, forced=forced, **kw):
            used.append(kw.get("by_duration"))
            return real_band(*args, **{**kw, "by_duration": forced})

        monkeypatch.setattr(stage_time, "_band", band)
        answers.append(queries.stage_time_at(reader, window, Filters(), at))
    assert answers[0] == answers[1] and answers[0]["stages"]
    assert set(used) <= {True, False}


@pytest.mark.parametrize("at", ["p50", "p90"])
def test_lower_percentiles_and_one_group(hand, at):
    app, window = hand
    reader = app.extensions["modalscope"]["reader"]
    q = queries.AT_QUANTILES[at]
    got = queries.stage_time_at(reader, window, Filters(input_type="image"), at)
    want, mean_ms, count = expected("image", q)
    assert got["traces"]["image"]["count"] == count
    assert {r["stage"]: r["self_ms"] for r in got["stages"]} == pytest.approx(want, abs=1e-3)
    assert sum(r["self_ms"] for r in got["stages"]) == pytest.approx(mean_ms, abs=5e-3)  # rounded to µs a stage
    flat = queries.stage_time_at(reader, window, Filters(), at, group_by=None)
    assert all(set(r) == {"stage", "self_ms", "share"} for r in flat["stages"])
    assert sum(r["self_ms"] for r in flat["stages"]) == pytest.approx(flat["traces"][""]["mean_ms"], abs=5e-3)


def test_traces_missing_from_the_table_are_read_whole(hand, engine):
    """Raw traces pruned while their rollups stay: the tail is the table's, still additive."""
    app, window = hand
    reader = app.extensions["modalscope"]["reader"]
    with engine.begin() as conn:
        slowest = conn.execute(Trace.__table__.select().where(Trace.input_type == "text")
                               .order_by(Trace.duration_ns.desc()).limit(1)).mappings().one()
        conn.execute(delete(Trace).where(Trace.trace_id == slowest["trace_id"]))
    got = queries.stage_time_at(reader, window, Filters(input_type="text"), "p99")
    splits = [split_of("text", i) for i in range(COUNTS["text"] - 1)]  # the slowest is gone
    durations = np.array([sum(s.values()) for s in splits], dtype=float)
    tail = durations[durations >= np.percentile(durations, 99)]
    assert got["traces"]["text"]["mean_ms"] == float(tail.mean())
    assert sum(r["self_ms"] for r in got["stages"]) == float(tail.mean())


def test_api_at_and_its_measure_header(hand):
    app, window = hand
    client = app.test_client()
    span = f"start={window.start_ns // 10**9}&end={window.end_ns // 10**9}"
    r = client.get(f"/api/v1/stages?at=p99&group_by=input_type&{span}")
    assert r.status_code == 200 and r.headers["X-Modalscope-Measure"] == "trace-self-time-at-percentile"
    rows = r.get_json()
    assert rows and all(set(x) == {"input_type", "stage", "self_ms", "share"} for x in rows)
    _, mean_ms, _ = expected("image", 0.99)
    assert sum(x["self_ms"] for x in rows if x["input_type"] == "image") == mean_ms
    plain = client.get(f"/api/v1/stages?group_by=input_type&{span}")
    assert plain.headers["X-Modalscope-Measure"] == "span-duration-percentiles"
    assert set(plain.get_json()[0]) == {"input_type", "stage", "count", "p50_ms", "p95_ms", "p99_ms", "share"}
    for bad in ("p42", "P99", "99", "max"):
        r = client.get(f"/api/v1/stages?at={bad}&{span}")
        assert r.status_code == 400 and r.get_json()["parameter"] == "at", bad
        assert "p50" in r.get_json()["error"]


def test_page_stack_sums_to_the_api_total(hand):
    """The Stages page's callback, called as the browser calls it: the right-hand stack of
    each input type adds up to the API's mean end-to-end time of its tail traces."""
    app, window = hand
    client = app.test_client()
    client.get("/")
    outs = ["stages-stack.figure", "stages-timeseries.figure", "stages-vit.figure", "stages-table.children"]
    state = {"start": str(window.start_ns // 10**9), "end": str(window.end_ns // 10**9)}
    body = {"output": ".." + "...".join(outs) + "..",
            "outputs": [{"id": o.split(".")[0], "property": o.split(".")[1]} for o in outs],
            "inputs": [{"id": "stages-state", "property": "data", "value": state}],
            "changedPropIds": ["stages-state.data"], "state": []}
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200, r.get_data(as_text=True)[:500]
    fig = r.get_json()["response"]["stages-stack"]["figure"]
    api = client.get(f"/api/v1/stages?at=p99&start={state['start']}&end={state['end']}").get_json()
    bars = [d for d in fig["data"] if d["type"] == "bar" and d.get("xaxis") == "x2"]
    total = [d for d in fig["data"] if d["type"] == "scatter" and d.get("xaxis") == "x2"]
    assert len(total) == 1 and total[0]["mode"] == "markers+text"
    unit = 1000.0 if "(s)" in fig["layout"]["yaxis"]["title"]["text"] else 1.0
    for col, it in enumerate(bars[0]["x"]):
        stack = sum(b["y"][col] for b in bars) * unit
        want = sum(x["self_ms"] for x in api if x["input_type"] == it)
        assert stack == pytest.approx(want, rel=1e-9)
        assert total[0]["y"][col] * unit == pytest.approx(want, rel=1e-9)
    assert "P99" in fig["layout"]["annotations"][1]["text"] and "not additive" in fig["layout"]["annotations"][0]["text"]
    assert "span P99" in r.get_data(as_text=True)
