"""Findings from the store: read the detectors' frames, run the catalog, add exemplars.

The detectors (``app/detectors/``) are pure; this module is their one reader. Percentile
data come from the rollups (``pair``, ``trace``, ``tstage``, per minute, from a trailing
look-back of ``MODALSCOPE_DETECT_BASELINE_MINUTES`` before the window so baselines exist),
and so do the span conventions the attribute detectors need (``cache``, ``batch``,
``cuda``, ``sync`` rollups, written at settle time); raw spans only around new instances
(``inst`` rollups) that look like cold starts; long traces (the load-balancer detector)
from the traces table. Exemplar look-ups for rollup-based findings search the finding's
first minute, then its first five (``EXEMPLAR_WINDOWS_NS``): a bounded raw read.

Public (called by the API, the CLI and the pages; keep these signatures): ``load_frames``,
``add_exemplars``, ``matches``, ``find``, ``judged_window``, ``read_minutes``, ``finding_identity``,
``finding_window``. Findings are ``core.findings.Finding`` values; their JSON
(``Finding.to_json``) is made only where they leave: the API, the CLI, stored evaluations.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import orjson
import pandas as pd

from ..core.findings import Finding
from ..core.series import SeriesKind
from ..models import packs, sketch
from ..models.reader import Filters, StoreReader
from . import detectors as d
from . import queries
from .params import Window

log = logging.getLogger(__name__)


def _columns_frame(cols: packs.Columns, dims_of: dict[int, tuple], dims: tuple[str, ...], with_sum: bool,
                   sketches: bool = True) -> pd.DataFrame:
    """``reader.rollups.columns`` as a frame: ``dims``, minute, count, errors (and
    ``sum_ns``), each row's sketch as ``keys``/``counts`` arrays, views into the columns'
    entries (``sketches`` False: without them)."""
    ids = np.sort(np.fromiter(dims_of, dtype=np.int64, count=len(dims_of)))
    at = np.searchsorted(ids, cols.series_id)  # each row's series among ``ids``
    values = [dims_of[i] for i in ids.tolist()]
    data: dict = {}
    for k, name in enumerate(dims):
        col = np.empty(len(values), dtype=object)
        col[:] = [v[k] for v in values]
        data[name] = col[at] if len(cols) else []
    data.update(minute=cols.minute, count=cols.count, errors=cols.errors)
    if with_sum:
        data["sum_ns"] = cols.sum_ns
    if not sketches:
        return pd.DataFrame(data)
    keys, counts = cols.keys, cols.counts
    ends = np.cumsum(cols.lengths).tolist()
    bounds = list(zip([0] + ends[:-1], ends))
    data["keys"] = [keys[a:b] for a, b in bounds]
    data["counts"] = [counts[a:b] for a, b in bounds]
    return pd.DataFrame(data)


def _convention_frames(reader: StoreReader, data_start: int, end_ns: int) -> dict[str, pd.DataFrame]:
    """The ``cache``/``batch``/``cuda``/``sync`` rollups as the detectors' frames (mostly from
    hour packs, ``models/packs.py``)."""
    def frame(kind, dims, sketches=True, **kw):
        return _columns_frame(*reader.rollups.columns(kind, data_start, end_ns, dims, sketches=sketches), dims,
                              sketches=sketches, **kw)

    # (cache and batch use only the counts and sums: read without sketches, as they are packed)
    cache = frame(SeriesKind.CACHE, ("service", "name", "caller", "callee"), with_sum=False, sketches=False)
    batch = frame(SeriesKind.BATCH, ("service",), with_sum=True, sketches=False)
    cuda = frame(SeriesKind.CUDA, ("service", "name", "callee"), with_sum=False)
    sync = frame(SeriesKind.SYNC, ("service",), with_sum=False)
    # Tag rows only: a cache's TOTAL series (tag key '') is no tag.
    cache = cache[cache["caller"].astype(bool)].reset_index(drop=True) if not cache.empty else cache
    return {
        "cache": (cache.set_axis(list(d.CACHE_COLUMNS), axis=1) if not cache.empty
                  else d.empty_frame(d.CACHE_COLUMNS)),
        "batch": (batch.set_axis(list(d.BATCH_COLUMNS), axis=1) if not batch.empty
                  else d.empty_frame(d.BATCH_COLUMNS)),
        "cuda": (cuda.assign(fallback=cuda["callee"] == "fallback")[list(d.CUDA_COLUMNS)] if not cuda.empty
                 else d.empty_frame(d.CUDA_COLUMNS)),
        "sync": sync[list(d.SYNC_COLUMNS)] if not sync.empty else d.empty_frame(d.SYNC_COLUMNS),
    }


def _data_start(window: Window, th: d.Thresholds) -> int:
    """Where the detectors' reads begin: a trailing look-back before the window for baselines."""
    return window.start_ns - max(30, th.baseline_minutes) * d.NS_MIN


def _births(reader: StoreReader, data_start: int, end_ns: int):
    """``(service, instance, first minute)`` of the instances born before ``end_ns``: first
    seen at least two minutes after the data begins (earlier ones were already running)."""
    first_data_minute = -(-data_start // d.NS_MIN)
    return [b for b in reader.rollups.first_minutes(SeriesKind.INSTANCE, data_start, end_ns)
            if b[2] >= first_data_minute + 2]


def _warm_minutes(th: d.Thresholds) -> int:
    """Whole minutes a new instance's warm-up may touch after its birth minute."""
    return math.ceil(th.cold_warmup_s / 60) + 1


def _cold_start_minutes(th: d.Thresholds) -> int:
    """Minutes after a birth whose rollups and raw spans a cold-start check reads (its warm-up
    and the steady half hour after it, rounded up, and a minute to spare)."""
    return _warm_minutes(th) + d.COLD_STEADY_NS // d.NS_MIN + 2


class Known(Protocol):
    """What earlier evaluations found over the same, unchanged data (``evaluations.StoredFindings``)."""

    def exemplars(self, f: Finding) -> Finding | None:
        """An identical finding whose exemplars were looked up over the same raw spans, or None."""

    def cold_start(self, service: str, instance: str, born_minute: int) -> list[Finding] | None:
        """The ``cold_start`` findings (one or none) an evaluation that checked this birth
        made from the same raw spans; None when no such evaluation is known."""


def _new_instances(reader: StoreReader, data_start: int, window: Window, th: d.Thresholds,
                   known: Known | None = None):
    """New instances worth a raw look (cold starts): first seen (``inst`` rollups) at least
    two minutes after the data begins and before the window ends, and slow enough in their
    first minutes (``detectors.cold_start_candidate``). Returns those (service, instance)
    pairs, the raw SERVER/CONSUMER spans of their services around each birth, and the
    findings ``known`` has for births it checked before (their rollups and spans are not read)."""
    warm_minutes = _warm_minutes(th)
    looked_at = warm_minutes + d.COLD_STEADY_NS // d.NS_MIN  # minutes from a birth
    by_service: dict[str, list[tuple[str, int]]] = {}
    taken: list[Finding] = []
    for service, instance, born in _births(reader, data_start, window.end_ns):
        # A birth an earlier evaluation checked over the same minutes: its verdict, no read.
        same = known.cold_start(service, instance, born) if known is not None else None
        if same is not None:
            taken.extend(same)
        else:
            by_service.setdefault(service, []).append((instance, born))
    found: set = set()
    rows: list[tuple] = []
    ids = reader.rollups.series_ids(SeriesKind.INSTANCE) if by_service else {}
    # One read a service of its minutes after all its births (a week holds ~600 births: a
    # statement each cost more than the rows), over one connection.
    reads = reader.rollups.rows_by_service(
        SeriesKind.INSTANCE, {service: [(b, b + looked_at) for _, b in births] for service, births in by_service.items()},
        ("name",), series_ids=ids) if by_service else {}
    for service, births in by_service.items():
        inst = reads[service]
        minutes = [r[0] for r in inst]
        for instance, born in births:
            after = inst[bisect.bisect_left(minutes, born):bisect.bisect_left(minutes, born + looked_at)]
            # (minute, count, errors, sum, sketch, name) rows straight into two histograms: a
            # frame per new instance cost more than the check (a day of demo data has ~120).
            first = sketch.merge_blobs([r[4] for r in after
                                        if r[5] == instance and r[0] < born + warm_minutes and r[4]])
            steady = sketch.merge_blobs([r[4] for r in after if r[0] >= born + warm_minutes and r[4]])
            if not d.cold_start_histograms_candidate(first, steady, th):
                continue
            found.add((service, instance))
            end = born * d.NS_MIN + int(th.cold_warmup_s * 1e9) + d.COLD_STEADY_NS + d.NS_MIN
            rows.extend(reader.attributes.spans(born * d.NS_MIN, end, (), kinds=d.KIND_SERVER_CODES, service=service,
                                                limit=max(1, th.max_spans)))
    return found, rows, taken


def _spans_frame(rows: list[tuple]) -> pd.DataFrame:
    if not rows:
        return d.empty_frame(d.SPAN_COLUMNS)
    rows = sorted(set(rows), key=lambda r: (r[5], r[0]))
    cols = list(zip(*rows))
    data = {name: list(col) for name, col in zip(d.SPAN_COLUMNS[:-1], cols[:-1])}
    data["attrs"] = [orjson.loads(a) if a else {} for a in cols[-1]]
    return pd.DataFrame(data)


def load_frames(reader: StoreReader, window: Window, th: d.Thresholds, known: Known | None = None) -> d.Frames:
    """Every frame from rollups (a trailing ``baseline_minutes`` before the window for
    baselines), long traces from the traces table, and raw spans only around new instances
    that look like cold starts (and that ``known`` did not check before)."""
    data_start = _data_start(window, th)
    memo = reader.context.memo()  # (the threads below share what this block looked up)

    def read_pairs():
        # (read whole: mostly hour packs, models/packs.py; the sketches as flat arrays only,
        # ``Frames.pair_sketches``: a view a row cost more than the few findings that use them)
        with reader.context.pinned(memo):
            cols, dims_of = reader.rollups.columns("pair", data_start, window.end_ns, ("caller", "callee"))
        frame = _columns_frame(cols, dims_of, ("caller", "callee"), with_sum=False, sketches=False)
        return frame, (cols.lengths, cols.keys, cols.counts)

    def read_births():
        with reader.context.pinned(memo):
            new_instances, span_rows, cold_starts_known = _new_instances(reader, data_start, window, th, known)
        return dict(new_instances=new_instances, spans=_spans_frame(span_rows), cold_starts_known=cold_starts_known)

    if reader.engine.dialect.name in THREADED_DIALECTS:
        # The largest read, and the raw reads around new instances, beside the others: the
        # server packs their rows while this process decodes the rest (PostgreSQL only).
        with ThreadPoolExecutor(2, thread_name_prefix="frames") as pool:
            pairs_read = pool.submit(read_pairs)
            births_read = pool.submit(read_births)
            frames = _other_frames(reader, data_start, window, th)
            frames.update(births_read.result())
            pairs, pair_sketches = pairs_read.result()
    else:
        frames = _other_frames(reader, data_start, window, th)
        frames.update(read_births())
        pairs, pair_sketches = read_pairs()
    return d.Frames(window.start_ns, window.end_ns, data_start, pairs=pairs, pair_sketches=pair_sketches, **frames)


def _other_frames(reader: StoreReader, data_start: int, window: Window, th: d.Thresholds) -> dict:
    """``load_frames``' frames but the pairs and the new instances', as ``Frames`` arguments."""
    traces = _columns_frame(*reader.rollups.columns("trace", data_start, window.end_ns, ("input_type",)),
                            ("input_type",), with_sum=True)
    # (the preprocessing stage's only: no detector reads the other stages' time)
    ts_rows = reader.rollups.rows(SeriesKind.TRACE_STAGE, data_start, window.end_ns, ("input_type", "stage"),
                                  Filters(stage="preprocessing"), sketches=False)
    min_long = int(th.lb_min_ceiling_s * (1 - th.lb_band) * 1e9)
    long_rows = reader.spans.long_traces(window.start_ns, window.end_ns, min_long)
    tstage = pd.DataFrame({"input_type": [r[5] for r in ts_rows], "stage": [r[6] for r in ts_rows],
                           "minute": [r[0] for r in ts_rows], "count": [r[1] for r in ts_rows],
                           "sum_ns": [r[3] for r in ts_rows]})
    long_traces = (pd.DataFrame(long_rows)[list(d.LONG_TRACE_COLUMNS)] if long_rows
                   else d.empty_frame(d.LONG_TRACE_COLUMNS))
    return dict(traces=traces, tstage=tstage, long_traces=long_traces,
                **_convention_frames(reader, data_start, window.end_ns))


def finding_window(f: Finding) -> Window:
    """A finding's ``start``/``end`` as a window."""
    return Window(f.start_ns, f.end_ns)


#: The attribute a finding of each attribute kind is about (its exemplars carry it), and
#: whether its subject's service narrows the read (a cache's lookups come from any service).
_EXEMPLAR_KEYS = {"cache_penetration": ("cache.name", False), "batching_failure": ("batch.size", True),
                  "cuda_graph_fallback": ("gpu.cuda_graph", True)}
# Exemplar look-ups read the finding's first minute, then its first five minutes, then (only
# when those found none) its whole window: a look-up's cost grows with the spans it reads.
EXEMPLAR_WINDOWS_NS = (d.NS_MIN, 5 * d.NS_MIN)
# Raw spans an attribute finding's exemplar look-up reads at most (the earliest of its
# window): five minutes of a flood held millions, and reading them all held the dashboard
# worker and the settler that evaluates the catalog for seconds and hundreds of megabytes;
# five minutes of the demo's own busiest traffic hold ~36,000 spans.
EXEMPLAR_MAX_SPANS = 50_000


def _exemplar_rows(reader: StoreReader, f: Finding, w: Window) -> list[dict]:
    """Exemplar rows (``trace_id``; an attribute finding's also carry the ``hint`` its spans
    give, ``detectors.describe_from_spans``) of ``f`` in ``w``."""
    s, ev = f.subject, f.evidence
    if f.kind in ("hot_spot", "p99_band_break"):
        min_ms = ev.get("threshold_ms") if f.kind == "p99_band_break" else ev.get("p99_ms")
        return queries.exemplar_traces(reader, w, Filters(caller=s.caller, callee=s.callee),
                                       min_ms=min_ms, limit=d.MAX_EXEMPLARS)
    if f.kind == "baseline_regression":
        thr = ev.get("threshold_ms")
        return reader.calls.slowest_traces(w.start_ns, w.end_ns, input_type=s.input_type,
                                           min_ns=int(thr * 1e6) if thr else None, limit=d.MAX_EXEMPLARS)
    if f.kind in d.ATTRIBUTE_KINDS:
        # Only the spans describe_from_spans looks at: the finding's own convention key (and
        # service), or for fusion the SERVER/CONSUMER spans without their attributes. Reading
        # every span with any key and parsing its JSON cost more than the rest of the look-up.
        if f.kind == "fusion_sync_wait":
            # (the encoder and fusion spans only, all the detector looks at: a third of the rows)
            rows = reader.attributes.spans(w.start_ns, w.end_ns, (), kinds=d.KIND_SERVER_CODES,
                                           limit=EXEMPLAR_MAX_SPANS, stages=d.SYNC_STAGES)
        else:
            key, by_service = _EXEMPLAR_KEYS[f.kind]
            rows = reader.attributes.spans(w.start_ns, w.end_ns, (key,),
                                           service=s.service if by_service else None,
                                           limit=EXEMPLAR_MAX_SPANS)
        described = d.describe_from_spans(f, _spans_frame(rows))
        return [{"trace_id": t, "hint": described.hint} for t in described.exemplar_trace_ids]
    if f.kind == "preprocessing_bound":
        return queries.exemplar_traces(reader, w, Filters(stage="preprocessing", input_type=s.input_type),
                                       limit=d.MAX_EXEMPLARS)
    return []


#: Exemplar look-ups run this many at a time where the database does the work in another
#: process (PostgreSQL: most of a look-up is the server's and the round trip). SQLite
#: answers inside this process, under the interpreter lock: there they run one after another
#: (no faster in threads, measured: docs/benchmarks.md).
EXEMPLAR_THREADS = 3
#: Where reads run beside each other (``add_exemplars``, ``load_frames``). (Exemplar look-ups
#: beside the detectors were tried: the look-ups' own Python work slowed the detectors as much
#: as it saved, see docs/benchmarks.md.)
THREADED_DIALECTS = frozenset({"postgresql"})


def finding_identity(f: Finding) -> bytes:
    """What an exemplar look-up depends on: a finding's kind, severity, subject, window and
    evidence (not its exemplars, nor its hint, which the look-up may rewrite)."""
    return orjson.dumps({"kind": f.kind, "severity": f.severity, "subject": f.subject.to_json(), "start": f.start,
                         "end": f.end, "evidence": f.evidence}, option=orjson.OPT_SORT_KEYS)


def add_exemplars(reader: StoreReader, findings: list[Finding], known: Known | None = None) -> None:
    """Exemplar traces for rollup-based findings (the others carry theirs already): each
    such finding in ``findings`` is replaced by its copy with exemplars (and hint).

    ``known.exemplars(f)``: an identical finding whose exemplars were already looked up over
    the same, unchanged raw spans, or None; its exemplars and hint are taken instead of a
    look-up.

    A look-up reads raw spans sorted by duration, so its cost grows with its window: each
    one first searches the finding's first minute, widens to its first five while it has
    fewer than ``MAX_EXEMPLARS`` (a band break's window starts at its first outlier; a hot
    spot or a regression holds over the whole run), and to the whole window when that found
    nothing or the window is no longer. (A flood of ~20,000 spans/s puts over a million
    spans in a minute.) Each finding's look-up touches only that finding.
    """
    todo = [i for i, f in enumerate(findings) if not f.exemplar_trace_ids]
    if known is not None and todo:
        left = []
        for i in todo:
            same = known.exemplars(findings[i])
            if same is None:
                left.append(i)
            else:
                findings[i] = findings[i].replace(exemplar_trace_ids=same.exemplar_trace_ids, hint=same.hint)
        todo = left

    memo = reader.context.memo()

    def look_up(i: int) -> Finding:
        # (a finding's few reads on one connection, on any thread, sharing what the
        # evaluation already looked up once)
        with reader.context.pinned(memo):
            return _with_exemplars(reader, findings[i])

    if len(todo) > 1 and EXEMPLAR_THREADS > 1 and reader.engine.dialect.name in THREADED_DIALECTS:
        with ThreadPoolExecutor(min(EXEMPLAR_THREADS, len(todo)), thread_name_prefix="exemplars") as pool:
            done = list(pool.map(look_up, todo))
    else:
        done = [look_up(i) for i in todo]
    for i, f in zip(todo, done):
        findings[i] = f


def _early_rows(reader: StoreReader, f: Finding, w: Window) -> dict[int, list[dict]]:
    """A regression's exemplar rows of its first minute and its first five (``_exemplar_rows``
    of each, by ``EXEMPLAR_WINDOWS_NS``) read in one statement when its window holds both;
    empty for the other kinds and windows (each read on its own)."""
    short, long_ = EXEMPLAR_WINDOWS_NS
    if f.kind != "baseline_regression" or w.end_ns - w.start_ns <= long_:
        return {}
    thr = f.evidence.get("threshold_ms")
    a, b = reader.calls.slowest_traces_from(w.start_ns, (w.start_ns + short, w.start_ns + long_),
                                            input_type=f.subject.input_type,
                                            min_ns=int(thr * 1e6) if thr else None, limit=d.MAX_EXEMPLARS)
    return {short: a, long_: b}


def _with_exemplars(reader: StoreReader, f: Finding) -> Finding:
    """``f`` with the exemplars (and an attribute finding's hint) its look-up found."""
    w = finding_window(f)
    rows: list[dict] = []
    try:
        early = _early_rows(reader, f, w)
        for first in EXEMPLAR_WINDOWS_NS:
            if w.end_ns - w.start_ns <= first:
                break
            rows = (early[first] if first in early else _exemplar_rows(reader, f, Window(w.start_ns, w.start_ns + first))
                    ) or rows
            if len(rows) >= d.MAX_EXEMPLARS:
                break
        if not rows or (len(rows) < d.MAX_EXEMPLARS and w.end_ns - w.start_ns <= EXEMPLAR_WINDOWS_NS[-1]):
            rows = _exemplar_rows(reader, f, w) or rows
    except Exception:  # noqa: BLE001 - exemplars are a courtesy; the finding stands without them
        log.exception("exemplar look-up for a %s finding failed", f.kind)
        rows = []
    hint = rows[0]["hint"] if rows and f.kind in d.ATTRIBUTE_KINDS else f.hint
    return f.replace(exemplar_trace_ids=[r["trace_id"].lower() for r in rows][: d.MAX_EXEMPLARS], hint=hint)


def matches(f: Finding, filters: Filters) -> bool:
    """A finding is kept under a filter when its subject names that value (``service``
    also matches a pair's caller or callee)."""
    s = f.subject
    if filters.service and filters.service not in (s.service, s.caller, s.callee):
        return False
    for name in ("caller", "callee", "stage", "input_type"):
        want = getattr(filters, name)
        if want and getattr(s, name) != want:
            return False
    return True


@contextlib.contextmanager
def _no_gc():
    """The cyclic garbage collector off while frames of a few hundred thousand rows are
    built: those allocations trigger full collections that walk every row again (a third
    of the read). Reference counting still frees everything; the previous state returns."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: Longest window the detectors judge: they work minute by minute, so a window of a year
#: held a worker long and much of its memory. A longer one is judged over its last 7 days.
MAX_WINDOW_S = 7 * 86400


def judged_window(window: Window) -> Window:
    """The part of ``window`` the detectors judge: its last ``MAX_WINDOW_S``."""
    if window.seconds > MAX_WINDOW_S:
        return Window(window.end_ns - MAX_WINDOW_S * 1_000_000_000, window.end_ns)
    return window


def read_minutes(reader: StoreReader, window: Window, th: d.Thresholds) -> tuple[int, int]:
    """The first and last minute whose rollups or raw spans ``find`` reads for ``window``:
    from the baseline look-back before it to its end — or, when an instance was born in the
    window's last minutes, to the end of that cold start's steady half hour after it
    (``_new_instances`` reads that far)."""
    window = judged_window(window)
    data_start = _data_start(window, th)
    last = -(-window.end_ns // d.NS_MIN)
    for _, _, born in _births(reader, data_start, window.end_ns):
        last = max(last, born + _cold_start_minutes(th))
    return data_start // d.NS_MIN, last


def find(reader: StoreReader, window: Window, filters: Filters = Filters(), th: d.Thresholds | None = None,
         exemplars: bool = True, timings: dict | None = None,
         known: Known | None = None) -> list[Finding]:
    """Every finding in the window (at most its last ``MAX_WINDOW_S``), most severe first;
    ``known``: what earlier evaluations found over the same data (``Known``)."""
    th = th or d.Thresholds()
    window = judged_window(window)  # every caller (pages, CLI, API) is bounded here
    t0 = time.perf_counter()
    # (one connection for this thread's few hundred reads: ReadContext.pinned)
    with reader.context.pinned():
        with _no_gc():
            frames = load_frames(reader, window, th, known)
            t1 = time.perf_counter()
            out = []
            per: dict[str, float] = {}
            for kind, fn in d.DETECTORS.items():
                a = time.perf_counter()
                out.extend(fn(frames, th))
                per[kind] = time.perf_counter() - a
            t2 = time.perf_counter()
        out = [f for f in out if matches(f, filters)]
        if exemplars:
            add_exemplars(reader, out, known)
    t3 = time.perf_counter()
    if timings is not None:
        timings.update({"read_s": t1 - t0, "detect_s": t2 - t1, "exemplars_s": t3 - t2, "total_s": t3 - t0,
                        "per_detector_s": per, "raw_spans": len(frames.spans)})
    return d.sort_findings(out)
