"""Findings evaluated ahead of the request.

Running every detector over a day of data takes seconds at ten million spans (2.3 s
measured, BENCHMARKS.md), too slow for the page on-call opens first. So the worker's settler
evaluates the anomaly catalog over the standard relative ranges (``MODALSCOPE_FINDINGS_RANGES``,
default the last hour and the last 24 h) every ``MODALSCOPE_FINDINGS_EVERY_S`` seconds and
stores the findings (table ``finding_evaluations``), the way an alerting engine evaluates
its rules on a schedule.

A *relative* request ("the last 24 h", no explicit start) is answered from the newest stored
evaluation of the same length and thresholds whose window ends at most ``FRESH_S`` before the
request's; the answer says which window it covers and when it was evaluated. Without one —
and for every absolute window, whose answer must be exactly that window's — the detectors
run on the request, and a relative result is stored for the next caller. Stored findings are
unfiltered: a filter is applied on reading, as ``findings.matches`` does for fresh ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from dataclasses import dataclass

import orjson
from sqlalchemy import Engine, delete, select

from ..models import FindingEvaluation
from ..models.reader import Filters, StoreReader
from . import detectors as d
from . import findings as fnd
from .params import Window

log = logging.getLogger(__name__)

NS = 1_000_000_000
#: How much older than the request's window end a stored evaluation may be and still answer it.
FRESH_S = 90
#: Evaluations older than this are deleted when a new one is stored.
KEEP_S = 15 * 60


@dataclass(frozen=True)
class Evaluation:
    """Findings of the window ``[start_ns, end_ns)``, evaluated at ``evaluated_ns``
    (``stored``: read from ``finding_evaluations`` rather than computed for this request)."""

    findings: list[dict]
    start_ns: int
    end_ns: int
    evaluated_ns: int
    stored: bool


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
    return Evaluation(orjson.loads(row.findings), row.start_ns, row.end_ns, row.evaluated_ns, stored=True)


def store(engine: Engine, window: Window, key: str, found: list[dict], evaluated_ns: int) -> None:
    """Keep ``found`` (unfiltered) as the evaluation of ``window``; drop evaluations of the
    same range older than ``KEEP_S``."""
    range_s, fe = round(window.seconds), FindingEvaluation
    with engine.begin() as conn:
        conn.execute(delete(fe).where(fe.range_s == range_s, fe.thresholds_key == key,
                                      fe.end_ns < window.end_ns - KEEP_S * NS))
        conn.execute(fe.__table__.insert().values(
            range_s=range_s, thresholds_key=key, start_ns=window.start_ns, end_ns=window.end_ns,
            evaluated_ns=evaluated_ns, findings=orjson.dumps(found).decode()))


def evaluate(reader: StoreReader, window: Window, th: d.Thresholds) -> Evaluation:
    """Run the catalog over ``window`` (unfiltered) and store the result."""
    found = fnd.find(reader, window, Filters(), th)
    ev = Evaluation(found, window.start_ns, window.end_ns, time.time_ns(), stored=False)
    try:
        store(reader.engine, window, thresholds_key(th), found, ev.evaluated_ns)
    except Exception:  # noqa: BLE001 - a cache: a store that refuses the write (read-only role) still answers
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
    there is one, else the detectors run now (and, for a relative window, the result is
    stored)."""
    if relative:
        key = thresholds_key(th)
        try:
            hit = latest(reader.engine, round(window.seconds), key, window.end_ns - FRESH_S * NS)
        except Exception:  # noqa: BLE001 - a store not yet upgraded to 0004 answers without the cache
            log.warning("could not read stored findings evaluations", exc_info=True)
            hit = None
        if hit is None:
            hit = evaluate(reader, window, th)
        kept = [f for f in hit.findings if fnd.matches(f, filters)]
        return dataclasses.replace(hit, findings=d.sort_findings(kept))
    found = fnd.find(reader, window, filters, th)
    return Evaluation(found, window.start_ns, window.end_ns, time.time_ns(), stored=False)


class EvaluationSchedule:
    """Called from the settler's loop: every ``every_s`` seconds, evaluate each range ending
    now and store it — unless another process (a second receiver's settler, a dashboard
    request) stored one recently enough. ``every_s`` 0 turns it off."""

    def __init__(self, engine: Engine, ranges_s: tuple[int, ...], every_s: float,
                 thresholds: d.Thresholds | None = None, *, first_delay_s: float = 0.0) -> None:
        """``first_delay_s``: the first evaluation waits that long; receivers started together
        pass a random one, so their schedules fall out of step and one evaluation serves all."""
        self.engine = engine
        self.ranges_s = ranges_s
        self.every_s = every_s
        self.thresholds = thresholds
        self._next = time.monotonic() + first_delay_s if first_delay_s else 0.0

    def maybe_run(self, now: float | None = None) -> int:
        """Evaluate what is due; returns how many ranges were evaluated."""
        if not self.every_s or not self.ranges_s:
            return 0
        now = time.monotonic() if now is None else now
        if now < self._next:
            return 0
        self._next = now + self.every_s
        try:
            th = self.thresholds = self.thresholds or d.Thresholds.from_env()
        except Exception:  # noqa: BLE001 - a bad threshold setting is reported by the dashboard, not here
            log.exception("findings evaluation: bad detector settings")
            return 0
        key = thresholds_key(th)
        reader = StoreReader(self.engine)
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
        return done
