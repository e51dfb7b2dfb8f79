"""Dashboard and API latency over a large store, against exact answers computed from raw spans.

Run from the repository root:

    .venv/bin/python bench/dashboard_bench.py --spans 200000 --runs 3 --baseline-runs 1   # a quick look
    .venv/bin/python bench/dashboard_bench.py --spans 1000000 --json 1m.json
    .venv/bin/python bench/dashboard_bench.py --spans 10000000 --json 10m.json    # fills the store once
    .venv/bin/python bench/dashboard_bench.py --spans 10000000 \\
        --database-url postgresql://postgres@127.0.0.1:5432 --json 10m-pg.json   # PostgreSQL, copied from SQLite

The store is ``modalscope demo``'s generator: ``--hours`` (default 24) of traffic at the rate
that makes ``--spans``, every anomaly pattern injected, settled. SQLite stores are kept at
``/tmp/modalscope-bench/store-<spans>.db`` (``--db`` to choose) and reused by later runs; the
fill time is printed and kept beside the store (``<db>.fill.json``).

PostgreSQL (``--database-url``): the SQLite store of the same size is filled first if needed,
then copied with ``COPY`` (secondary indexes dropped during the copy and rebuilt, then
``VACUUM ANALYZE``; each step timed). A URL naming no database (or ``postgres``) gets a
uniquely named database that is dropped afterwards; a URL naming a database keeps it, and a
later run with the same ``--spans`` reuses it.

Then, in a fresh process acting as one dashboard worker (``create_app``; the API through
Flask's test client, so times are server-side), for windows of 1 h and 24 h ending at the
newest span's minute (and 7 d when the store holds that much) it times, median of ``--runs``
after one warm-up:

* every ``/api/v1`` endpoint: health, pairs, input-types, stages, traces (no filter, a pair,
  a pair and a latency band, a stage), traces/<id>, cache, anomalies, compare (the busiest
  pair, the busiest one whose callee sends spans, whole traces);
* every page's data callback, called as the browser calls it (``POST /_dash-update-component``
  with the page's state store; figures and tables built and serialised);
* the query functions those callbacks call (``app/queries/``, ``app/findings.find``).

The windows are absolute, so after the warm-up the anomaly calls (API, Anomalies page,
overview's findings) are answered from the findings stored for that exact window
(``app/evaluations.py``); ``findings.find`` and "absolute window: its first request" time the
detectors themselves.

The worker's peak RSS (``ru_maxrss``) is taken after all of that. Then the exact answers of
``/pairs``, ``/input-types`` and ``/stages`` for the same windows are computed from the raw
rows with pandas (``groupby().quantile()``: numpy's default linear definition), timed the
same way (``--baseline-runs``), and compared with ours: speed-up, and the largest relative
error of any P50/P90/P95/P99 of any group (counts must match exactly):

* ``/input-types``: the raw spans of every trace with a span in the window (not the
  settler's ``traces`` table): start and duration from the root span, the input type from
  every span's stored signals as settling combines them (``input_type_from_signals``: the
  root's first, then by start), the traces starting in the window grouped by input type;
* ``/pairs``: the calls starting in the window as ``ingest/traces.trace_calls`` makes them
  (``exact_pairs``): model calls and CLIENT spans joined to their SERVER/CONSUMER children
  (the earliest child in another service, else a model call's provider, else the address
  ladder of ``traces.address_callee``, else the caller when a child is in its own service;
  a transport span under a model call of its service makes none), with the span's duration;
  queue hand-offs from the producer's start to the consumer's end;
* ``/stages``: spans starting in the window with their trace's input type (from its raw
  spans the same way), span durations grouped by (input type, stage).

Output: a Markdown table (call | ms per window | exact ms | speed-up | max rel err) and,
with ``--json FILE``, everything measured. ``--no-baseline`` skips the pandas part.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

HOUR_NS = 3_600_000_000_000
MINUTE_NS = 60_000_000_000
SPANS_PER_TRACE = 27.3  # the demo's average (217,724 spans in 7,983 traces)
WINDOWS = (("1h", 1), ("24h", 24), ("7d", 168))
COPY_TABLES = ("series", "spans", "pair_calls", "traces", "rollups", "rollups_15m", "rollups_hourly", "cursors")
PCT = {"pairs": (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99)),
       "input_types": (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)),
       "stages": (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99))}
KEYS = {"pairs": ("caller", "callee"), "input_types": ("input_type",), "stages": ("input_type", "stage"),
        "cache": ("cache", "group")}
PCT["cache"] = (("hit_rate", None),)  # compared as the percentiles are: relative error, and counts
CACHE_GROUP_BY = "user_tier"  # the Cache page's group in every window (Subject.group_by)


def default_db(spans: int) -> str:
    return os.path.join(bl.BENCH_DIR, f"store-{spans}.db")


# -- filling -----------------------------------------------------------------------------------
def _sqlite_files(path: str) -> list[str]:
    return [path + suffix for suffix in ("", "-wal", "-shm")]


def pack_store(url: str) -> float:
    """Pack the store's closed hours of rollups (``models/packs.py``), as the receivers' settler
    does a few minutes after each hour ends, and verify them at once (nothing else writes to
    the bench's store). Returns the seconds it took."""
    from tqdm import tqdm

    from modalscope.models import packs
    from modalscope.models.engine import make_engine

    engine = make_engine(url, write=True)
    try:
        t0 = time.perf_counter()
        with tqdm(desc="packing hours", unit=" packs", file=sys.stderr, mininterval=1) as bar:
            built = packs.pack_everything(engine, progress=lambda done, total: (setattr(bar, "total", total),
                                                                                bar.update(1)))
        took = time.perf_counter() - t0
    finally:
        engine.dispose()
    if built:
        bl.log(f"packed {built} hours of rollups in {took:.1f} s")
    return took


def fill_sqlite(path: str, spans: int, hours: float) -> dict:
    """Fill ``path`` with demo traffic (unless it already holds ~``spans``) and settle it.
    Returns what the fill took (from ``<path>.fill.json`` when the store was reused).

    The fill goes to ``<path>.filling`` and is renamed when complete, so an interrupted fill
    leaves nothing behind that a later run would mistake for a store."""
    from sqlalchemy import func, select
    from tqdm import tqdm

    from modalscope.ingest import demo
    from modalscope.ingest.settle import settle
    from modalscope.models import Span, Trace
    from modalscope.models.engine import make_engine
    from modalscope.models.schema import ensure_schema

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    sidecar = path + ".fill.json"
    if os.path.exists(path):
        ensure_schema(f"sqlite:///{path}", create=False)
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            have = conn.execute("SELECT count(*) FROM spans").fetchone()[0]
        if have < spans * 0.95:
            raise SystemExit(f"{path} holds {have:,} spans, fewer than --spans {spans:,}: remove it or pick another --db")
        if have > spans * 1.5:
            bl.log(f"note: {path} holds {have:,} spans, more than --spans {spans:,}; measuring it as it is")
        bl.log(f"reusing {path}: {have:,} spans")
        if os.path.exists(sidecar):
            with open(sidecar) as fh:
                return {**json.load(fh), "reused": True}
        return {"spans": have, "reused": True}
    partial = path + ".filling"
    for f in _sqlite_files(partial):
        if os.path.exists(f):
            os.remove(f)
    url = f"sqlite:///{partial}"
    done = False
    try:
        ensure_schema(url)
        engine = make_engine(url, write=True)
        try:
            rate = spans / SPANS_PER_TRACE / (hours * 3600)
            config = demo.DemoConfig(now_ns=time.time_ns(), seed=7, hours=hours, rate=rate)
            bl.log(f"filling {path}: {hours:g} h of demo traffic at {rate:.2f} requests/s (~{spans:,} spans)")
            t0 = time.perf_counter()
            with tqdm(total=int(rate * hours * 3600), desc="generating", unit=" traces", file=sys.stderr,
                      mininterval=1) as bar:
                result = demo.fill(engine, config, progress=bar.update)
            t1 = time.perf_counter()
            with engine.connect() as conn:
                pending = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
            with tqdm(total=pending, desc="settling", unit=" traces", file=sys.stderr, mininterval=1) as bar:
                settle(engine, force=True, progress=bar.update)
            t2 = time.perf_counter()
            with engine.connect() as conn:
                stored = conn.execute(select(func.count()).select_from(Span)).scalar_one()
        finally:
            engine.dispose()  # the last connection checkpoints the WAL into the file
        conn = sqlite3.connect(partial)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        os.replace(partial, path)
        for f in _sqlite_files(partial)[1:]:
            if os.path.exists(f):
                os.remove(f)
        done = True
    finally:
        if not done:
            for f in _sqlite_files(partial):
                if os.path.exists(f):
                    os.remove(f)
    info = {"spans": stored, "traces": result.traces, "hours": hours, "generate_write_s": round(t1 - t0, 1),
            "settle_s": round(t2 - t1, 1), "filled_utc": bl.machine_info()["date_utc"]}
    with open(sidecar, "w") as fh:
        json.dump(info, fh)
    bl.log(f"filled {stored:,} spans in {result.traces:,} traces: generate+write {t1 - t0:.0f} s, "
           f"settle {t2 - t1:.0f} s")
    return {**info, "reused": False}


def _pg_index_plan(pg, table: str) -> list[tuple[str, str]]:
    """(drop statement, create statement) for ``table``'s secondary indexes and non-primary
    unique constraints: dropped for the bulk copy, rebuilt afterwards."""
    rows = pg.execute(
        """SELECT i.indexname, i.indexdef, c.contype, pg_get_constraintdef(c.oid)
           FROM pg_indexes i
           LEFT JOIN pg_constraint c ON c.conindid = (quote_ident(i.schemaname) || '.' || quote_ident(i.indexname))::regclass
           WHERE i.schemaname = current_schema() AND i.tablename = %s""", (table,)).fetchall()
    plan = []
    for name, indexdef, contype, condef in rows:
        if contype == "p":
            continue
        if contype == "u":
            plan.append((f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"',
                         f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {condef}'))
        elif contype is None:
            plan.append((f'DROP INDEX "{name}"', indexdef))
    return plan


def copy_to_postgres(sqlite_path: str, pg_url: str) -> dict:
    """Copy every table of the SQLite store into an empty PostgreSQL database (schema by migrations)."""
    import psycopg
    from tqdm import tqdm

    from modalscope.models.schema import ensure_schema

    ensure_schema(pg_url)
    lite = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    timings = {"copy_s": 0.0, "index_s": 0.0, "analyze_s": 0.0}
    counts = {t: lite.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COPY_TABLES}
    try:
        with psycopg.connect(bl.libpq_url(pg_url)) as pg, \
                tqdm(total=sum(counts.values()), desc="copying to PostgreSQL", unit=" rows", unit_scale=True,
                     file=sys.stderr, mininterval=1) as bar:
            for table in COPY_TABLES:
                pg_cols = [r[0] for r in pg.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                    "AND table_name = %s ORDER BY ordinal_position", (table,))]
                lite_cols = {r[1] for r in lite.execute(f"PRAGMA table_info({table})")}
                cols = [c for c in pg_cols if c in lite_cols]
                plan = _pg_index_plan(pg, table)
                for drop, _ in plan:
                    pg.execute(drop)
                t0 = time.perf_counter()
                col_list = ", ".join(f'"{c}"' for c in cols)
                with pg.cursor().copy(f'COPY "{table}" ({col_list}) FROM STDIN') as cp:
                    cur = lite.execute(f"SELECT {col_list} FROM {table}")
                    while True:
                        chunk = cur.fetchmany(20_000)
                        if not chunk:
                            break
                        for row in chunk:
                            cp.write_row(row)
                        bar.update(len(chunk))
                t1 = time.perf_counter()
                for _, create in plan:
                    pg.execute(create)
                if "id" in cols:
                    pg.execute(f"SELECT setval(pg_get_serial_sequence('\"{table}\"', 'id'), "
                               f"(SELECT max(id) FROM \"{table}\")) WHERE EXISTS (SELECT 1 FROM \"{table}\")")
                pg.commit()
                timings["copy_s"] += t1 - t0
                timings["index_s"] += time.perf_counter() - t1
        t0 = time.perf_counter()
        with psycopg.connect(bl.libpq_url(pg_url), autocommit=True) as pg:
            for table in COPY_TABLES:
                pg.execute(f'VACUUM ANALYZE "{table}"')
        timings["analyze_s"] = time.perf_counter() - t0
    finally:
        lite.close()
    out = {k: round(v, 1) for k, v in timings.items()}
    out["rows"] = counts
    bl.log(f"copied to PostgreSQL: COPY {out['copy_s']:.0f} s, indexes {out['index_s']:.0f} s, "
           f"VACUUM ANALYZE {out['analyze_s']:.0f} s")
    return out


# -- what is timed ---------------------------------------------------------------------------
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
    served = next((p for p in pairs if reader.subject_spans(window.start_ns, window.end_ns, kind=2,
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


def _anomaly_chart_calls(client, ok, key: str, base: dict) -> list["Call"]:
    """The Anomalies page's charts, as the browser asks for them after the list: one chart
    (the first finding's), and the list with every chart one after another (what one worker
    serves for the whole page; a browser sends the charts at once, to as many workers)."""
    from modalscope.app import ids

    list_body = _dash_body("anomalies-list.children", ids.AN_STATE, base)

    def specs() -> list[tuple[int, dict]]:
        found: list[tuple[int, dict]] = []

        def walk(node):
            if isinstance(node, dict):
                props = node.get("props") or {}
                cid = props.get("id")
                if isinstance(cid, dict) and cid.get("type") == ids.AN_CHART_SPEC:
                    found.append((cid["index"], props["data"]))
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(ok(client.post("/_dash-update-component", json=list_body)).get_json())
        return found

    def chart_body(index: int, spec: dict) -> dict:
        return {"output": key, "outputs": {"id": {"index": index, "type": ids.AN_CHART}, "property": "figure"},
                "inputs": [{"id": {"index": index, "type": ids.AN_CHART_SPEC}, "property": "data", "value": spec}],
                "changedPropIds": [], "state": []}

    def whole_page():
        for index, spec in specs():
            ok(client.post("/_dash-update-component", json=chart_body(index, spec)))

    first = {}

    def one_chart_only():
        if "spec" not in first:  # the list is read once, untimed
            first["spec"] = specs()[:1]
        if first["spec"]:
            return ok(client.post("/_dash-update-component", json=chart_body(*first["spec"][0])))
        return None

    return [Call("page", "page anomalies (one finding's chart)", one_chart_only),
            Call("page", "page anomalies: the list and every chart, one after another", whole_page)]


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
    if an_key:
        calls += _anomaly_chart_calls(client, ok, an_key, base)

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


# -- exact answers from raw rows -----------------------------------------------------------------
def _quantile_rows(df, keys: tuple[str, ...], kind: str, extra: Callable | None = None) -> dict[tuple, dict]:
    g = df.groupby(list(keys), sort=False)["duration_ns"]
    qs = [q for _, q in PCT[kind]]
    quant = g.quantile(qs)
    counts = g.size()
    out: dict[tuple, dict] = {}
    for key, n in counts.items():
        key = key if isinstance(key, tuple) else (key,)
        row = {"count": int(n)}
        for name, qv in PCT[kind]:
            row[name] = float(quant.loc[(*key, qv)]) / 1e6
        out[key] = row
    if extra is not None:
        extra(out)
    return out


def _loads(text):
    """A JSON column's value (None for NULL, '' or junk; pandas reads NULL as NaN)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def span_signals_of(signals: str | None, attributes: str | None) -> dict | None:
    """A span's signals as settling reads them: the stored ones, else (a span stored before
    signals were) those its attributes give (``ingest.traces.signals_of``)."""
    from modalscope.core.spans import SpanRecord
    from modalscope.ingest.traces import legacy_signals

    sig = _loads(signals)
    if sig:
        return sig if isinstance(sig, dict) else None
    attrs = _loads(attributes)
    if not isinstance(attrs, dict) or not attrs:
        return None
    return legacy_signals(SpanRecord("", "", None, "", "", 0, 0, 0, attributes=attrs))


def input_type_from_signals(root: dict | None, others: list[tuple[int, str, dict | None]]) -> str:
    """A trace's input type from its spans' signals (docs/design.md "Input types", the settler's
    ``signals.trace_input_type``): the root's signals first, then the other spans' by start
    (then span id, the settler's row order). ``others``: (start, span id, signals)."""
    from modalscope.ingest.signals import trace_input_type

    ordered = [sig for _, _, sig in sorted(others, key=lambda e: (e[0], e[1]))]
    return trace_input_type(([root] if root is not None else []) + ordered)


# Spans whose attributes settling reads again when they have no stored signals
# (ingest.traces.LEGACY_SIGNAL_NEEDLES): only these rows' attributes are read.
_LEGACY_LIKE = " OR ".join("attributes LIKE '%\"" + k.replace("_", "!_") + "%' ESCAPE '!'"
                           for k in ("mm.input_type", "mm.image_count", "mm.audio_count", "mm.video_count",
                                     "mm.prompt_chars", "gen_ai.", "openinference.", "llm."))


def _raw_traces(conn, traces_sql: str, params: dict):
    """trace_id -> (start_ns, duration_ns, input type) from the raw spans of the traces that
    ``traces_sql`` (a SELECT of trace ids) names: the root (no parent; the earliest if several)
    gives start and duration, a trace without one its spans' extent; the input type from every
    span's signals (``input_type_from_signals``)."""
    import pandas as pd
    from sqlalchemy import text

    spans = pd.read_sql(text(
        "SELECT trace_id, span_id, parent_span_id, start_ns, duration_ns, signals, "
        f"CASE WHEN signals IS NULL AND ({_LEGACY_LIKE}) THEN attributes ELSE NULL END AS attributes "
        f"FROM spans WHERE trace_id IN ({traces_sql})"), conn, params=params)
    spans["is_root"] = spans["parent_span_id"].isna() | (spans["parent_span_id"] == "")
    spans["end_ns"] = spans["start_ns"] + spans["duration_ns"]
    roots = spans[spans["is_root"]].sort_values(["trace_id", "start_ns", "span_id"]).drop_duplicates("trace_id")
    extent = spans.groupby("trace_id").agg(first=("start_ns", "min"), last=("end_ns", "max"))
    said = spans[spans["signals"].notna() | spans["attributes"].notna()]
    sigs: dict[str, list[tuple[int, str, dict | None]]] = {}
    for tid, sid, start, signals, attributes in said[["trace_id", "span_id", "start_ns", "signals",
                                                      "attributes"]].itertuples(index=False):
        sig = span_signals_of(signals, attributes)
        if sig:
            sigs.setdefault(tid, []).append((start, sid, sig))
    out = {}
    root_of = {r.trace_id: r for r in roots.itertuples(index=False)}
    for tid, first, last in extent.itertuples():
        root = root_of.get(tid)
        start, duration = (root.start_ns, root.duration_ns) if root is not None else (first, max(0, last - first))
        mine = sigs.get(tid, [])
        root_sig = next((sig for _, sid, sig in mine if sid == root.span_id), None) if root is not None else None
        others = [e for e in mine if root is None or e[1] != root.span_id]
        out[tid] = (start, duration, input_type_from_signals(root_sig, others))
    return out


def exact_input_types(engine, window) -> dict[tuple, dict]:
    """Per input type, trace latency percentiles from the raw spans (not the traces table)."""
    import pandas as pd

    # Traces belong to a window by their root's start (a root-less trace by its first span:
    # it is found through any span starting in the window, then filtered by its start).
    params = {"a": window.start_ns, "b": window.end_ns}
    with engine.connect() as conn:
        facts = _raw_traces(conn, "SELECT trace_id FROM spans WHERE start_ns >= :a AND start_ns < :b", params)
    df = pd.DataFrame([(it, d) for s, d, it in facts.values() if window.start_ns <= s < window.end_ns],
                      columns=["input_type", "duration_ns"])
    return _quantile_rows(df, KEYS["input_types"], "input_types")


def exact_stages(engine, window) -> dict[tuple, dict]:
    """Per input type and stage, span latency percentiles; a span's input type is its trace's,
    from that trace's raw spans."""
    import pandas as pd
    from sqlalchemy import text

    params = {"a": window.start_ns, "b": window.end_ns}
    with engine.connect() as conn:
        df = pd.read_sql(text("SELECT trace_id, stage, duration_ns FROM spans WHERE start_ns >= :a AND start_ns < :b"),
                         conn, params=params)
        facts = _raw_traces(conn, "SELECT trace_id FROM spans WHERE start_ns >= :a AND start_ns < :b", params)
    df["input_type"] = df["trace_id"].map({t: f[2] for t, f in facts.items()}).fillna("unknown")
    df["stage"] = df["stage"].fillna("other").replace("", "other")
    return _quantile_rows(df, KEYS["stages"], "stages")


# A consumer starts after its producer, give or take clock skew and the time in the queue:
# consumers linked to a producer in the window are looked for this far around it.
HANDOFF_SLACK_NS = HOUR_NS


def _text_value(sig: dict | None, key: str) -> str:
    value = (sig or {}).get(key)
    return "" if value is None or isinstance(value, (dict, list, bool)) else str(value).strip()


def exact_pairs(engine, window) -> dict[tuple, dict]:
    """Per (caller, callee), the calls starting in the window (docs/design.md "Service pairs",
    as ``ingest.traces.trace_calls`` makes them): a model call (signals ``call``, any kind but
    SERVER/CONSUMER) or a CLIENT span names its callee by its earliest SERVER/CONSUMER child
    in another service, else (a model call) its provider, else its address
    (``traces.address_callee``), else its own service when a child is in it; a transport
    span that took its stage from a model-call parent of its service, with no such child,
    makes none. A CONSUMER span's hand-off from its PRODUCER parent, else from the earliest
    PRODUCER its links name, runs from the producer's start to the consumer's end."""
    import pandas as pd
    from sqlalchemy import bindparam, text

    from modalscope.ingest.traces import address_callee

    a, b = window.start_ns, window.end_ns
    sql = text(
        "SELECT c.trace_id AS trace_id, c.span_id AS span_id, c.parent_span_id AS parent_span_id, "
        "c.service AS caller, c.kind AS kind, c.duration_ns AS duration_ns, c.status AS status, "
        "c.signals AS signals, k.service AS child_service, k.start_ns AS child_start, "
        "CASE WHEN k.service IS NULL OR k.service = c.service OR c.signals IS NULL THEN c.attributes END AS attributes "
        "FROM spans c LEFT JOIN spans k ON k.trace_id = c.trace_id AND k.parent_span_id = c.span_id "
        "AND k.kind IN (2, 5) AND k.span_id <> c.span_id "
        "WHERE c.start_ns >= :a AND c.start_ns < :b AND (c.kind = 3 OR (c.kind NOT IN (2, 5) AND "
        f"(c.signals LIKE '%\"call\"%' OR (c.signals IS NULL AND ({_LEGACY_LIKE.replace('attributes', 'c.attributes')})))))")
    with engine.connect() as conn:
        df = pd.read_sql(sql, conn, params={"a": a, "b": b})
        heirs = df[df["signals"].str.contains('"inh"', regex=False, na=False)]
        parents = {}
        keys = sorted({(t, p) for t, p in heirs[["trace_id", "parent_span_id"]].itertuples(index=False) if p})
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            tids = sorted({t for t, _ in chunk})
            rows = conn.execute(text(
                "SELECT trace_id, span_id, service, signals, attributes FROM spans "
                "WHERE trace_id IN :t AND span_id IN :s").bindparams(bindparam("t", expanding=True),
                                                                     bindparam("s", expanding=True)),
                {"t": tids, "s": sorted({p for _, p in chunk})}).all()
            for tid, sid, service, signals, attributes in rows:
                parents[(tid, sid)] = (service, span_signals_of(signals, attributes))
        handoffs = _handoffs(conn, a, b)
    ids = ["trace_id", "span_id"]
    calls = []
    for (tid, sid), g in df.groupby(ids, sort=False):
        first = g.iloc[0]
        caller, kind = first["caller"], int(first["kind"])
        sig = span_signals_of(first["signals"], g["attributes"].dropna().iloc[0] if g["attributes"].notna().any()
                              else None)
        model_call = bool(sig and sig.get("call")) and kind not in (2, 5)
        kids = g[g["child_service"].notna()]
        if not model_call:
            if kind != 3:
                continue
            if sig and sig.get("inh") and kids.empty and first["parent_span_id"]:
                parent = parents.get((tid, first["parent_span_id"]))
                if parent is not None and parent[0] == caller and parent[1] and parent[1].get("call"):
                    continue  # its time is the model call's
        other = kids[kids["child_service"] != caller].sort_values("child_start", kind="stable")
        if len(other):
            callee = other.iloc[0]["child_service"]
        else:
            attrs = _loads(g["attributes"].dropna().iloc[0]) if g["attributes"].notna().any() else None
            callee = (_text_value(sig, "provider") if model_call else "") or \
                address_callee(attrs if isinstance(attrs, dict) else {})
            if not callee and len(kids):
                callee = caller
        if callee:
            calls.append((caller, callee, int(first["duration_ns"]), int(first["status"])))
    calls.extend(handoffs)
    m = pd.DataFrame(calls, columns=["caller", "callee", "duration_ns", "status"])

    def errors(out):
        err = (m["status"] == 2).groupby([m["caller"], m["callee"]]).mean()
        for key, v in err.items():
            out[key]["error_rate"] = float(v)

    return _quantile_rows(m, KEYS["pairs"], "pairs", errors)


def _handoffs(conn, a: int, b: int) -> list[tuple[str, str, int, int]]:
    """(producer's service, consumer's service, producer start to consumer end, 2 when
    either failed) of the hand-offs whose producer starts in [a, b)."""
    from sqlalchemy import bindparam, text

    from modalscope.ingest.traces import link_targets

    consumers = conn.execute(text(
        "SELECT c.trace_id, c.span_id, c.service, c.start_ns + c.duration_ns, c.status, c.links, "
        "p.kind, p.service, p.start_ns, p.status "
        "FROM spans c LEFT JOIN spans p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id "
        "WHERE c.kind = 5 AND c.start_ns >= :lo AND c.start_ns < :hi"),
        {"lo": a - HANDOFF_SLACK_NS, "hi": b + HANDOFF_SLACK_NS}).all()
    out = []
    wanted: dict[tuple, list] = {}
    for tid, sid, service, end, status, links, pkind, pservice, pstart, pstatus in consumers:
        if pkind == 4:
            if a <= pstart < b:
                out.append((pservice, service, max(0, end - pstart), 2 if 2 in (pstatus, status) else 0))
            continue
        targets = [(t, s) for t, s in link_targets(_loads(links)) if (t, s) != (tid, sid)]
        if targets:
            wanted[(tid, sid)] = [service, end, status, targets]
    keys = sorted({t for v in wanted.values() for t in v[3]})
    found = {}
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        stmt = text("SELECT trace_id, span_id, kind, service, start_ns, status FROM spans "
                    "WHERE trace_id IN :t AND span_id IN :s").bindparams(bindparam("t", expanding=True),
                                                                         bindparam("s", expanding=True))
        for tid, sid, kind, service, start, status in conn.execute(
                stmt, {"t": sorted({t for t, _ in chunk}), "s": sorted({s for _, s in chunk})}):
            found[(tid, sid)] = (kind, service, start, status)
    for service, end, status, targets in wanted.values():
        best = None
        for t, s in targets:
            p = found.get((t, s))
            if p is not None and p[0] == 4 and (best is None or (p[2], t, s) < best[0]):
                best = ((p[2], t, s), p)
        if best is not None and a <= best[1][2] < b:
            _, pservice, pstart, pstatus = best[1]
            out.append((pservice, service, max(0, end - pstart), 2 if 2 in (pstatus, status) else 0))
    return out


def _cache_hit(value) -> bool | None:
    """``cache.hit`` re-stated from docs/design.md: a boolean, or from sources without booleans a
    number (non-zero: hit) or one of true/1/hit/yes, false/0/miss/no; anything else is no
    lookup."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0 if math.isfinite(value) else None
    if isinstance(value, str):
        v = value.strip().lower()
        return True if v in ("true", "1", "hit", "yes") else False if v in ("false", "0", "miss", "no") else None
    return None


def _cache_group(attrs: dict, resource: str | None) -> str | None:
    """The lookup's ``CACHE_GROUP_BY``: the span attribute, else the resource attribute, as text."""
    value = attrs.get(CACHE_GROUP_BY)
    if value is None and resource:
        res = json.loads(resource)
        value = res.get(CACHE_GROUP_BY) if isinstance(res, dict) else None
    if value is None or isinstance(value, (dict, list)):
        return None
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def exact_cache(engine, window) -> dict[tuple, dict]:
    """Per cache and ``CACHE_GROUP_BY`` value, lookups and hit rate from the raw spans."""
    import pandas as pd
    from sqlalchemy import text

    with engine.connect() as conn:
        df = pd.read_sql(text("SELECT attributes, resource FROM spans WHERE start_ns >= :a AND start_ns < :b "
                              "AND attributes LIKE '%\"cache.name\"%'"), conn,
                         params={"a": window.start_ns, "b": window.end_ns})
    rows = []
    for attributes, resource in df.itertuples(index=False):
        attrs = json.loads(attributes)
        cache, hit = attrs.get("cache.name"), _cache_hit(attrs.get("cache.hit"))
        if cache is None or isinstance(cache, (dict, list)) or hit is None:
            continue
        rows.append((str(cache), _cache_group(attrs, resource), hit))
    lookups = pd.DataFrame(rows, columns=["cache", "group", "hit"])
    g = lookups.groupby(["cache", "group"], dropna=False)["hit"].agg(["size", "sum"])
    return {(cache, None if pd.isna(group) else group): {"count": int(n), "hit_rate": float(hits) / n}
            for (cache, group), (n, hits) in g.iterrows()}


def cache_rows(rows: list[dict]) -> list[dict]:
    """The cache view's rows with their lookups as ``count`` (``compare_rows``)."""
    return [{**r, "count": r["hits"] + r["misses"]} for r in rows]


EXACT = {"pairs": exact_pairs, "input_types": exact_input_types, "stages": exact_stages, "cache": exact_cache}


def compare_rows(kind: str, ours: list[dict], exact: dict[tuple, dict]) -> dict:
    """Largest relative error of our percentiles against the exact ones, and count agreement."""
    worst = None
    max_err = 0.0
    count_mismatch = []
    seen = set()
    for r in ours:
        key = tuple(r[k] for k in KEYS[kind])
        seen.add(key)
        ex = exact.get(key)
        if ex is None:
            count_mismatch.append({"group": key, "ours": r["count"], "exact": 0})
            continue
        if r["count"] != ex["count"]:
            count_mismatch.append({"group": key, "ours": r["count"], "exact": ex["count"]})
        for name, _ in PCT[kind]:
            mine, true = r.get(name), ex[name]
            if mine is None or true <= 0:
                continue
            err = abs(mine - true) / true
            if worst is None or err > max_err:
                max_err = err
                worst = {"group": list(key), "percentile": name, "ours_ms": mine, "exact_ms": round(true, 4),
                         "count": ex["count"]}
    for key, ex in exact.items():
        if key not in seen:
            count_mismatch.append({"group": key, "ours": 0, "exact": ex["count"]})
    return {"groups": len(exact), "max_rel_err": max_err, "worst": worst,
            "count_mismatches": [{**c, "group": list(c["group"])} for c in count_mismatch]}


# -- the measuring process -----------------------------------------------------------------------
def measure(url: str, runs: int, baseline_runs: int, no_baseline: bool, groups: tuple[str, ...] = GROUPS) -> dict:
    from sqlalchemy import func, select

    from modalscope.app import create_app
    from modalscope.app.params import Window
    from modalscope.models import Span, Trace
    from modalscope.settings import Settings

    app = create_app(Settings(database_url=url))
    client = app.test_client()
    client.get("/")
    reader = app.extensions["modalscope"]["reader"]
    engine = reader.engine
    with engine.connect() as conn:
        n_spans = conn.execute(select(func.count()).select_from(Span)).scalar_one()
        n_traces = conn.execute(select(func.count()).select_from(Trace)).scalar_one()
        pending = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
        first, last = conn.execute(select(func.min(Span.start_ns), func.max(Span.start_ns))).one()
    if not n_spans:
        raise SystemExit("the store holds no spans")
    # Whole minutes: rollups count a span in the minute it starts, so a minute-aligned window
    # holds exactly the spans the raw-row answer reads.
    end = (last // MINUTE_NS + 1) * MINUTE_NS
    out: dict = {"database": engine.dialect.name, "spans": n_spans, "traces": n_traces, "pending_traces": pending,
                 "first_start_ns": first, "last_start_ns": last, "windows": {}, "rows": []}
    windows = [(label, Window(end - hours * HOUR_NS, end)) for label, hours in WINDOWS
               if label != "7d" or first <= end - hours * HOUR_NS + HOUR_NS]
    results: dict[tuple[str, str], Any] = {}
    for label, w in windows:
        subject = pick_subject(reader, w)
        out["windows"][label] = {"start_ns": w.start_ns, "end_ns": w.end_ns, "caller": subject.caller,
                                 "callee": subject.callee, "band_ms": subject.band, "trace_id": subject.trace_id,
                                 "fast_pair": subject.extra.get("fast_pair"),
                                 "served_pair": subject.extra.get("served_pair")}
        calls = [c for c in build_calls(app, client, reader, w, subject) if c.group in groups]
        for i, call in enumerate(calls, 1):
            bl.log(f"[{label}] {i}/{len(calls)} {call.group}: {call.name}")
            ms, samples, result, error = bl.timed_call(call.name, call.fn, runs)
            if error is not None:
                out["rows"].append({"window": label, "group": call.group, "call": call.name, "ms": None,
                                    "error": error, "exact": None})
                continue
            bl.log(f"  {ms:,.1f} ms (median of {runs}; max {max(samples):,.1f} ms)")
            out["rows"].append({"window": label, "group": call.group, "call": call.name, "ms": round(ms, 2),
                                "samples_ms": [round(s, 2) for s in samples], "exact": call.exact})
            if call.exact:
                results[(label, call.name)] = (call, result)
    out["worker_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if no_baseline:
        return out
    out["exact"] = {}
    for label, w in windows:
        for kind, fn in EXACT.items():
            bl.log(f"[{label}] exact {kind} from raw rows (pandas) ...")
            ms, samples, exact = bl.timed(lambda fn=fn, w=w: fn(engine, w), baseline_runs)
            out["exact"][f"{label} {kind}"] = {"window": label, "kind": kind, "ms": round(ms, 1),
                                               "samples_ms": [round(s, 1) for s in samples], "groups": len(exact)}
            for row in out["rows"]:
                if row["window"] == label and row["exact"] == kind:
                    call, result = results[(label, row["call"])]
                    ours = call.rows(result.get_json() if hasattr(result, "get_json") else result)
                    acc = compare_rows(kind, ours, exact)
                    row.update({"exact_ms": round(ms, 1), "speedup": round(ms / row["ms"], 2) if row["ms"] else None,
                                "max_rel_err": acc["max_rel_err"], "worst": acc["worst"], "groups": acc["groups"],
                                "count_mismatches": acc["count_mismatches"]})
    out["peak_rss_mb_with_baseline"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


# -- report ---------------------------------------------------------------------------------------
def _times(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.1f}×" if x < 10 else f"{x:,.0f}×"


def report(data: dict) -> str:
    labels = list(data["windows"])
    by_call: dict[tuple[str, str], dict[str, dict]] = {}
    for r in data["rows"]:
        by_call.setdefault((r["group"], r["call"]), {})[r["window"]] = r
    headers = ["call", *(f"{w} ms" for w in labels), "exact ms", "speed-up", "max rel err"]
    lines = []
    order = {"api": 0, "page": 1, "query": 2}
    for (group, call), per in sorted(by_call.items(), key=lambda kv: order[kv[0][0]]):
        cells = [call if group != "query" else f"query {call}"]
        cells += [("FAILED" if per[w]["ms"] is None else bl.fmt_ms(per[w]["ms"])) if w in per else "—"
                  for w in labels]
        if any("exact_ms" in per.get(w, {}) for w in labels):
            cells.append(" / ".join(bl.fmt_ms(per[w].get("exact_ms")) for w in labels if w in per))
            cells.append(" / ".join(_times(per[w].get("speedup")) for w in labels if w in per))
            cells.append(" / ".join(f"{per[w]['max_rel_err'] * 100:.2f}%" if "max_rel_err" in per[w] else "—"
                                    for w in labels if w in per))
        else:
            cells += ["", "", ""]
        lines.append(cells)
    return bl.md_table(headers, lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--spans", type=int, default=1_000_000, help="size of the store (default 1,000,000)")
    ap.add_argument("--hours", type=float, default=24, help="hours of traffic the store spans (default 24; 168 adds a 7d window)")
    ap.add_argument("--db", default=None, help="SQLite store (default /tmp/modalscope-bench/store-<spans>.db)")
    ap.add_argument("--database-url", default=None,
                    help="sqlite:///PATH (as --db), or PostgreSQL: postgresql://postgres@127.0.0.1:5432[/name], "
                         "filled by copying the SQLite store of the same size")
    ap.add_argument("--runs", type=int, default=5, help="timed calls after one warm-up; the median is reported (default 5)")
    ap.add_argument("--groups", default="api,page,query",
                    help="which calls: api (/api/v1), page (page callbacks), query (query functions); default all")
    ap.add_argument("--baseline-runs", type=int, default=3, help="timed pandas computations after one warm-up (default 3)")
    ap.add_argument("--no-baseline", action="store_true", default=bool(os.environ.get("BENCH_NO_BASELINE")),
                    help="skip the exact pandas answers (env BENCH_NO_BASELINE=1)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write everything measured here")
    ap.add_argument("--measure-only", default=None, metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    bl.sigterm_as_interrupt()
    groups = parse_groups(ap, args.groups)
    if args.measure_only:
        try:
            print(json.dumps(measure(args.measure_only, args.runs, args.baseline_runs, args.no_baseline, groups)))
        except KeyboardInterrupt:
            return 130
        return 0
    if args.database_url and args.database_url.startswith("sqlite:///"):
        args.db, args.database_url = args.database_url[len("sqlite:///"):], None  # the same as --db
    if args.database_url and not bl.is_postgres(args.database_url):
        ap.error("--database-url must be sqlite:///PATH or a PostgreSQL URL")
    machine = bl.machine_info(args.database_url)
    db = args.db or default_db(args.spans)
    fill = fill_sqlite(db, args.spans, args.hours)
    url = f"sqlite:///{db}"
    pack_store(url)
    temp_db = None
    pg_fill = None
    try:
        if args.database_url:
            name = bl.database_name(args.database_url)
            if name in (None, "postgres"):
                temp_db = name = bl.unique_db_name("msbench_dash")
                bl.create_database(args.database_url, name)
            elif not bl.database_exists(args.database_url, name):
                bl.create_database(args.database_url, name)
            url = bl.libpq_url(args.database_url, name).replace("postgresql://", "postgresql+psycopg://", 1)
            pg_fill = _prepare_postgres(url, db)
            pack_store(url)
        cmd = [sys.executable, os.path.abspath(__file__), "--measure-only", url, "--runs", str(args.runs),
               "--baseline-runs", str(args.baseline_runs), "--groups", ",".join(groups)] + \
            (["--no-baseline"] if args.no_baseline else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            stdout, _ = proc.communicate()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        if proc.returncode != 0:
            bl.log(f"the measuring process failed (exit {proc.returncode})")
            return 1
        data = json.loads(stdout.strip().splitlines()[-1])
    except KeyboardInterrupt:
        bl.log("interrupted")
        return 130
    finally:
        if temp_db:
            bl.drop_database(args.database_url, temp_db)
    data.update({"machine": machine, "store": db if not args.database_url else f"PostgreSQL (copied from {db})",
                 "fill": fill, "postgres_copy": pg_fill, "runs": args.runs, "baseline_runs": args.baseline_runs})
    print(f"store: {data['spans']:,} spans in {data['traces']:,} traces ({data['pending_traces']} pending), "
          f"{data['database']}: {data['store']}")
    if not fill.get("reused"):
        print(f"fill: generate+write {fill['generate_write_s']} s, settle {fill['settle_s']} s")
    if pg_fill and not pg_fill.get("reused"):
        print(f"PostgreSQL copy: COPY {pg_fill['copy_s']} s, indexes {pg_fill['index_s']} s, "
              f"VACUUM ANALYZE {pg_fill['analyze_s']} s")
    print(bl.machine_line(machine))
    print(f"median of {args.runs} after a warm-up; exact: pandas from raw rows, median of {args.baseline_runs}; "
          f"windows end at the newest span's minute")
    print(report(data))
    print(f"dashboard worker peak RSS (every call above, before the pandas baseline): {data['worker_rss_mb']} MB"
          + (f"; with the baseline: {data['peak_rss_mb_with_baseline']} MB" if "peak_rss_mb_with_baseline" in data else ""))
    for key, e in (data.get("exact") or {}).items():
        rows = [r for r in data["rows"] if r["window"] == e["window"] and r.get("exact") == e["kind"]]
        mism = sum(len(r.get("count_mismatches", [])) for r in rows)
        worst = max(rows, key=lambda r: r.get("max_rel_err", 0))["worst"] if rows else None
        print(f"exact {key}: {e['groups']} groups, {e['ms']:,.0f} ms; count mismatches {mism}; worst: {worst}")
    bl.write_json(args.json, data)
    return 0


def _prepare_postgres(url: str, sqlite_path: str) -> dict:
    """Copy the SQLite store into the (empty) PostgreSQL database, or reuse it if it holds the same store."""
    from sqlalchemy import create_engine, inspect, text

    from modalscope.models.engine import normalize_url

    with contextlib.closing(sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)) as lite:
        spans = lite.execute("SELECT count(*) FROM spans").fetchone()[0]
    engine = create_engine(normalize_url(url))
    try:
        tables = inspect(engine).get_table_names()
        have = 0
        if "spans" in tables:
            with engine.connect() as conn:
                have = conn.execute(text("SELECT count(*) FROM spans")).scalar_one()
    finally:
        engine.dispose()
    if tables and have == spans:
        bl.log(f"reusing the PostgreSQL database: {have:,} spans")
        return {"reused": True}
    if tables:
        raise SystemExit(f"the PostgreSQL database holds {have:,} spans, the SQLite store {spans:,}: "
                         "name an empty or new database")
    return copy_to_postgres(sqlite_path, url)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        bl.log("interrupted")
        raise SystemExit(130) from None
