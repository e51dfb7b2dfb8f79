"""The convention rollups the attribute-based detectors read (``cache``, ``batch``, ``cuda``,
``sync``, ``inst`` series, written at settle time): what settling stores, a late span's
re-settle, the cache-tag cardinality cap, retag and retention, and the detectors finding the
same patterns from the stored rollups as from raw spans. Names are deliberately not the
demo's; every storage test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import func, select

from modalscope.app import detectors as d
from modalscope.app import findings
from modalscope.app.params import Window
from modalscope.core.spans import SpanRecord
from modalscope.ingest.settle import CACHE_TAG_VALUES, settle
from modalscope.ingest.writer import write_spans
from modalscope.models import Rollup, Series
from modalscope.models.reader import AttributeReader, RollupReader, StoreReader

MIN = d.NS_MIN
MS = 1_000_000
T0 = 29_000_000  # unix minutes
TH = d.Thresholds()


def _rec(trace: int, span: int, parent: int | None, service: str, name: str, kind: int, start_ns: int, dur_ms: float,
         stage: str = "other", instance: str = "i-1", **attrs) -> SpanRecord:
    return SpanRecord(f"{trace:032x}", f"{span:016x}", None if parent is None else f"{parent:016x}", service, name,
                      kind, start_ns, start_ns + int(dur_ms * MS), attributes=attrs,
                      resource={"service.name": service, "service.instance.id": instance}, stage=stage)


def convention_trace(i: int, start_ns: int, *, tier: str = "gold", hit: bool = True, batch=4, graph="captured",
                     spread_ms: float = 10, instance: str = "w-1") -> list[SpanRecord]:
    """A request: a SERVER root, a cache lookup, two encoders (in two services) before a
    fusion step, and a GPU step with a batch size and a CUDA Graph mode (names the default
    stage rules give the stages used here, so a retag changes nothing)."""
    root = _rec(i, 1, None, "front", "Handle", 2, start_ns, 900, instance=instance)
    return [
        root,
        _rec(i, 2, 1, "front", "kv.get", 3, start_ns + 1 * MS, 2, stage="network", instance=instance,
             **{"cache.name": "kv", "cache.hit": hit, "tier": tier}),
        _rec(i, 3, 1, "enc-a", "EncA/Encode", 2, start_ns + 5 * MS, 300, stage="encoder", instance=instance),
        _rec(i, 4, 1, "enc-b", "EncB/Encode", 2, start_ns + 5 * MS, 300 - spread_ms, stage="encoder", instance=instance),
        _rec(i, 5, 1, "fuse", "Fusion", 2, start_ns + 310 * MS, 40, stage="fusion", instance=instance),
        _rec(i, 6, 1, "gpu", "Generate", 1, start_ns + 360 * MS, 100, stage="inference", instance=instance,
             **{"batch.size": batch, "gpu.cuda_graph": graph}),
    ]


def convention_rows(engine, kind: str) -> dict[tuple, tuple[int, int, int]]:
    """(service, name, caller, callee, minute) -> (count, error_count, sum_ns) of one kind."""
    with engine.connect() as conn:
        q = (select(Series.service, Series.name, Series.caller, Series.callee, Rollup.minute, Rollup.count,
                    Rollup.error_count, Rollup.sum_ns)
             .join(Series, Series.id == Rollup.series_id).where(Series.kind == kind))
        return {tuple(r[:5]): tuple(r[5:]) for r in conn.execute(q)}


def test_settle_writes_the_convention_rollups_and_a_late_span_corrects_them(engine):
    base = T0 * MIN
    traces = [convention_trace(1, base, tier="gold", hit=True, batch=1, graph="fallback", spread_ms=80),
              convention_trace(2, base + 1_000 * MS, tier="free", hit=False, batch=4, spread_ms=20),
              convention_trace(3, base + MIN, tier="free", hit=True, batch="8", instance="w-2")]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    cache = convention_rows(engine, "cache")
    assert cache == {("front", "kv", "tier", "gold", T0): (1, 0, 2 * MS),
                     ("front", "kv", "tier", "free", T0): (1, 1, 2 * MS),
                     ("front", "kv", "tier", "free", T0 + 1): (1, 0, 2 * MS),
                     # the cache's TOTAL series: every lookup once
                     ("front", "kv", "", "", T0): (2, 1, 4 * MS),
                     ("front", "kv", "", "", T0 + 1): (1, 0, 2 * MS)}
    assert convention_rows(engine, "batch") == {("gpu", "", "", "", T0): (2, 1, 5),
                                               ("gpu", "", "", "", T0 + 1): (1, 0, 8)}
    assert convention_rows(engine, "cuda") == {("gpu", "Generate", "", "fallback", T0): (1, 1, 100 * MS),
                                              ("gpu", "Generate", "", "captured", T0): (1, 0, 100 * MS),
                                              ("gpu", "Generate", "", "captured", T0 + 1): (1, 0, 100 * MS)}
    assert convention_rows(engine, "sync") == {("fuse", "", "", "", T0): (2, 0, 100 * MS),
                                              ("fuse", "", "", "", T0 + 1): (1, 0, 10 * MS)}
    inst = convention_rows(engine, "inst")
    assert inst[("front", "w-1", "", "", T0)] == (2, 0, 1800 * MS)  # a trace's first span on an instance
    assert inst[("enc-a", "w-2", "", "", T0 + 1)] == (1, 0, 300 * MS)
    # A late span re-opens trace 2: its lookup was a miss by another tier, and a third
    # encoder finishes later. The re-settle takes back the old contributions exactly.
    late = [_rec(2, 7, 1, "front", "kv.get", 3, base + 1_050 * MS, 2, stage="network",
                 **{"cache.name": "kv", "cache.hit": False, "tier": "gold"}),
            _rec(2, 8, 1, "enc-c", "EncC", 2, base + 1_005 * MS, 350, stage="encoder")]
    write_spans(engine, late)
    settle(engine, force=True)
    cache = convention_rows(engine, "cache")
    assert cache[("front", "kv", "tier", "gold", T0)] == (2, 1, 4 * MS)
    assert cache[("front", "kv", "tier", "free", T0)] == (1, 1, 2 * MS)
    assert cache[("front", "kv", "", "", T0)] == (3, 2, 6 * MS)
    assert convention_rows(engine, "sync")[("fuse", "", "", "", T0)] == (2, 0, 80 * MS + 70 * MS)
    assert convention_rows(engine, "batch")[("gpu", "", "", "", T0)] == (2, 1, 5)


def test_a_cache_tag_with_too_many_values_overflows_into_one_series(engine):
    base = T0 * MIN
    spans = []
    n = CACHE_TAG_VALUES + 8
    for i in range(n):
        spans.append(_rec(i + 1, 1, None, "front", "kv.get", 3, base + i * 10 * MS, 1,
                          **{"cache.name": "kv", "cache.hit": i % 2 == 0, "user": f"u{i:03d}", "tier": "gold"}))
    write_spans(engine, spans[: n // 2])
    settle(engine, force=True)  # two settles: the cap holds across batches
    write_spans(engine, spans[n // 2:])
    settle(engine, force=True)
    rows = convention_rows(engine, "cache")
    users = {k[3] for k in rows if k[2] == "user"}
    assert len(users) == CACHE_TAG_VALUES + 1 and "" in users
    assert sum(v[0] for k, v in rows.items() if k[2] == "user") == n  # every lookup still counted
    assert sum(v[0] for k, v in rows.items() if k[2] == "tier") == n
    frames = findings.load_frames(StoreReader(engine), Window(base, base + 10 * MIN), TH)
    assert set(frames.cache["key"]) == {"user", "tier"}
    assert d.detect_cache_penetration(frames, TH) == []  # an overflowed key is no cache-key tag


def pattern_traces(seed: int = 5) -> list[SpanRecord]:
    """An hour of requests, 20 a minute: from minute 30 to 45 the free tier's cache hit rate
    collapses while gold dominates, batch sizes stick at 1 under double load, a third of the
    GPU steps fall back from CUDA Graphs, and encoders finish 200 ms apart."""
    rng = random.Random(seed)
    spans: list[SpanRecord] = []
    i = 0
    for m in range(60):
        inside = 30 <= m < 45
        for k in range(40 if inside else 20):
            i += 1
            t = (T0 + m) * MIN + k * 1_000 * MS
            tier = "gold" if rng.random() < (0.7 if inside else 0.4) else "free"
            hit = rng.random() < (0.05 if inside and tier == "free" else 0.9)
            fallback = inside and rng.random() < 0.3
            spans += convention_trace(i, t, tier=tier, hit=hit, batch=1 if inside else 4 + i % 3,
                                      graph="fallback" if fallback else "captured",
                                      spread_ms=200 if inside else 5 + rng.random() * 5)
    return spans


def raw_frames(spans: list[SpanRecord], traces: pd.DataFrame, window: Window) -> d.Frames:
    rows = [{"trace_id": s.trace_id, "service": s.service, "name": s.name, "kind": s.kind, "stage": s.stage,
             "start_ns": s.start_ns, "duration_ns": s.end_ns - s.start_ns, "status": s.status,
             "instance": s.resource.get("service.instance.id"), "attrs": s.attributes} for s in spans]
    return d.Frames(window.start_ns, window.end_ns, window.start_ns - 60 * MIN,
                    spans=pd.DataFrame(rows).sort_values("start_ns", kind="stable"), traces=traces)


KINDS = ("cache_penetration", "batching_failure", "cuda_graph_fallback", "fusion_sync_wait")


def test_detectors_find_the_same_from_stored_rollups_as_from_raw_spans(engine):
    spans = pattern_traces()
    write_spans(engine, spans)
    settle(engine, force=True)
    window = Window(T0 * MIN, (T0 + 60) * MIN)
    reader = StoreReader(engine)
    found = findings.find(reader, window, th=TH)
    frames = findings.load_frames(reader, window, TH)
    assert frames.spans.empty  # nothing read raw: no new instance here
    from_raw = [f for f in d.run_all(raw_frames(spans, frames.traces, window), TH) if f.kind in KINDS]
    from_rollups = [f for f in found if f.kind in KINDS]
    assert sorted(f.kind for f in from_rollups) == sorted(KINDS)

    def key(f):
        return f.kind, repr(f.subject.to_json()), f.start, f.end

    assert sorted(map(key, from_rollups)) == sorted(map(key, from_raw))
    for a, b in zip(sorted(from_rollups, key=key), sorted(from_raw, key=key)):
        assert a.evidence["sample_count"] == b.evidence["sample_count"]
        for name, value in a.evidence.items():  # sketch medians within the sketch's error
            assert value == pytest.approx(b.evidence[name], rel=0.02), (a.kind, name)
        assert 1 <= len(a.exemplar_trace_ids) <= 5  # from a bounded raw read of the window
    by_kind = {f.kind: f for f in from_rollups}
    cache = by_kind["cache_penetration"]
    assert cache.subject.to_json() == {"cache": "kv", "attribute": {"key": "tier", "value": "free"}}
    misses = {s.trace_id for s in spans if s.attributes.get("tier") == "free" and not s.attributes.get("cache.hit")}
    assert set(cache.exemplar_trace_ids) <= misses
    assert "instance w-1" in by_kind["cuda_graph_fallback"].hint


def test_raw_spans_read_around_a_new_instance_change_no_finding_from_the_rollups(engine):
    """Beside the convention rollups, ``frames.spans`` holds only the SERVER spans read around
    new instances (without attributes): the attribute detectors' evidence and hints stay the
    rollups' (a CUDA Graph fallback's extra latency was None on a day with a cold start)."""
    spans = pattern_traces()
    write_spans(engine, spans)
    settle(engine, force=True)
    window = Window(T0 * MIN, (T0 + 60) * MIN)
    frames = findings.load_frames(StoreReader(engine), window, TH)
    around_birth = raw_frames([s for s in spans if s.kind == 2], frames.traces, window).spans.assign(
        attrs=lambda df: [{} for _ in range(len(df))])
    plain = [f for f in d.run_all(frames, TH) if f.kind in KINDS]
    with_raw = [f for f in d.run_all(dataclasses.replace(frames, spans=around_birth), TH) if f.kind in KINDS]
    assert sorted(f.kind for f in plain) == sorted(KINDS)
    assert with_raw == plain
    (cuda,) = [f for f in with_raw if f.kind == "cuda_graph_fallback"]
    assert cuda.evidence["extra_latency_ratio"] is not None


def test_attribute_findings_read_a_bounded_number_of_raw_spans_for_exemplars(engine, monkeypatch):
    """An attribute finding's exemplars come from at most EXEMPLAR_MAX_SPANS raw spans, the
    earliest of its window (a flood puts millions in five minutes): with a bound of 40, every
    exemplar is a trace among the window's first 40 matching spans, and still one that
    shows the finding."""
    spans = pattern_traces()
    write_spans(engine, spans)
    settle(engine, force=True)
    window = Window(T0 * MIN, (T0 + 60) * MIN)
    reader = StoreReader(engine)
    read: list[int] = []
    real = reader.attributes.spans
    monkeypatch.setattr(reader.attributes, "spans", lambda *a, **k: read.append(len(rows := real(*a, **k))) or rows)
    monkeypatch.setattr(findings, "EXEMPLAR_MAX_SPANS", 40)
    found = {f.kind: f for f in findings.find(reader, window, th=TH) if f.kind in KINDS}
    assert sorted(found) == sorted(KINDS) and read and max(read) <= 40
    for kind, key in (("cache_penetration", "cache.name"), ("batching_failure", "batch.size"),
                      ("cuda_graph_fallback", "gpu.cuda_graph")):
        f = found[kind]
        start = f.start if isinstance(f.start, int) else findings.finding_window(f).start_ns
        first = sorted((s for s in spans if key in s.attributes and s.start_ns >= start
                        and (kind == "cache_penetration" or s.service == f.subject.service)),
                       key=lambda s: s.start_ns)[:40]
        assert f.exemplar_trace_ids and set(f.exemplar_trace_ids) <= {s.trace_id for s in first}, kind
    misses = {s.trace_id for s in spans if s.attributes.get("tier") == "free" and not s.attributes.get("cache.hit")}
    assert set(found["cache_penetration"].exemplar_trace_ids) <= misses
    monkeypatch.setattr(findings, "EXEMPLAR_MAX_SPANS", 1_000_000)
    read.clear()
    findings.find(reader, window, th=TH)
    assert max(read) > 40  # without the bound the same look-ups read more


def test_exemplar_look_ups_start_with_the_findings_first_minute(engine, monkeypatch):
    """Each look-up reads the finding's first minute first and widens (five minutes, then the
    whole window) only while it has fewer than MAX_EXEMPLARS: a finding whose first minute
    shows five is never read further; one that needs more is widened."""
    spans = pattern_traces()
    write_spans(engine, spans)
    settle(engine, force=True)
    window = Window(T0 * MIN, (T0 + 60) * MIN)
    reader = StoreReader(engine)
    reads: dict[str, list[int]] = {}
    real = findings._exemplar_rows

    def spy(r, f, w):
        out = real(r, f, w)
        reads.setdefault(f.kind, []).append((w.end_ns - w.start_ns, len(out)))
        return out
    monkeypatch.setattr(findings, "_exemplar_rows", spy)
    found = {f.kind: f for f in findings.find(reader, window, th=TH)}
    assert set(reads) >= {"cache_penetration", "batching_failure", "cuda_graph_fallback"}
    for kind, seen in reads.items():
        assert seen[0][0] == MIN, (kind, seen)  # the first minute first
        for (_, got), (longer, _) in zip(seen, seen[1:]):
            assert got < d.MAX_EXEMPLARS and longer > MIN  # widened only while short of exemplars
        if seen[0][1] >= d.MAX_EXEMPLARS:
            assert len(seen) == 1
        assert found[kind].exemplar_trace_ids
    assert any(len(seen) == 1 for seen in reads.values())


def _new_instance_spans() -> list[SpanRecord]:
    """70 minutes of one service: instance p-4 appears at minute 40 and is 20x slower for two
    minutes; p-3 appears at minute 20 at full speed (a restart)."""
    rng = random.Random(3)
    spans = []
    i = 0
    for m in range(70):
        for k in range(12):
            i += 1
            t = (T0 + m) * MIN + k * 5_000 * MS
            pods = ["p-1", "p-2"] + (["p-3"] if m >= 20 else []) + (["p-4"] if m >= 40 else [])
            pod = pods[i % len(pods)]
            dur = 100 * np.exp(0.1 * rng.gauss(0, 1)) * (20 if pod == "p-4" and m < 42 else 1)
            spans.append(_rec(i, 1, None, "model", "Serve", 2, t, dur, stage="inference", instance=pod))
    return spans


def test_cold_start_from_instance_rollups_reads_raw_spans_only_around_the_birth(engine):
    """A new instance appears at minute 40: requests on it are 20x slower for two minutes.
    Another appears at minute 20 at full speed (a restart): no raw read for it."""
    write_spans(engine, _new_instance_spans())
    settle(engine, force=True)
    reader = StoreReader(engine)
    window = Window((T0 + 10) * MIN, (T0 + 70) * MIN)
    th = dataclasses.replace(TH, baseline_minutes=30)
    frames = findings.load_frames(reader, window, th)
    assert frames.new_instances == {("model", "p-4")}
    assert frames.spans["start_ns"].min() >= (T0 + 40) * MIN  # only around the birth
    (f,) = [f for f in findings.find(reader, window, th=th) if f.kind == "cold_start"]
    assert f.subject.to_json() == {"service": "model", "attribute": {"key": "service.instance.id", "value": "p-4"}}
    assert f.start == d.rfc3339((T0 + 40) * MIN) and f.end <= d.rfc3339((T0 + 43) * MIN)
    assert f.evidence["ratio"] > 10 and len(f.exemplar_trace_ids) == 5


def test_a_cold_start_check_a_stored_evaluation_made_is_not_read_again(engine, monkeypatch):
    """A new window takes the cold-start verdict of a stored evaluation that checked the same
    birth (its raw spans are not read again) while no logged write touched that birth's
    minutes; an evaluation that did not see the birth, or a write since, and it is read."""
    from sqlalchemy import update

    from modalscope.app import evaluations as ev
    from modalscope.models import RollupChange, changes
    from modalscope.models.reader import Filters

    write_spans(engine, _new_instance_spans())
    settle(engine, force=True)
    with engine.begin() as conn:  # as if settled ten minutes ago (CHANGE_MARGIN_S)
        conn.execute(update(RollupChange).values(changed_ns=RollupChange.changed_ns - 600 * 10**9))
    reader = StoreReader(engine)
    th = dataclasses.replace(TH, baseline_minutes=30)
    reads = []
    real = AttributeReader.spans
    monkeypatch.setattr(AttributeReader, "spans",
                        lambda self, *a, **k: reads.append(k.get("service")) or real(self, *a, **k))
    checked = []  # the minutes of instance rollups read after births
    real_inst = RollupReader.rows_by_service
    monkeypatch.setattr(RollupReader, "rows_by_service", lambda self, kind, ranges, *a, **k: checked.extend(
        r for rs in ranges.values() for r in rs) or real_inst(self, kind, ranges, *a, **k))

    def cold_starts(window):
        return [f for f in ev.find_for(reader, window, Filters(), th, relative=False).findings
                if f.kind == "cold_start"]

    # A window ending before the birth stores nothing to take: the next one reads.
    cold_starts(Window((T0 + 5) * MIN, (T0 + 39) * MIN))
    reads.clear()
    first = cold_starts(Window((T0 + 10) * MIN, (T0 + 70) * MIN))
    assert reads == ["model"] and len(first) == 1
    exact = [f for f in findings.find(reader, Window((T0 + 12) * MIN, (T0 + 70) * MIN), th=th)
             if f.kind == "cold_start"]
    reads.clear()
    checked.clear()
    assert cold_starts(Window((T0 + 12) * MIN, (T0 + 70) * MIN)) == exact == first and reads == []
    # nor the instance rollups after p-4's birth (p-1 and p-2, first seen when the data
    # begins, are births only to a window whose look-back starts earlier: they are read)
    assert not any(a <= T0 + 40 < b for a, b in checked)
    # A write logged over the birth's minutes since: read again, the same finding.
    with engine.begin() as conn:
        changes.record(conn, T0 + 41, T0 + 41)
    assert cold_starts(Window((T0 + 14) * MIN, (T0 + 70) * MIN)) == exact and reads == ["model"]


def test_retention_and_retag_keep_the_convention_rollups_consistent(engine):
    from modalscope.ingest.retag import retag
    from modalscope.ingest.retention import RetentionPolicy, prune
    from modalscope.ingest.rules_file import default_rules

    write_spans(engine, pattern_traces()[:600])
    settle(engine, force=True)
    before = {k: convention_rows(engine, k) for k in ("cache", "batch", "cuda", "sync", "inst")}
    assert all(before.values())
    retag(engine, default_rules())
    assert {k: convention_rows(engine, k) for k in before} == before  # rebuilt to the same numbers
    policy = RetentionPolicy(span_days=1, minute_rollup_days=1, hourly_rollup_days=1)
    prune(engine, policy, now_ns=(T0 + 3 * 24 * 60) * MIN)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Rollup)).scalar_one() == 0


def test_the_pair_sketches_the_reader_hands_on_are_the_frames_rows(engine):
    """``load_frames`` passes the pair rollups' decoded sketches on as flat arrays
    (``Frames.pair_sketches``), not as a column a row; they are exactly the rows' keys and
    counts, in row order, so the pair detectors cut each pair's entries and merge any of
    its rows from them."""
    from tests.app.conftest import side_calls_trace
    from tests.factories import multimodal_trace

    rng = random.Random(6)
    base = T0 * MIN
    spans = [s for i in range(40) for s in multimodal_trace(rng, base + i * 7_000_000_000, images=1 + i % 3)]
    spans += [s for i in range(40) for s in side_calls_trace(rng, base + i * 7_000_000_000 + 3_000_000_000,
                                                              db_ms=3 + i, llm_ms=100 + i)]
    write_spans(engine, spans)
    settle(engine, force=True)
    reader = StoreReader(engine)
    frames = findings.load_frames(reader, Window(base, base + 10 * MIN), TH)
    assert len(frames.pairs) >= 8 and frames.pairs[["caller", "callee"]].drop_duplicates().shape[0] >= 2
    assert "keys" not in frames.pairs.columns
    # The same rows with a sketch column a row, as hand-made frames have them.
    full = findings._columns_frame(*reader.rollups.columns("pair", frames.data_start_ns, frames.end_ns,
                                                           ("caller", "callee")), ("caller", "callee"), with_sum=False)
    assert full.drop(columns=["keys", "counts"]).equals(frames.pairs)
    lens, keys, counts = frames.pair_sketches
    want = d._flat_sketches(full["keys"], full["counts"])
    assert np.array_equal(lens, want[0]) and np.array_equal(keys, want[1]) and np.array_equal(counts, want[2])
    for key, g in frames.pairs.groupby(["caller", "callee"]):
        rows = full.loc[g.index]
        cut = d._pair_flats(frames)[key]
        assert all(np.array_equal(x, y) for x, y in zip(cut, d._flat_sketches(rows["keys"], rows["counts"])))
        for sel in (g["minute"].to_numpy() % 2 == 0, g["minute"].to_numpy() >= 0, g["minute"].to_numpy() < 0):
            got = d._pair_rows_histogram(frames, g, sel)
            assert np.array_equal(got.counts, d.histogram_of(rows["keys"].to_numpy()[sel],
                                                             rows["counts"].to_numpy()[sel]).counts)
            assert np.array_equal(got.counts, d._pair_rows_histogram(frames, rows, sel).counts)


@pytest.mark.slow
def test_reads_in_threads_find_what_they_find_one_after_another(engine, monkeypatch):
    """On PostgreSQL the exemplar look-ups run a few at a time, and the pair rollups are read
    beside the other frames: each finding gets the same exemplars (and attribute findings the
    same evidence) as when they run one after another, in the same order of findings, and the
    frames give the same findings; here on both databases."""
    import copy
    import threading
    import time as _time

    from modalscope.ingest import demo

    now = _time.time_ns() // MIN * MIN
    demo.fill(engine, demo.DemoConfig(now_ns=now, hours=1.0, rate=0.15))
    settle(engine, force=True)
    reader = StoreReader(engine)
    found = findings.find(reader, Window(now - 60 * MIN, now), exemplars=False)
    # the demo's patterns: several findings, rollup- and attribute-based, whose look-ups read raw spans
    assert len(found) >= 3 and any(f.kind in d.ATTRIBUTE_KINDS for f in found)
    assert sum(not f.exemplar_trace_ids for f in found) >= 3
    serial, threaded = copy.deepcopy(found), copy.deepcopy(found)
    monkeypatch.setattr(findings, "THREADED_DIALECTS", frozenset())
    findings.add_exemplars(reader, serial)
    looked_up_in: set[str] = set()
    real = findings._exemplar_rows

    def watched(*a, **k):
        looked_up_in.add(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(findings, "_exemplar_rows", watched)
    monkeypatch.setattr(findings, "THREADED_DIALECTS", frozenset({engine.dialect.name}))
    findings.add_exemplars(reader, threaded)
    assert threaded == serial and any(f.exemplar_trace_ids for f in serial)
    assert looked_up_in and all(name.startswith("exemplars") for name in looked_up_in)

    # The frames: the pairs read in a thread of their own beside the rest, the same findings.
    window = Window(now - 60 * MIN, now)
    monkeypatch.setattr(findings, "THREADED_DIALECTS", frozenset())
    alone = d.run_all(findings.load_frames(reader, window, TH), TH)
    pair_reads: list[str] = []
    real_columns = RollupReader.columns
    monkeypatch.setattr(RollupReader, "columns", lambda self, kind, *a, **k: (
        pair_reads.append(threading.current_thread().name) if kind == "pair" else None)
        or real_columns(self, kind, *a, **k))
    monkeypatch.setattr(findings, "THREADED_DIALECTS", frozenset({engine.dialect.name}))
    beside = d.run_all(findings.load_frames(reader, window, TH), TH)
    assert alone and beside == alone
    assert len(pair_reads) == 1 and pair_reads[0].startswith("frames")


@pytest.mark.slow
def test_the_pair_detectors_find_the_same_with_shared_minute_matrices_as_without(engine, monkeypatch):
    """The hot-spot and band-break detectors share each pair's minute matrix when all fit in
    ``SHARED_MATRICES_BYTES`` (hot spot sums it into blocks), else build their own a pair at a
    time: the same findings either way."""
    from modalscope.ingest import demo

    # a fixed afternoon: the demo's daily volume curve puts too few calls near midnight
    now = 1_764_867_600 * 1_000_000_000  # 2025-12-04 17:00 UTC
    demo.fill(engine, demo.DemoConfig(now_ns=now, hours=1.5, rate=0.15, seed=4))
    settle(engine, force=True)
    reader = StoreReader(engine)
    frames = findings.load_frames(reader, Window(now - 90 * MIN, now), TH)
    shared = d.detect_hot_spot(frames, TH) + d.detect_p99_band_break(frames, TH)
    assert d._pair_minute_matrices(frames) is not None, "a demo hour and a half fits: shared"
    assert {f.kind for f in shared} == {"hot_spot", "p99_band_break"}, "the demo's pair patterns"
    blocks = d._blocks(frames, TH)
    mats = {key: (d._pair_minute_matrices(frames)[key], d._pair_block_matrix(frames, key, blocks, TH))
            for key in d._pair_series(frames)}
    monkeypatch.setattr(d.pairs, "SHARED_MATRICES_BYTES", 0)
    alone = dataclasses.replace(frames)  # (no caches)
    assert d._pair_minute_matrices(alone) is None
    for key, g in d._pair_series(alone).items():  # the same arrays, cell for cell
        assert np.array_equal(mats[key][0], d._pair_minute_matrix(alone, g, d._pair_flats(alone)[key]))
        assert np.array_equal(mats[key][1], d._pair_block_matrix(alone, key, blocks, TH))
    assert d.detect_hot_spot(alone, TH) + d.detect_p99_band_break(alone, TH) == shared
