"""What the dashboard bench times (part of ``dashboard_bench.py``, not a script): every API
call, page callback and query function for one window, about a subject picked before timing."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from dashboard_exact import CACHE_GROUP_BY, cache_rows


@dataclass
class Call:
    group: str  # api | page | query
    name: str
    fn: Callable[[], Any]
    exact: str | None = None  # pairs | input_types | stages: compared with the exact answer
    rows: Callable[[Any], list[dict]] | None = None  # the result's rows, for that comparison


@dataclass
class Subject:
    """What the pair/trace-specific calls look at in one window (picked before timing)."""

    caller: str | None
    callee: str | None
    band: tuple[float, float] | None
    trace_id: str
    stage: str = "preprocessing"
    group_by: str = CACHE_GROUP_BY
    extra: dict = field(default_factory=dict)


GROUPS = ("api", "page", "query")


def parse_groups(ap, value: str) -> tuple[str, ...]:
    groups = tuple(g.strip() for g in value.split(",") if g.strip())
    if not groups or any(g not in GROUPS for g in groups):
        ap.error(f"--groups: a comma-separated list of {', '.join(GROUPS)}")
    return groups


def pick_subject(reader, window) -> Subject:
    from modalscope.app import queries
    from modalscope.models.reader import Filters

    pairs = queries.pairs(reader, window)
    caller = callee = None
    band = None
    if pairs:
        caller, callee = pairs[0]["caller"], pairs[0]["callee"]  # the busiest pair
        dist = queries.latency_distribution(reader, window, Filters(caller=caller, callee=callee))
        p99 = dist["p99_ms"]
        for b in dist["bins"]:  # the display bin holding the P99: a click on the histogram's tail
            if p99 is not None and b["min_ms"] <= p99 <= b["max_ms"]:
                band = (b["min_ms"], b["max_ms"])
    slowest = queries.exemplar_traces(reader, window, Filters(), limit=1)
    subject = Subject(caller, callee, band, slowest[0]["trace_id"] if slowest else "0" * 31 + "1")
    if len(pairs) > 1:
        # The pair with the fastest calls among the ten busiest: its slowest calls hide behind
        # its caller's slower calls to other services (the hard case for an exemplar search).
        fast = min(pairs[:10], key=lambda p: (p["p50_ms"] if p["p50_ms"] is not None else math.inf))
        subject.extra["fast_pair"] = (fast["caller"], fast["callee"])
    # Compare reads the callee's SERVER spans: the busiest pair whose callee sends spans of
    # its own (the busiest pair's callee may be an uninstrumented database, read in no time).
    served = next((p for p in pairs if reader.attributes.subjects(window.start_ns, window.end_ns, kind=2,
                                                                  service=p["callee"], limit=1)), None)
    if served is not None and (served["caller"], served["callee"]) != (caller, callee):
        subject.extra["served_pair"] = (served["caller"], served["callee"])
    return subject


def _dash_body(key: str, store: str, data: dict) -> dict:
    def spec(s: str) -> dict:
        cid, prop = s.rsplit(".", 1)
        return {"id": cid, "property": prop}

    outputs = [spec(s) for s in key[2:-2].split("...")] if key.startswith("..") else spec(key)
    return {"output": key, "outputs": outputs, "inputs": [{"id": store, "property": "data", "value": data}],
            "changedPropIds": [f"{store}.data"], "state": []}


def _anomaly_chart_calls(client, ok, key: str, base: dict, suspects_key: str | None = None) -> list["Call"]:
    """The Anomalies page's charts and incidents' suspects, as the browser asks for them after
    the list: one chart (the first finding's), one incident's suspects, and the list with every
    chart and every suspects line one after another (what one worker serves for the whole page;
    a browser sends them at once, to as many workers)."""
    from modalscope.app import ids

    list_body = _dash_body("anomalies-list.children", ids.AN_STATE, base)

    def asks() -> dict[str, list[tuple[dict, dict]]]:
        """The page's chart specs and suspects asks: (pattern id, store data) by store type."""
        found: dict[str, list[tuple[dict, dict]]] = {ids.AN_CHART_SPEC: [], ids.INCIDENT_SUSPECTS_ASK: []}

        def walk(node):
            if isinstance(node, dict):
                props = node.get("props") or {}
                cid = props.get("id")
                if isinstance(cid, dict) and cid.get("type") in found:
                    found[cid["type"]].append((cid, props["data"]))
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(ok(client.post("/_dash-update-component", json=list_body)).get_json())
        return found

    def chart_body(cid: dict, spec: dict) -> dict:
        return {"output": key, "outputs": {"id": {**cid, "type": ids.AN_CHART}, "property": "figure"},
                "inputs": [{"id": cid, "property": "data", "value": spec}], "changedPropIds": [], "state": []}

    def suspects_body(cid: dict, ask: dict) -> dict:
        return {"output": suspects_key,
                "outputs": {"id": {**cid, "type": ids.INCIDENT_SUSPECTS}, "property": "children"},
                "inputs": [{"id": cid, "property": "data", "value": ask}], "changedPropIds": [], "state": []}

    def whole_page():
        found = asks()
        for cid, spec in found[ids.AN_CHART_SPEC]:
            ok(client.post("/_dash-update-component", json=chart_body(cid, spec)))
        for cid, ask in found[ids.INCIDENT_SUSPECTS_ASK] if suspects_key else ():
            ok(client.post("/_dash-update-component", json=suspects_body(cid, ask)))

    first: dict = {}

    def one(kind: str, body):
        def call():
            if kind not in first:  # the list is read once, untimed
                first[kind] = asks()[kind][:1]
            if first[kind]:
                return ok(client.post("/_dash-update-component", json=body(*first[kind][0])))
            return None
        return call

    calls = [Call("page", "page anomalies (one finding's chart)", one(ids.AN_CHART_SPEC, chart_body))]
    if suspects_key:
        calls.append(Call("page", "page anomalies (one incident's suspects)", one(ids.INCIDENT_SUSPECTS_ASK,
                                                                                suspects_body)))
    return calls + [Call("page", "page anomalies: the list, every chart and suspects line, one after another",
                          whole_page)]


def page_callbacks(dash_app) -> list[tuple[str, str, str]]:
    """(label, output key, state store id) of every callback whose one input is a page's
    ``*-state`` store: the callbacks that fetch a page's data."""
    out = []
    for key, spec in dash_app.callback_map.items():
        ins = spec.get("inputs") or []
        if len(ins) != 1 or ins[0].get("property") != "data" or not str(ins[0].get("id", "")).endswith("-state"):
            continue
        fn = getattr(spec.get("callback"), "__wrapped__", spec.get("callback"))
        module = getattr(fn, "__module__", "").rsplit(".", 1)[-1]
        page = "toolbar" if module == "components" else module
        what = getattr(fn, "__name__", "?").strip("_").replace("_", " ")
        out.append((f"{page}" + ("" if what == "fill" else f" ({what})"), key, ins[0]["id"]))
    return sorted(out)


#: How many times a call has deleted every stored findings evaluation (``_past_day_request``).
_CLEARED = [0]


def _evaluated_ahead(reader, window, th) -> Callable[[], Any]:
    """What a request for the findings of a window ending now costs when the worker has
    evaluated that range (app/evaluations.py): the evaluation is made once, untimed, and the
    call reads it for a window 30 s later, as a request arriving then would."""
    from modalscope.app import evaluations
    from modalscope.app.params import Window
    from modalscope.models.reader import Filters

    state: dict = {}

    def call():
        # (again after a call below cleared every stored evaluation: read_under_load times
        # each call twice, idle and loaded)
        if state.get("cleared") != _CLEARED[0]:
            evaluations.evaluate(reader, window, th)
            state["cleared"] = _CLEARED[0]
        later = Window(window.start_ns + 30 * 10**9, window.end_ns + 30 * 10**9)
        ev = evaluations.find_for(reader, later, Filters(), th, relative=True)
        if not ev.stored:
            raise RuntimeError("the stored evaluation did not answer")
        return ev.findings

    return call


def _absolute_first_request(reader, window, th) -> Callable[[], Any]:
    """The first request for an absolute window's findings: the stored findings of absolute
    windows are deleted before each call, so the detectors run and store their result (the
    API and page calls above, after their warm-up, are answered from that stored result)."""
    from sqlalchemy import delete

    from modalscope.app import evaluations
    from modalscope.models import FindingEvaluation
    from modalscope.models.reader import Filters

    def call():
        with reader.engine.begin() as conn:
            conn.execute(delete(FindingEvaluation).where(FindingEvaluation.range_s == evaluations.ABSOLUTE_RANGE))
        ev = evaluations.find_for(reader, window, Filters(), th, relative=False)
        if ev.stored:
            raise RuntimeError("a stored evaluation answered the first request")
        return ev.findings

    return call


def _past_day_request(reader, window, th, *, evaluated_ahead: bool) -> Callable[[], Any]:
    """The first request for a window in the day before the last 24 h (a post-mortem of
    yesterday's incident): the window's last ``min(length, 12 h)`` ending 6 h before the
    newest whole hour, seen from a day later. ``evaluated_ahead``: the settler has evaluated
    that day (``EvaluationSchedule`` with ``past_days``, untimed, once); else nothing stored
    overlaps it (every stored evaluation is deleted before each call)."""
    from sqlalchemy import delete

    from modalscope.app import evaluations
    from modalscope.models import FindingEvaluation
    from modalscope.models.reader import Filters

    day_later = window.end_ns + 86_400 * 10**9
    (past,) = evaluations.past_windows(day_later, 1)
    end = past.end_ns - 6 * 3600 * 10**9
    target = type(window)(end - min(window.end_ns - window.start_ns, 12 * 3600 * 10**9), end)
    fe, state = FindingEvaluation, {}

    def call():
        with reader.engine.begin() as conn:
            if not evaluated_ahead or "done" not in state:
                conn.execute(delete(fe))
                _CLEARED[0] += 1
            else:
                conn.execute(delete(fe).where(fe.start_ns == target.start_ns, fe.end_ns == target.end_ns))
        if evaluated_ahead and "done" not in state:
            schedule = evaluations.EvaluationSchedule(reader.engine, (), every_s=60, thresholds=th, past_days=1)
            if schedule.maybe_run(now_ns=day_later) != 1:
                raise RuntimeError("the past day was not evaluated")
            state["done"] = True
        ev = evaluations.find_for(reader, target, Filters(), th, relative=False)
        if ev.stored:
            raise RuntimeError("a stored evaluation answered the first request")
        return ev.findings

    return call


def build_calls(app, client, reader, window, subject: Subject) -> list[Call]:
    """Every API call, page callback and query function timed for ``window``."""
    from modalscope.app import findings, queries
    from modalscope.app import state as st
    from modalscope.app.detectors import Thresholds
    from modalscope.models.reader import Filters

    start_s, end_s = window.start_ns // 1_000_000_000, window.end_ns // 1_000_000_000
    q = f"start={start_s}&end={end_s}"
    base = {"start": str(start_s), "end": str(end_s)}
    pair_q = pair_f = None
    pair_state: dict = {}
    if subject.caller:
        pair_q = f"caller={subject.caller}&callee={subject.callee}"
        pair_f = Filters(caller=subject.caller, callee=subject.callee)
        pair_state = {"caller": subject.caller, "callee": subject.callee}
    band_q = band_state = None
    if subject.band:
        band_q = f"min_ms={subject.band[0]}&max_ms={subject.band[1]}"
        band_state = {**pair_state, "min_ms": str(subject.band[0]), "max_ms": str(subject.band[1])}

    def ok(resp):
        if resp.status_code not in (200, 204):
            raise RuntimeError(f"{resp.status_code}: {resp.get_data(as_text=True)[:300]}")
        return resp

    def api(path):
        return lambda: ok(client.get(path))

    def json_rows(rows):  # the response's JSON (measure() decodes it)
        return rows

    calls = [
        Call("api", "/api/v1/health", api("/api/v1/health")),
        Call("api", "/api/v1/pairs", api(f"/api/v1/pairs?{q}"), "pairs", json_rows),
        Call("api", "/api/v1/input-types", api(f"/api/v1/input-types?{q}"), "input_types", json_rows),
        Call("api", "/api/v1/stages", api(f"/api/v1/stages?{q}"), "stages", json_rows),
        Call("api", "/api/v1/traces", api(f"/api/v1/traces?{q}&limit=20")),
    ]
    if pair_q:
        calls.append(Call("api", "/api/v1/traces?caller&callee", api(f"/api/v1/traces?{q}&{pair_q}&limit=20")))
    if "fast_pair" in subject.extra:
        fast_q = "caller={}&callee={}".format(*subject.extra["fast_pair"])
        calls.append(Call("api", "/api/v1/traces?caller&callee (the pair with the fastest calls)",
                          api(f"/api/v1/traces?{q}&{fast_q}&limit=20")))
    if band_q:
        calls.append(Call("api", "/api/v1/traces?caller&callee&min_ms&max_ms",
                          api(f"/api/v1/traces?{q}&{pair_q}&{band_q}&limit=20")))
    calls += [
        Call("api", "/api/v1/traces?stage", api(f"/api/v1/traces?{q}&stage={subject.stage}&limit=20")),
        Call("api", "/api/v1/traces/<id>", api(f"/api/v1/traces/{subject.trace_id}")),
        Call("api", f"/api/v1/cache?group_by={subject.group_by}", api(f"/api/v1/cache?{q}&group_by={subject.group_by}"),
             "cache", cache_rows),
        Call("api", "/api/v1/anomalies", api(f"/api/v1/anomalies?{q}")),
        Call("api", "/api/v1/compare" + ("?caller&callee" if pair_q else ""),
             api(f"/api/v1/compare?{q}" + (f"&{pair_q}" if pair_q else ""))),
        Call("api", "/api/v1/share?panel=pair-heatmap", api(f"/api/v1/share?panel=pair-heatmap&{q}")),
    ]
    if "served_pair" in subject.extra:
        served_q = "caller={}&callee={}".format(*subject.extra["served_pair"])
        calls.append(Call("api", "/api/v1/compare?caller&callee (the busiest pair with an instrumented callee)",
                          api(f"/api/v1/compare?{q}&{served_q}")))
    calls.append(Call("api", "/api/v1/compare (whole traces)", api(f"/api/v1/compare?{q}")))

    # Page data callbacks, as the browser calls them.
    dash_app = app.extensions["modalscope"]["dash"]
    states = {
        "toolbar": [("", {"path": "/", "state": base})],
        "drilldown": [(" pair", {**base, **pair_state})] + ([(" pair+band", {**base, **band_state})] if band_state else []),
        "trace": [("", {"trace_id": subject.trace_id, "state": base})],
        "cache": [("", {**base, "group_by": subject.group_by})],
        "compare": [(" pair" if pair_state else "", {**base, **pair_state})]
        + ([(" pair with an instrumented callee", {**base, "caller": subject.extra["served_pair"][0],
                                                 "callee": subject.extra["served_pair"][1]})]
           if "served_pair" in subject.extra else []),
    }
    for label, key, store in page_callbacks(dash_app):
        page = label.split(" ", 1)[0]
        for suffix, data in states.get(page, [("", base)]):
            body = _dash_body(key, store, data)
            calls.append(Call("page", f"page {label}{suffix}",
                              lambda body=body: ok(client.post("/_dash-update-component", json=body))))

    # The Anomalies page draws each finding's chart in its own request after the list.
    an_key = next((k for k in dash_app.callback_map if '"anomalies-chart"' in k), None)
    suspects_key = next((k for k in dash_app.callback_map if '"incident-suspects"' in k), None)
    if an_key:
        calls += _anomaly_chart_calls(client, ok, an_key, base, suspects_key)

    # The query functions behind them.
    th = Thresholds.from_env()
    step = st.step_minutes(window)
    calls += [
        Call("query", "overview: overview_rows", lambda: queries.overview_rows(reader, window), "input_types",
             lambda rows: [r for r in rows if r["count"]]),
        Call("query", "overview: traffic_series", lambda: queries.traffic_series(reader, window, step_minutes=step)),
        Call("query", "overview/anomalies: findings.find", lambda: findings.find(reader, window, th=th)),
        # A "last N" request when the worker keeps its evaluation fresh (app/evaluations.py):
        # the worker evaluated the window 30 s before the request's.
        Call("query", "anomalies, window ending now: the worker's evaluation", _evaluated_ahead(reader, window, th)),
        # An absolute window's first request; later ones (the API and page calls, after their
        # warm-up) read what it stored while no write touches its minutes.
        Call("query", "anomalies, absolute window: its first request", _absolute_first_request(reader, window, th)),
        # The same 6 h earlier (a shared link to last night): for 24 h it overlaps the stored
        # evaluation by 18 h and takes what it can from it; for 1 h nothing stored overlaps.
        Call("query", "anomalies, absolute window 6 h earlier: its first request",
             _absolute_first_request(reader, type(window)(window.start_ns - 6 * 3600 * 10**9,
                                                          window.end_ns - 6 * 3600 * 10**9), th)),
        # A window in the day before the last 24 h, opened a day later (1 h, or 12 h for the
        # 24 h column): with that day evaluated ahead by the settler, and with nothing stored.
        Call("query", "anomalies, a window in the day before, evaluated ahead: its first request",
             _past_day_request(reader, window, th, evaluated_ahead=True)),
        Call("query", "anomalies, the same window, nothing stored: its first request",
             _past_day_request(reader, window, th, evaluated_ahead=False)),
        Call("query", "pairs: pair_heatmap", lambda: queries.pair_heatmap(reader, window), "pairs",
             lambda heat: heat["pairs"]),
        Call("query", "pairs: pair_table", lambda: queries.pair_table(reader, window), "pairs", lambda rows: rows),
    ]
    if pair_f:
        calls += [
            Call("query", "drilldown: latency_distribution (pair)", lambda: queries.latency_distribution(reader, window, pair_f)),
            Call("query", "drilldown: percentile_series (pair)",
                 lambda: queries.percentile_series(reader, window, pair_f, step_minutes=step)),
            Call("query", "drilldown: exemplar_traces (pair, slowest 20)",
                 lambda: queries.exemplar_traces(reader, window, pair_f, limit=20)),
        ]
    if subject.band:
        calls.append(Call("query", "drilldown: exemplar_traces (pair, band)",
                          lambda: queries.exemplar_traces(reader, window, pair_f, subject.band[0], subject.band[1], limit=20)))
    calls += [
        Call("query", "trace: exemplar_traces (slowest 20)", lambda: queries.exemplar_traces(reader, window, Filters(), limit=20)),
        Call("query", "trace: trace_view", lambda: queries.trace_view(reader, subject.trace_id, window)),
        Call("query", "stages: stage_breakdown", lambda: queries.stage_breakdown(reader, window)),
        Call("query", "stages: stage_series", lambda: queries.stage_series(reader, window, step_minutes=step)),
        Call("query", "stages: vit_layers", lambda: queries.vit_layers(reader, window)),
        Call("query", "stages: stages", lambda: queries.stages(reader, window, group_by="input_type"), "stages",
             lambda rows: rows),
        Call("query", "cache: cache_rates", lambda: queries.cache_rates(reader, window, subject.group_by), "cache",
             cache_rows),
        Call("query", "cache: cache_series",
             lambda: queries.cache_series(reader, window, subject.group_by, step_minutes=st.step_minutes(window, 60))),
        Call("query", "compare: compare" + (" (pair)" if pair_f else ""),
             lambda: queries.compare(reader, window, None, pair_f or Filters())),
        Call("query", "toolbar: filter_options", lambda: queries.filter_options(reader)),
    ]
    return calls
