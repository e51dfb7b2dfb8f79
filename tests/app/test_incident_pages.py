"""The overview's top incidents and the Anomalies page grouped by incident, without a
browser: the pages' callbacks run inside the app against the demo's pattern store (what the
browser would receive), and the incident cards on hand-built incidents."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from modalscope.app import components as c
from modalscope.app import ids
from modalscope.app import incidents as inc
from modalscope.app.params import Window, parse_time, rfc3339
from modalscope.core.findings import AttributeSuspect, Finding, Incident, StageSuspect, Subject
from modalscope.ingest import demo
from tests.demo_stores import PATTERNS

MIN = 60_000_000_000
HOSTILE = "<img src=x onerror=alert(1)>"


def _tree(x) -> dict:
    return json.loads(json.dumps(x, default=lambda o: o.to_plotly_json() if hasattr(o, "to_plotly_json") else str(o)))


def _nodes(node, pred):
    """Every component (props and type) in a dumped tree for which ``pred(node)`` holds."""
    out = []
    if isinstance(node, dict):
        if "props" in node and pred(node):
            out.append(node)
        for v in node.values():
            out.extend(_nodes(v, pred))
    elif isinstance(node, list):
        for v in node:
            out.extend(_nodes(v, pred))
    return out


def _sections(tree) -> list[dict]:
    return _nodes(tree, lambda n: str(n["props"].get("id", "")).startswith(inc.ANCHOR_PREFIX))


def _text(node) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return "".join(_text(x) for x in node)
    if isinstance(node, dict):
        return _text(node.get("props", {}).get("children", ""))
    return ""


def _hrefs(tree) -> list[str]:
    return [n["props"]["href"] for n in _nodes(tree, lambda n: "href" in n["props"])]


def _q(href: str) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}


def _window(start_ns: int, end_ns: int) -> dict:
    return {"start": rfc3339(start_ns), "end": rfc3339(end_ns)}


@pytest.fixture(scope="module")
def cold_window() -> dict:
    """An hour around the injected cold start: its incident is among the overview's top three."""
    (p,) = [p for p in demo.injected_patterns(PATTERNS) if p.kind == "cold_start"]
    return _window(p.start_ns // MIN * MIN - 30 * MIN, p.end_ns // MIN * MIN + 30 * MIN)


@pytest.fixture(scope="module")
def whole_window() -> dict:
    return _window(PATTERNS.start_ns // MIN * MIN, PATTERNS.end_ns // MIN * MIN + 2 * MIN)


# -- the overview ----------------------------------------------------------------------
def test_overview_heads_incidents_by_their_cause(pattern_store, cold_window):  # noqa: F811
    from modalscope.app.pages import anomalies, overview

    with pattern_store.app.test_request_context():
        anomalies._fill(cold_window)  # judges the incidents over their own spans (stored)
        tree = _tree(overview._incidents(cold_window))
        api = pattern_store.get("incidents", **cold_window)
    cards = _nodes(tree, lambda n: "ms-incident" in str(n["props"].get("className", "")).split())
    assert 1 <= len(cards) <= 3 and len(cards) == min(3, len(api))
    titles = [_text(_nodes(card, lambda n: n["props"].get("className") == "ms-finding-title")[0]) for card in cards]
    cold = [t for t in titles if "cold start" in t]
    assert cold and "llm" in cold[0] and "first requests' median" in cold[0] and " s vs " in cold[0], titles
    # Headed by the cause: the band break and regressions it brought are folded under it.
    assert not any(t.split(" — ")[0].split(" ", 1)[1] in ("p99 band break", "baseline regression")
                   for t in titles if "llm" in t), titles
    cold_card = cards[titles.index(cold[0])]
    api_cold = next(i for i in api if i["headline"]["kind"] == "cold_start")
    related = len(api_cold["findings"]) - 1
    assert related >= 2 and f"+{related} related findings" in _text(cold_card)
    assert "Likely cause: cold start" in _text(cold_card)
    (link,) = [h for h in _hrefs(cold_card) if h.startswith("/anomalies?")]
    assert _q(link)["incident"] == api_cold["id"] and link.endswith("#incident-" + api_cold["id"])
    assert _q(link)["start"] == cold_window["start"]
    assert "overview-incidents-note" not in json.dumps(tree)  # judged, as /api/v1/incidents
    # Same ids, severities and order as the API.
    assert [card["props"]["id"] for card in cards] == [f"overview-incident-{i['id']}" for i in api[:3]]


def test_overview_without_stored_judgements_groups_the_window(pattern_store, whole_window):  # noqa: F811
    """No catalog rerun per incident: the window's own findings, grouped, and a note saying so."""
    from modalscope.app import evaluations
    from modalscope.app.pages import overview
    from modalscope.models.reader import Filters

    with pattern_store.app.test_request_context():
        reader, th = c.reader(), c.thresholds()
        window = Window(parse_time(whole_window["start"], "start"), parse_time(whole_window["end"], "end"))
        found = evaluations.find_for(reader, window, Filters(), th, relative=False).findings
        quick = inc.window_incidents(reader, window, found)
        tree = _tree(overview.top_incidents(quick, whole_window, judged=False))
        with pytest.raises(inc.NotJudged):  # an hour nobody judged: nothing stored
            inc.cached_finder(reader, th)(Window(window.start_ns - 600 * MIN, window.start_ns - 540 * MIN))
    assert "overview-incidents-note" in json.dumps(tree)
    heads = [i.headline.kind for i in quick]
    assert "cold_start" in heads and "cache_penetration" in heads
    assert not any(i.headline.kind in inc.SYMPTOM_KINDS for i in quick if i.cause_known)
    unknown = [i for i in quick[:3] if not i.cause_known]
    assert all(i.suspects for i in unknown)
    assert len(_nodes(tree, lambda n: n["props"].get("id", "").startswith("overview-incident-") if isinstance(
        n["props"].get("id"), str) else False)) == 3


def test_window_incident_ids_open_the_judged_incident(pattern_store, whole_window):  # noqa: F811
    """An overview link made from the window's grouping finds its incident on the Anomalies
    page even where judging the incident over its own span changed its headline."""
    from modalscope.app.pages import anomalies

    with pattern_store.app.test_request_context():
        reader = c.reader()
        res = anomalies.st.resolve(whole_window)
        ev, judged = anomalies.page_incidents(res, whole_window)
        groups = inc.group(ev.findings, inc.topology(reader, res.window))
        for g in groups:
            chosen = inc.find_incident(judged, inc.incident_id(g[0]), lambda: groups)
            assert chosen is not None and inc.pick([chosen.findings], g[0]) is not None, g[0].kind
        assert inc.find_incident(judged, "0" * 16, lambda: groups) is None


# -- the Anomalies page ----------------------------------------------------------------
def _suspects_answer(store, cid: dict, data) -> str:
    """The cause line an incident's own suspects request answers, as the browser asks it."""
    key = next(k for k in store.app.extensions["modalscope"]["dash"].callback_map if '"incident-suspects"' in k)
    body = {"output": key, "outputs": {"id": {**cid, "type": ids.INCIDENT_SUSPECTS}, "property": "children"},
            "inputs": [{"id": cid, "property": "data", "value": data}], "changedPropIds": [], "state": []}
    r = store.client.post("/_dash-update-component", json=body)
    assert r.status_code == 200, r.get_data(as_text=True)
    (answer,) = r.get_json()["response"].values()
    return _text(answer["children"])


def test_incidents_listed_without_suspects_get_the_apis_suspects_in_a_request_each(pattern_store, whole_window):
    """The Anomalies page lists incidents without waiting for their Compares: each incident
    whose cause is unknown says it is comparing, and its own request answers the suspects
    ``/api/v1/incidents`` gives it. A store the browser tampered with gets "not available"."""
    from modalscope.app.pages import anomalies

    with pattern_store.app.test_request_context():
        tree = _tree(anomalies._fill(whole_window))
    api = {i["id"]: i for i in pattern_store.get("incidents", **whole_window)}
    asks = _nodes(tree, lambda n: isinstance(n["props"].get("id"), dict)
                  and n["props"]["id"].get("type") == ids.INCIDENT_SUSPECTS_ASK)
    unknown = {i for i, v in api.items() if not v["cause_known"]}
    assert unknown and {n["props"]["id"]["incident"] for n in asks} == unknown
    lines = _nodes(tree, lambda n: isinstance(n["props"].get("id"), dict)
                   and n["props"]["id"].get("type") == ids.INCIDENT_SUSPECTS)
    assert lines and all("comparing" in _text(n) for n in lines)
    for n in asks:
        cid, data = n["props"]["id"], n["props"]["data"]
        want = [StageSuspect(s["stage"], s["added_share"]) if "stage" in s else
                AttributeSuspect(s["key"], s["value"], s["lift"]) for s in api[cid["incident"]]["suspects"]]
        assert want, cid  # the demo's unknown-cause incidents each have suspects
        assert _suspects_answer(pattern_store, cid, data) == _text(c.suspects_line(want))
    cid, data = asks[0]["props"]["id"], asks[0]["props"]["data"]
    for bad in (None, "x", {**data, "start_ns": str(data["start_ns"])}, {**data, "end_ns": data["start_ns"]},
                {**data, "start_ns": data["start_ns"] + 1}, {**data, "end_ns": data["start_ns"] + 8 * 86_400 * 10**9},
                {**data, "start_ns": 2**70, "end_ns": 2**70 + MIN},
                {**data, "subject": {"attribute": "x"}}, {**data, "subject": {"service": ["a"]}}):
        assert "not available" in _suspects_answer(pattern_store, cid, bad), bad


def test_anomalies_page_is_grouped_by_incident(pattern_store, whole_window):  # noqa: F811
    from modalscope.app.pages import anomalies

    with pattern_store.app.test_request_context():
        tree = _tree(anomalies._fill(whole_window))
        api = pattern_store.get("incidents", **whole_window)
        found = pattern_store.get("anomalies", **whole_window)
    sections = _sections(tree)
    assert [s["props"]["id"] for s in sections] == [inc.ANCHOR_PREFIX + i["id"] for i in api]
    cards = _nodes(tree, lambda n: "ms-finding-card" in str(n["props"].get("className", "")).split())
    assert len(cards) == len(found)  # every finding of the window once
    cold = next(i for i in api if i["headline"]["kind"] == "cold_start")
    section = next(s for s in sections if s["props"]["id"] == inc.ANCHOR_PREFIX + cold["id"])
    roles = [str(n["props"]["className"]) for n in _nodes(
        section, lambda n: "ms-finding-card" in str(n["props"].get("className", "")).split())]
    assert "ms-incident-head" in roles[0] and len(roles) >= 3
    assert all("ms-incident-folded" in r for r in roles[1:])
    # A folded symptom's hint links to its incident, on this page.
    hint_links = _nodes(section, lambda n: "ms-incident-hint-link" in str(n["props"].get("className", "")))
    assert len(hint_links) == len(roles) - 1
    for a in hint_links:
        assert _q(a["props"]["href"])["incident"] == cold["id"]
        assert a["props"]["href"].endswith("#incident-" + cold["id"])
        assert _q(a["props"]["href"])["start"] == whole_window["start"]
    hints = _nodes(section, lambda n: n["props"].get("className") == "ms-finding-hint")
    assert any(_text(h).startswith("Likely caused by cold_start") and "/anomalies?" not in _text(h) for h in hints)


def test_anomalies_page_filters_by_kind_and_severity(pattern_store, whole_window):  # noqa: F811
    from modalscope.app.pages import anomalies

    with pattern_store.app.test_request_context():
        api = pattern_store.get("incidents", **whole_window)
        by_kind = _tree(anomalies._fill({**whole_window, "kind": "p99_band_break"}))
        by_sev = _tree(anomalies._fill({**whole_window, "severity": "warning"}))
        both = _tree(anomalies._fill({**whole_window, "severity": "warning", "kind": "p99_band_break"}))
        none = _tree(anomalies._fill({**whole_window, "severity": "info"}))
    with_break = [i["id"] for i in api if any(f["kind"] == "p99_band_break" for f in i["findings"])]
    warnings = [i["id"] for i in api if i["severity"] == "warning"]
    assert 0 < len(with_break) < len(api) and 0 < len(warnings) < len(api)
    ids_of = lambda t: [s["props"]["id"].removeprefix(inc.ANCHOR_PREFIX) for s in _sections(t)]  # noqa: E731
    assert ids_of(by_kind) == with_break
    assert ids_of(by_sev) == warnings
    assert ids_of(both) == [i for i in warnings if i in with_break]
    assert ids_of(none) == [] and "No incident matches these filters." in json.dumps(none)
    # The filters are links in the URL state: the current one marked, the others keep it.
    kind_bar = _nodes(by_kind, lambda n: n["props"].get("id") == ids.AN_KIND_FILTER)[0]
    active = _nodes(kind_bar, lambda n: n["props"].get("className") == "ms-chip active")
    assert [_text(a) for a in active] == ["p99 band break"]
    sev_bar = _nodes(by_kind, lambda n: n["props"].get("id") == ids.AN_SEVERITY_FILTER)[0]
    crit = next(a for a in _nodes(sev_bar, lambda n: "href" in n["props"]) if _text(a) == "critical")
    assert _q(crit["props"]["href"]) == {**whole_window, "kind": "p99_band_break", "severity": "critical"}


def test_incident_url_selects_it(pattern_store, whole_window):  # noqa: F811
    from modalscope.app.pages import anomalies

    with pattern_store.app.test_request_context():
        api = pattern_store.get("incidents", **whole_window)
        last = api[-1]
        tree = _tree(anomalies._fill({**whole_window, "incident": last["id"]}))
        missing = _tree(anomalies._fill({**whole_window, "incident": "f" * 16}))
        bad = _tree(anomalies._fill({**whole_window, "incident": "<b>", "kind": "x y", "severity": "high"}))
    sections = _sections(tree)
    assert sections[0]["props"]["id"] == inc.ANCHOR_PREFIX + last["id"]
    assert "ms-incident-selected" in sections[0]["props"]["className"]
    assert not any("ms-incident-selected" in s["props"]["className"] for s in sections[1:])
    assert sorted(s["props"]["id"] for s in sections) == sorted(inc.ANCHOR_PREFIX + i["id"] for i in api)
    assert "That incident is not in this window" in json.dumps(missing) and len(_sections(missing)) == len(api)
    text = json.dumps(bad)
    for key in ("incident: '<b>'", "kind: 'x y'", "severity: 'high'"):
        assert key in text
    assert len(_sections(bad)) == len(api)  # the bad keys are ignored, the page stands


def test_links_are_relative_and_text_stays_text(pattern_store, whole_window):  # noqa: F811
    from modalscope.app.pages import anomalies, overview

    with pattern_store.app.test_request_context():
        trees = [_tree(anomalies._fill(whole_window)), _tree(overview._incidents(whole_window))]
    for tree in trees:
        hrefs = _hrefs(tree)
        assert hrefs and all(h.startswith("/") and not h.startswith("//") for h in hrefs)
    headline = Finding.from_json({
        "kind": "cold_start", "severity": "critical", "start": "2025-11-30T10:30:00Z",
        "end": "2025-11-30T10:35:00Z", "hint": HOSTILE, "exemplar_trace_ids": ["javascript:alert(1)"],
        "subject": {"service": HOSTILE, "attribute": {"key": HOSTILE, "value": "javascript:x"}},
        "evidence": {"first_median_ms": 3918.1, "steady_median_ms": 248.2}})
    built = inc.build([headline])
    card = _tree(c.incident_card(built, inc.incident_page_href(built.id, {"range": "1h"})))
    assert HOSTILE in _text(card) and "3.92 s vs 248 ms" in _text(card)
    assert [h.split("?")[0] for h in _hrefs(card)] == ["/anomalies"]
    section = _tree(overview.top_incidents([built], {"range": "1h"}, judged=True))
    assert all(h.startswith("/") for h in _hrefs(section))
    for page in ("overview.py", "anomalies.py", "_anomaly_cards.py", "_anomaly_charts.py"):
        source = (Path(overview.__file__).parent / page).read_text()
        assert "dangerously_allow_html" not in source and "dcc.Markdown" not in source


def test_card_pieces():
    assert c.kind_text("p99_band_break") == "p99 band break"
    def with_evidence(evidence: dict) -> Finding:
        return Finding("p99_band_break", "warning", Subject(), "2025-11-30T10:30:00Z", "2025-11-30T10:35:00Z",
                       evidence)

    assert c.finding_measure(with_evidence({"hit_rate": 0.1011, "baseline_hit_rate": 0.8413})) == \
        "hit rate 10.1 % vs 84.1 %"
    assert c.finding_measure(with_evidence({"p99_ms": 11380.6, "baseline_p99_ms": 2788.8})) == "P99 11.4 s vs 2.79 s"
    assert c.finding_measure(with_evidence({"sample_count": 3})) == ""
    assert c.span_text("2025-11-30T10:30:00Z", "2025-11-30T10:35:00Z") == "2025-11-30 10:30 → 10:35 UTC"
    assert c.span_text("2025-11-30T23:30:00Z", "2025-12-01T00:35:00Z") == \
        "2025-11-30 23:30 → 2025-12-01 00:35 UTC"
    unknown = Incident("ab" * 8, "critical", "a", "b", False,
                       (with_evidence({}).replace(subject=Subject(caller="gateway", callee="llm")),),
                       (StageSuspect("preprocessing", 0.556), AttributeSuspect("input_type", "multi_image", 2.75)))
    text = _text(_tree(c.incident_cause(unknown)))
    assert text.startswith("Cause unknown") and "stage preprocessing (56 % of the added time)" in text
    assert "input_type=multi_image (×2.8)" in text
    # A Compare that found nothing says so, on a card drawn at once or later.
    assert _text(_tree(c.incident_cause(dataclasses.replace(unknown, suspects=())))).endswith("none found")
    assert _text(_tree(c.incident_cause(dataclasses.replace(unknown, suspects=()), later=True))).startswith(
        "Cause unknown — suspects: comparing")
    assert _text(c.suspects_line([])).endswith("none found") and "not available" in _text(c.suspects_line(None))
    assert inc.page_href({"range": "1h", "min_ms": "3"}, kind="cold_start", incident=None) == \
        "/anomalies?range=1h&kind=cold_start"
    assert inc.incident_page_href("ab" * 8, {}) == f"/anomalies?incident={'ab' * 8}#incident-{'ab' * 8}"
