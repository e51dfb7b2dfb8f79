"""The anomaly catalog's detectors on small hand-made frames: each fires on its pattern and
stays quiet on the negatives docs/design.md names (few samples, one outlier, the daily volume
curve). Service and span names are deliberately not the demo's."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from modalscope.app import detectors as d
from modalscope.models import sketch

MIN = d.NS_MIN
T0 = 29_000_000  # unix minutes (2025)
MS = 1_000_000


def sparse(values_ns):
    k, c = np.unique(sketch.keys_of(np.asarray(values_ns, dtype=float)), return_counts=True)
    return k.astype(np.int32), c.astype(np.int32)


def pair_rows(caller, callee, per_minute):
    """per_minute: {minute offset: list of durations in ms}."""
    rows = []
    for m, vals in per_minute.items():
        if len(vals):
            k, c = sparse(np.asarray(vals) * MS)
            rows.append({"caller": caller, "callee": callee, "minute": T0 + m, "count": len(vals), "errors": 0,
                         "keys": k, "counts": c})
    return rows


def frames(minutes=120, report_from=0, **kw):
    f = d.Frames(start_ns=(T0 + report_from) * MIN, end_ns=(T0 + minutes) * MIN, data_start_ns=T0 * MIN)
    for name, value in kw.items():
        setattr(f, name, value)
    return f


def lognormal(rng, n, median_ms, sigma=0.3):
    return [median_ms * np.exp(sigma * rng.gauss(0, 1)) for _ in range(n)]


TH = d.Thresholds()


# -- p99_band_break ---------------------------------------------------------------------
def band_frames(stall_from=None, stall_share=0.06, calls=60, single_outlier=False, curve=False, shift=1.0):
    rng = random.Random(3)
    per = {}
    for m in range(120):
        n = calls if not curve else int(calls * (0.5 + m / 60))
        vals = lognormal(rng, n, 100)
        if stall_from is not None and stall_from <= m < stall_from + 15:
            k = max(1, int(n * stall_share))
            vals[:k] = [3000 + rng.random() * 2000 for _ in range(k)]
        if shift != 1.0 and m >= 90:
            vals = [v * shift for v in vals]
        if single_outlier and m == 95:
            vals[0] = 50_000
        per[m] = vals
    return frames(pairs=pd.DataFrame(pair_rows("svc-a", "svc-b", per)))


def test_band_break_fires_with_its_window_and_frozen_baseline():
    (f,) = d.detect_p99_band_break(band_frames(stall_from=80), TH)
    assert f.kind == "p99_band_break" and f.subject.to_json() == {"caller": "svc-a", "callee": "svc-b"}
    assert f.start == d.rfc3339((T0 + 80) * MIN) and f.end == d.rfc3339((T0 + 95) * MIN)
    ev = f.evidence
    assert ev["p99_ms"] > 2 * ev["baseline_p99_ms"] and ev["p50_ms"] == pytest.approx(ev["baseline_p50_ms"], rel=0.25)
    assert ev["sample_count"] >= 15 * 60 and ev["baseline_minutes"] >= 30


@pytest.mark.parametrize("case", ["quiet", "single_outlier", "daily_curve", "few_samples", "all_slower",
                                  "no_baseline"])
def test_band_break_negatives(case):
    if case == "quiet":
        f = band_frames()
    elif case == "single_outlier":
        f = band_frames(single_outlier=True)
    elif case == "daily_curve":
        f = band_frames(curve=True)
    elif case == "few_samples":
        f = band_frames(stall_from=80, calls=1)
    elif case == "all_slower":  # P50 moves too: a shift, not a band break
        f = band_frames(shift=3.0)
    else:  # the stall starts before 30 minutes of baseline exist
        f = band_frames(stall_from=5)
        f.start_ns = f.data_start_ns
        f.pairs = f.pairs[f.pairs["minute"] < T0 + 40]
        f.end_ns = (T0 + 40) * MIN
    assert d.detect_p99_band_break(f, TH) == []


# -- hot_spot -----------------------------------------------------------------------------
def hot_frames(hot_p99=True, tied=False):
    rng = random.Random(5)
    rows = []
    for i in range(8):
        per = {}
        for m in range(10):
            n = 40 if i else 100
            median = 50 if i < 4 else 400
            if i == 0:
                median = 600 if hot_p99 else 5
            if tied:
                n = 40
            per[m] = lognormal(rng, n, median, 0.5)
        rows += pair_rows("front", f"back-{i}", per)
    return frames(minutes=10, pairs=pd.DataFrame(rows))


def test_hot_spot_is_top_quartile_of_volume_and_p99():
    found = d.detect_hot_spot(hot_frames(), TH)
    assert [f.subject.to_json() for f in found] == [{"caller": "front", "callee": "back-0"}]
    assert found[0].evidence["calls"] == 1000


@pytest.mark.parametrize("chunk", [1, 7, 50])
def test_band_break_compares_a_chunk_of_minutes_at_a_time_with_the_same_answer(monkeypatch, chunk):
    """A week of minutes is compared a day at a time (memory); any chunk gives the same."""
    whole = d.detect_p99_band_break(band_frames(stall_from=60), TH)
    assert whole
    monkeypatch.setattr(d.band_break, "BAND_CHUNK_MINUTES", chunk)
    assert d.detect_p99_band_break(band_frames(stall_from=60), TH) == whole


def test_block_matrices_are_the_minute_matrices_summed_into_blocks():
    """The hot spot builds each pair's blocks straight from its rows (no minute matrix kept:
    a week of minutes for every pair took a worker past 500 MB); the sums must be those of
    the band break's minute matrix, whatever the alignment of the data's first minute."""
    rng = random.Random(7)
    df = pd.DataFrame(pair_rows("a", "b", {m: lognormal(rng, rng.randint(0, 40), 50, 1.0) for m in range(3, 97)}))
    f = frames(minutes=97)
    f.data_start_ns = (T0 + 3) * MIN
    minutes = d._pair_minute_matrix(f, df)
    assert minutes.shape == (94, d.sketch.NUM_KEYS // d.COARSE) and minutes.sum() == df["count"].sum()
    blocks = d._blocks(f, TH)
    by_block = d._coarse_rows(df, (d._block_of(df["minute"].to_numpy(), TH) - blocks[0]) // TH.block_minutes,
                              len(blocks))
    minute_blocks = (d._block_of(np.arange(f.first_minute, f.end_minute), TH) - blocks[0]) // TH.block_minutes
    expected = np.zeros_like(by_block)
    np.add.at(expected, minute_blocks, minutes)
    assert (by_block == expected).all() and by_block.sum() == df["count"].sum()


def _hot_cells_one_by_one(counts, p99, min_samples):
    """The hot-spot rule cell by cell, as docs/design.md states it."""
    hot = np.zeros(counts.shape, dtype=bool)
    for j in range(counts.shape[1]):
        ok = counts[:, j] >= min_samples
        n = int(ok.sum())
        if n < 4:
            continue
        q = -(-n // 4)
        for i in np.flatnonzero(ok):
            hot[i, j] = ((counts[ok, j] >= counts[i, j] * (1 - d.VOLUME_TIE)).sum() <= q
                         and (p99[ok, j] >= p99[i, j]).sum() <= q)
    return hot


@pytest.mark.parametrize("chunk", [1, 50, 4_000_000])
def test_hot_cells_are_the_rule_cell_by_cell(monkeypatch, chunk):
    """All pairs against all pairs, some blocks at a time: ties within VOLUME_TIE, equal P99s,
    pairs under min_samples and blocks with fewer than 4 ranked pairs as the rule says."""
    monkeypatch.setattr(d.hot_spot, "HOT_CELLS_CHUNK", chunk)
    rng = np.random.default_rng(7)
    for n_pairs in (3, 4, 9, 23):
        counts = rng.choice([0, 5, 19, 20, 21, 22, 40, 100, 105], size=(n_pairs, 37)).astype(float)
        p99 = rng.choice([1e6, 2e6, 2e6, 5e6, 9e6], size=counts.shape)
        p99[counts == 0] = np.nan
        for min_samples in (0, 20, 50):
            want = _hot_cells_one_by_one(counts, p99, min_samples)
            assert (d._hot_cells(counts, p99, min_samples) == want).all(), (n_pairs, min_samples)
            if n_pairs >= 9 and min_samples == 20:
                assert want.any() and not want.all()


def test_coarse_quantiles_of_the_used_bins_are_those_of_all_bins():
    rng = np.random.default_rng(3)
    mat = np.zeros((50, sketch.NUM_KEYS // d.COARSE), dtype=np.int64)
    mat[:, 40:61] = rng.integers(0, 4, size=(50, 21))
    mat[7] = 0  # an empty row: nan
    for q in (0.0, 0.5, 0.99, 1.0):
        np.testing.assert_array_equal(d._coarse_quantile(mat[:, 40:61], q, 40), d._coarse_quantile(mat, q))


@pytest.mark.parametrize("kw", [{"hot_p99": False}, {"tied": True}])
def test_hot_spot_negatives(kw):
    # The busiest pair is fast; or every pair has the same volume (ties rank against).
    assert d.detect_hot_spot(hot_frames(**kw), TH) == []


# -- span-based detectors -------------------------------------------------------------------
def span(trace, service, name, kind, stage, start_ns, dur_ms, instance="i-1", **attrs):
    return {"trace_id": trace, "service": service, "name": name, "kind": kind, "stage": stage, "start_ns": start_ns,
            "duration_ns": int(dur_ms * MS), "status": 1, "instance": instance, "attrs": attrs}


def tid(i):
    return f"{i:032x}"


def cache_frames(collapse=True, n_per_min=30):
    rng = random.Random(1)
    rows = []
    i = 0
    for m in range(60):
        for _ in range(n_per_min):
            i += 1
            inside = collapse and 30 <= m < 45
            r = rng.random()
            tier = ("t-a" if r < (0.65 if inside else 0.4) else "t-b" if r < 0.8 else "t-c")
            hit = rng.random() < (0.08 if inside and tier == "t-c" else 0.85)
            rows.append(span(tid(i), "edge", "GET x", 3, "network", (T0 + m) * MIN + i, 1,
                             **{"cache.name": "kv", "cache.hit": hit, "tier": tier, "db.system": "redis"}))
    return frames(minutes=60, spans=pd.DataFrame(rows))


def test_cache_penetration_names_the_tag_value():
    (f,) = d.detect_cache_penetration(cache_frames(), TH)
    assert f.subject.to_json() == {"cache": "kv", "attribute": {"key": "tier", "value": "t-c"}}
    assert (f.start, f.end) == (d.rfc3339((T0 + 30) * MIN), d.rfc3339((T0 + 45) * MIN))
    assert f.evidence["hit_rate"] < 0.2 < 0.8 < f.evidence["dominant_hit_rate"]
    assert 1 <= len(f.exemplar_trace_ids) <= 5 and "tier=t-a" in f.hint


@pytest.mark.parametrize("kw", [{"collapse": False}, {"n_per_min": 2}])
def test_cache_penetration_negatives(kw):
    assert d.detect_cache_penetration(cache_frames(**kw), TH) == []


def sync_frames(spread_ms):
    rows = []
    for i in range(400):
        t = (T0 + i // 10) * MIN + i
        rows += [span(tid(i), "enc-1", "E1", 2, "encoder", t, 500),
                 span(tid(i), "enc-2", "E2", 2, "encoder", t, 500 - spread_ms),
                 span(tid(i), "fuse", "F", 2, "fusion", t + 500 * MS, 50)]
    return frames(minutes=40, spans=pd.DataFrame(rows))


def test_fusion_sync_wait():
    found = d.detect_fusion_sync_wait(sync_frames(200), TH)
    assert [f.subject.to_json() for f in found] == [{"service": "fuse", "stage": "fusion"}]
    assert found[0].evidence["median_spread_ms"] == pytest.approx(200)
    assert d.detect_fusion_sync_wait(sync_frames(12), TH) == []


def batch_frames(stuck, load):
    rows = []
    i = 0
    for m in range(60):
        inside = 30 <= m < 40
        for _ in range(int(20 * (load if inside else 1))):
            i += 1
            size = 1 if inside and stuck else 4 + i % 3
            rows.append(span(tid(i), "gpu-svc", "fwd", 1, "encoder", (T0 + m) * MIN + i, 30, **{"batch.size": size}))
    tr = pd.DataFrame([{"input_type": "x", "minute": T0 + m, "count": int(20 * (load if 30 <= m < 40 else 1)),
                        "errors": 0, "sum_ns": 1, "keys": np.zeros(0, np.int32), "counts": np.zeros(0, np.int32)}
                       for m in range(60)])
    return frames(minutes=60, spans=pd.DataFrame(rows), traces=tr)


def test_batching_failure_needs_high_load():
    (f,) = d.detect_batching_failure(batch_frames(True, 1.5), TH)
    assert f.subject.to_json() == {"service": "gpu-svc", "attribute": {"key": "batch.size", "value": 1}}
    assert (f.start, f.end) == (d.rfc3339((T0 + 30) * MIN), d.rfc3339((T0 + 40) * MIN))
    assert d.detect_batching_failure(batch_frames(True, 0.5), TH) == []  # low load: batch 1 is expected
    assert d.detect_batching_failure(batch_frames(False, 1.5), TH) == []


def fallback_frames(share):
    rows = []
    for i in range(1200):
        m = i // 20
        fb = 30 <= m < 40 and (i % 100) < share * 100
        rows.append(span(tid(i), "gen", "step", 1, "inference", (T0 + m) * MIN + i, 160 if fb else 100,
                         instance="p-2" if fb else "p-1", **{"gpu.cuda_graph": "fallback" if fb else "captured"}))
    return frames(minutes=60, spans=pd.DataFrame(rows))


def test_cuda_graph_fallback():
    (f,) = d.detect_cuda_graph_fallback(fallback_frames(0.3), TH)
    assert f.subject.to_json() == {"service": "gen", "attribute": {"key": "gpu.cuda_graph", "value": "fallback"}}
    assert f.evidence["extra_latency_ratio"] == pytest.approx(0.6) and "p-2" in f.hint
    assert d.detect_cuda_graph_fallback(fallback_frames(0.01), TH) == []


def lb_frames(n_piled, errors=True):
    rows = [{"trace_id": tid(i), "root_service": "front", "input_type": "multi_image",
             "start_ns": (T0 + 10 + i) * MIN, "duration_ns": int((29.9 + 0.01 * i) * 1e9), "error": errors}
            for i in range(n_piled)]
    rows += [{"trace_id": tid(100 + i), "root_service": "front", "input_type": "image",
              "start_ns": (T0 + i) * MIN, "duration_ns": int((10 + i) * 1e9), "error": False} for i in range(5)]
    return frames(minutes=60, long_traces=pd.DataFrame(rows))


def test_lb_timeout_truncation():
    (f,) = d.detect_lb_timeout_truncation(lb_frames(8), TH)
    assert f.severity == "critical" and f.subject.to_json() == {"service": "front", "input_type": "multi_image"}
    assert f.evidence["ceiling_s"] == 30 and len(f.exemplar_trace_ids) == 5
    assert d.detect_lb_timeout_truncation(lb_frames(3), TH) == []  # too few
    assert d.detect_lb_timeout_truncation(lb_frames(8, errors=False), TH) == []  # long, but not cut


def cold_frames(cold):
    rows = []
    rng = random.Random(2)
    for i in range(2000):
        t = (T0 + i // 40) * MIN + (i % 40) * 1_500_000_000
        inst = f"w-{i % 3}" if t < (T0 + 20) * MIN else f"w-{i % 4}"
        dur = 200 * np.exp(0.2 * rng.gauss(0, 1))
        if inst == "w-3" and cold and t < (T0 + 22) * MIN:
            dur += 3000
        rows.append(span(tid(i), "model", "Serve", 2, "inference", t, dur, instance=inst))
    return frames(minutes=50, spans=pd.DataFrame(rows))


def test_cold_start():
    (f,) = d.detect_cold_start(cold_frames(True), TH)
    assert f.subject.to_json() == {"service": "model", "attribute": {"key": "service.instance.id", "value": "w-3"}}
    assert f.start == d.rfc3339((T0 + 20) * MIN) and f.end <= d.rfc3339((T0 + 23) * MIN)
    assert d.detect_cold_start(cold_frames(False), TH) == []  # a new instance at speed: a restart


# -- rollup-based input-type detectors ------------------------------------------------------
def trace_frames(it, median_ms, slow_from=None, slow_factor=1.5, per_minute=20, pre_share=0.2, pre_jump=None):
    rng = random.Random(9)
    tr, ts = [], []
    for m in range(60):
        vals = lognormal(rng, per_minute, median_ms, 0.15)
        if slow_from is not None and slow_from <= m < slow_from + 15:
            vals = [v * slow_factor for v in vals]
        k, c = sparse(np.asarray(vals) * MS)
        total = int(sum(vals) * MS)
        tr.append({"input_type": it, "minute": T0 + m, "count": per_minute, "errors": 0, "sum_ns": total,
                   "keys": k, "counts": c})
        share = pre_jump if (pre_jump and 40 <= m < 50) else pre_share
        ts.append({"input_type": it, "stage": "preprocessing", "minute": T0 + m, "count": per_minute,
                   "sum_ns": int(total * share)})
    return frames(minutes=60, traces=pd.DataFrame(tr), tstage=pd.DataFrame(ts))


def test_baseline_regression_against_the_seed_table():
    (f,) = d.detect_baseline_regression(trace_frames("multi_image", 5000, slow_from=30), TH)
    assert f.subject.to_json() == {"input_type": "multi_image"} and f.severity == "critical"
    assert f.evidence["baseline_p95_ms"] == 6400 and f.evidence["p95_ms"] > 7040
    assert (f.start, f.end) == (d.rfc3339((T0 + 30) * MIN), d.rfc3339((T0 + 45) * MIN))
    # Within the SLO; and an input type with no baseline.
    assert d.detect_baseline_regression(trace_frames("multi_image", 5000), TH) == []
    assert d.detect_baseline_regression(trace_frames("audio", 50_000), TH) == []
    # Few samples: nothing, however slow.
    assert d.detect_baseline_regression(trace_frames("text", 300, slow_from=30, per_minute=1), TH) == []
    # A configured baseline wins.
    th = d.Thresholds(baseline="multi_image:3000:4000")
    assert d.detect_baseline_regression(trace_frames("multi_image", 5000), th)


def test_preprocessing_bound():
    (f,) = d.detect_preprocessing_bound(trace_frames("image", 1300, pre_jump=0.45), TH)
    assert f.subject.to_json() == {"input_type": "image", "stage": "preprocessing"}
    assert f.evidence["share"] == pytest.approx(0.45, abs=0.01)
    assert f.evidence["baseline_share"] == pytest.approx(0.2, abs=0.01)
    # A high but steady share is the input type's normal bottleneck, not a finding.
    assert d.detect_preprocessing_bound(trace_frames("image", 1300, pre_share=0.4), TH) == []


# -- the whole catalog ----------------------------------------------------------------------
def test_run_all_orders_by_severity_and_shapes_findings():
    f = band_frames(stall_from=80)
    f.long_traces = lb_frames(8).long_traces
    found = d.run_all(f, TH)
    assert [x.kind for x in found] == ["lb_timeout_truncation", "p99_band_break"] or \
        [x.severity for x in found] == sorted((x.severity for x in found), key=d.SEVERITY_ORDER.get)
    for x in found:
        assert list(x.to_json()) == ["kind", "severity", "subject", "start", "end", "evidence", "exemplar_trace_ids", "hint"]
        assert x.start.endswith("Z") and x.hint
        assert all(isinstance(v, (int, float)) or v is None for v in x.evidence.values())
    assert d.run_all(frames(), TH) == []  # nothing stored: nothing found


def test_thresholds_are_documented_settings():
    from dataclasses import fields

    from modalscope.settings import DOCUMENTED, SettingsError

    th = d.Thresholds.from_env({})
    assert th == d.Thresholds()
    for field in fields(d.Thresholds):
        assert d.SETTINGS[field.name] in DOCUMENTED
    assert d.Thresholds.from_env({"MODALSCOPE_DETECT_BAND_RATIO": "3"}).band_ratio == 3.0
    with pytest.raises(SettingsError, match="MODALSCOPE_DETECT_BASELINE_MINUTES"):
        d.Thresholds.from_env({"MODALSCOPE_DETECT_BASELINE_MINUTES": "10"})
    with pytest.raises(SettingsError, match="MODALSCOPE_DETECT_MIN_SAMPLES"):
        d.Thresholds.from_env({"MODALSCOPE_DETECT_MIN_SAMPLES": "many"})


@pytest.mark.parametrize("stored", ["in_time_order", "reversed", "through_index"])
def test_attribute_spans_reads_the_wanted_spans_in_start_order(engine, stored, monkeypatch):
    """The findings' raw read (``reader.attributes.spans``): SERVER/CONSUMER spans and
    spans carrying a convention key, attributes only on the latter, in start order whether
    row ids follow time (read by id range) or not (read through the start index)."""
    from modalscope.core.spans import SpanRecord
    from modalscope.ingest.writer import write_spans
    from modalscope.models.reader import attributes as reader_module
    from modalscope.models.reader import StoreReader

    if stored == "through_index":  # row ids too loose for an id-range read
        monkeypatch.setattr(reader_module, "ATTRIBUTE_SCAN_SLACK", 0)
    base = T0 * MIN
    spans = []
    for i in range(60):
        kind = (1, 2, 3, 5)[i % 4]
        attrs = {"cache.name": "c", "cache.hit": i % 3 == 0} if i % 5 == 0 else {"other.key": i}
        spans.append(SpanRecord(f"{i + 1:032x}", f"{i + 1:016x}", None, "svc-a", f"op{i % 3}", kind,
                                base + i * 1_000_000_000, base + i * 1_000_000_000 + 5 * MS,
                                attributes=attrs, resource={"service.name": "svc-a", "service.instance.id": "i-1"}))
    write_spans(engine, spans[::-1] if stored == "reversed" else spans)
    reader = StoreReader(engine)
    lo, hi = base + 10 * 1_000_000_000, base + 50 * 1_000_000_000
    rows = reader.attributes.spans(lo, hi, ("cache.name", "batch.size"), kinds=(2, 5))
    want = [s for s in spans if lo <= s.start_ns < hi and (s.kind in (2, 5) or "cache.name" in s.attributes)]
    assert [r[0] for r in rows] == [s.trace_id for s in want]
    assert [r[5] for r in rows] == sorted(r[5] for r in rows)
    for r, s in zip(rows, want):
        assert (r[1], r[2], r[3], r[6], r[8]) == ("svc-a", s.name, s.kind, 5 * MS, "i-1")
        assert (r[9] != "") == ("cache.name" in s.attributes)
    assert reader.attributes.spans(hi + 3600 * 10**9, hi + 7200 * 10**9, ("cache.name",), kinds=(2,)) == []


def test_thresholds_are_read_once_per_app(monkeypatch):
    from modalscope.app.detectors import Thresholds

    store: dict = {}
    first = Thresholds.kept_in(store)
    monkeypatch.setenv("MODALSCOPE_DETECT_MIN_SAMPLES", "999")
    assert Thresholds.kept_in(store) is first and first.min_samples == Thresholds().min_samples
    assert Thresholds.kept_in({}).min_samples == 999


@pytest.mark.parametrize("share,counted", [(1_000_000, 50_000), (2, 50_000), (1_000_000, 1), (2, 1)])
def test_attribute_spans_of_one_service_are_the_same_through_its_index(engine, share, counted, monkeypatch):
    """``service`` narrows the raw read to one service: through that service's span index
    when its spans are a small part of the window, else by scanning the window; same rows,
    same order, either way (ties of start time by row id). While the service's spans are few
    (``ATTRIBUTE_WALK_COUNTED``) the window's are counted only that far, not whole."""
    from sqlalchemy import event

    from modalscope.core.spans import SpanRecord
    from modalscope.ingest.writer import write_spans
    from modalscope.models.reader import attributes as reader_module
    from modalscope.models.reader import StoreReader

    monkeypatch.setattr(reader_module, "ATTRIBUTE_SERVICE_SHARE", share)
    monkeypatch.setattr(reader_module, "ATTRIBUTE_WALK_COUNTED", counted)
    base = T0 * MIN
    spans = []
    for i in range(240):
        service = ("svc-a", "svc-b", "svc-c", "svc-d", "svc-e", "svc-f")[i % 6]
        kind = (1, 2, 3, 5)[i % 4]
        attrs = {"batch.size": i % 7} if i % 3 == 0 else {}
        start = base + (i // 2) * 1_000_000_000  # pairs of spans share a start
        spans.append(SpanRecord(f"{i + 1:032x}", f"{i + 1:016x}", None, service, f"op{i % 3}", kind,
                                start, start + (i % 9 + 1) * 7 * MS, attributes=attrs,
                                resource={"service.name": service}))
    write_spans(engine, spans)
    reader = StoreReader(engine)
    lo, hi = base + 10 * 1_000_000_000, base + 100 * 1_000_000_000
    statements: list[str] = []
    listen = lambda conn, cursor, statement, *a: statements.append(statement)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listen)
    try:
        rows = reader.attributes.spans(lo, hi, ("batch.size",), kinds=(2,), service="svc-a")
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    everything = reader.attributes.spans(lo, hi, ("batch.size",), kinds=(2,))
    assert rows == [r for r in everything if r[1] == "svc-a"] and len(rows) >= 10
    through_index = any("duration_bucket IN" in s and "ORDER BY" in s for s in statements)
    assert through_index == (share == 2)  # svc-a holds a sixth of the window
    counted_whole = any("min(spans.id)" in s for s in statements)
    assert counted_whole == (share != 2 or counted == 1)
    assert reader.attributes.spans(lo, hi, ("batch.size",), kinds=(2,), service="svc-a", limit=4) == rows[:4]


def test_a_services_rollups_over_several_stretches_are_read_at_once(engine):
    """``reader.rollups.rows_by_service`` (new instances' first minutes): the rows of every
    stretch, overlapping ones once, in minute order, as the window reads give them."""
    from modalscope.core.spans import SpanRecord
    from modalscope.ingest.settle import settle
    from modalscope.ingest.writer import write_spans
    from modalscope.models.reader import Filters, StoreReader

    spans = []
    for i in range(90):
        svc = ("svc-a", "svc-b")[i % 2]
        start = (T0 + i // 3) * MIN + (i % 3) * 1_000_000_000
        spans.append(SpanRecord(f"{i + 1:032x}", f"{i + 1:016x}", None, svc, "op", 2, start, start + (i + 1) * MS,
                                resource={"service.name": svc, "service.instance.id": f"{svc}-{i % 4}"}))
    write_spans(engine, spans)
    settle(engine, force=True)
    reader = StoreReader(engine)
    stretches = [(T0 + 20, T0 + 24), (T0 + 2, T0 + 5), (T0 + 4, T0 + 8), (T0 + 40, T0 + 41)]
    got = reader.rollups.rows_by_service("inst", {"svc-a": stretches}, ("name",))["svc-a"]
    every = reader.rollups.rows("inst", T0 * MIN, (T0 + 30) * MIN, ("name",), Filters(service="svc-a"))
    want = [r for r in every if any(a <= r[0] < b for a, b in stretches)]
    assert [r[0] for r in got] == sorted(r[0] for r in got)
    assert sorted(got, key=repr) == sorted(want, key=repr)
    assert {r[0] for r in got} == set(range(T0 + 2, T0 + 8)) | set(range(T0 + 20, T0 + 24))
    assert {r[5] for r in got} == {"svc-a-0", "svc-a-2"}  # (svc-a's instances; none of svc-b's)
    assert reader.rollups.rows_by_service("inst", {"svc-a": []}, ("name",)) == {"svc-a": []}
    from modalscope.models.reader.rollups import merged_ranges
    assert merged_ranges([(5, 9), (1, 3), (3, 4), (8, 12), (20, 21)]) == [(1, 4), (5, 12), (20, 21)]


def test_counts_past_a_key_per_row_are_the_masked_sums():
    rng = np.random.default_rng(5)
    keys_col, counts_col = [], []
    for i in range(40):
        k = np.sort(rng.choice(4096, size=int(rng.integers(0, 12)), replace=False)).astype(np.int32)
        keys_col.append(k)
        counts_col.append(rng.integers(1, 1000, size=len(k)).astype(np.int32))
    for key in (0, 1000, 2048, 4095):
        want = [int(c[k > key].sum()) for k, c in zip(keys_col, counts_col)]
        assert d._counts_above(keys_col, counts_col, key).tolist() == want
    assert d._counts_above([], [], 5).tolist() == []
    none = [np.array([], dtype=np.int32)] * 2
    assert d._counts_above(none, none, 5).tolist() == [0, 0]


@pytest.mark.parametrize("cells", [sketch.NUM_KEYS, 3 * sketch.NUM_KEYS, 1 << 20])
def test_row_quantiles_are_each_rows_histogram_quantile(monkeypatch, cells):
    """``_row_quantiles`` (the fusion detector's block medians), some rows at a time, gives
    exactly ``histogram_of(...).quantile`` of each row's sketches; empty rows nan."""
    monkeypatch.setattr(d.sketches, "ROW_QUANTILE_CELLS", cells)
    rng = np.random.default_rng(11)
    n_rows, keys_col, counts_col, row_of = 9, [], [], []
    for i in range(60):
        k, c = sparse(rng.lognormal(16, 1.5, size=int(rng.integers(0, 40))))
        keys_col.append(k)
        counts_col.append(c)
        row_of.append(int(rng.choice([0, 1, 2, 4, 5, 6, 8])))  # rows 3 and 7 get nothing
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        got = d._row_quantiles(np.array(row_of), keys_col, counts_col, n_rows, q)
        for r in range(n_rows):
            mine = [i for i in range(60) if row_of[i] == r]
            want = d.histogram_of([keys_col[i] for i in mine], [counts_col[i] for i in mine]).quantile(q)
            assert (np.isnan(got[r]) if want is None else got[r] == want), (q, r)
    assert np.isnan(d._row_quantiles(np.array([], dtype=int), [], [], 3, 0.5)).all()


def _penetrated_block_by_block(stats, th):
    """The cache-penetration rule block by block (the detector's loop before it was vectorised)."""
    flagged = {}
    for blk, g in stats.groupby("block"):
        total = g["n"].sum()
        dom = g.loc[g["n"].idxmax()]
        share = dom["n"] / total
        if share < th.cache_dominant_share or dom["n"] < th.min_samples:
            continue
        dom_rate = dom["hits"] / dom["n"]
        for tag, n, hits in zip(g["tag"], g["n"], g["hits"]):
            if tag == dom["tag"] or n < th.min_samples:
                continue
            rate = hits / n
            if rate < (1 - th.cache_drop) * dom_rate:
                flagged.setdefault(tag, []).append((int(blk), str(dom["tag"]), rate, dom_rate, int(n), share))
    return flagged


def test_penetrated_blocks_are_the_rule_block_by_block():
    """All blocks at once: dominant value (first of equal volumes), its share and samples,
    the other values' hit rates, as the rule reads block by block."""
    rng = np.random.default_rng(2)
    th = d.Thresholds()
    rows = []
    for blk in range(0, 1000, 5):
        for tag in rng.choice(["bronze", "gold", "silver", "x"], size=int(rng.integers(1, 5)), replace=False):
            n = int(rng.choice([0, 5, 30, 30, 60, 200]))
            rows.append((blk, str(tag), n, int(rng.integers(0, n + 1)) if n else 0))
    stats = (pd.DataFrame(rows, columns=["block", "tag", "n", "hits"]).sort_values(["block", "tag"])
             .reset_index(drop=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        want = _penetrated_block_by_block(stats, th)
    assert len(want) >= 2 and sum(map(len, want.values())) > 5  # the data has what the rule is about
    assert d._penetrated(stats, th) == want
    assert d._penetrated(stats.iloc[:0], th) == {}


def test_coarse_rows_add_each_sketch_to_its_row_and_drop_rows_outside():
    rng = np.random.default_rng(9)
    rows_df = []
    for _ in range(30):
        k, c = sparse(rng.lognormal(17, 1.2, size=int(rng.integers(0, 30))))
        rows_df.append({"keys": k, "counts": c})
    df = pd.DataFrame(rows_df)
    nb = sketch.NUM_KEYS // d.COARSE
    for rows in (rng.integers(0, 7, size=30), rng.integers(-3, 10, size=30)):
        want = np.zeros((7, nb), dtype=np.int64)
        for r, k, c in zip(rows, df["keys"], df["counts"]):
            if 0 <= r < 7:
                np.add.at(want[r], k // d.COARSE, c)
        got = d._coarse_rows(df, rows, 7)
        assert got.dtype == np.int32 and (got == want).all()
    assert (d._coarse_rows(df.iloc[:0], np.array([], dtype=int), 4) == 0).all()


def test_pair_groups_are_a_sorted_group_by_of_caller_and_callee():
    """The pair detectors' groups (from runs of consecutive rows) are exactly pandas'
    ``groupby(["caller", "callee"], sort=True)``: the same keys in the same order, the same
    sub-frames with their index, the same positions; in runs as the reader gives them,
    interleaved row by row, and with a row lacking its callee (grouped nowhere)."""
    rng = np.random.default_rng(11)
    names = [("gw", "vision"), ("gw", "auth"), ("api", "db"), ("gw", "vision-enc"), ("api", "cache")]
    rows = [{"caller": c, "callee": e, "minute": T0 + m, "count": int(rng.integers(1, 9))}
            for c, e in names for m in range(40)]
    runs = pd.DataFrame(rows)
    for df in (runs, runs.sample(frac=1, random_state=3).reset_index(drop=True),
               pd.concat([runs, pd.DataFrame([{"caller": "gw", "callee": None, "minute": T0, "count": 1}])],
                         ignore_index=True)):
        want = df.groupby(["caller", "callee"], sort=True)
        series, positions = d._pair_groups(frames(pairs=df))
        assert list(series) == [k for k, _ in want] and len(series) == len(names)
        for key, g in want:
            assert series[key].equals(g) and series[key].index.equals(g.index)
            assert np.array_equal(positions[key], want.indices[key])


def test_pair_flats_cut_each_pairs_entries_from_the_whole_frames():
    """Each pair's (lengths, keys, counts) as the hot-spot and band-break detectors share
    them: the same as concatenating that pair's rows, whether cut from the reader's flat
    arrays (``Frames.pair_sketches``) or from the frame's own rows, with the pairs' rows
    interleaved or in runs of consecutive rows, and some rows empty."""
    rng = np.random.default_rng(4)
    rows = []
    for i in range(90):
        k, c = sparse(rng.lognormal(16, 1.0, size=int(rng.integers(0, 12))))
        k, c = np.asarray(k, dtype=np.int32), np.asarray(c, dtype=np.int32)
        rows.append({"caller": "a", "callee": ("b", "c", "d")[int(rng.integers(0, 3))], "minute": T0 + i,
                     "count": int(c.sum()), "errors": 0, "keys": k, "counts": c})
    interleaved = pd.DataFrame(rows)
    # ... and in runs (a reader's frame: a pair's rows are a run for each of its series)
    runs = interleaved.iloc[np.argsort((np.arange(90) // 45) * 3 + interleaved["callee"].map(
        {"b": 0, "c": 1, "d": 2}).to_numpy(), kind="stable")].reset_index(drop=True)
    for df in (interleaved, runs):
        lens = np.array([len(k) for k in df["keys"]], dtype=np.int64)
        from_reader = (lens, np.concatenate(list(df["keys"])), np.concatenate(list(df["counts"])))
        for pair_sketches in (from_reader, None):
            f = d.Frames(T0 * MIN, (T0 + 60) * MIN, T0 * MIN, pairs=df, pair_sketches=pair_sketches)
            got = d._pair_flats(f)
            assert sorted(got) == [("a", "b"), ("a", "c"), ("a", "d")]
            for key, g in df.groupby(["caller", "callee"]):
                want = d._flat_sketches(g["keys"], g["counts"])
                assert all(np.array_equal(x, y) for x, y in zip(got[key], want)), key
            assert d._pair_flats(f) is got  # computed once a frame


def test_encoder_ends_are_what_pandas_grouping_gives():
    """``_encoder_ends`` (the fusion detector's per-trace encoder ends from raw spans, by
    sorted reductions) against the two named aggregations it replaced."""
    import numpy as np
    import pandas as pd

    from modalscope.app.detectors import _encoder_ends

    rng = np.random.default_rng(5)
    n = 500
    enc = pd.DataFrame({"trace_id": [f"{t:032x}" for t in rng.integers(0, 60, n)],
                        "service": rng.choice(["vit", "whisper", "text-enc", "clip"], n),
                        "start_ns": rng.integers(0, 10**9, n), "duration_ns": rng.integers(1, 10**8, n)})
    ends = (enc.assign(end=enc["start_ns"] + enc["duration_ns"])
            .groupby(["trace_id", "service"]).agg(end=("end", "max"), start=("start_ns", "min")).reset_index())
    want = ends.groupby("trace_id").agg(n=("service", "size"), first=("end", "min"), last=("end", "max"),
                                        start=("start", "min"))
    got = _encoder_ends(enc)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert (got["n"] >= 2).any() and (got["n"] == 1).any()
    assert _encoder_ends(enc.iloc[:0]).empty


# -- p99_band_break: evidence and its end --------------------------------------------------
def late_pair_frames(stall_from, sigma=0.3, lead=60, minutes=150, calls=60, stall_for=15, seed=11):
    """A pair whose calls begin ``lead`` minutes after the frames' data does (a window asked
    from before the traffic began), stalling 6 % of its calls at ``stall_from`` (minutes
    from its first call) for ``stall_for`` minutes."""
    rng = random.Random(seed)
    p99 = 100 * np.exp(2.326 * sigma)
    per = {}
    for m in range(minutes):
        vals = lognormal(rng, calls, 100, sigma)
        if stall_from <= m < stall_from + stall_for:
            vals[:int(calls * 0.06)] = [6 * p99 * (0.8 + 0.4 * rng.random()) for _ in range(int(calls * 0.06))]
        per[lead + m] = vals
    return frames(minutes=lead + minutes, pairs=pd.DataFrame(pair_rows("ingest", "scorer", per)))


@pytest.mark.parametrize("stall_from", [2, 10, 25])
def test_band_break_needs_thirty_minutes_of_the_pairs_own_data(stall_from):
    """Empty minutes before a pair's first call are no baseline: a stall in its first half
    hour fires nothing, whatever the window's look-back held."""
    found = d.detect_p99_band_break(late_pair_frames(stall_from), TH)
    assert all(f.start >= d.rfc3339((T0 + 60 + 30) * MIN) for f in found), found
    if stall_from + 15 <= 30:  # over before the pair's first half hour ends: nothing at all
        assert found == []
    else:  # still stalling after it: that part may be a break, with a baseline of 30 minutes
        assert [f.evidence["baseline_data_minutes"] for f in found] == [30]


def test_band_break_after_thirty_minutes_of_data_fires_and_says_so():
    (f,) = d.detect_p99_band_break(late_pair_frames(40), TH)
    assert f.start == d.rfc3339((T0 + 100) * MIN) and f.end == d.rfc3339((T0 + 115) * MIN)
    assert d.BAND_BASELINE_DATA_MINUTES <= f.evidence["baseline_data_minutes"] <= TH.baseline_minutes


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_band_break_on_a_heavy_tail_ends_when_its_p99_returns(seed):
    """A heavy tail (sigma 1.5) puts stray calls past twice its P99 every few minutes: the
    break still ends within two calm blocks (and a block of slack) of the stall's end."""
    lead, stall_from, stall_for, minutes = 60, 60, 20, 200
    found = d.detect_p99_band_break(late_pair_frames(stall_from, sigma=1.5, lead=lead, minutes=minutes,
                                                     stall_for=stall_for, seed=seed), TH)
    assert len(found) == 1, found
    f = found[0]
    stall_end = T0 + lead + stall_from + stall_for
    assert d.rfc3339((T0 + lead + stall_from - TH.block_minutes) * MIN) <= f.start \
        <= d.rfc3339((T0 + lead + stall_from + TH.block_minutes) * MIN)
    assert d.rfc3339((stall_end - TH.block_minutes) * MIN) <= f.end \
        <= d.rfc3339((stall_end + (d.BAND_CALM_BLOCKS + 1) * TH.block_minutes) * MIN), f
    assert f.evidence["exit_threshold_ms"] < f.evidence["threshold_ms"]


def test_band_break_tail_tests_match_their_definitions():
    from math import comb

    for k, n, p in [(0, 5, 0.3), (3, 10, 0.2), (7, 13, 0.077), (12, 12, 0.5), (2, 40, 0.01), (30, 40, 0.9)]:
        exact = sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
        assert d._binomial_tail(k, n, p) == pytest.approx(exact, rel=1e-9, abs=1e-15)
    assert d._binomial_tail(4, 3, 0.5) == 0.0 and d._binomial_tail(1, 5, 0.0) == 0.0
    # Three calls past the threshold in a block a thirteenth of its baseline's calls, none in
    # the baseline: (1/13)^3, not enough on its own; a fourth is.
    assert d._excess_p(3, 300, 0, 3600) > d.BAND_ENTRY_P > d._excess_p(4, 300, 0, 3600)
    # A median is moved only past the tolerance by more than sampling noise.
    assert not d._median_moved(400, 185, 380)[()] and d._median_moved(400, 160, 380)[()]
