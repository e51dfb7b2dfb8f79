"""A pair's exemplars from raw spans (the search ``pair_calls`` replaces), pair by pair.

    .venv/bin/python bench/pair_fallback_bench.py --db sqlite:////tmp/modalscope-bench/store-10000000.db \
        1:gateway:userdb 24:gateway:vision-encoder
    .venv/bin/python bench/pair_fallback_bench.py --db postgresql://postgres@127.0.0.1:5432/msbench10m \
        1:gateway:preprocessor

``queries.exemplar_traces`` reads a pair's slowest calls from ``pair_calls``; it searches the
raw spans instead where that table is not complete: windows before ``pair_calls`` held every
call (a store upgraded to it) and backlogs of more pending traces than it reads one by one.
This times that search: the reader is told ``pair_calls`` is complete from no time at all
(nothing in the store is changed). Each SUBJECT is ``HOURS:CALLER:CALLEE``, the window the
last HOURS ending at the newest span's minute; the slowest 20, as the drilldown's table asks.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchlib

import benchlib as bl  # noqa: E402


def parse_subject(spec: str) -> tuple[float, str, str]:
    parts = spec.split(":", 2)  # (a callee may be host:port)
    try:
        hours, caller, callee = float(parts[0]), parts[1], parts[2]
    except (ValueError, IndexError):
        raise SystemExit(f"pair_fallback_bench: bad subject {spec!r}: HOURS:CALLER:CALLEE") from None
    if len(parts) != 3 or not caller or not callee:
        raise SystemExit(f"pair_fallback_bench: bad subject {spec!r}: HOURS:CALLER:CALLEE")
    return hours, caller, callee


def main() -> int:
    bl.sigterm_as_interrupt()
    args = bl.subject_args(__doc__, runs=2).parse_args()
    subjects = [(spec, *parse_subject(spec)) for spec in args.subjects]

    from modalscope.app import queries
    from modalscope.app.params import Window
    from modalscope.models.reader import Filters, StoreReader

    machine = bl.machine_info(args.db)
    print(bl.machine_line(machine))
    engine, last = bl.open_store(args.db, "pair_fallback_bench")
    reader = StoreReader(engine)
    reader.calls.complete_from = lambda: 2**62  # every window before it: the raw-span search
    end = last // 60_000_000_000 * 60_000_000_000
    rows, out = [], []
    for spec, hours, caller, callee in subjects:
        window = Window(end - int(hours * 3600e9), end)
        filters = Filters(caller=caller, callee=callee)
        found, times, rest = bl.first_and_rest(
            lambda: queries.exemplar_traces(reader, window, filters, limit=20), args.runs)
        rows.append((spec, bl.fmt_ms(times[0]), bl.fmt_ms(rest), len(found)))
        out.append({"subject": spec, "first_ms": times[0], "median_ms": rest, "samples_ms": times,
                    "rows": len(found)})
        print(f"{spec}: first {times[0]:.0f} ms, median of the next {args.runs} {bl.fmt_ms(rest)} ms, "
              f"{len(found)} rows", flush=True)
    print(bl.md_table(("subject", "first call ms", f"median of {args.runs} ms", "rows"), rows))
    engine.dispose()
    bl.write_json(args.json, {"machine": machine, "args": vars(args), "subjects": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
