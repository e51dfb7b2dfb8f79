"""All detectors of the anomaly catalog over 24 h of demo data at the default rate.

    .venv/bin/python bench/detectors_bench.py [--hours 24] [--db PATH] [--repeat 3]

Fills a temporary SQLite store with ``--hours`` of demo traffic (``ingest/demo/``
``fill``, default rate, every pattern injected; ``--db PATH`` keeps / reuses that file)
and times ``app.findings.find`` over the whole window: the rollup and raw-span reads, the
ten detectors, and the exemplar look-ups. Target (docs/design.md): < 2 s.

Then the findings of that absolute window as a request gets them (``app/evaluations.py``):
the first request (detectors run, result stored) and the next ones (answered from it while no
logged write touched its minutes), and what checking the change log costs when a day of
settle batches (two a second) was logged since the evaluation (a scratch SQLite file, and a
scratch PostgreSQL database when ``--postgres`` names a server).

``--windows 1,3,6,12,24,168`` instead times ``find`` over the last N hours of the store
(``--db``: any store, e.g. ``dashboard_bench.py``'s of ten million spans, a SQLite file or a
database URL), shortest first, with the process's peak RSS after each: what an absolute
window's first request costs by its length, each phase's and each detector's median time,
and a digest of the findings (the same digest: the same answers, byte for byte).

    .venv/bin/python bench/detectors_bench.py --db /tmp/modalscope-bench/store-10000000.db \
        --windows 1,3,6,12,24,168
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchlib

NOW = 1_764_504_030 * 1_000_000_000  # fixed: the same data in every run


def main() -> int:
    from modalscope.app.detectors import Thresholds
    from modalscope.app.findings import find
    from modalscope.app.params import Window
    from modalscope.ingest import demo
    from modalscope.ingest.settle import settle
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade
    from modalscope.models.reader import StoreReader

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--db", default=None, help="SQLite file to fill (reused when it exists)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--postgres", default=None, metavar="URL",
                    help="also time the change-log check on PostgreSQL (e.g. postgresql://postgres@127.0.0.1:5432)")
    ap.add_argument("--windows", default=None, metavar="HOURS",
                    help="comma-separated window lengths: time find over the last N hours of --db")
    args = ap.parse_args()
    if args.windows:
        if not args.db or ("://" not in args.db and not os.path.exists(args.db)):
            ap.error("--windows needs --db naming an existing store (a SQLite file or a database URL)")
        try:
            hours = [float(h) for h in args.windows.split(",")]
        except ValueError:
            ap.error(f"--windows: hours as numbers, comma-separated (got {args.windows!r})")
        return window_lengths(args.db, hours, args.repeat)
    config = demo.DemoConfig(now_ns=NOW, hours=args.hours)
    path = args.db or os.path.join(tempfile.mkdtemp(prefix="modalscope-bench-"), "day.db")
    url = f"sqlite:///{path}"
    if not os.path.exists(path):
        upgrade(url)
        engine = make_engine(url, write=True)
        t = time.perf_counter()
        r = demo.fill(engine, config)
        settle(engine, force=True)
        print(f"filled {r.traces} traces / {r.spans} spans in {time.perf_counter() - t:.1f} s", flush=True)
        engine.dispose()
    _pack(url)
    engine = make_engine(url)
    reader = StoreReader(engine)
    window = Window(config.start_ns, config.end_ns + 120_000_000_000)
    runs = []
    for i in range(args.repeat):
        timings: dict = {}
        found = find(reader, window, th=Thresholds.from_env(), timings=timings)
        runs.append(timings)
        print(f"run {i + 1}: {timings['total_s']:.3f} s total (read {timings['read_s']:.3f}, detect "
              f"{timings['detect_s']:.3f}, exemplars {timings['exemplars_s']:.3f}); {len(found)} findings; "
              f"{timings['raw_spans']} raw spans read", flush=True)
    print("per detector (last run, s):", json.dumps({k: round(v, 3) for k, v in runs[-1]["per_detector_s"].items()}))
    print(f"median total: {statistics.median(r['total_s'] for r in runs):.3f} s (target < 2 s)")
    stored_findings(reader, window, args.repeat)
    change_log_check(args.postgres)
    import benchlib

    print(benchlib.machine_line(benchlib.machine_info()))
    kinds = sorted({f.kind for f in found})
    print("kinds found:", ", ".join(kinds))
    engine.dispose()
    return 0


def _pack(url: str) -> None:
    """Pack the store's closed hours of rollups, as the receivers' settler does a few minutes
    after each hour ends (``models/packs.py``), verified at once: nothing else writes here."""
    from modalscope.models import packs
    from modalscope.models.engine import make_engine

    engine = make_engine(url, write=True)
    try:
        t = time.perf_counter()
        built = packs.pack_everything(engine)
        if built:
            print(f"packed {built} hours of rollups in {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        engine.dispose()


def window_lengths(path: str, hours: list[float], repeat: int) -> int:
    """``find`` over the last N hours of the store for each N, shortest first."""
    import hashlib
    import resource

    import orjson

    from sqlalchemy import func, select

    import benchlib
    from modalscope.app.detectors import Thresholds
    from modalscope.app.findings import find
    from modalscope.app.params import Window
    from modalscope.models import Span
    from modalscope.models.engine import make_engine
    from modalscope.models.reader import StoreReader

    url = path if "://" in path else f"sqlite:///{path}"
    _pack(url)
    engine = make_engine(url)
    reader = StoreReader(engine)
    with engine.connect() as conn:
        last = conn.execute(select(func.max(Span.start_ns))).scalar_one()
    if last is None:
        raise SystemExit("the store holds no spans")
    minute = 60_000_000_000
    end = (last // minute + 1) * minute
    th = Thresholds.from_env()
    print("| window | total ms | read | detectors | exemplars | findings | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    per_detector: dict[str, dict[float, float]] = {}  # detector -> window -> median ms
    medians: list[str] = []
    for h in sorted(hours):
        window = Window(end - int(h * 3600e9), end)
        runs = []
        for _ in range(repeat):
            timings: dict = {}
            found = find(reader, window, th=th, timings=timings)
            runs.append(timings)

        def span(key: str) -> str:
            values = sorted(r[key] * 1000 for r in runs)
            return f"{values[0]:,.0f}–{values[-1]:,.0f}" if len(values) > 1 else f"{values[0]:,.0f}"

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"| {h:g} h | {span('total_s')} | {span('read_s')} | {span('detect_s')} | {span('exemplars_s')} "
              f"| {len(found)} | {rss:,.0f} |", flush=True)
        digest = hashlib.sha256(orjson.dumps([f.to_json() for f in found], option=orjson.OPT_SORT_KEYS)).hexdigest()
        medians.append(f"{h:g} h: " + ", ".join(f"{key[:-2]} {statistics.median(r[key] for r in runs) * 1000:,.1f}"
                                                for key in ("total_s", "read_s", "detect_s", "exemplars_s"))
                       + f" ms (medians); findings digest {digest[:16]}")
        for kind in runs[0]["per_detector_s"]:
            per_detector.setdefault(kind, {})[h] = statistics.median(r["per_detector_s"][kind] * 1000 for r in runs)
    print()
    print("\n".join(medians))
    print()
    print("| detector (median ms) | " + " | ".join(f"{h:g} h" for h in sorted(hours)) + " |")
    print("|---|" + "---|" * len(hours))
    for kind, by_window in per_detector.items():
        print(f"| {kind} | " + " | ".join(f"{by_window[h]:,.1f}" for h in sorted(hours)) + " |")
    print(benchlib.machine_line(benchlib.machine_info()))
    engine.dispose()
    return 0


def stored_findings(reader, window, repeat: int) -> None:
    """An absolute window's first request, then ``repeat`` more (answered from the stored result)."""
    from sqlalchemy import delete

    from modalscope.app import evaluations
    from modalscope.app.detectors import Thresholds
    from modalscope.models import FindingEvaluation
    from modalscope.models.reader import Filters

    from sqlalchemy import func, select

    from modalscope.models import RollupChange

    with reader.engine.begin() as conn:
        conn.execute(delete(FindingEvaluation).where(FindingEvaluation.range_s == evaluations.ABSOLUTE_RANGE))
        last = conn.execute(select(func.max(RollupChange.changed_ns))).scalar() or 0
    # A write logged less than CHANGE_MARGIN_S before an evaluation makes it stale: a store
    # settled just now (this script's fill) is first left alone that long.
    wait = (last + evaluations.CHANGE_MARGIN_S * 1_000_000_000 - time.time_ns()) / 1e9
    if wait > 0:
        print(f"waiting {wait:.0f} s: the store was settled less than {evaluations.CHANGE_MARGIN_S} s ago", flush=True)
        time.sleep(wait + 1)
    th = Thresholds.from_env()
    times = []
    for i in range(repeat + 1):
        t = time.perf_counter()
        ev = evaluations.find_for(reader, window, Filters(), th, relative=False)
        times.append((time.perf_counter() - t) * 1000)
        if ev.stored != (i > 0):
            raise RuntimeError(f"request {i + 1}: stored={ev.stored}")
    print(f"absolute window, first request: {times[0]:.0f} ms; the next {repeat} (stored): "
          + ", ".join(f"{t:.1f}" for t in times[1:]) + " ms", flush=True)


def change_log_check(postgres: str | None) -> None:
    """``changes.changed_since`` after a day of logged settle batches (two a second)."""
    import benchlib

    from modalscope.models import Base, RollupChange, changes
    from modalscope.models.engine import make_engine

    def measure(url: str, label: str) -> None:
        engine = make_engine(url, write=True)
        try:
            Base.metadata.create_all(engine)
            now = time.time_ns()
            minute = now // 60_000_000_000
            day = [{"first_minute": minute - 1440 + i // 120 - 3, "last_minute": minute - 1440 + i // 120,
                    "changed_ns": now - 86_000 * 1_000_000_000 + i * 500_000_000} for i in range(172_000)]
            with engine.begin() as conn:
                conn.execute(RollupChange.__table__.insert(), day)
                conn.exec_driver_sql("ANALYZE rollup_changes")  # as autovacuum would have by then
            with engine.connect() as conn:
                out = []
                for hours in (23.8, 1.0):
                    runs = []
                    for _ in range(3):
                        t = time.perf_counter()
                        hit = changes.changed_since(conn, now - int(hours * 3600) * 1_000_000_000,
                                                    minute - 3000, minute - 1500)
                        runs.append((time.perf_counter() - t) * 1000)
                    assert not hit
                    out.append(f"evaluated {hours} h ago {statistics.median(runs):.1f} ms")
            print(f"change-log check ({label}, 172,000 rows): " + "; ".join(out), flush=True)
        finally:
            engine.dispose()

    with tempfile.TemporaryDirectory(prefix="modalscope-bench-") as tmp:
        measure(f"sqlite:///{tmp}/changes.db", "SQLite")
    if postgres:
        with benchlib.temp_postgres_database(postgres) as url:
            measure(url, "PostgreSQL")


if __name__ == "__main__":
    raise SystemExit(main())
