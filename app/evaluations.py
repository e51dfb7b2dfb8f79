"""Findings evaluated ahead of the request.

Running every detector over a day of data at ten million spans takes longer than the page
on-call opens first may wait (docs/benchmarks.md). So the worker's settler
evaluates the anomaly catalog over the standard relative ranges (``MODALSCOPE_FINDINGS_RANGES``,
default the last hour and the last 24 h) every ``MODALSCOPE_FINDINGS_EVERY_S`` seconds and
stores the findings (table ``finding_evaluations``), the way an alerting engine evaluates
its rules on a schedule.

A *relative* request ("the last 24 h", no explicit start) is answered from the newest stored
evaluation of the same length and thresholds whose window ends at most ``FRESH_S`` before the
request's; the answer says which window it covers and when it was evaluated. Without one the
detectors run on the request, and the result is stored for the next caller.

An *absolute* window's answer must be exactly that window's, so the detectors run on its first
request; the result is stored (``range_s`` = ``ABSOLUTE_RANGE``) and answers later requests for
the same window and thresholds while no write to the rollups logged since (``models/changes``:
settle batches, retention, retag) touches a minute the detectors read for it — a permalink, a
post-mortem's embedded panel or a shared link to last night's incident is computed once — and,
whatever was written since, for ``ABSOLUTE_FRESH_S`` (90 s) after it was evaluated, the
staleness a relative window's answer is allowed (a window still receiving spans, which a team
opens together during an incident, runs the detectors once per 90 s, not on every request).
Stored findings are unfiltered: a filter is applied on reading, as ``findings.matches`` does
for fresh ones. They are kept as the JSON the API answers (``Finding.to_json``, a list a row)
and read back as ``Finding`` values (``Finding.from_json``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Callable

import orjson
from sqlalchemy import Engine, and_, delete, or_, select
from sqlalchemy.exc import DBAPIError

from ..core.every import Every
from ..core.findings import Finding
from ..durations import DAY_NS, HOUR_NS, NS
from ..models import FindingEvaluation, changes
from ..models.reader import Filters, StoreReader
from . import detectors as d
from . import findings as fnd
from .params import Window

log = logging.getLogger(__name__)

#: How much older than the request's window end a stored evaluation may be and still answer it.
FRESH_S = 90
#: Stored evaluations of a relative window whose end is older than this are deleted when a
#: new one of that range is stored (absolute windows' go after ``changes.KEEP_S``).
RELATIVE_KEEP_S = 15 * 60
#: ``range_s`` of an absolute window's stored findings.
ABSOLUTE_RANGE = 0
#: A write logged up to this long before an absolute window's evaluation started still makes
#: it stale: a settle batch stamps its change before it commits (and hosts' clocks differ).
CHANGE_MARGIN_S = changes.CHANGE_MARGIN_S
#: For this long after its evaluation an absolute window's stored findings answer whatever was
#: written since: the staleness a relative window's answer may have.
ABSOLUTE_FRESH_S = FRESH_S
#: Absolute windows' findings kept at most (the least recently evaluated go first).
ABSOLUTE_MAX_KEPT = 500


@dataclass(frozen=True)
class Evaluation:
    """Findings of the window ``[start_ns, end_ns)``, evaluated at ``evaluated_ns``
    (``stored``: read from ``finding_evaluations`` rather than computed for this request)."""

    findings: list[Finding]
    start_ns: int
    end_ns: int
    evaluated_ns: int
    stored: bool


def dumps(found: list[Finding]) -> str:
    """Findings as a stored evaluation keeps them: the JSON array the API answers."""
    return orjson.dumps([f.to_json() for f in found]).decode()


def loads(stored: str | bytes) -> list[Finding]:
    """A stored evaluation's findings (``dumps``)."""
    return [Finding.from_json(f) for f in orjson.loads(stored)]


def thresholds_key(th: d.Thresholds) -> str:
    """A short digest of every threshold: an evaluation answers only requests made with the
    same settings."""
    blob = orjson.dumps(dataclasses.asdict(th), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:32]


def latest(engine: Engine, range_s: int, key: str, not_before_end_ns: int) -> Evaluation | None:
    """The newest stored evaluation of ``range_s`` seconds and thresholds ``key`` ending at
    or after ``not_before_end_ns``, or None."""
    fe = FindingEvaluation
    q = (select(fe.findings, fe.start_ns, fe.end_ns, fe.evaluated_ns)
         .where(fe.range_s == range_s, fe.thresholds_key == key, fe.end_ns >= not_before_end_ns)
         .order_by(fe.end_ns.desc()).limit(1))
    with engine.connect() as conn:
        row = conn.execute(q).first()
    if row is None:
        return None
    return Evaluation(loads(row.findings), row.start_ns, row.end_ns, row.evaluated_ns, stored=True)


def store(engine: Engine, window: Window, key: str, found: list[Finding], evaluated_ns: int) -> None:
    """Keep ``found`` (unfiltered) as the evaluation of ``window``; drop evaluations of the
    same range older than ``RELATIVE_KEEP_S``."""
    range_s, fe = round(window.seconds), FindingEvaluation
    with engine.begin() as conn:
        conn.execute(delete(fe).where(fe.range_s == range_s, fe.thresholds_key == key,
                                      fe.end_ns < window.end_ns - RELATIVE_KEEP_S * NS))
        conn.execute(fe.__table__.insert().values(
            range_s=range_s, thresholds_key=key, start_ns=window.start_ns, end_ns=window.end_ns,
            evaluated_ns=evaluated_ns, findings=dumps(found)))


def cached_absolute(engine: Engine, window: Window, th: d.Thresholds) -> Evaluation | None:
    """The stored findings of exactly ``window`` with thresholds ``th``, if evaluated at most
    ``ABSOLUTE_FRESH_S`` ago or if no write to the rollups has touched the minutes they were
    computed from since; else None."""
    fe = FindingEvaluation
    q = (select(fe.findings, fe.evaluated_ns)
         .where(fe.range_s == ABSOLUTE_RANGE, fe.thresholds_key == thresholds_key(th),
                fe.end_ns == window.end_ns, fe.start_ns == window.start_ns)
         .order_by(fe.evaluated_ns.desc()).limit(1))
    with engine.connect() as conn:
        row = conn.execute(q).first()
    if row is None:
        return None
    # Within ABSOLUTE_FRESH_S it answers as a relative window's evaluation does: spans that
    # arrived since wait at most that long (the answer says when it was evaluated), and a
    # window still receiving spans runs the detectors once per period, not on every request.
    if time.time_ns() - row.evaluated_ns > ABSOLUTE_FRESH_S * NS:
        # (one connection at a time: a write engine's SQLite connections each begin IMMEDIATE)
        first, last = fnd.read_minutes(StoreReader(engine), window, th)
        with engine.connect() as conn:
            if changes.changed_since(conn, row.evaluated_ns - CHANGE_MARGIN_S * NS, first, last):
                return None
    return Evaluation(loads(row.findings), window.start_ns, window.end_ns, row.evaluated_ns, stored=True)


def store_absolute(engine: Engine, window: Window, th: d.Thresholds, found: list[Finding], started_ns: int) -> None:
    """Keep ``found`` (unfiltered) as the findings of exactly ``window``, evaluated from
    ``started_ns`` on; older copies of it, entries past ``changes.KEEP_S`` and all but the
    newest ``ABSOLUTE_MAX_KEPT`` go."""
    fe, key = FindingEvaluation, thresholds_key(th)
    absolute = fe.range_s == ABSOLUTE_RANGE
    with engine.begin() as conn:
        conn.execute(delete(fe).where(absolute, or_(
            and_(fe.thresholds_key == key, fe.start_ns == window.start_ns, fe.end_ns == window.end_ns),
            fe.evaluated_ns < started_ns - changes.KEEP_S * NS)))
        surplus = (select(fe.id).where(absolute).order_by(fe.evaluated_ns.desc())
                   .offset(ABSOLUTE_MAX_KEPT - 1).limit(1000))
        conn.execute(delete(fe).where(fe.id.in_(list(conn.execute(surplus).scalars()))))
        conn.execute(fe.__table__.insert().values(
            range_s=ABSOLUTE_RANGE, thresholds_key=key, start_ns=window.start_ns, end_ns=window.end_ns,
            evaluated_ns=started_ns, findings=dumps(found)))


#: Stored evaluations (the newest overlapping the window) a new one may take results from.
KNOWN_SOURCES = 8



@dataclass(frozen=True)
class _Stored:
    window: Window  # the window its detectors judged
    evaluated_ns: int
    findings: list[Finding]


class StoredFindings:
    """What stored evaluations already computed from raw spans, for ``findings.find``.

    Most of a new evaluation was evaluated before: the settler re-evaluates the last 24 h every
    minute, and an absolute window opened from the dashboard is mostly the relative one it was
    pinned from. Two parts of an evaluation read raw spans, and both depend only on the spans
    they read, not on the window (at ten million spans, half of a 24 h window's first request):

    - a finding's exemplar look-up (``exemplars``): a finding identical to a stored one (kind,
      severity, subject, window, evidence: ``findings.finding_identity``) takes that one's
      exemplars and hint;
    - a new instance's cold-start check (``cold_start``): a stored evaluation that checked the
      same birth found the same ``cold_start`` finding, or none;

    each only while no write logged since that evaluation (less ``CHANGE_MARGIN_S``) touched
    the minutes those spans are in. At most ``KNOWN_SOURCES`` stored evaluations overlapping
    the window are read, on the first question.
    """

    def __init__(self, reader: StoreReader, window: Window, th: d.Thresholds) -> None:
        self.reader, self.th = reader, th if th is not None else d.Thresholds()  # (find's default)
        self.window = fnd.judged_window(window)
        self._stored: list[_Stored] | None = None
        self._identities: dict[bytes, tuple[int, Finding]] = {}
        self._seen: dict[tuple[int, int], set[tuple[str, str]]] = {}
        self._changes: dict[int, list[tuple[int, int]] | None] = {}

    def _load(self) -> list[_Stored]:
        if self._stored is not None:
            return self._stored
        fe, self._stored = FindingEvaluation, []
        q = (select(fe.findings, fe.start_ns, fe.end_ns, fe.evaluated_ns)
             .where(fe.thresholds_key == thresholds_key(self.th), fe.start_ns < self.window.end_ns,
                    fe.end_ns > self.window.start_ns)
             .order_by(fe.evaluated_ns.desc()).limit(KNOWN_SOURCES))
        with self.reader.engine.connect() as conn:
            rows = conn.execute(q).all()
        for found, start_ns, end_ns, evaluated_ns in rows:  # newest first
            stored = _Stored(fnd.judged_window(Window(start_ns, end_ns)), evaluated_ns, loads(found))
            self._stored.append(stored)
            for f in stored.findings:  # the newest copy of a finding is kept
                if f.exemplar_trace_ids:
                    self._identities.setdefault(fnd.finding_identity(f), (evaluated_ns, f))
        return self._stored

    def _unchanged(self, evaluated_ns: int, first_minute: int, last_minute: int) -> bool:
        since = evaluated_ns - CHANGE_MARGIN_S * NS
        if since not in self._changes:  # one read a stored evaluation, not one a finding
            with self.reader.engine.connect() as conn:
                self._changes[since] = changes.changes_since(conn, since, changes.READ_AT_MOST)
        logged = self._changes[since]
        if logged is None:  # (too many to hold: ask about these minutes alone)
            with self.reader.engine.connect() as conn:
                return not changes.changed_since(conn, since, first_minute, last_minute)
        return not any(a <= last_minute and b >= first_minute for a, b in logged)

    def exemplars(self, f: Finding) -> Finding | None:
        """The stored copy of ``f`` whose exemplars still hold, or None."""
        self._load()
        hit = self._identities.get(fnd.finding_identity(f))
        if hit is None:
            return None
        evaluated_ns, stored = hit
        w = fnd.finding_window(stored)
        return stored if self._unchanged(evaluated_ns, w.start_ns // d.NS_MIN, -(-w.end_ns // d.NS_MIN)) else None

    def _seen_between(self, first_minute: int, end_minute: int) -> set[tuple[str, str]]:
        """(service, instance) of the instances seen in minutes ``[first_minute, end_minute)``."""
        key = (first_minute, end_minute)
        if key not in self._seen:
            self._seen[key] = {(svc, name) for svc, name, _ in self.reader.rollups.first_minutes(
                "inst", first_minute * d.NS_MIN, end_minute * d.NS_MIN)}
        return self._seen[key]

    def cold_start(self, service: str, instance: str, born_minute: int) -> list[Finding] | None:
        """The ``cold_start`` finding (or none) of the newest stored evaluation that checked
        this instance born at ``born_minute`` (the minutes of its check unchanged since)."""
        th, here = self.th, -(-fnd._data_start(self.window, self.th) // d.NS_MIN)
        for ev in self._load():
            w = ev.window
            first_data = -(-fnd._data_start(w, th) // d.NS_MIN)
            # It saw this birth (first seen 2 minutes after its data began, before its end) and
            # would have reported a cold start found there (from its window's first minute on).
            if not (born_minute >= first_data + 2 and -(-w.start_ns // d.NS_MIN) <= born_minute
                    and born_minute * d.NS_MIN < w.end_ns):
                continue
            # Its data began earlier: the instance must not show before the birth there either.
            if first_data < here and (service, instance) in self._seen_between(first_data, here):
                continue
            if not self._unchanged(ev.evaluated_ns, born_minute, born_minute + fnd._cold_start_minutes(th)):
                return None  # (older evaluations are older than the change too)
            return [f for f in ev.findings if f.kind == "cold_start" and f.subject.service == service
                    and f.subject.attribute is not None and f.subject.attribute.value == instance
                    and f.start_ns // d.NS_MIN == born_minute]
        return None


def evaluate(reader: StoreReader, window: Window, th: d.Thresholds) -> Evaluation:
    """Run the catalog over ``window`` (unfiltered) and store the result."""
    found = fnd.find(reader, window, Filters(), th, known=StoredFindings(reader, window, th))
    ev = Evaluation(found, window.start_ns, window.end_ns, time.time_ns(), stored=False)
    try:
        store(reader.engine, window, thresholds_key(th), found, ev.evaluated_ns)
    except DBAPIError:  # a cache: a store that refuses the write (a read-only role) still answers
        log.warning("could not store the findings evaluation", exc_info=True)
    return ev


def ends_now(args) -> bool:
    """A request whose window ends now (neither ``start`` nor ``end`` given: ``range=`` or
    the default), the kind a stored evaluation may answer."""
    return not args.get("start") and not args.get("end")


def find_for(reader: StoreReader, window: Window, filters: Filters, th: d.Thresholds, *,
             relative: bool) -> Evaluation:
    """The findings a page or ``/api/v1/anomalies`` shows for ``window`` (filtered, most
    severe first): for a relative window a fresh stored evaluation of the same length when
    there is one, for an absolute window its stored findings while still valid; else the
    detectors run now and the result is stored for the next request."""
    if relative:
        key = thresholds_key(th)
        hit = latest(reader.engine, round(window.seconds), key, window.end_ns - FRESH_S * NS)
        if hit is None:
            hit = evaluate(reader, window, th)
    else:
        hit = _absolute(reader, window, th)
    kept = [f for f in hit.findings if fnd.matches(f, filters)]
    return dataclasses.replace(hit, findings=d.sort_findings(kept))


#: Called before the detectors run for an absolute window no stored evaluation answers (each
#: costs seconds and a stored row); the dashboard adds its per-client budget
#: (``window_budget.admit``), the settler and the commands add nothing.
FIRST_EVALUATION_GATES: list[Callable[[], None]] = []


def _absolute(reader: StoreReader, window: Window, th: d.Thresholds) -> Evaluation:
    """An absolute window's findings (unfiltered): stored ones still valid, else computed
    now and stored."""
    hit = cached_absolute(reader.engine, window, th)
    if hit is not None:
        return hit
    for gate in FIRST_EVALUATION_GATES:
        gate()  # may refuse: the web layer's per-client budget raises its 429 here
    started_ns = time.time_ns()  # before the first read: a write after it makes the result stale
    found = fnd.find(reader, window, Filters(), th, known=StoredFindings(reader, window, th))
    try:
        store_absolute(reader.engine, window, th, found, started_ns)
    except DBAPIError:  # a cache: a store that refuses the write (a read-only role) still answers
        log.warning("could not store the findings of an absolute window", exc_info=True)
    return Evaluation(found, window.start_ns, window.end_ns, started_ns, stored=False)


#: Past days evaluated ahead at most (``past_days``).
PAST_DAYS_MAX = 6


def past_days(retention_days: float, minute_rollup_days: float) -> int:
    """How many 24 h windows before the last 24 h the settler keeps evaluated: as far back as
    both minute rollups and raw spans are kept (``0`` keeps them forever), at most
    ``PAST_DAYS_MAX``. The defaults (raw spans 7 days, minute rollups 2) give one: the day
    before the last 24 h, where yesterday's incident is."""
    kept = [x for x in (retention_days, minute_rollup_days) if x and x > 0]
    horizon = min(kept) if kept else PAST_DAYS_MAX + 1
    return max(0, min(PAST_DAYS_MAX, math.floor(horizon) - 1))


def past_windows(now_ns: int, days: int) -> list[Window]:
    """The ``days`` windows of 24 h before the last 24 h, ending on whole hours, newest first."""
    hour = now_ns // HOUR_NS * HOUR_NS
    return [Window(hour - (k + 1) * DAY_NS, hour - k * DAY_NS) for k in range(1, days + 1)]


def settler_evaluations(settings):
    """What a settler evaluates between passes, as a picklable ``engine -> EvaluationSchedule``
    (a settler may run in a process of its own), or None when the settings turn it off: each
    of ``findings_ranges_s`` every ``findings_every_s``, and the days before the last 24 h as
    far back as the rollups and spans they read (``past_days``)."""
    if not settings.findings_every_s or not settings.findings_ranges_s:
        return None
    return functools.partial(_settler_schedule, ranges_s=tuple(settings.findings_ranges_s),
                             every_s=float(settings.findings_every_s),
                             past_days=past_days(settings.retention_days, settings.minute_rollup_days))


def _settler_schedule(engine: Engine, *, ranges_s: tuple[int, ...], every_s: float, past_days: int):
    # a random first delay: receivers started together fall out of step, so one evaluation serves all
    return EvaluationSchedule(engine, ranges_s, every_s, first_delay_s=random.uniform(0, min(every_s / 4, 15)),
                              past_days=past_days)


class EvaluationSchedule:
    """Called from the settler's loop: every ``every_s`` seconds, evaluate each range ending
    now and store it — unless another process (a second receiver's settler, a dashboard
    request) stored one recently enough. ``every_s`` 0 turns it off.

    With ``past_days``, each tick also evaluates one of the 24 h windows before the last 24 h
    (``past_windows``: they move on each hour) whose stored findings are missing or stale, as
    an absolute window (``_absolute``). A window opened there later (a post-mortem of last
    night) then finds most of its exemplars and cold-start checks done (``StoredFindings``):
    only the detectors and the rollup reads are left to its first request."""

    def __init__(self, engine: Engine, ranges_s: tuple[int, ...], every_s: float,
                 thresholds: d.Thresholds | None = None, *, first_delay_s: float = 0.0,
                 past_days: int = 0) -> None:
        """``first_delay_s``: the first evaluation waits that long; receivers started together
        pass a random one, so their schedules fall out of step and one evaluation serves all."""
        self.engine = engine
        self.ranges_s = ranges_s
        self.every_s = every_s
        self.thresholds = thresholds
        self.past_days = past_days
        self._every = Every(every_s, first_delay_s or None)
        # One reader across ticks: it keeps the hour packs it decoded (``packs.PackCache``),
        # so each minute's evaluation of the last 24 h fetches only the packs built since.
        self.reader = StoreReader(engine)

    def maybe_run(self, now: float | None = None, now_ns: int | None = None) -> int:
        """Evaluate what is due; returns how many windows were evaluated (``now_ns``: the
        wall clock the past windows follow, for tests)."""
        if not (self.ranges_s or self.past_days) or not self._every.due(now):
            return 0
        try:
            th = self.thresholds = self.thresholds or d.Thresholds.from_env()
        except Exception:  # noqa: BLE001 - a bad threshold setting is reported by the dashboard, not here
            log.exception("findings evaluation: bad detector settings")
            return 0
        key = thresholds_key(th)
        reader = self.reader
        done = 0
        for range_s in self.ranges_s:
            end_ns = time.time_ns()
            try:
                # Someone else (another receiver's settler, a request) evaluated it just now;
                # a quarter period keeps the newest evaluation under FRESH_S old for 60 s.
                if latest(self.engine, range_s, key, end_ns - int(self.every_s * NS) // 4) is not None:
                    continue
                evaluate(reader, Window(end_ns - range_s * NS, end_ns), th)
                done += 1
            except Exception:  # noqa: BLE001 - evaluation must never stop settling
                log.exception("findings evaluation over %d s failed", range_s)
        return done + self._evaluate_past(reader, th, time.time_ns() if now_ns is None else now_ns)

    def _evaluate_past(self, reader: StoreReader, th: d.Thresholds, now_ns: int) -> int:
        """One past window whose stored findings are missing or stale (newest first), a tick."""
        for window in past_windows(now_ns, self.past_days):
            try:
                if not _absolute(reader, window, th).stored:  # (stored: still valid, next)
                    return 1
            except Exception:  # noqa: BLE001 - evaluation must never stop settling
                log.exception("findings evaluation of the past window %s failed", window)
                return 0
        return 0
