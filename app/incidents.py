"""Incidents: the anomaly catalog's findings grouped by what caused them.

One injected problem fires several findings: a cold start on an LLM instance also breaks the
P99 band of gateway→llm and pushes two input types past their SLO. The catalog lists them
side by side; an incident folds them under the finding that names the mechanism.

Grouping rule (``group``), on findings of one evaluation:

* **Path.** A finding touches a set of services (``path_services``): its ``service``; a
  pair's caller and callee; a cache's name and the services that look it up (``cache``
  rollups); an input type's services — those its traces go through, from the ``pair``
  (caller, callee) and ``op`` (service) rollups carrying that input type over the span looked
  at, narrowed to the ``op`` services of that stage when the subject also names a stage. An
  instance belongs to its service. Two findings share a path when their sets meet and they do
  not name two different input types (every input type passes the gateway; two types' own
  findings each say where that type hurts).
* **Causes** (every kind but the symptom kinds ``baseline_regression``, ``p99_band_break``,
  ``hot_spot``) that overlap in time on a shared path form one incident (and so do two runs
  of one kind and subject at most a detector block apart).
* **A symptom folds under a cause** on a shared path whose span holds the symptom's onset
  (from one detector block before the cause's start, ``ONSET_SLACK_NS``, to its end): a cause
  explains what starts while it acts, not what was already going on. With several, the one
  overlapping it longest, then the most severe, then the earliest.
* **Symptoms left over** that overlap in time on a shared path form incidents of their own,
  with ``cause_known`` false.

The headline is the incident's most severe cause, then the earliest (then the longest), or
without causes the most severe, earliest symptom (a pair's before an input type's: it says
where). Folded symptoms get a hint naming the cause, with a link to it.

Severity and membership must not depend on the request window, so ``incidents`` judges
each incident again over its own span (``judge``): the catalog runs over the incident's
``start``–``end`` and the incident found there is the answer, repeated until its span holds
still. Its ``id`` hashes the headline's kind, subject and start minute.

``group``, ``build``, ``path_services`` and friends are pure; ``topology``, ``suspects``
and ``incidents`` read the store. Findings and incidents are ``core.findings`` values
(``Finding``, ``Incident``); ``to_json`` gives what the API answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping
from urllib.parse import quote, urlencode

import orjson

from ..core.findings import AttributeSuspect, Finding, Incident, IncidentLinks, StageSuspect, Suspect
from ..durations import MINUTE_NS as NS_MIN
from ..models.reader import Filters, StoreReader
from . import evaluations, links, queries
from . import state as st
from .findings import THREADED_DIALECTS, matches
from .params import Window, rfc3339

log = logging.getLogger(__name__)

SYMPTOM_KINDS = frozenset({"baseline_regression", "p99_band_break", "hot_spot"})
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
#: A symptom may start this long before its cause: detectors report whole blocks (5 min).
ONSET_SLACK_NS = 5 * NS_MIN
#: Leading symptom among equals: a pair's finding names a place, an input type's only a class.
SYMPTOM_ORDER = {"p99_band_break": 0, "hot_spot": 1, "baseline_regression": 2}
#: Times an incident is judged again over its own span before its span is taken as settled.
JUDGE_ROUNDS = 3
#: Incidents whose suspects are looked up at once (a thread each: the two cores' share).
SUSPECT_THREADS = 2
#: An incident is judged over its span and this long on either side: the band-break detector
#: judges a minute by the block after it and finds a break's onset from the minutes before it
#: (a window starting on the onset missed a cold start's break). Findings that end before
#: the span are left out.
JUDGE_PAD_NS = 2 * ONSET_SLACK_NS
#: Suspects kept of each sort (stages, attribute values).
MAX_SUSPECTS = 5
#: A stage counts as a suspect from this share of the added time on.
MIN_ADDED_SHARE = 0.05


# -- pure: paths -----------------------------------------------------------------------
@dataclass(frozen=True)
class Topology:
    """Which services each input type's traces and each cache touch (see the module doc)."""

    input_types: Mapping[str, frozenset[str]] = field(default_factory=dict)
    input_type_stages: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    caches: Mapping[str, frozenset[str]] = field(default_factory=dict)


def path_services(f: Finding, topo: Topology) -> frozenset[str]:
    """The services (and ``cache:<name>``) a finding touches."""
    s = f.subject
    out: set[str] = set(s.services())
    if s.cache:
        out.add(f"cache:{s.cache}")
        out |= topo.caches.get(s.cache, frozenset())
    it = s.input_type
    if it:
        if s.stage and (it, s.stage) in topo.input_type_stages:
            out |= topo.input_type_stages[(it, s.stage)]
        else:
            out |= topo.input_types.get(it, frozenset())
    return frozenset(out)


def same_path(a: Finding, b: Finding, topo: Topology) -> bool:
    ia, ib = a.subject.input_type, b.subject.input_type
    if ia and ib and ia != ib:
        return False
    return bool(path_services(a, topo) & path_services(b, topo))


def span_ns(f: Finding) -> tuple[int, int]:
    return f.start_ns, f.end_ns


def overlap_ns(a: Finding, b: Finding) -> int:
    (sa, ea), (sb, eb) = span_ns(a), span_ns(b)
    return min(ea, eb) - max(sa, sb)


def is_cause(f: Finding) -> bool:
    return f.kind not in SYMPTOM_KINDS


def _rank(f: Finding) -> tuple:
    """Headline order: most severe, earliest, longest, then a fixed order of kind and subject."""
    s, e = span_ns(f)
    return (SEVERITY_ORDER.get(f.severity, 9), s, -(e - s), SYMPTOM_ORDER.get(f.kind, -1), f.kind,
            orjson.dumps(f.subject.to_json(), option=orjson.OPT_SORT_KEYS))


def _components(items: list[Finding], linked: Callable[[Finding, Finding], bool]) -> list[list[int]]:
    parent = list(range(len(items)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            if linked(items[i], items[j]):
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(items)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def group(findings: Iterable[Finding], topo: Topology) -> list[list[Finding]]:
    """The findings as incidents (lists of findings, headline first), by the module's rule."""
    findings = list(findings)
    causes = [f for f in findings if is_cause(f)]
    symptoms = [f for f in findings if not is_cause(f)]
    linked = lambda a, b: overlap_ns(a, b) > 0 and same_path(a, b, topo)  # noqa: E731

    def cause_linked(a: Finding, b: Finding) -> bool:
        # (one detector's run broken by a quiet block is still one problem)
        return _same_problem(a, b) or linked(a, b)

    cause_groups = [[causes[i] for i in g] for g in _components(causes, cause_linked)]
    of_cause = {id(f): k for k, g in enumerate(cause_groups) for f in g}
    folded: list[list[Finding]] = [[] for _ in cause_groups]
    left = []
    for s in symptoms:
        s_start = span_ns(s)[0]
        fits = [c for c in causes
                if span_ns(c)[0] - ONSET_SLACK_NS <= s_start < span_ns(c)[1] and same_path(s, c, topo)]
        if not fits:
            left.append(s)
            continue
        best = min(fits, key=lambda c: (-overlap_ns(s, c), _rank(c)))
        folded[of_cause[id(best)]].append(s)
    out = []
    for g, extra in zip(cause_groups, folded):
        g = sorted(g, key=_rank)
        out.append(g + sorted(extra, key=_rank))
    for g in _components(left, linked):
        out.append(sorted((left[i] for i in g), key=_rank))
    return out


# -- pure: one incident ----------------------------------------------------------------
def incident_id(headline: Finding) -> str:
    """Stable across windows: the headline's kind, subject and start minute."""
    start_min = headline.start_ns // NS_MIN
    blob = orjson.dumps({"kind": headline.kind, "subject": headline.subject.to_json(), "start_minute": start_min},
                        option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:16]


def finding_href(f: Finding) -> str:
    """The Anomalies page over a finding's window, narrowed to its subject."""
    return st.to_href(links.ANOMALIES_PATH, {**links.finding_window(f), **links.finding_filters(f)})


def caused_hint(symptom: Finding, cause: Finding, prefix: str = "", incident: str | None = None) -> str:
    """A folded symptom's hint: it names the cause and links to it (to its incident on the
    Anomalies page when ``incident`` names one), then the symptom's own."""
    href = finding_href(cause) if incident is None else incident_page_href(incident, {
        **links.finding_window(cause), **links.finding_filters(cause)})
    return (f"Likely caused by {cause.kind} ({cause.subject.text()}) from {cause.start}: "
            f"see {prefix}{href}. {symptom.hint or ''}").strip()


#: The Anomalies page's own URL keys (not in ``state.KEYS``: only that page reads them).
PAGE_KEYS = ("kind", "severity", "incident")
#: A section's element id on the Anomalies page is this and the incident's id.
ANCHOR_PREFIX = "incident-"


def incident_page_href(incident_id: str, state: Mapping[str, str], **page: str | None) -> str:
    """The Anomalies page opened at one incident: ``state``'s window and filters, ``page``'s
    ``kind``/``severity``, ``incident=<id>`` and the section's anchor."""
    return page_href(state, incident=incident_id, **page) + "#" + ANCHOR_PREFIX + incident_id


def page_href(state: Mapping[str, str], **page: str | None) -> str:
    """The Anomalies page with ``state``'s window and filters and the page's own keys."""
    base = st.to_href(links.ANOMALIES_PATH, st.carried(state))
    extra = [(k, str(page[k])) for k in PAGE_KEYS if page.get(k)]
    if not extra:
        return base
    return base + ("&" if "?" in base else "?") + urlencode(extra, quote_via=quote, safe=":,")


def incident_links(headline: Finding, start_ns: int, end_ns: int, exemplars: list[str],
                   prefix: str = "") -> IncidentLinks:
    """``compare``/``drilldown`` over the incident's span for the headline's subject, and
    ``traces``: the trace pages of its exemplars. ``prefix``: the dashboard's root URL."""
    span = {"start": rfc3339(start_ns), "end": rfc3339(max(end_ns, start_ns + NS_MIN))}
    filters = links.finding_filters(headline)
    traces = [h for h in (links.trace_href(t, span) for t in exemplars) if h]
    return IncidentLinks(prefix + st.to_href(links.COMPARE_PATH, {**span, **filters}),
                         prefix + st.to_href(links.DRILLDOWN_PATH, {**span, **filters}),
                         tuple(prefix + h for h in traces))


def build(members: list[Finding], suspects: list[Suspect] | None = None, prefix: str = "") -> Incident:
    """The incident of one group (headline first, as ``group`` returns them). A folded
    symptom's hint is rewritten in the incident's copy of it only."""
    head = members[0]
    cause_known = is_cause(head)
    spans = [span_ns(f) for f in members]
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    iid = incident_id(head)
    out_findings = tuple(f.replace(hint=caused_hint(f, head, prefix, iid)) if cause_known and not is_cause(f) else f
                         for f in members)
    exemplars: list[str] = []
    for f in members:
        for t in f.exemplar_trace_ids:
            if t not in exemplars and len(exemplars) < 5:
                exemplars.append(t)
    severity = min((f.severity for f in members), key=lambda s: SEVERITY_ORDER.get(s, 9))
    return Incident(iid, severity, rfc3339_s(start), rfc3339_s(end), cause_known, out_findings,
                    () if cause_known else tuple(suspects or ()), incident_links(head, start, end, exemplars, prefix))


def rfc3339_s(ns: int) -> str:
    """As the findings write times: whole seconds."""
    return rfc3339(ns // 1_000_000_000 * 1_000_000_000).replace(".000Z", "Z")


def sort_incidents(incidents: list[Incident]) -> list[Incident]:
    """Most severe first, then latest first."""
    return sorted(incidents, key=lambda i: (SEVERITY_ORDER.get(i.severity, 9), -i.start_ns, i.id))


def suspects_from_compare(result: Mapping) -> list[Suspect]:
    """Compare's answer as suspects: stages by their share of the added time, then attribute
    values by lift, strongest first."""
    stages = sorted((r for r in result.get("stages") or [] if (r.get("share_of_added_time") or 0) >= MIN_ADDED_SHARE),
                    key=lambda r: -r["share_of_added_time"])[:MAX_SUSPECTS]
    attrs = sorted(result.get("attributes") or [], key=lambda r: -r["lift"])[:MAX_SUSPECTS]
    return ([StageSuspect(r["stage"], r["share_of_added_time"]) for r in stages]
            + [AttributeSuspect(r["key"], r["value"], r["lift"]) for r in attrs])


def matches_any(members: Iterable[Finding], filters: Filters) -> bool:
    return any(matches(f, filters) for f in members)


def _same_finding(a: Finding, b: Finding) -> bool:
    return a.kind == b.kind and a.subject == b.subject and overlap_ns(a, b) >= 0


def _same_problem(a: Finding, b: Finding) -> bool:
    """The same kind and subject, overlapping or at most a detector block apart."""
    return a.kind == b.kind and a.subject == b.subject and overlap_ns(a, b) >= -ONSET_SLACK_NS


def pick(groups: Iterable[Iterable[Finding]], headline: Finding) -> list[Finding] | None:
    """The group headed by ``headline``'s finding again (same kind and subject,
    overlapping), else the group holding it; None when it is not found there."""
    groups = [list(g) for g in groups]
    for g in groups:
        if _same_finding(g[0], headline):
            return g
    for g in groups:
        if any(_same_finding(f, headline) for f in g):
            return g
    return None


def span_window(members: Iterable[Finding]) -> Window:
    """The whole minutes covering the findings' spans."""
    spans = [span_ns(f) for f in members]
    s = min(a for a, _ in spans) // NS_MIN * NS_MIN
    e = -(-max(b for _, b in spans) // NS_MIN) * NS_MIN
    return Window(s, max(e, s + NS_MIN))


# -- reading the store -----------------------------------------------------------------
def topology(reader: StoreReader, window: Window) -> Topology:
    """Services per input type (``pair`` callers and callees, ``op`` services) and per
    (input type, stage) (``op``), and per cache (``cache`` rollups' services), from the
    series with rollups in ``window``."""
    found = reader.rollups.kinds_in_window({"pair": ("caller", "callee", "input_type"),
                                            "op": ("service", "stage", "input_type"),
                                            "cache": ("service", "name")}, window.start_ns, window.end_ns)
    types: dict[str, set[str]] = {}
    stages: dict[tuple[str, str], set[str]] = {}
    caches: dict[str, set[str]] = {}
    for caller, callee, it in found["pair"]:
        if it:
            types.setdefault(it, set()).update(x for x in (caller, callee) if x)
    for service, stage, it in found["op"]:
        if it and service:
            types.setdefault(it, set()).add(service)
            if stage:
                stages.setdefault((it, stage), set()).add(service)
    for service, name in found["cache"]:
        if name and service:
            caches.setdefault(name, set()).add(service)
    return Topology({k: frozenset(v) for k, v in types.items()}, {k: frozenset(v) for k, v in stages.items()},
                    {k: frozenset(v) for k, v in caches.items()})


def suspects_subject(members: list[Finding]) -> tuple[Window, dict[str, str]]:
    """What an incident's suspects compare: its span (``span_window``) and the filters naming
    its headline's subject."""
    return span_window(members), links.finding_filters(members[0])


def suspects(reader: StoreReader, members: list[Finding]) -> list[Suspect]:
    """What Compare finds for the incident's span against the same length just before it,
    narrowed to the headline's subject."""
    window, filters = suspects_subject(members)
    return suspects_in(reader, window, Filters(**filters))


def suspects_in(reader: StoreReader, window: Window, filters: Filters) -> list[Suspect]:
    """``suspects`` of an incident spanning ``window`` whose headline's subject is ``filters``
    (what a page that draws them later sends back)."""
    try:
        result = queries.compare(reader, window, None, filters)
    except Exception:  # noqa: BLE001 - suspects are a lead; the incident stands without them
        log.exception("the suspects of an incident could not be computed")
        return []
    return suspects_from_compare(result)


def suspects_of(reader: StoreReader, incidents_: list[list[Finding] | None]) -> list[list[Suspect] | None]:
    """``suspects`` of each incident's members (None: none wanted); two at a time where the
    database works in its own process (``findings.THREADED_DIALECTS``): each is a Compare
    whose reads wait on the store. On SQLite the reads run under this process's interpreter
    lock: two Compares side by side were slower than one after another (docs/benchmarks.md)."""
    wanted = [m for m in incidents_ if m is not None]
    if len(wanted) < 2 or reader.engine.dialect.name not in THREADED_DIALECTS:
        found = iter([suspects(reader, m) for m in wanted])
    else:
        with ThreadPoolExecutor(max_workers=SUSPECT_THREADS) as pool:
            found = iter(list(pool.map(lambda m: suspects(reader, m), wanted)))
    return [None if m is None else next(found) for m in incidents_]


Finder = Callable[[Window], list[Finding]]


def judge_window(members: Iterable[Finding]) -> Window:
    """Where an incident is judged: its whole minutes and ``JUDGE_PAD_NS`` either side."""
    w = span_window(members)
    return Window(w.start_ns - JUDGE_PAD_NS, w.end_ns + JUDGE_PAD_NS)


def judge(members: list[Finding], finder: Finder, topo_of: Callable[[Window], Topology]) -> list[Finding]:
    """The incident as the catalog finds it over its own span, until the span holds still.
    A headline the catalog does not find again there (a detector that needs the wider
    window's context, e.g. "load is high" against the window's median) keeps its group."""
    for _ in range(JUDGE_ROUNDS):
        window = judge_window(members)
        since = window.start_ns + JUDGE_PAD_NS
        found = [f for f in finder(window) if span_ns(f)[1] > since]
        again = pick(group(found, topo_of(window)), members[0])
        if again is None:
            return members
        if judge_window(again) == window:
            return again
        members = again
    return members


def incidents(reader: StoreReader, window: Window, finder: Finder, filters: Filters = Filters(),
              found: list[Finding] | None = None, prefix: str = "", with_suspects: bool = True) -> list[Incident]:
    """The incidents of ``window``, most severe first. ``finder(window)``: the catalog's
    unfiltered findings of a window (cached or not, the caller's choice); ``found``: the
    request window's own, when already at hand. An incident is kept under ``filters`` when
    one of its findings matches them. ``with_suspects`` False: no Compare for incidents whose
    cause is unknown (their ``suspects`` are empty; a page asks ``suspects_in`` later)."""
    cache: dict[Window, Topology] = {}

    def topo_of(w: Window) -> Topology:
        if w not in cache:
            cache[w] = topology(reader, w)
        return cache[w]

    first = group(finder(window) if found is None else found, topo_of(window))
    judged = [(members, judge(members, finder, topo_of)) for members in first]
    # Incidents whose headline was found again first: another group judged over its own span
    # may come back headed by a cut of the same finding, which is then the same incident.
    # (then the larger: a run of a cause broken by a quiet block judged alone is part of it)
    judged.sort(key=lambda mj: (not _same_finding(mj[1][0], mj[0][0]), -len(mj[1])))
    kept: list[list[Finding]] = []
    for _, members in judged:
        if any(_same_problem(members[0], f) for k in kept for f in k if is_cause(f) or f is k[0]):
            continue
        kept.append(members)
    kept = [m for m in kept if matches_any(m, filters)]
    found_suspects = (suspects_of(reader, [None if is_cause(m[0]) else m for m in kept]) if with_suspects
                      else [None] * len(kept))
    return sort_incidents([build(m, s, prefix) for m, s in zip(kept, found_suspects)])


# -- for the pages ---------------------------------------------------------------------
class NotJudged(LookupError):
    """An incident's own span has no stored evaluation yet (``cached_finder``)."""


def cached_finder(reader: StoreReader, th) -> Finder:
    """A finder answering only from stored evaluations of absolute windows (what earlier
    ``incidents`` runs stored); raises ``NotJudged`` where the catalog would have to run."""
    def finder(w: Window) -> list[Finding]:
        hit = evaluations.cached_absolute(reader.engine, w, th)
        if hit is None:
            raise NotJudged(w)
        return hit.findings

    return finder


def window_incidents(reader: StoreReader, window: Window, found: list[Finding], filters: Filters = Filters(),
                     prefix: str = "", suspects_for: int = 3) -> list[Incident]:
    """The incidents of ``window`` judged over the window only (``group`` and ``build`` on its
    findings, no catalog rerun per incident): a fast stand-in for ``incidents`` whose
    severities are the window's. Suspects are looked up for the first ``suspects_for`` only."""
    out = sort_incidents([build(m, None, prefix) for m in group(found, topology(reader, window))
                          if matches_any(m, filters)])
    wanted = [None if i.cause_known else list(i.findings) for i in out[:suspects_for]]
    for n, found_suspects in enumerate(suspects_of(reader, wanted)):
        if found_suspects is not None:
            out[n] = dataclasses.replace(out[n], suspects=tuple(found_suspects))
    return out


def find_incident(incidents_: list[Incident], wanted: str | None,
                  groups: Callable[[], list[list[Finding]]]) -> Incident | None:
    """The incident ``wanted`` names: by id, else (an id from ``window_incidents``, whose
    headline a rerun may have changed) the incident holding that group's headline finding.
    ``groups``: the window's ``group`` result, asked for only when the id is not found."""
    if not wanted:
        return None
    for i in incidents_:
        if i.id == wanted:
            return i
    for g in groups():
        if incident_id(g[0]) == wanted:
            for i in incidents_:
                if pick([i.findings], g[0]) is not None:
                    return i
    return None
