"""Settling late traces into a large store: the rollup rows each batch reads and rewrites.

    .venv/bin/python bench/late_settle_bench.py [--db /tmp/modalscope-bench/store-10000000.db] [--traces 2000]

Copies the store (``dashboard_bench.py``'s, filled there; the copy is removed at the end),
writes ``--traces`` traces (gateway -> vision encoder -> fusion -> llm, 7 spans each) at
random times over the day before its newest span, and times ``settle``: each trace touches
minute, quarter-hour and hourly rollup rows already there, spread over the whole day — what a
collector's retried batch or a Cloud Trace backfill does to a store that has been running.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.factories
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchlib


def main() -> int:
    import benchlib
    from modalscope.ingest.settle import settle
    from modalscope.ingest.writer import write_spans
    from modalscope.models.engine import make_engine
    from tests.factories import multimodal_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="/tmp/modalscope-bench/store-10000000.db")
    ap.add_argument("--traces", type=int, default=2000)
    args = ap.parse_args()
    if not os.path.exists(args.db):
        raise SystemExit(f"{args.db}: no such store (bench/dashboard_bench.py fills it)")
    workdir = tempfile.mkdtemp(prefix="modalscope-settle-bench-", dir=os.path.dirname(args.db))
    try:
        copy = os.path.join(workdir, "store.db")
        t = time.perf_counter()
        shutil.copyfile(args.db, copy)
        print(f"copied the store in {time.perf_counter() - t:.0f} s", flush=True)
        engine = make_engine(f"sqlite:///{copy}", write=True)
        with engine.connect() as conn:
            last = conn.exec_driver_sql("select max(start_ns) from spans").scalar_one()
        rng = random.Random(1)
        spans = [s for _ in range(args.traces) for s in multimodal_trace(rng, last - rng.randrange(86400 * 10**9))]
        write_spans(engine, spans)
        t = time.perf_counter()
        settled = settle(engine, force=True)
        dt = time.perf_counter() - t
        print(f"settled {settled:,} late traces ({len(spans):,} spans) spread over a day in {dt:.1f} s: "
              f"{settled / dt:,.0f} traces/s")
        print(benchlib.machine_line(benchlib.machine_info()))
        engine.dispose()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
