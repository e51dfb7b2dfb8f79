"""Findings and incidents as the Overview and Anomalies pages list them: titles, measures,
links to the pages that explain them, and incident cards."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from dash import dcc, html
from flask import current_app

from ...core.findings import Finding, Incident, StageSuspect, Suspect
from ...durations import MINUTE_NS
from ...models.reader import Filters
from .. import evaluations, ids, links, panels
from ..detectors import Thresholds
from .. import state as st
from ..findings import MAX_WINDOW_S
from ..incidents import is_cause, suspects_subject
from ..params import Window, rfc3339
from ..units import evidence_measure, fmt_ms, fmt_pct
from .layout import empty_state, reader


# -- findings ----------------------------------------------------------------
SEVERITY_ORDER = ("critical", "warning", "info")


def thresholds():
    """The detectors' thresholds (environment), read once per app like ``/api/v1/anomalies``."""
    return Thresholds.kept_in(current_app.extensions["modalscope"])


def find_findings(res, state: Mapping[str, Any]):
    """The same findings ``/api/v1/anomalies`` returns, most severe first, as an
    ``evaluations.Evaluation`` (a window ending now may be answered by the worker's
    evaluation of up to 90 s ago; ``evaluation_note`` says so)."""
    return evaluations.find_for(reader(), res.window, res.filters, thresholds(),
                                relative=evaluations.ends_now(state))


def evaluation_note(ev) -> str:
    """Plain text: which window the findings cover and when they were evaluated."""
    def hm(ns: int) -> str:
        return rfc3339(ns)[11:19]

    when = f"evaluated at {hm(ev.evaluated_ns)} UTC" + (" (a stored evaluation)" if ev.stored else "")
    return (f"{when} over {rfc3339(ev.start_ns)[:16].replace('T', ' ')} → "
            f"{rfc3339(ev.end_ns)[:16].replace('T', ' ')} UTC")


def subject_text(subject: Mapping[str, Any]) -> str:
    """A finding's subject as plain text (values are span data: shown, never interpreted)."""
    return panels.subject_text(subject)  # one definition, shared with the embeds


def evidence_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)[:200]
    return str(value)


def finding_links(f: Finding, state: Mapping[str, str], n_traces: int = 5) -> list:
    """Drilldown, Compare (and Cache) for the finding's subject and window, and its exemplar traces."""
    out = [dcc.Link("drilldown", href=links.finding_drill_href(f), className="ms-finding-link"),
           dcc.Link("compare", href=links.finding_compare_href(f), className="ms-finding-link")]
    cache_href = links.finding_cache_href(f)
    if cache_href:
        out.append(dcc.Link("cache", href=cache_href, className="ms-finding-link"))
    window = links.finding_window(f)
    traces = []
    for tid in f.exemplar_trace_ids[:n_traces]:
        href = links.trace_href(tid, window or state)
        if href:
            traces.append(dcc.Link(str(tid)[:12] + "…", href=href, className="ms-mono ms-trace-link", title=str(tid)))
    if traces:
        out.append(html.Span("traces:", className="ms-note"))
        out.extend(traces)
    return out


def finding_title(f: Finding) -> list:
    sev = f.severity
    return [html.Span(sev, className=f"ms-severity ms-severity-{sev}"), " ",
            html.Strong(f.kind), " — ", html.Span(subject_text(f.subject.to_json()))]


def top_findings(found: list[Finding], state: Mapping[str, str], n: int = 3) -> html.Div:
    """The overview's panel: the ``n`` most severe findings with their links, findings that
    name a mechanism (the likely causes) before symptoms, most severe first within each."""
    if not found:
        return empty_state("No findings in this window.",
                           "The anomaly catalog (band breaks, hot spots, cache penetration, regressions …) "
                           "found nothing that needs attention.")
    items = []
    for f in sorted(found, key=lambda f: not is_cause(f))[:n]:
        items.append(html.Li(className="ms-finding", children=[
            html.Div(finding_title(f), className="ms-finding-title"),
            html.Div(span_text(f.start, f.end), className="ms-note"),
            html.Div(finding_links(f, state, n_traces=2), className="ms-finding-links"),
        ]))
    more = dcc.Link(f"all {len(found)} findings →", href=st.to_href("/anomalies", st.carried(state)),
                    id="overview-all-findings")
    return html.Div([html.Ul(items, className="ms-finding-list", id="overview-findings-list"), more])


# -- incidents -----------------------------------------------------------------
# (observed, baseline, how to show them): the first pair a finding's evidence holds is its
# measure, e.g. "P99 11.4 s vs 2.79 s".
MEASURES = (
    ("p99_ms", "baseline_p99_ms", "P99", "ms"),
    ("p95_ms", "baseline_p95_ms", "P95", "ms"),
    ("first_median_ms", "steady_median_ms", "first requests' median", "ms"),
    ("median_spread_ms", "baseline_spread_ms", "median sync wait", "ms"),
    ("share", "baseline_share", "share of time", "pct"),
    ("hit_rate", "baseline_hit_rate", "hit rate", "pct"),
    ("batch_one_share", "baseline_batch_one_share", "batches of one", "pct"),
    ("fallback_share", "baseline_fallback_share", "CUDA graph fallbacks", "pct"),
)


def kind_text(kind: Any) -> str:
    """A finding kind as words: ``cold_start`` → "cold start"."""
    return str(kind or "").replace("_", " ")


def finding_measure(f: Finding) -> str:
    """The finding's headline number against its baseline, in human units ('' when none)."""
    ev = f.evidence
    if isinstance(ev.get("max_duration_ms"), (int, float)) and isinstance(ev.get("ceiling_s"), (int, float)):
        # "longest 29.97 s vs ceiling 30 s": just under it
        return evidence_measure({k: ev[k] for k in ("max_duration_ms", "ceiling_s")})
    for obs, base, label, unit in MEASURES:
        o, b = ev.get(obs), ev.get(base)
        if isinstance(o, (int, float)) and not isinstance(o, bool):
            fmt = fmt_ms if unit == "ms" else fmt_pct
            vs = f" vs {fmt(b)}" if isinstance(b, (int, float)) and not isinstance(b, bool) else ""
            return f"{label} {fmt(o)}{vs}"
    return ""


def incident_headline(i: Incident) -> list:
    """Severity badge, the headline finding's kind and subject, and its measure."""
    head = i.headline
    sev = i.severity
    measure = finding_measure(head)
    return [html.Span(sev, className=f"ms-severity ms-severity-{sev}"), " ",
            html.Strong(kind_text(head.kind)), " — ", html.Span(subject_text(head.subject.to_json())),
            *([html.Span(f" · {measure}", className="ms-incident-measure")] if measure else [])]


def span_text(start: Any, end: Any) -> str:
    """An incident's span as "2025-11-30 10:30 → 10:35 UTC" (the date once when it is one day)."""
    s, e = str(start or ""), str(end or "")
    if len(s) < 16 or len(e) < 16:
        return f"{s} → {e}"
    e_short = e[11:16] if s[:10] == e[:10] else e[:16].replace("T", " ")
    return f"{s[:16].replace('T', ' ')} → {e_short} UTC"


def incident_cause(i: Incident, later: bool = False) -> html.Div:
    """"Cause: <headline kind>" when a mechanism was found, else Compare's suspects. ``later``:
    an incident listed without its suspects gets a cause line that its own request fills
    (``callbacks``: a Compare per incident cost most of a page that waited for them all)."""
    if i.cause_known:
        head = i.headline
        return html.Div(["Likely cause: ", html.Strong(kind_text(head.kind)), " on ",
                         subject_text(head.subject.to_json())], className="ms-incident-cause")
    if later and not i.suspects:
        w, subject = suspects_subject(list(i.findings))
        ask = {"start_ns": w.start_ns, "end_ns": w.end_ns, "subject": subject}
        return html.Div([html.Div(suspects_line((), pending=True), className="ms-incident-cause",
                                  id={"type": ids.INCIDENT_SUSPECTS, "incident": i.id}),
                         dcc.Store(id={"type": ids.INCIDENT_SUSPECTS_ASK, "incident": i.id}, data=ask)])
    return html.Div(suspects_line(i.suspects), className="ms-incident-cause")


def suspects_line(suspects: Sequence[Suspect] | None, pending: bool = False) -> list:
    """The cause line of an incident whose cause is unknown: its three strongest suspects;
    ``pending`` while they are being looked up, None when they could not be."""
    if pending:
        return ["Cause unknown — suspects: ", "comparing with the time before …"]
    if suspects is None:
        return ["Cause unknown — suspects: ", "not available for this incident"]
    parts = []
    for s in suspects:
        if isinstance(s, StageSuspect):
            parts.append(f"stage {s.stage} ({fmt_pct_safe(s.added_share)} of the added time)")
        else:
            parts.append(f"{s.key}={s.value} (×{float(s.lift or 0):.2g})")
    return ["Cause unknown — suspects: ", "; ".join(str(p) for p in parts[:3]) or "none found"]


def asked_suspects(ask: Any) -> tuple[Window, Filters] | None:
    """An incident's span and subject from its cause line's store (``incident_cause``), which
    the browser sends back, so checked like a query: None unless whole minutes of at most
    the detectors' longest window and subject filters of text."""
    if not isinstance(ask, dict):
        return None
    start, end = ask.get("start_ns"), ask.get("end_ns")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        return None
    if not (0 <= start < end < 2**63) or start % MINUTE_NS or end % MINUTE_NS \
            or end - start > MAX_WINDOW_S * 10**9:
        return None
    subject = ask.get("subject")
    if not isinstance(subject, dict) or not all(k in links.SUBJECT_FILTERS and isinstance(v, str) and len(v) <= 512
                                                for k, v in subject.items()):
        return None
    return Window(start, end), Filters(**subject)


def fmt_pct_safe(v: Any) -> str:
    return fmt_pct(float(v), 0) if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"


def incident_card(i: Incident, href: str, later: bool = False) -> html.Li:
    """The overview's card of one incident: badge, headline, span, "+N related findings",
    cause or suspects, and ``href`` (the incident on the Anomalies page)."""
    related = max(len(i.findings) - 1, 0)
    sev = i.severity
    return html.Li(className=f"ms-finding ms-incident ms-finding-{sev}", id=f"overview-incident-{i.id}",
                   children=[
        html.Div(incident_headline(i), className="ms-finding-title"),
        html.Div([span_text(i.start, i.end),
                  f" · +{related} related finding{'' if related == 1 else 's'}" if related else ""],
                 className="ms-note"),
        incident_cause(i, later),
        html.Div(dcc.Link("open incident →", href=href, className="ms-finding-link ms-incident-link"),
                 className="ms-finding-links"),
    ])
