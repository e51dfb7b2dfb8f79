"""Compare (``app.queries.compare``) over the newest hours of any store, subject by subject.

    .venv/bin/python bench/compare_bench.py --db sqlite:////tmp/modalscope-bench/store-10000000.db \
        1:gateway:llm 24:gateway:llm 1 24 1::::encoder
    .venv/bin/python bench/compare_bench.py --db postgresql://postgres@127.0.0.1:5432/msbench10m 24:gateway:auth

Each SUBJECT is ``HOURS[:CALLER[:CALLEE[:SERVICE[:STAGE]]]]``: the window is the last HOURS
ending at the newest span's minute, the filters as Compare's (``HOURS`` alone: whole traces).
For each, one process calls ``compare`` ``--runs`` + 1 times and prints the first call (cold
pages and statement caches) and the median of the rest, the selection's and baseline's counts,
and the three values ranked first. ``dashboard_bench.py`` times the API and page calls; this
script is for one subject at a time, on any store (``dashboard_bench.py``'s included).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchlib

import benchlib as bl  # noqa: E402


def parse_subject(spec: str):
    from modalscope.models.reader import Filters

    hours, caller, callee, service, stage = (spec.split(":") + [""] * 4)[:5]
    try:
        hours_f = float(hours)
    except ValueError:
        raise SystemExit(f"compare_bench: bad subject {spec!r}: HOURS[:CALLER[:CALLEE[:SERVICE[:STAGE]]]]") from None
    return hours_f, Filters(caller=caller or None, callee=callee or None, service=service or None,
                            stage=stage or None)


def main() -> int:
    bl.sigterm_as_interrupt()
    args = bl.subject_args(__doc__, runs=3).parse_args()
    subjects = [(spec, *parse_subject(spec)) for spec in args.subjects]

    from modalscope.app import queries
    from modalscope.app.params import Window
    from modalscope.models.reader import StoreReader

    machine = bl.machine_info(args.db)
    print(bl.machine_line(machine))
    engine, last = bl.open_store(args.db, "compare_bench")
    reader = StoreReader(engine)
    end = (last // 60_000_000_000 + 1) * 60_000_000_000
    rows, out = [], []
    for spec, hours, filters in subjects:
        window = Window(end - int(hours * 3600e9), end)
        result, times, rest = bl.first_and_rest(lambda: queries.compare(reader, window, None, filters), args.runs)
        top = ", ".join(f"{a['key']}={a['value']}" for a in result["attributes"][:3])
        rows.append((spec, bl.fmt_ms(times[0]), bl.fmt_ms(rest), bl.fmt_int(result["selection"]["count"]),
                     bl.fmt_int(result["baseline"]["count"]), top or "—"))
        out.append({"subject": spec, "first_ms": times[0], "median_ms": rest, "samples_ms": times,
                    "selection": result["selection"], "baseline": result["baseline"],
                    "attributes": result["attributes"]})
        print(f"{spec}: first {times[0]:.0f} ms, median of the next {args.runs} {bl.fmt_ms(rest)} ms", flush=True)
    print(bl.md_table(("subject", "first call ms", f"median of {args.runs} ms", "selection", "baseline", "ranked first"),
                      rows))
    engine.dispose()
    bl.write_json(args.json, {"machine": machine, "args": vars(args), "subjects": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
