"""Incidents: the grouping rule on hand-built findings, and on the demo's injected patterns
through /api/v1/incidents (the session-shared pattern store of tests/demo_stores.py)."""

from __future__ import annotations

import pytest

from modalscope.app import incidents as inc
from modalscope.app.params import parse_time
from modalscope.core.findings import AttributeSuspect, Finding, StageSuspect, Subject
from modalscope.ingest import demo
from modalscope.models.reader import Filters
from tests.demo_stores import PATTERNS

MIN = 60_000_000_000
T0 = "2025-11-30T10:"

TOPO = inc.Topology(
    input_types={"text": frozenset({"gateway", "llm", "userdb"}),
                 "multi_image": frozenset({"gateway", "vision-encoder", "fusion", "llm"})},
    input_type_stages={("multi_image", "preprocessing"): frozenset({"gateway", "vision-encoder"})},
    caches={"profile": frozenset({"gateway"})},
)


def f(kind: str, subject: dict, start: str, end: str, severity: str = "warning", hint: str = "own hint") -> Finding:
    return Finding.from_json({"kind": kind, "severity": severity, "subject": subject, "start": f"{T0}{start}:00Z",
                              "end": f"{T0}{end}:00Z", "evidence": {"sample_count": 100},
                              "exemplar_trace_ids": ["ab" * 16], "hint": hint})


COLD = f("cold_start", {"service": "llm", "attribute": {"key": "service.instance.id", "value": "pod-9"}}, "30", "34")
BAND_LLM = f("p99_band_break", {"caller": "gateway", "callee": "llm"}, "30", "32", "critical")
REG_TEXT = f("baseline_regression", {"input_type": "text"}, "30", "35", "critical")


def kinds(group: list[Finding]) -> list[str]:
    return [x.kind for x in group]


def test_symptoms_fold_under_the_cause_on_their_path():
    groups = inc.group([REG_TEXT, BAND_LLM, COLD], TOPO)
    assert len(groups) == 1
    assert groups[0][0] is COLD and set(kinds(groups[0][1:])) == {"p99_band_break", "baseline_regression"}
    built = inc.build(groups[0])
    assert built.cause_known is True and built.suspects == ()
    assert built.headline.kind == "cold_start"
    assert built.severity == "critical"  # the most severe of its findings
    assert (built.start, built.end) == (COLD.start, REG_TEXT.end)
    folded = [x for x in built.findings if x.kind != "cold_start"]
    for x in folded:  # each names the cause and links to it, then keeps its own hint
        assert "cold_start" in x.hint and "/anomalies?" in x.hint and "service=llm" in x.hint
        assert x.hint.endswith("own hint")
    assert REG_TEXT.hint == "own hint"  # the findings themselves are not rewritten
    assert built.headline.hint == "own hint"
    assert built.links.compare.startswith("/compare?start=") and "service=llm" in built.links.compare
    assert built.links.drilldown.startswith("/drilldown?")
    assert built.links.traces == (f"/trace/{'ab' * 16}?start={T0}30:00.000Z&end={T0}35:00.000Z",)


def test_a_symptom_off_the_causes_path_or_onset_stays_apart():
    vision = f("p99_band_break", {"caller": "gateway", "callee": "vision-encoder"}, "30", "40", "critical")
    before = f("p99_band_break", {"caller": "gateway", "callee": "llm"}, "10", "33", "critical")
    groups = inc.group([COLD, vision, before], TOPO)
    assert [kinds(g) for g in groups if g[0] is COLD] == [["cold_start"]]
    # Both symptoms overlap on the gateway, with no cause: one incident, cause unknown.
    (left,) = [g for g in groups if g[0] is not COLD]
    assert set(map(id, left)) == {id(vision), id(before)} and left[0] is before  # earlier leads
    built = inc.build(left, [StageSuspect("encoder", 0.8)])
    assert built.cause_known is False and built.suspects == (StageSuspect("encoder", 0.8),)
    assert built.to_json()["suspects"] == [{"stage": "encoder", "added_share": 0.8}]
    assert all(x.hint == "own hint" for x in built.findings)


def test_causes_on_one_path_merge_and_the_most_severe_heads():
    fallback = f("cuda_graph_fallback", {"service": "llm", "attribute": {"key": "gpu.cuda_graph", "value": "fallback"}},
                 "31", "50")
    lb = f("lb_timeout_truncation", {"service": "gateway", "input_type": "multi_image"}, "33", "45", "critical")
    groups = inc.group([fallback, COLD, lb], TOPO)
    assert len(groups) == 1 and groups[0][0] is lb  # critical before earlier
    # Without the critical one, the earlier cause heads.
    assert inc.group([fallback, COLD], TOPO)[0][0] is COLD


def test_two_input_types_or_distant_services_do_not_merge():
    text = f("baseline_regression", {"input_type": "text"}, "30", "40", "critical")
    multi = f("baseline_regression", {"input_type": "multi_image"}, "30", "40", "critical")
    assert len(inc.group([text, multi], TOPO)) == 2  # both pass the gateway, each says where it hurts
    batching = f("batching_failure", {"service": "vision-encoder", "attribute": {"key": "batch.size", "value": 1}},
                 "30", "40")
    assert len(inc.group([COLD, batching], TOPO)) == 2
    pre = f("preprocessing_bound", {"input_type": "multi_image", "stage": "preprocessing"}, "30", "40")
    assert inc.path_services(pre, TOPO) == {"gateway", "vision-encoder"}  # the stage narrows the type
    assert [kinds(g) for g in inc.group([pre, multi], TOPO)] == [["preprocessing_bound", "baseline_regression"]]


def test_cache_path_and_hot_spot_fold():
    cache = f("cache_penetration", {"cache": "profile", "attribute": {"key": "user_tier", "value": "bronze"}},
              "50", "59")
    hot = f("hot_spot", {"caller": "gateway", "callee": "userdb"}, "50", "59")
    band = f("p99_band_break", {"caller": "gateway", "callee": "userdb"}, "49", "59", "critical")  # a minute early
    groups = inc.group([hot, band, cache], TOPO)
    assert len(groups) == 1 and groups[0][0] is cache
    apart = inc.group([hot, band, cache], inc.Topology())  # no cache users known: nothing shared
    assert [kinds(g) for g in apart] == [["cache_penetration"], ["p99_band_break", "hot_spot"]]


def test_id_is_stable_and_ignores_seconds_and_severity():
    a = COLD.replace(start=f"{T0}30:20Z")
    b = COLD.replace(severity="critical", end=f"{T0}59:00Z")
    assert inc.incident_id(a) == inc.incident_id(COLD) == inc.incident_id(b)
    assert inc.incident_id(COLD.replace(start=f"{T0}31:00Z")) != inc.incident_id(COLD)
    assert inc.incident_id(COLD.replace(subject=Subject(service="llm"))) != inc.incident_id(COLD)


def test_suspects_from_compare_strongest_first():
    result = {"stages": [{"stage": "encoder", "share_of_added_time": 0.2}, {"stage": "preprocessing",
                          "share_of_added_time": 0.78}, {"stage": "other", "share_of_added_time": 0.02}],
              "attributes": [{"key": "service.instance.id", "value": "pod-7", "lift": 4.1},
                             {"key": "input_type", "value": "multi_image", "lift": 6.0}]}
    assert inc.suspects_from_compare(result) == [
        StageSuspect("preprocessing", 0.78), StageSuspect("encoder", 0.2),
        AttributeSuspect("input_type", "multi_image", 6.0), AttributeSuspect("service.instance.id", "pod-7", 4.1)]


def test_judging_over_its_own_span_decides_severity_and_members():
    """The request window's copy of a finding is replaced by the one found over the
    incident's own span; a headline not found there keeps its group."""
    calls = []
    narrow_reg = REG_TEXT.replace(severity="warning")

    def finder(window):
        calls.append(window)
        return [COLD, narrow_reg]

    got = inc.judge([COLD, REG_TEXT], finder, lambda w: TOPO)
    assert [x.severity for x in got] == ["warning", "warning"]
    lo = parse_time(COLD.start, "start") - inc.JUDGE_PAD_NS
    assert calls[0].start_ns == lo and calls[0].end_ns == parse_time(REG_TEXT.end, "end") + inc.JUDGE_PAD_NS
    assert inc.judge([COLD, REG_TEXT], lambda w: [], lambda w: TOPO) == [COLD, REG_TEXT]


def test_filters_keep_incidents_naming_them():
    assert inc.matches_any([COLD, REG_TEXT], Filters(input_type="text"))
    assert not inc.matches_any([COLD, REG_TEXT], Filters(service="fusion"))


# -- on the demo's data -----------------------------------------------------------------
#: The injected patterns that name a mechanism.
CAUSES = [p for p in demo.injected_patterns(PATTERNS) if p.kind not in inc.SYMPTOM_KINDS]
SIX_HOURS = {"start": (PATTERNS.end_ns - 6 * 3600 * 10**9) / 1e9 + 120, "end": PATTERNS.end_ns / 1e9 + 120}


@pytest.fixture(scope="module")
def demo_incidents(pattern_store):
    return pattern_store.get("incidents", **SIX_HOURS)


@pytest.fixture(scope="module")
def demo_findings(pattern_store):
    return pattern_store.get("anomalies", **SIX_HOURS)


def _overlaps(a: dict, start_ns: int, end_ns: int) -> bool:
    return parse_time(a["start"], "start") < end_ns and start_ns < parse_time(a["end"], "end")


@pytest.mark.parametrize("pattern", CAUSES, ids=lambda p: p.kind)
def test_each_injected_cause_heads_its_own_incident(demo_incidents, pattern):
    heads = [i for i in demo_incidents if i["headline"]["kind"] == pattern.kind
             and i["headline"]["subject"] == pattern.subject and _overlaps(i["headline"], pattern.start_ns, pattern.end_ns)]
    assert len(heads) == 1, [(i["headline"]["kind"], i["headline"]["subject"]) for i in demo_incidents]
    assert heads[0]["cause_known"] is True and heads[0]["suspects"] == []
    # No other incident is headed by another cause of the injected ones.
    others = [i for i in demo_incidents if i is not heads[0] and any(
        x["kind"] == pattern.kind and x["subject"] == pattern.subject for x in i["findings"])]
    assert not others


def test_symptoms_of_injected_causes_are_folded(demo_incidents, demo_findings):
    by_head = {(i["headline"]["kind"], str(i["headline"]["subject"])): i for i in demo_incidents}
    cold = next(i for i in demo_incidents if i["headline"]["kind"] == "cold_start")
    cache = next(i for i in demo_incidents if i["headline"]["kind"] == "cache_penetration")
    assert {("p99_band_break", "llm")} <= {(x["kind"], x["subject"].get("callee")) for x in cold["findings"]}
    assert {x["kind"] for x in cold["findings"]} >= {"baseline_regression"}
    assert {(x["kind"], x["subject"].get("callee")) for x in cache["findings"]} >= {
        ("hot_spot", "userdb"), ("p99_band_break", "userdb")}
    for i in (cold, cache):
        for x in i["findings"][1:]:
            assert x["hint"].startswith(f"Likely caused by {i['headline']['kind']}") and "/anomalies?" in x["hint"]
    # The only incident without a known cause is the injected band break's (no mechanism
    # injected there); every other symptom the catalog found sits under a cause.
    unknown = [i for i in demo_incidents if not i["cause_known"]]
    assert [(i["headline"]["kind"], i["headline"]["subject"]) for i in unknown] == [
        ("p99_band_break", {"caller": "gateway", "callee": "vision-encoder"})]
    assert unknown[0]["suspects"] and all(("stage" in s and 0 < s["added_share"] <= 1) or s["lift"] > 1
                                          for s in unknown[0]["suspects"])
    symptoms = [x for x in demo_findings if x["kind"] in inc.SYMPTOM_KINDS]
    heading = [x for x in symptoms if (x["kind"], str(x["subject"])) in by_head
               and by_head[(x["kind"], str(x["subject"]))]["cause_known"] is False]
    assert len(symptoms) >= 8 and len(heading) == 1
    assert len(demo_incidents) < len(demo_findings)


def test_incidents_are_shaped_and_most_severe_first(demo_incidents):
    order = [inc.SEVERITY_ORDER[i["severity"]] for i in demo_incidents]
    assert order == sorted(order)
    for i in demo_incidents:
        assert set(i) == {"id", "severity", "start", "end", "headline", "cause_known", "findings", "suspects", "links"}
        assert i["findings"][0]["kind"] == i["headline"]["kind"] and i["start"] < i["end"]
        assert i["start"] == min(x["start"] for x in i["findings"])
        assert i["severity"] == min((x["severity"] for x in i["findings"]), key=inc.SEVERITY_ORDER.get)
        assert set(i["links"]) == {"compare", "drilldown", "traces"}
        assert i["links"]["compare"].startswith("http://localhost/compare?start=")
        assert all(t.startswith("http://localhost/trace/") for t in i["links"]["traces"])
    assert len({i["id"] for i in demo_incidents}) == len(demo_incidents)


def test_id_and_severity_hold_in_a_window_just_covering_the_incident(pattern_store, demo_incidents):
    checked = []
    for i in demo_incidents:
        s, e = parse_time(i["start"], "start"), parse_time(i["end"], "end")
        window = {"start": s / 1e9, "end": e / 1e9}
        head = i["headline"]
        if not any(x["kind"] == head["kind"] and x["subject"] == head["subject"]
                   for x in pattern_store.get("anomalies", **window)):
            # The catalog itself does not see it there: batching_failure needs load "high"
            # against the window's median block, and the demo's data begin just before it.
            assert head["kind"] == "batching_failure"
            continue
        narrow = pattern_store.get("incidents", **window)
        same = [n for n in narrow if n["id"] == i["id"]]
        assert same, (head["kind"], i["start"], [n["headline"]["kind"] for n in narrow])
        assert same[0]["severity"] == i["severity"]
        assert (same[0]["start"], same[0]["end"]) == (i["start"], i["end"])
        assert [(x["kind"], x["subject"]) for x in same[0]["findings"]] == [
            (x["kind"], x["subject"]) for x in i["findings"]]
        checked.append(head["kind"])
    assert len(checked) >= len(demo_incidents) - 1 and "cold_start" in checked


def test_filters_and_errors_as_anomalies(pattern_store, demo_incidents):
    llm = pattern_store.get("incidents", service="llm", **SIX_HOURS)
    assert llm and {i["id"] for i in llm} < {i["id"] for i in demo_incidents}
    assert {"cold_start", "cuda_graph_fallback"} <= {i["headline"]["kind"] for i in llm}
    r = pattern_store.client.get("/api/v1/incidents?range=soon")
    assert r.status_code == 400 and r.get_json()["parameter"] == "range"
    r = pattern_store.client.get("/api/v1/incidents?range=8d")
    assert r.status_code == 400 and r.get_json()["parameter"] == "range"
    r = pattern_store.client.get("/api/v1/incidents?start=2025-11-30T12:00:00Z&end=2025-11-30T11:00:00Z")
    assert r.status_code == 400 and r.get_json()["parameter"] == "end"
