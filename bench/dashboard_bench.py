"""Dashboard and API query times over a large store (default 10 million spans, SQLite).

    .venv/bin/python bench/dashboard_bench.py --db /tmp/modalscope-10m.db [--spans 10000000]

Fills the store once with `modalscope demo`'s generator (24 h of traffic at the rate that
makes ``--spans``), settles it, then — in a fresh process, as a dashboard worker would be —
times every page's query functions and every /api/v1 call (server time, median of 5 after
one warm-up), and compares with reading the raw rows and computing exact percentiles with
pandas. Peak RSS of that measuring process is reported (ru_maxrss).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HOUR_NS = 3_600_000_000_000
SPANS_PER_TRACE = 27  # the demo's average, measured: 632,011 spans / 23,379 traces


def fill(url: str, spans: int, hours: float) -> None:
    from sqlalchemy import func, select
    from tqdm import tqdm

    from modalscope.ingest import demo
    from modalscope.ingest.settle import settle
    from modalscope.models import Span, Trace
    from modalscope.models.engine import make_engine
    from modalscope.models.schema import ensure_schema

    ensure_schema(url)
    engine = make_engine(url, write=True)
    with engine.connect() as conn:
        have = conn.execute(select(func.count()).select_from(Span)).scalar_one()
    if have >= spans * 0.95:
        print(f"store already holds {have:,} spans", file=sys.stderr)
        return
    rate = spans / SPANS_PER_TRACE / (hours * 3600)
    config = demo.DemoConfig(now_ns=time.time_ns(), seed=7, hours=hours, rate=rate)
    traces = int(rate * hours * 3600)
    t0 = time.perf_counter()
    with tqdm(total=traces, desc="generating", unit=" traces", file=sys.stderr) as bar:
        result = demo.fill(engine, config, progress=bar.update)
    t1 = time.perf_counter()
    with engine.connect() as conn:
        pending = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
    with tqdm(total=pending, desc="settling", unit=" traces", file=sys.stderr) as bar:
        settle(engine, force=True, progress=bar.update)
    t2 = time.perf_counter()
    print(f"filled {result.spans:,} spans in {result.traces:,} traces: generate+write {t1 - t0:.0f} s, "
          f"settle {t2 - t1:.0f} s", file=sys.stderr)
    engine.dispose()


def _time(fn, runs: int = 5) -> float:
    fn()  # warm-up: page cache, series registry, imports
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def measure(url: str) -> dict:
    import pandas as pd
    from sqlalchemy import func, select, text

    from modalscope.app import create_app, queries
    from modalscope.app.params import Window
    from modalscope.models import Span
    from modalscope.models.reader import Filters
    from modalscope.settings import Settings

    app = create_app(Settings(database_url=url))
    client = app.test_client()
    reader = app.extensions["modalscope"]["reader"]
    engine = reader.engine
    with engine.connect() as conn:
        n_spans = conn.execute(select(func.count()).select_from(Span)).scalar_one()
        last = conn.execute(select(func.max(Span.start_ns))).scalar_one()
    now = last + 1
    out = {"spans": n_spans, "rows": []}
    pair = Filters(caller="gateway", callee="vision-encoder")
    for label, hours in (("1h", 1), ("24h", 24)):
        w = Window(now - hours * HOUR_NS, now)
        step = max(1, int(hours * 60 // 120))
        some = queries.exemplar_traces(reader, w, Filters(), limit=1)
        trace_id = some[0]["trace_id"] if some else "0" * 32
        calls = {
            "overview: overview_rows": lambda: queries.overview_rows(reader, w),
            "overview: traffic_series": lambda: queries.traffic_series(reader, w, step_minutes=step),
            "pairs: pair_heatmap": lambda: queries.pair_heatmap(reader, w),
            "pairs: pair_table": lambda: queries.pair_table(reader, w),
            "drilldown: latency_distribution (pair)": lambda: queries.latency_distribution(reader, w, pair),
            "drilldown: percentile_series (pair)": lambda: queries.percentile_series(reader, w, pair, step_minutes=step),
            "drilldown: exemplar_traces (pair, slowest 20)": lambda: queries.exemplar_traces(reader, w, pair, limit=20),
            "drilldown: exemplar_traces (pair, band 1-2 s)": lambda: queries.exemplar_traces(reader, w, pair, min_ms=1000, max_ms=2000, limit=20),
            "trace: trace_view": lambda: queries.trace_view(reader, trace_id, w),
            "stages: stage_breakdown": lambda: queries.stage_breakdown(reader, w),
            "stages: stage_series": lambda: queries.stage_series(reader, w, step_minutes=step),
            "stages: vit_layers": lambda: queries.vit_layers(reader, w),
            "stages: stages": lambda: queries.stages(reader, w),
            "filters: filter_options": lambda: queries.filter_options(reader),
        }
        start_s, end_s = (now - hours * HOUR_NS) / 1e9, now / 1e9
        q = f"start={start_s:.3f}&end={end_s:.3f}"
        for path in (f"/api/v1/pairs?{q}", f"/api/v1/input-types?{q}", f"/api/v1/stages?{q}",
                     f"/api/v1/traces?{q}&caller=gateway&callee=vision-encoder&limit=20",
                     f"/api/v1/traces/{trace_id}"):
            calls[f"api: {path.split('?')[0]}"] = (lambda p=path: _ok(client.get(p)))
        for name, fn in calls.items():
            out["rows"].append({"window": label, "call": name, "ms": round(_time(fn), 1)})
        # A dashboard worker's memory: after every page and API call, before the pandas
        # baseline below (which reads millions of raw rows into one frame).
        out["worker_rss_mb"] = max(out.get("worker_rss_mb", 0),
                                   round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
        if os.environ.get("BENCH_NO_BASELINE"):
            continue
        # Exact percentiles with pandas from raw rows, for the same answers.
        sql_types = text("SELECT input_type, duration_ns FROM traces WHERE start_ns >= :a AND start_ns < :b")
        sql_stages = text("SELECT stage, duration_ns FROM spans WHERE start_ns >= :a AND start_ns < :b")
        params = {"a": now - hours * HOUR_NS, "b": now}

        def exact_types():
            with engine.connect() as conn:
                df = pd.read_sql(sql_types, conn, params=params)
            return df.groupby("input_type")["duration_ns"].quantile([0.5, 0.95, 0.99])

        def exact_stages():
            with engine.connect() as conn:
                df = pd.read_sql(sql_stages, conn, params=params)
            return df.groupby("stage")["duration_ns"].quantile([0.5, 0.95, 0.99])

        out["rows"].append({"window": label, "call": "exact pandas: input types (traces table)",
                            "ms": round(_time(exact_types, runs=2), 1)})
        out["rows"].append({"window": label, "call": "exact pandas: stage percentiles (raw spans)",
                            "ms": round(_time(exact_stages, runs=2), 1)})
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def _ok(resp):
    assert resp.status_code == 200, (resp.status_code, resp.get_data(as_text=True)[:200])
    return resp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="/tmp/modalscope-10m.db")
    ap.add_argument("--spans", type=int, default=10_000_000)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    url = f"sqlite:///{args.db}"
    if args.measure_only:
        print(json.dumps(measure(url)))
        return
    fill(url, args.spans, args.hours)
    # Measure in a fresh process: a dashboard worker's memory, not the generator's.
    res = subprocess.run([sys.executable, __file__, "--db", args.db, "--measure-only"],
                         capture_output=True, text=True, check=True)
    data = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"store: {data['spans']:,} spans ({args.db}); {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| window | call | server ms (median of 5) |")
    print("|---|---|---|")
    for r in data["rows"]:
        print(f"| {r['window']} | {r['call']} | {r['ms']:,} |")
    print(f"dashboard worker peak RSS (app + every page query and API call): {data['worker_rss_mb']} MB; "
          f"with the pandas baseline too: {data['peak_rss_mb']} MB")


if __name__ == "__main__":
    main()
