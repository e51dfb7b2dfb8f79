"""All detectors of the anomaly catalog over 24 h of demo data at the default rate.

    .venv/bin/python bench/detectors_bench.py [--hours 24] [--db PATH] [--repeat 3]

Fills a temporary SQLite store with ``--hours`` of demo traffic (``ingest/demo.py``
``fill``, default rate, every pattern injected; ``--db PATH`` keeps / reuses that file)
and times ``app.findings.find`` over the whole window: the rollup and raw-span reads, the
ten detectors, and the exemplar look-ups. Target (DESIGN.md / issue 5): < 2 s.
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
    args = ap.parse_args()
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
    import benchlib

    print(benchlib.machine_line(benchlib.machine_info()))
    kinds = sorted({f["kind"] for f in found})
    print("kinds found:", ", ".join(kinds))
    engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
