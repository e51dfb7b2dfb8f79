"""The dashboard's answers over a bench store, to compare two versions of the code byte for byte.

    .venv/bin/python bench/answers_bench.py --db /tmp/modalscope-bench/store-1000000.db --out before.json
    (check out the other version)
    .venv/bin/python bench/answers_bench.py --db /tmp/modalscope-bench/store-1000000.db --compare before.json

Each answer is a ``/api/v1`` response body (pairs, input types, stages, cache rates, traces,
anomalies, incidents, compare) or a chart's series (traffic, percentiles, cache hit rates) at
steps of 1, 5, 15, 30 and 60 minutes, and the Stages page's time at P50 and P99, over windows ending at the store's newest minute and
windows with ragged edges. ``--compare`` prints every answer that differs (and those only one side has) and exits 1
if any differs. Nothing is written to the store: give each version its own copy, migrated with
``modalscope db upgrade`` where the newer code's schema differs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: (label, hours back from the newest minute, seconds taken off the end: a ragged window)
WINDOWS = (("1h", 1, 0), ("6h ragged", 6, 437), ("24h", 24, 0), ("23h ragged", 23, 2_011))
STEPS = (1, 5, 15, 30, 60)


def answers(url: str) -> dict[str, str]:
    from sqlalchemy import func, select

    from modalscope.app import create_app, queries
    from modalscope.core.window import Window
    from modalscope.durations import HOUR_NS, MINUTE_NS
    from modalscope.models import Span
    from modalscope.models.reader import Filters
    from modalscope.settings import Settings

    app = create_app(Settings(database_url=url))
    client = app.test_client()
    reader = app.extensions["modalscope"]["reader"]
    with reader.engine.connect() as conn:
        last = conn.execute(select(func.max(Span.start_ns))).scalar_one()
    newest = (last // MINUTE_NS + 1) * MINUTE_NS
    out: dict[str, str] = {}

    def keep(name: str, value) -> None:
        out[name] = hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()

    for label, hours, ragged_s in WINDOWS:
        end = newest - ragged_s * 1_000_000_000
        window = Window(end - hours * HOUR_NS, end)
        q = f"start={window.start_ns // 1_000_000_000}&end={window.end_ns // 1_000_000_000}"
        for path in ("pairs", "input-types", "stages", "cache?group_by=user_tier", "cache", "traces?limit=20",
                     "traces?stage=encoder&limit=20", "anomalies", "incidents", "compare"):
            resp = client.get(f"/api/v1/{path}{'&' if '?' in path else '?'}{q}")
            keep(f"{label} /api/v1/{path} {resp.status_code}", resp.get_data(as_text=True))
        for step in STEPS:
            keep(f"{label} traffic series step {step}", queries.traffic_series(reader, window, Filters(), step))
            keep(f"{label} percentile series step {step}", queries.percentile_series(reader, window, Filters(), step))
            keep(f"{label} cache series step {step}", queries.cache_series(reader, window, "user_tier", None, step))
        for at in ("p50", "p99"):
            keep(f"{label} stage time at {at}", queries.stage_time_at(reader, window, Filters(), at))
        print(f"{label}: {len(out)} answers", file=sys.stderr, flush=True)
    reader.engine.dispose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--db", default="/tmp/modalscope-bench/store-1000000.db", help="a SQLite bench store")
    ap.add_argument("--database-url", default=None, help="a PostgreSQL bench store instead of --db")
    ap.add_argument("--out", default=None, metavar="FILE", help="write the answers' digests here")
    ap.add_argument("--compare", default=None, metavar="FILE", help="compare with digests written by --out")
    args = ap.parse_args()
    url = args.database_url or f"sqlite:///{args.db}"
    if not args.database_url and not Path(args.db).exists():
        ap.error(f"{args.db} does not exist: build it with bench/dashboard_bench.py --spans N first")
    got = answers(url)
    if args.out:
        Path(args.out).write_bytes(orjson.dumps(got, option=orjson.OPT_INDENT_2))
    if args.compare:
        want = orjson.loads(Path(args.compare).read_bytes())
        differ = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
        for name in differ:
            print(f"differs: {name}")
        for name in sorted(want.keys() ^ got.keys()):
            print(f"only in {'the file' if name in want else 'this run'}: {name}")
        print(f"{len(want.keys() & got.keys()) - len(differ)} of {len(want.keys() & got.keys())} answers identical")
        return 1 if differ else 0
    print(f"{len(got)} answers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
