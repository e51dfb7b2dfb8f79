"""Anomalies (``/anomalies``): the anomaly catalog's findings in the window (the same as
``/api/v1/anomalies``) grouped by incident (``/api/v1/incidents``): a section per incident,
most severe first, headed by its likely cause (or its leading symptom and Compare's
suspects), with the window's findings it folds under it. Each finding card has its evidence
numbers in their units, the hint (a folded symptom's links to its incident), a small chart of
what fired it over time (``evidence_series``: the subject's percentiles, a hit rate, a share,
a spread) with the threshold, ceiling or baseline it is judged against as a labelled line and
the finding's window shaded, and links to the drilldown, Compare and its exemplar traces. Findings the incidents judged over their own spans leave out are
listed last. URL state: window and filters (a filter keeps the incidents one of whose
findings names it), ``kind=`` (incidents with a finding of that kind), ``severity=`` and
``incident=<id>`` (that incident first, marked; its section's anchor is ``#incident-<id>``).

The list comes first and each chart after it, in its own request (a pattern-matching
callback per card, as a dashboard loads its panels): a dozen charts over a day took half of
the page's 300 ms budget and most of its bytes on a slow machine. The first ``MAX_CHARTS``
cards shown get a chart, and so does the first card of every other kind.
"""

from __future__ import annotations

from datetime import datetime, timezone

import re

import dash
from dash import MATCH, Input, Output, dcc, html

import math

import numpy as np

from modalscope.app import components as c
from modalscope.app import evaluations, figures, findings, ids, links, queries
from modalscope.app import incidents as inc
from modalscope.app import state as st
from modalscope.app.params import ParamError, Window, parse_time, rfc3339
from modalscope.app.units import evidence_items
from modalscope.models.reader import Filters, RollupQuery

dash.register_page(__name__, path="/anomalies", name="Anomalies", title="modalscope · anomalies", order=6)

PATH = "/anomalies"
MAX_CHARTS = 12
CONTEXT_NS = 45 * 60_000_000_000  # before the finding's window, on its chart
# A finding's window is at most the detectors' longest (its run may start in the baseline
# look-back before the judged window): a longer one came from an edited request.
MAX_CHART_S = findings.MAX_WINDOW_S + 2 * 3600
# What a card's chart shows until its callback draws it: no template, a few bytes.
CHART_HEIGHT = 220
PLACEHOLDER = {"data": [], "layout": {"height": CHART_HEIGHT, "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
                                      "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                      "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)"}}


def evidence_window(f: dict) -> tuple[Window, int, int] | None:
    try:
        s, e = parse_time(str(f["start"]), "start"), parse_time(str(f["end"]), "end")
    except (KeyError, ParamError):
        return None
    return Window(s - CONTEXT_NS, e + CONTEXT_NS // 3), s, e


def chart_spec(f: dict) -> dict:
    """What a finding's chart needs (kept in the card, sent back by the browser): its kind,
    window, subject filters, attribute, cache and evidence numbers."""
    subject = f.get("subject") if isinstance(f.get("subject"), dict) else {}
    spec = {"kind": str(f.get("kind") or ""), "start": str(f["start"]), "end": str(f["end"]),
            "subject": links.finding_filters(f),
            "evidence": {str(k): v for k, v in (f.get("evidence") or {}).items() if _number(v) is not None}}
    attr = subject.get("attribute")
    if isinstance(attr, dict) and isinstance(attr.get("key"), str):
        spec["attribute"] = {"key": attr["key"], "value": str(attr.get("value"))}
    if isinstance(subject.get("cache"), str):
        spec["cache"] = subject["cache"]
    return spec


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def chart_title(spec: dict) -> str:
    """The line above a finding's chart: what it draws."""
    kind, subject = spec.get("kind"), spec.get("subject") or {}
    attr = spec.get("attribute") or {}
    f = Filters(**{k: v for k, v in subject.items() if k in links.SUBJECT_FILTERS and isinstance(v, str)})
    if kind == "cache_penetration":
        return f"Hit rate of {attr.get('key')}={attr.get('value')} in cache {spec.get('cache')}, against the floor"
    if kind == "preprocessing_bound":
        return f"Preprocessing's share of end-to-end time ({f.input_type or 'all'} requests)"
    if kind == "batching_failure":
        return f"Share of batches of one on {f.service}"
    if kind == "cuda_graph_fallback":
        return f"Share of CUDA Graph fallbacks on {f.service}"
    if kind == "fusion_sync_wait":
        return "Median spread between the first and last encoder to finish, before fusion"
    if kind == "cold_start":
        return f"Median request time of {f.service}'s new instance {attr.get('value')}"
    if kind == "lb_timeout_truncation":
        return f"Slowest {f.input_type + ' ' if f.input_type else ''}requests against the timeout ceiling"
    if kind == "baseline_regression":
        return f"P50 / P95 of end-to-end {f.input_type} requests against the baseline"
    return f"P50 / P99 of {queries.subject_label(f)}"


def _chart(f: dict, i: int):
    """The card's chart, empty until its own callback (``_fill_chart``) draws it."""
    if evidence_window(f) is None:
        return None
    spec = chart_spec(f)
    return html.Div([html.Div(chart_title(spec), className="ms-note ms-evidence-chart-title"),
                     dcc.Store(id={"type": ids.AN_CHART_SPEC, "index": i}, data=spec),
                     c.loading(c.graph({"type": ids.AN_CHART, "index": i}, figure=PLACEHOLDER,
                                       config={"displayModeBar": False}))])


def chart_figure(spec: dict | None):
    """A finding's chart: what fired it around its window, with its threshold (``spec``: the
    card's store, which the browser sends back, so it is checked like a query)."""
    spec = spec if isinstance(spec, dict) else {}
    subject = spec.get("subject") if isinstance(spec.get("subject"), dict) else {}
    subject = {k: v for k, v in subject.items() if k in links.SUBJECT_FILTERS and isinstance(v, str)}
    ew = evidence_window({**spec, "subject": subject})
    if ew is None:
        return figures.empty_figure("This finding has no valid window.", CHART_HEIGHT)
    window, s, e = ew
    if window.seconds > MAX_CHART_S:
        return figures.empty_figure("This finding's window is too long to chart.", CHART_HEIGHT)
    ev = spec.get("evidence") if isinstance(spec.get("evidence"), dict) else {}
    ev = {str(k): _number(v) for k, v in ev.items()}
    attr = spec.get("attribute") if isinstance(spec.get("attribute"), dict) else {}
    attr = {k: str(attr[k]) for k in ("key", "value") if isinstance(attr.get(k), (str, int, float))}
    cache = spec.get("cache") if isinstance(spec.get("cache"), str) else None
    step = st.step_minutes(window, 60)
    rows, series, lines, unit = evidence_series(str(spec.get("kind") or ""), window, Filters(**subject), step, ev,
                                                attr, cache)
    return figures.evidence_figure(rows, datetime.fromtimestamp(s / 1e9, tz=timezone.utc),
                                   datetime.fromtimestamp(e / 1e9, tz=timezone.utc), CHART_HEIGHT,
                                   series=series, lines=lines, unit=unit)


def evidence_series(kind: str, window: Window, filters: Filters, step: int, ev: dict, attr: dict,
                    cache: str | None):
    """``(rows, series, lines, unit)`` of a finding's chart (``figures.evidence_figure``): per
    kind, the measure that fired it per ``step`` minutes, and the threshold, ceiling or
    baseline it was judged against (from its evidence, else the detectors' thresholds)."""
    th = c.thresholds()
    reader = c.reader()
    p = figures.PCT_STYLE
    if kind == "baseline_regression":
        rows = _quantile_rows(reader, RollupQuery("trace", window.start_ns, window.end_ns,
                                                  Filters(input_type=filters.input_type)), step, {"p50_ms": 0.5,
                                                                                                 "p95_ms": 0.95})
        margin = ev.get("margin") if ev.get("margin") is not None else th.baseline_margin
        return rows, [("p50_ms", "P50", p["p50"][1]), ("p95_ms", "P95", p["p99"][1])], \
            [("baseline P95", ev.get("baseline_p95_ms")), (f"threshold (+{margin * 100:.0f} %)", ev.get("threshold_ms"))], "ms"
    if kind == "lb_timeout_truncation":
        rows = _quantile_rows(reader, RollupQuery("trace", window.start_ns, window.end_ns,
                                                  Filters(input_type=filters.input_type)), step,
                              {"p50_ms": 0.5, "p99_ms": 0.99, "max_ms": 1.0})
        ceiling = ev.get("ceiling_s")
        return rows, [("p50_ms", "P50", p["p50"][1]), ("p99_ms", "P99", p["p99"][1]),
                      ("max_ms", "slowest", figures.CRITICAL)], \
            [("timeout ceiling", ceiling * 1000 if ceiling is not None else None)], "ms"
    if kind == "cold_start":
        return _cold_start_rows(reader, window, filters, step, ev, attr, th)
    if kind == "fusion_sync_wait":
        frame = _frame(reader, "sync", window, ("service",), Filters(service=filters.service), sketches=True)
        rows = _sketch_steps(frame, step, {"spread_ms": 0.5})
        return rows, [("spread_ms", "median encoder spread", figures.stage_color("fusion"))], \
            [("threshold", _or(ev.get("threshold_ms"), th.sync_spread_ms)),
             ("baseline", ev.get("baseline_spread_ms"))], "ms"
    if kind == "cache_penetration":
        return _cache_rows(reader, window, step, ev, attr, cache)
    if kind == "preprocessing_bound":
        pre = _frame(reader, "tstage", window, ("input_type",), Filters(stage="preprocessing",
                                                                        input_type=filters.input_type),
                     sketches=False, with_sum=True)
        tr = _frame(reader, "trace", window, ("input_type",), Filters(input_type=filters.input_type),
                    sketches=False, with_sum=True)
        part, whole = _sum_steps(pre, step, "sum_ns"), _sum_steps(tr, step, "sum_ns")
        rows = [{"t": _t(m), "share": part.get(m, 0) / whole[m]} for m in sorted(whole) if whole[m] > 0]
        return rows, [("share", "preprocessing share", figures.stage_color("preprocessing"))], \
            [("threshold", _or(ev.get("threshold_share"), th.preprocess_min_share)),
             ("baseline", ev.get("baseline_share"))], "pct"
    if kind == "batching_failure":
        frame = _frame(reader, "batch", window, ("service",), Filters(service=filters.service), sketches=False)
        ones, total = _sum_steps(frame, step, "errors"), _sum_steps(frame, step, "count")
        rows = [{"t": _t(m), "share": ones.get(m, 0) / total[m]} for m in sorted(total) if total[m] > 0]
        return rows, [("share", "batches of one", figures.stage_color("encoder"))], \
            [("stuck threshold", _or(ev.get("threshold_share"), th.batch_stuck_share)),
             ("baseline", ev.get("baseline_batch_one_share"))], "pct"
    if kind == "cuda_graph_fallback":
        frame = _frame(reader, "cuda", window, ("service", "callee"), Filters(service=filters.service),
                       sketches=False)
        total = _sum_steps(frame, step, "count")
        fb = _sum_steps(frame[frame["callee"] == "fallback"] if len(frame) else frame, step, "count")
        rows = [{"t": _t(m), "share": fb.get(m, 0) / total[m]} for m in sorted(total) if total[m] > 0]
        return rows, [("share", "fallback share", figures.stage_color("inference"))], \
            [("threshold", _or(ev.get("threshold_share"), th.fallback_share)),
             ("baseline", ev.get("baseline_fallback_share"))], "pct"
    # The pair kinds (hot spot, band break) and any other: the subject's P50/P99.
    rows = queries.percentile_series(reader, window, filters, step)
    if kind == "p99_band_break":
        lines = [("baseline P99", ev.get("baseline_p99_ms")),
                 (f"break threshold (×{_or(ev.get('threshold_ratio'), th.band_ratio):g})", ev.get("threshold_ms"))]
    elif kind == "hot_spot":
        lines = [("median P99 of the pairs", ev.get("median_pair_p99_ms"))]
    else:
        lines = []
    return rows, None, lines, "ms"


def _or(v, default):
    return default if v is None else v


def _t(minute: int) -> str:
    return rfc3339(int(minute) * 60_000_000_000)


def _frame(reader, kind: str, window: Window, dims: tuple[str, ...], filters: Filters, sketches: bool,
           with_sum: bool = False):
    """One rollup kind's minute rows in the window (``findings._columns_frame``)."""
    cols, dims_of = reader.rollup_columns(kind, window.start_ns, window.end_ns, dims, filters, sketches=sketches)
    return findings._columns_frame(cols, dims_of, dims, with_sum=with_sum, sketches=sketches)


def _sum_steps(frame, step: int, column: str) -> dict[int, float]:
    """``column`` summed per step (start minute -> sum)."""
    if frame is None or not len(frame):
        return {}
    steps = frame["minute"].to_numpy(dtype=np.int64) // step * step
    values = frame[column].to_numpy(dtype=np.float64)
    keys, at = np.unique(steps, return_inverse=True)
    return dict(zip(keys.tolist(), np.bincount(at, weights=values, minlength=len(keys)).tolist()))


def _sketch_steps(frame, step: int, quantiles: dict[str, float]) -> list[dict]:
    """Per step, the quantiles (ms) of the merged sketches of ``frame``'s rows."""
    if frame is None or not len(frame):
        return []
    steps = frame["minute"].to_numpy(dtype=np.int64) // step * step
    rows = []
    for m in sorted(set(steps.tolist())):
        sel = steps == m
        h = findings.d.histogram_of(frame["keys"].to_numpy()[sel], frame["counts"].to_numpy()[sel])
        if h.count:
            rows.append({"t": _t(m), **{k: h.quantile(q) / 1e6 for k, q in quantiles.items()}})
    return rows


def _quantile_rows(reader, q: RollupQuery, step: int, quantiles: dict[str, float]) -> list[dict]:
    rows = []
    for g in sorted(reader.rollup_steps(q, step), key=lambda g: g.key[-1]):
        if g.count > 0:
            values = g.histogram.quantiles(list(quantiles.values()))
            rows.append({"t": _t(g.key[-1]), **{k: (v / 1e6 if v is not None else None)
                                                for k, v in zip(quantiles, values)}})
    return rows


def _cold_start_rows(reader, window: Window, filters: Filters, step: int, ev: dict, attr: dict, th):
    """The new instance's median request time per step (``inst`` rollups: a request a trace
    and instance) beside all the service's instances', against the steady median and the
    cold threshold (``cold_factor`` x it)."""
    frame = _frame(reader, "inst", window, ("name",), Filters(service=filters.service), sketches=True)
    mine = frame[frame["name"] == attr.get("value")] if len(frame) else frame
    rows_all = {r["t"]: r for r in _sketch_steps(frame, step, {"all_ms": 0.5})}
    for r in _sketch_steps(mine, step, {"new_ms": 0.5}):
        rows_all.setdefault(r["t"], {"t": r["t"]}).update(r)
    rows = [rows_all[t] for t in sorted(rows_all)]
    steady = ev.get("steady_median_ms")
    factor = _or(ev.get("threshold_ratio"), th.cold_factor)
    return rows, [("all_ms", "all instances' median", figures.PCT_STYLE["p50"][1]),
                  ("new_ms", f"{attr.get('value', 'new instance')} median", figures.PCT_STYLE["p99"][1])], \
        [("steady median", steady), (f"cold threshold (×{factor:g})", steady * factor if steady is not None else None)], \
        "ms"


def _cache_rows(reader, window: Window, step: int, ev: dict, attr: dict, cache: str | None):
    """Hit rate per step of the finding's tag value and of the cache's other values of that
    tag (``cache`` rollups: lookups and misses), against the hit-rate floor."""
    frame = _frame(reader, "cache", window, ("name", "caller", "callee"), Filters(), sketches=False)
    key, value = attr.get("key"), attr.get("value")
    if len(frame):
        frame = frame[(frame["name"] == cache) & (frame["caller"] == key)]
    rows: dict[int, dict] = {}
    for label, part in (("mine", frame[frame["callee"] == value] if len(frame) else frame),
                        ("others", frame[frame["callee"] != value] if len(frame) else frame)):
        looked, missed = _sum_steps(part, step, "count"), _sum_steps(part, step, "errors")
        for m, n in looked.items():
            if n > 0:
                rows.setdefault(m, {"t": _t(m)})[label] = 1 - missed.get(m, 0) / n
    return [rows[m] for m in sorted(rows)], \
        [("others", f"other {key} values", figures.PCT_STYLE["p50"][1]),
         ("mine", f"{key}={value}", figures.PCT_STYLE["p99"][1])], \
        [("hit-rate floor", ev.get("threshold_hit_rate")), ("baseline", ev.get("baseline_hit_rate"))], "pct"


@dash.callback(
    Output({"type": ids.AN_CHART, "index": MATCH}, "figure"),
    Input({"type": ids.AN_CHART_SPEC, "index": MATCH}, "data"),
)
def _fill_chart(spec):
    return chart_figure(spec)


def _chart_or_blank(f: dict, i: int, chart: bool, state: dict):
    out = _chart(f, i) if chart else None
    if out is None and not chart:
        kind = f.get("kind") if isinstance(f.get("kind"), str) and KIND_RE.fullmatch(f["kind"]) else None
        more = [" ", dcc.Link(f"Show the {c.kind_text(kind)} findings", href=inc.page_href(state, kind=kind),
                              className="ms-finding-link")] if kind else []
        return html.Div([f"No chart on this card: the page draws {MAX_CHARTS} and the first of each kind.", *more],
                        className="ms-note ms-evidence-no-chart")
    return html.Div() if out is None else out


def finding_card(f: dict, i: int, state: dict, chart: bool, hint=None, role: str = "") -> html.Article:
    """One finding: ``hint`` replaces its hint text (a folded symptom's, with the link to its
    incident); ``role`` is an extra class (``ms-incident-head``, ``ms-incident-folded``)."""
    evidence = f.get("evidence") if isinstance(f.get("evidence"), dict) else {}
    ev_rows = [{"name": html.Span(label, title=key), "value": value} for key, label, value in evidence_items(evidence)]
    cls = f"ms-panel ms-finding-card ms-finding-{f.get('severity', 'info')} {role}".strip()
    return html.Article(className=cls, children=[
        html.Div(c.finding_title(f), className="ms-finding-title"),
        html.Div(c.span_text(f.get("start"), f.get("end")), className="ms-note"),
        html.P(hint if hint is not None else str(f.get("hint") or ""), className="ms-finding-hint"),
        html.Div(className="ms-grid-2", children=[
            c.text_table([("name", "evidence"), ("value", "value")], ev_rows, className="ms-table ms-evidence"),
            _chart_or_blank(f, i, chart, state),
        ]),
        html.Div(c.finding_links(f, state), className="ms-finding-links"),
    ])


KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
ID_RE = re.compile(r"[0-9a-f]{16}")


def page_keys(query) -> tuple[dict[str, str], list[str]]:
    """``kind``, ``severity`` and ``incident`` from the URL, checked: (kept, what was wrong)."""
    out, errors = {}, []
    checks = {"kind": KIND_RE.fullmatch, "severity": lambda v: v in c.SEVERITY_ORDER, "incident": ID_RE.fullmatch}
    for key, ok in checks.items():
        value = (query or {}).get(key)
        if isinstance(value, (list, tuple)):
            value = value[-1] if value else None
        if value in (None, ""):
            continue
        value = str(value).strip()[:64]
        if ok(value):
            out[key] = value
        else:
            errors.append(f"{key}: {value!r} is not " + {"kind": "a finding kind",
                                                         "severity": "critical, warning or info",
                                                         "incident": "an incident id (16 hex digits)"}[key])
    return out, errors


def layout(**query):
    state = st.from_query(query)
    res = st.resolve(state)
    return html.Div(className="ms-page", children=[
        dcc.Store(id=ids.AN_STATE, data={**state, **{k: v for k, v in query.items() if k in inc.PAGE_KEYS}}),
        c.toolbar(PATH, state, error=res.error),
        html.Div(c.share_control("anomalies", state), className="ms-share-bar"),
        c.loading(html.Div(id=ids.AN_LIST)),
    ])


def _filter_links(state: dict, page: dict, kinds: list[str]) -> html.Div:
    """The kind and severity filters: links (the URL is the state), the current one marked."""
    def chips(key: str, values: list[str], label: str, cid: str):
        items = [html.Span(label, className="ms-filter-label")]
        for v in [None, *values]:
            href = inc.page_href(state, **{**page, key: v, "incident": None})
            active = page.get(key) == v
            items.append(dcc.Link(c.kind_text(v) if v else "all", href=href,
                                  className="ms-chip active" if active else "ms-chip",
                                  style={"marginLeft": "0.6em", "fontWeight": 600 if active else None},
                                  title=f"{label}: {'current' if active else 'show'}"))
        return html.Div(items, id=cid, className="ms-incident-filter", style={"margin": "0.2em 0"})

    return html.Div([chips("severity", list(c.SEVERITY_ORDER), "Severity", ids.AN_SEVERITY_FILTER),
                     chips("kind", kinds, "Kind", ids.AN_KIND_FILTER)], className="ms-incident-filters")


def folded_hint(f: dict, incident: dict, href: str):
    """A folded symptom's hint with the URL in its text turned into a link to its incident."""
    hint = str(f.get("hint") or "")
    head = incident["headline"]
    url = inc.incident_page_href(incident["id"], {**links.finding_window(head), **links.finding_filters(head)})
    before, sep, after = hint.partition(f"see {url}.")
    if not sep:
        return [hint, " ", dcc.Link("see the incident", href=href, className="ms-finding-link")]
    return [before, dcc.Link("see the incident", href=href, className="ms-incident-hint-link"),
            "." + after]


def chart_budget():
    """Whether a card gets a chart, asked in the order the cards are shown: the first
    ``MAX_CHARTS``, and the first of each kind after them (every kind shows its evidence)."""
    kinds: set = set()
    drawn = [0]

    def take(f: dict, n: int) -> bool:
        if drawn[0] < MAX_CHARTS or f.get("kind") not in kinds:
            drawn[0] += 1
            kinds.add(f.get("kind"))
            return True
        return False

    return take


def incident_section(i: dict, members: list[tuple[int, dict]], state: dict, page: dict,
                     selected: bool, charts=None) -> html.Section:
    """One incident: its headline card (the window's finding, or the incident's own when the
    window's is cut differently), then the window's findings it folds, then its links."""
    href = inc.incident_page_href(i["id"], state, **{k: page.get(k) for k in ("kind", "severity")})
    mine = {id(f): m for m in i["findings"] for _, f in members if inc.pick([[m]], f) is not None}
    cards = []
    head_shown = False
    for n, f in members:
        m = mine.get(id(f), f)
        is_head = not head_shown and inc.pick([[i["headline"]]], f) is not None
        head_shown = head_shown or is_head
        folded = not is_head and i["cause_known"] and not inc.is_cause(m)
        cards.append((not is_head, finding_card(
            f, n, state, charts(f, n) if charts else n < MAX_CHARTS, hint=folded_hint(m, i, href) if folded else None,
            role="ms-incident-head" if is_head else "ms-incident-folded")))
    cards.sort(key=lambda x: x[0])  # the headline first
    cls = "ms-incident-section" + (" ms-incident-selected" if selected else "")
    related = len(i["findings"]) - 1
    return html.Section(id=inc.ANCHOR_PREFIX + i["id"], className=cls, **{"data-incident": i["id"]}, children=[
        html.Div(className=f"ms-panel ms-incident ms-finding-{i['severity']}", children=[
            html.H2(c.incident_headline(i), className="ms-incident-title",
                    style={"fontSize": "1.1rem", "margin": "0 0 0.3em"}),
            html.Div([c.span_text(i["start"], i["end"]),
                      f" · +{related} related finding{'' if related == 1 else 's'}" if related else "",
                      " · ", dcc.Link("link to this incident", href=href, className="ms-finding-link")],
                     className="ms-note"),
            c.incident_cause(i),
            html.Div([dcc.Link("compare", href=i["links"]["compare"], className="ms-finding-link"),
                      dcc.Link("drilldown", href=i["links"]["drilldown"], className="ms-finding-link")],
                     className="ms-finding-links"),
        ]),
        html.Div([card for _, card in cards], className="ms-incident-findings",
                 style={"marginLeft": "1.25rem"}),
    ])


def page_incidents(res, state: dict) -> tuple[evaluations.Evaluation, list[dict]]:
    """The window's findings (as ``/api/v1/anomalies``) and incidents (as ``/api/v1/incidents``)."""
    from modalscope.models.reader import Filters

    reader, th = c.reader(), c.thresholds()
    ev = evaluations.find_for(reader, res.window, Filters(), th, relative=evaluations.ends_now(state))

    def finder(w):  # an incident's own span: an absolute window, stored once evaluated
        return evaluations.find_for(reader, w, Filters(), th, relative=False).findings

    return ev, inc.incidents(reader, res.window, finder, res.filters, found=ev.findings)


@dash.callback(
    Output(ids.AN_LIST, "children"),
    Input(ids.AN_STATE, "data"),
)
def _fill(state):
    state = state or {}
    page, errors = page_keys(state)
    state = st.from_query(state)
    res = st.resolve(state)
    ev, all_incidents = page_incidents(res, state)
    found = [f for f in ev.findings if findings.matches(f, res.filters)]
    notes = [c.banner(e) for e in errors]
    if not found and not all_incidents:
        return html.Div([*notes, c.empty_state("No findings in this window.",
                             "Nothing in the anomaly catalog fired. Widen the time range, clear filters, or ",
                             *c.EMPTY_HINT)])
    kinds = sorted({f["kind"] for i in all_incidents for f in i["findings"]} | {f["kind"] for f in found})
    shown = [i for i in all_incidents
             if (not page.get("kind") or any(f["kind"] == page["kind"] for f in i["findings"]))
             and (not page.get("severity") or i["severity"] == page["severity"])]
    chosen = inc.find_incident(all_incidents, page.get("incident"),
                               lambda: inc.group(ev.findings, inc.topology(c.reader(), res.window)))
    if page.get("incident") and chosen is None:
        notes.append(c.banner("That incident is not in this window; widen the time range.", "info"))
    if chosen is not None:
        shown = [chosen, *(i for i in shown if i is not chosen)]
    # Each of the window's findings is shown once, under the first incident holding it.
    owner: dict[int, int] = {}
    for n, f in enumerate(found):
        for k, i in enumerate(all_incidents):
            if inc.pick([i["findings"]], f) is not None:
                owner[n] = k
                break
    by_incident: dict[int, list[tuple[int, dict]]] = {}
    for n, k in owner.items():
        by_incident.setdefault(k, []).append((n, found[n]))
    index = {id(i): k for k, i in enumerate(all_incidents)}
    charts = chart_budget()
    sections = [incident_section(i, by_incident.get(index[id(i)], []), state, page, i is chosen, charts)
                for i in shown]
    loose = [(n, f) for n, f in enumerate(found) if n not in owner
             and (not page.get("kind") or f["kind"] == page["kind"])
             and (not page.get("severity") or f["severity"] == page["severity"])]
    if loose:
        sections.append(html.Section(id="anomalies-other-findings", className="ms-incident-section", children=[
            html.H2("Findings in no incident", className="ms-panel-title"),
            html.Div("The incidents, judged over their own spans, do not hold these.", className="ms-note"),
            *(finding_card(f, n, state, charts(f, n)) for n, f in loose)]))
    if not sections:
        sections = [c.empty_state("No incident matches these filters.", "Clear the kind or severity filter.")]
    counts = {s: sum(1 for i in all_incidents if i["severity"] == s) for s in c.SEVERITY_ORDER}
    head = html.Div([html.Span(f"{len(all_incidents)} incidents ("
                               + " · ".join(f"{n} {s}" for s, n in counts.items() if n) + f"), {len(found)} findings",
                               id="anomalies-counts"),
                     html.Span(" — " + c.evaluation_note(ev), id="anomalies-evaluated")], className="ms-note")
    return html.Div([*notes, head, _filter_links(state, page, kinds), html.Div(style={"height": "0.6em"}),
                     html.Div(sections, id=ids.AN_INCIDENTS)])
