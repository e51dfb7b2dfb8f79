"""What each cache layer buys: the dashboard's reads with one layer turned off at a time.

The layers between a request and the minute rollups, turned off here by patching the code
that consults them (the store is not changed):

* ``quarter tier``: 15-minute rollups, which charts at 15- and 30-minute steps read for
  their whole quarters (read as minutes instead);
* ``hour tier``: hourly rollups for a window's whole hours (read as minutes and quarters);
* ``hour packs``: a closed hour of a kind's minute rollups as one blob, which the detectors
  and the heatmap read (``models/packs.py``; read as minute rows instead);
* ``pack cache``: the worker's in-process copy of decoded packs (``packs.PackCache``);

Stored evaluations and reused findings are measured by ``dashboard_bench.py`` (its anomalies
rows: "window ending now", "an absolute window's first request", "nothing stored").

Each variant runs in a fresh app (so no cache of another variant helps it) on a store built
by ``dashboard_bench.py --spans N``; medians of ``--runs`` calls after one warm-up, ms:

    .venv/bin/python bench/cache_layers_bench.py --db /tmp/modalscope-bench/store-1000000.db
    .venv/bin/python bench/cache_layers_bench.py --database-url postgresql://postgres@127.0.0.1:5432/msbench1m
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HOUR_NS = 3_600_000_000_000
MINUTE_NS = 60_000_000_000
WINDOWS = (("1h", 1), ("24h", 24))


@contextlib.contextmanager
def _patched(target, name: str, value) -> Iterator[None]:
    old = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, old)


@contextlib.contextmanager
def no_quarters() -> Iterator[None]:
    from modalscope.models.reader import tiers

    with _patched(tiers, "_split_quarters", lambda first, last: ([(first, last)], None)):
        yield


@contextlib.contextmanager
def no_hours() -> Iterator[None]:
    import modalscope.models.reader as reader_pkg
    from modalscope.app.queries import cache as cache_queries
    from modalscope.models.reader import rollups, tiers

    real = tiers.tier_plan

    def minutes_and_quarters(start_ns, end_ns, minutes_kept_from=None, *, hours=True):
        return real(start_ns, end_ns, minutes_kept_from, hours=False)

    with contextlib.ExitStack() as stack:
        for module in (tiers, rollups, reader_pkg, cache_queries):
            stack.enter_context(_patched(module, "tier_plan", minutes_and_quarters))
        yield


@contextlib.contextmanager
def no_packs() -> Iterator[None]:
    from modalscope.models import packs

    with _patched(packs, "read", lambda *a, **k: {}):
        yield


@contextlib.contextmanager
def no_pack_cache() -> Iterator[None]:
    from modalscope.models import packs

    with _patched(packs.PackCache, "get", lambda self, *a: None):
        yield


VARIANTS: tuple[tuple[str, Callable], ...] = (
    ("every layer", contextlib.nullcontext),
    ("no quarter tier", no_quarters),
    ("no hour tier", no_hours),
    ("no hour packs", no_packs),
    ("no pack cache", no_pack_cache),
)


def _calls(app, client, window) -> list[tuple[str, Callable]]:
    from modalscope.app import findings, queries
    from modalscope.app import state as st
    from modalscope.app.detectors import Thresholds
    from modalscope.models.reader import Filters

    reader = app.extensions["modalscope"]["reader"]
    start_s, end_s = window.start_ns // 1_000_000_000, window.end_ns // 1_000_000_000
    q = f"start={start_s}&end={end_s}"
    step = st.step_minutes(window)  # the overview's and drill-down's chart step

    def api(path):
        def call():
            resp = client.get(path)
            if resp.status_code != 200:
                raise RuntimeError(f"{path}: {resp.status_code} {resp.get_data(as_text=True)[:200]}")
        return call

    return [
        ("/api/v1/pairs", api(f"/api/v1/pairs?{q}")),
        ("/api/v1/input-types", api(f"/api/v1/input-types?{q}")),
        ("/api/v1/stages", api(f"/api/v1/stages?{q}")),
        ("/api/v1/cache?group_by=user_tier", api(f"/api/v1/cache?{q}&group_by=user_tier")),
        ("pair heatmap", lambda: queries.pair_heatmap(reader, window, Filters())),
        ("traffic series (chart)", lambda: queries.traffic_series(reader, window, Filters(), step)),
        ("percentile series (chart)", lambda: queries.percentile_series(reader, window, Filters(), step)),
        ("stage series (chart)", lambda: queries.stage_series(reader, window, Filters(), step)),
        ("findings.find (nothing stored)", lambda: findings.find(reader, window, Filters(), Thresholds())),
    ]


def _median_ms(fn: Callable, runs: int) -> float:
    fn()  # warm-up: connections, imports, the pack cache of this variant
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def measure(url: str, runs: int) -> dict:
    from sqlalchemy import func, select

    from modalscope.app import create_app
    from modalscope.core.window import Window
    from modalscope.models import Span
    from modalscope.settings import Settings

    out: dict = {"url": url, "runs": runs, "rows": []}
    for variant, switch in VARIANTS:
        with switch():
            app = create_app(Settings(database_url=url))
            client = app.test_client()
            engine = app.extensions["modalscope"]["reader"].engine
            with engine.connect() as conn:
                spans, last = conn.execute(select(func.count(), func.max(Span.start_ns)).select_from(Span)).one()
            out["spans"] = spans
            end = (last // MINUTE_NS + 1) * MINUTE_NS
            for label, hours in WINDOWS:
                window = Window(end - hours * HOUR_NS, end)
                for name, fn in _calls(app, client, window):
                    ms = _median_ms(fn, runs)
                    out["rows"].append({"variant": variant, "window": label, "call": name, "ms": round(ms, 1)})
                    print(f"{variant:16} {label:4} {name:34} {ms:9.1f} ms", file=sys.stderr, flush=True)
            engine.dispose()
    return out


def report(data: dict) -> str:
    variants = [v for v, _ in VARIANTS]
    calls = list(dict.fromkeys(r["call"] for r in data["rows"]))
    ms = {(r["variant"], r["window"], r["call"]): r["ms"] for r in data["rows"]}
    lines = [f"{data['spans']:,} spans, {data['url'].split('@')[-1]}; ms, median of {data['runs']} "
             "(1 h / 24 h)", "",
             "| call | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for call in calls:
        cells = [" / ".join(f"{ms.get((v, w, call), float('nan')):,.1f}" for w, _ in WINDOWS) for v in variants]
        lines.append(f"| {call} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--db", default="/tmp/modalscope-bench/store-1000000.db", help="a SQLite bench store")
    ap.add_argument("--database-url", default=None, help="a PostgreSQL bench store instead of --db")
    ap.add_argument("--runs", type=int, default=5, help="timed calls after one warm-up (default 5)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write every figure here")
    args = ap.parse_args()
    url = args.database_url or f"sqlite:///{args.db}"
    if not args.database_url and not Path(args.db).exists():
        ap.error(f"{args.db} does not exist: build it with bench/dashboard_bench.py --spans N first")
    data = measure(url, args.runs)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    print(report(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
