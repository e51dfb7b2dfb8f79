"""The finding and incident types (``core/findings.py``): their JSON is exactly the object
the API answers and stored evaluations keep, key order included, and reads back equal."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from modalscope.app import detectors as d
from modalscope.app import evaluations
from modalscope.app import incidents as inc
from modalscope.core.findings import (Attribute, AttributeSuspect, Finding, Incident, IncidentLinks, StageSuspect,
                                      Subject)
from tests.app.test_detectors import TH, batch_frames, cache_frames, cold_frames, lb_frames

MIN = 60_000_000_000
KEYS = ["kind", "severity", "subject", "start", "end", "evidence", "exemplar_trace_ids", "hint"]

#: What the load-balancer and batching detectors answered over the frames of
#: tests/app/test_detectors.py when a finding was a plain dict: the same bytes now.
LB_JSON = (
    '{"kind":"lb_timeout_truncation","severity":"critical","subject":{"service":"front","input_type":"multi_image"},'
    '"start":"2025-02-19T21:30:00Z","end":"2025-02-19T21:38:00Z","evidence":{"ceiling_s":30,'
    '"max_duration_ms":29970.0,"band_ms":599.4,"truncated":8,"error_share":1.0,"threshold_count":5,'
    '"sample_count":8},"exemplar_trace_ids":["00000000000000000000000000000000","00000000000000000000000000000001",'
    '"00000000000000000000000000000002","00000000000000000000000000000003","00000000000000000000000000000004"],'
    '"hint":"Requests pile up just under 30 s and end in errors: a load-balancer timeout (defaults are 30 s / 60 s) '
    'below the request time cuts long multimodal requests. Raise the backend timeout for this route, or stream / '
    'split long requests."}')
BATCH_JSON = (
    '{"kind":"batching_failure","severity":"warning","subject":{"service":"gpu-svc","attribute":{"key":"batch.size",'
    '"value":1}},"start":"2025-02-19T21:50:00Z","end":"2025-02-19T22:00:00Z","evidence":{"batch_one_share":1.0,'
    '"baseline_batch_one_share":0.0,"threshold_share":0.8,"load_ratio":1.5,"threshold_load_ratio":1.0,'
    '"mean_batch_size":1.0,"sample_count":300},"exemplar_trace_ids":["00000000000000000000000000000259",'
    '"0000000000000000000000000000025a","0000000000000000000000000000025b","0000000000000000000000000000025c",'
    '"0000000000000000000000000000025d"],"hint":"batch.size is stuck at 1 while load is high: mixed input sizes '
    'defeat dynamic batching. Bucket or pad inputs to a few fixed sizes so requests can share a batch."}')


def _old_finding(kind, severity, subject: dict, start_ns, end_ns, evidence, hint, exemplars=()) -> dict:
    """``detectors.finding`` as it was when it built the API's dict itself."""
    ev = {k: (round(float(v), 4) if isinstance(v, (float, np.floating)) else int(v) if isinstance(v, (np.integer,))
              else v) for k, v in evidence.items()}
    ids = []
    for t in exemplars:
        t = str(t).lower()
        if t not in ids:
            ids.append(t)
        if len(ids) >= d.MAX_EXEMPLARS:
            break
    return {"kind": kind, "severity": severity, "subject": subject, "start": d.rfc3339(start_ns),
            "end": d.rfc3339(end_ns), "evidence": ev, "exemplar_trace_ids": ids, "hint": hint}


SUBJECTS = [
    {"caller": "gateway", "callee": "llm"},
    {"service": "front", "input_type": "multi_image"},
    {"service": "fuse", "stage": "fusion"},
    {"input_type": "image", "stage": "preprocessing"},
    {"input_type": "text"},
    {"cache": "kv", "attribute": {"key": "tier", "value": "t-c"}},
    {"service": "gpu-svc", "attribute": {"key": "batch.size", "value": 1}},
    {"service": "model", "attribute": {"key": "service.instance.id", "value": "w-3"}},
]


@pytest.mark.parametrize("subject", SUBJECTS, ids=lambda s: "+".join(s))
def test_finding_helper_writes_the_old_dict_byte_for_byte(subject):
    start, end = 29_000_000 * MIN + 123_456_789, 29_000_015 * MIN + 999_999_999  # (sub-second ends, cut)
    evidence = {"p99_ms": np.float64(912.345678), "sample_count": np.int64(1200), "ratio": 2.5, "note": None}
    exemplars = ["AB" * 16, "ab" * 16, "cd" * 16, *(f"{i:032x}" for i in range(6))]
    got = d.finding("p99_band_break", "critical", Subject.from_json(subject), start, end, evidence, "a hint",
                    exemplars)
    want = _old_finding("p99_band_break", "critical", subject, start, end, evidence, "a hint", exemplars)
    assert orjson.dumps(got.to_json()) == orjson.dumps(want)
    assert list(got.to_json()) == KEYS and list(got.to_json()["subject"]) == list(subject)
    assert Finding.from_json(got.to_json()) == got
    assert Finding.from_json(orjson.loads(orjson.dumps(want))) == got  # (as a stored row reads back)


def test_real_detector_findings_keep_their_json():
    (lb,) = d.detect_lb_timeout_truncation(lb_frames(8), TH)
    (batch,) = d.detect_batching_failure(batch_frames(True, 1.5), TH)
    assert orjson.dumps(lb.to_json()).decode() == LB_JSON
    assert orjson.dumps(batch.to_json()).decode() == BATCH_JSON
    assert lb.subject == Subject(service="front", input_type="multi_image")
    assert batch.subject.attribute == Attribute("batch.size", 1)
    found = (d.detect_cache_penetration(cache_frames(), TH) + d.detect_cold_start(cold_frames(True), TH)
             + [lb, batch])
    for f in found:
        assert isinstance(f, Finding) and list(f.to_json()) == KEYS
        assert Finding.from_json(f.to_json()) == f
        assert Finding.from_json(orjson.loads(orjson.dumps(f.to_json()))) == f
        assert f.start == d.rfc3339(f.start_ns) and f.end == d.rfc3339(f.end_ns)


def test_stored_findings_read_back_to_the_same_bytes():
    (lb,) = d.detect_lb_timeout_truncation(lb_frames(8), TH)
    (batch,) = d.detect_batching_failure(batch_frames(True, 1.5), TH)
    row = f"[{LB_JSON},{BATCH_JSON}]"  # a stored evaluation's findings, as written before the types
    assert evaluations.loads(row) == [lb, batch]
    assert evaluations.dumps(evaluations.loads(row)) == row
    assert evaluations.loads(evaluations.dumps([])) == []


def test_finding_is_a_value():
    f = Finding.from_json(orjson.loads(LB_JSON))
    with pytest.raises(AttributeError):
        f.kind = "other"  # type: ignore[misc]
    g = f.replace(exemplar_trace_ids=["ab" * 16], hint="new")
    assert g.exemplar_trace_ids == ("ab" * 16,) and g.hint == "new" and f.hint != "new"
    assert (f.start_ns, f.end_ns) == (29_000_010 * MIN, 29_000_018 * MIN)
    assert f.subject.filters() == {"service": "front", "input_type": "multi_image"}
    assert Subject.from_json({"cache": "kv", "attribute": {"key": "tier", "value": "t-c"}}).text() == "cache=kv, tier=t-c"
    with pytest.raises(ValueError):
        Subject.from_json({"model": "x"})


def _finding(kind: str, subject: dict, start_min: int, end_min: int, severity: str = "warning") -> Finding:
    return d.finding(kind, severity, Subject.from_json(subject), (29_000_000 + start_min) * MIN,
                     (29_000_000 + end_min) * MIN, {"sample_count": 100}, "own hint", ["ab" * 16])


def test_incident_json_and_round_trip():
    cold = _finding("cold_start", {"service": "llm", "attribute": {"key": "service.instance.id", "value": "p-9"}}, 30, 34)
    band = _finding("p99_band_break", {"caller": "gateway", "callee": "llm"}, 30, 32, "critical")
    built = inc.build([cold, band])
    out = built.to_json()
    assert list(out) == ["id", "severity", "start", "end", "headline", "cause_known", "findings", "suspects", "links"]
    assert out["headline"] == out["findings"][0] == cold.to_json() and built.headline is cold
    assert out["findings"][1]["hint"].startswith("Likely caused by cold_start") and band.hint == "own hint"
    assert list(out["links"]) == ["compare", "drilldown", "traces"] and out["suspects"] == []
    assert Incident.from_json(out) == built
    assert Incident.from_json(orjson.loads(orjson.dumps(out))).to_json() == out

    alone = inc.build([band], [StageSuspect("encoder", 0.8), AttributeSuspect("input_type", "image", 2.5)])
    assert alone.to_json()["suspects"] == [{"stage": "encoder", "added_share": 0.8},
                                           {"key": "input_type", "value": "image", "lift": 2.5}]
    assert Incident.from_json(alone.to_json()) == alone
    assert isinstance(alone.links, IncidentLinks) and alone.links.traces
    with pytest.raises(ValueError):
        Incident("ab" * 8, "warning", "a", "b", False, ())
