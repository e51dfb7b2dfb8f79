"""Settling alone: the ingest bench's requests written unsettled, then one settle timed by part.

    .venv/bin/python bench/settle_bench.py [--requests 40] [--spans-per-request 5000] [--repeat 3]

Each run decodes and tags ``ingest_bench.py``'s requests as a receiver does, writes them into a
fresh SQLite store without settling, then times ``settle(force=True)`` over all of them in this
process, with the time its parts took: claiming (``within_budget``), reading the span rows
(``load_trace_rows``), computing the summaries (``summarize_rows``), and writing them
(``_apply_summary``, the rollup writes among it). What the receiver's settler does during a
burst, without the receiver beside it on the cores.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchlib, ingest_bench

PARTS = ("within_budget", "load_trace_rows", "_summarize", "_apply_summary", "apply_contributions")


def _timed_parts(module, spent: collections.Counter) -> None:
    """Wrap the settle module's parts so each adds its time to ``spent``."""
    for name in PARTS:
        fn = getattr(module, name)

        @functools.wraps(fn)
        def timed(*args, _fn=fn, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_name] += time.perf_counter() - t0

        setattr(module, name, timed)


def one_run(payloads: list[bytes], spent: collections.Counter) -> dict:
    from modalscope.ingest import settle as settle_module
    from modalscope.ingest.otlp.protobuf import decode_protobuf
    from modalscope.ingest.rules_file import load_rules
    from modalscope.ingest.writer import write_spans
    from modalscope.models.engine import make_engine
    from modalscope.models.schema import ensure_schema

    workdir = tempfile.mkdtemp(prefix="modalscope-settle-bench-")
    path = os.path.join(workdir, "store.db")
    try:
        url = f"sqlite:///{path}"
        ensure_schema(url)
        engine = make_engine(url, write=True)
        rules = load_rules(None)
        spans = 0
        for payload in payloads:
            records = decode_protobuf(payload).spans
            rules.tag(records)
            write_spans(engine, records)
            spans += len(records)
        spent.clear()
        t0 = time.perf_counter()
        traces = settle_module.settle(engine, force=True)
        total = time.perf_counter() - t0
        engine.dispose()
        return {"spans": spans, "traces": traces, "total_s": total, **{k: spent[k] for k in PARTS}}
    finally:
        for name in os.listdir(workdir):
            os.remove(os.path.join(workdir, name))
        os.rmdir(workdir)


def main() -> int:
    import benchlib as bl
    from ingest_bench import make_payloads
    from modalscope.ingest import settle as settle_module

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40, help="requests a run (default 40)")
    ap.add_argument("--spans-per-request", type=int, default=5000, help="spans a request (default 5000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs; medians are printed (default 3)")
    ap.add_argument("--json", metavar="FILE", help="also write machine details and runs here")
    args = ap.parse_args()

    bl.sigterm_as_interrupt()
    info = bl.machine_info()
    print(bl.machine_line(info))
    payloads = make_payloads(args.requests, args.spans_per_request)
    spent: collections.Counter = collections.Counter()
    _timed_parts(settle_module, spent)
    runs = [one_run(payloads, spent) for _ in range(args.repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("total_s", *PARTS)}
    spans = runs[0]["spans"]
    print(f"{spans:,} spans in {runs[0]['traces']:,} traces, median of {len(runs)} runs:")
    print(bl.md_table(
        ["settle s", "spans/s", "claim s", "read rows s", "summarize s", "write s", "of it rollups s"],
        [[f"{med['total_s']:.2f}", f"{spans / med['total_s']:,.0f}", f"{med['within_budget']:.2f}",
          f"{med['load_trace_rows']:.2f}", f"{med['_summarize']:.2f}", f"{med['_apply_summary']:.2f}",
          f"{med['apply_contributions']:.2f}"]]))
    bl.write_json(args.json, {"machine": info, "runs": runs, "medians": med})
    return 0


if __name__ == "__main__":
    sys.exit(main())
