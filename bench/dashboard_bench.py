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
import json
import os
import resource
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402
# The parts, re-exported: read_under_load.py and the tests use them through this module.
from dashboard_calls import (  # noqa: E402,F401
    GROUPS, Call, Subject, build_calls, page_callbacks, parse_groups, pick_subject)
from dashboard_exact import (  # noqa: E402,F401
    CACHE_GROUP_BY, EXACT, HOUR_NS, KEYS, PCT, _cache_hit, cache_rows, compare_rows, exact_cache,
    exact_input_types, exact_pairs, exact_stages, input_type_from_signals, span_signals_of)
from dashboard_store import (  # noqa: E402,F401
    COPY_TABLES, SPANS_PER_TRACE, copy_to_postgres, default_db, fill_sqlite, pack_store, prepare_postgres)

MINUTE_NS = 60_000_000_000
WINDOWS = (("1h", 1), ("24h", 24), ("7d", 168))


# -- the measuring process -----------------------------------------------------------------------
def measure(url: str, runs: int, baseline_runs: int, no_baseline: bool, groups: tuple[str, ...] = GROUPS,
            only: tuple[str, ...] = ()) -> dict:
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
        calls = [c for c in build_calls(app, client, reader, w, subject)
                 if c.group in groups and (not only or any(o in c.name for o in only))]
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
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="only the calls whose name contains TEXT (repeatable), e.g. --only 'page stages'")
    ap.add_argument("--json", default=None, metavar="FILE", help="write everything measured here")
    ap.add_argument("--measure-only", default=None, metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    bl.sigterm_as_interrupt()
    groups = parse_groups(ap, args.groups)
    if args.measure_only:
        try:
            print(json.dumps(measure(args.measure_only, args.runs, args.baseline_runs, args.no_baseline, groups,
                                     tuple(args.only))))
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
            pg_fill = prepare_postgres(url, db)
            pack_store(url)
        cmd = [sys.executable, os.path.abspath(__file__), "--measure-only", url, "--runs", str(args.runs),
               "--baseline-runs", str(args.baseline_runs), "--groups", ",".join(groups)] + \
            (["--no-baseline"] if args.no_baseline else []) + [a for o in args.only for a in ("--only", o)]
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


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        bl.log("interrupted")
        raise SystemExit(130) from None
