"""Which index each of the readers' hot statements takes, as the database itself explains it.

    .venv/bin/python bench/query_plans.py [--hours 0.5] [--database-url postgresql://postgres@127.0.0.1:5432]

Fills a fresh store with demo traffic, runs the reads whose plan decides their speed on a
large store, captures the statements they send and prints the database's own plan of each,
beside the index it should take. Exits 1 when a read takes another way: a slow call in
``dashboard_bench.py`` at 10 M spans would show the same, later and without naming the read.
The test suite checks what these reads answer; this script checks how they find it.

SQLite plans by the statement and the indexes, so its expectations hold on any store.
PostgreSQL plans by its statistics: there only the read that forces its plan (a service's
spans of a window, which turns plain index scans off for its transaction) is checked, and the
other plans are printed as this store got them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchlib

import benchlib  # noqa: E402

MIN = 60_000_000_000
MS = 1_000_000
DAY_NS = 86_400 * 10**9


@dataclass
class Check:
    read: str
    needle: str  # which captured statements are this read's
    want: list[str]  # each must be in the plan (on the dialects in ``checked_on``)
    refuse: list[str] = field(default_factory=list)  # none may be
    checked_on: tuple[str, ...] = ("sqlite",)
    plans: list[str] = field(default_factory=list)

    def verdict(self, dialect: str) -> str:
        if not self.plans:
            return "NO STATEMENT"
        if dialect not in self.checked_on:
            return "shown"
        ok = all(all(w in p for w in self.want) and not any(r in p + " " for r in self.refuse) for p in self.plans)
        return "ok" if ok else "OTHER PLAN"


@contextlib.contextmanager
def explained(engine, check: Check):
    """Explain, in the reading transaction itself, each statement containing the needle."""
    from sqlalchemy import event

    dialect = engine.dialect.name
    prefix = "EXPLAIN QUERY PLAN " if dialect == "sqlite" else "EXPLAIN "

    def explain(conn, cursor, statement, parameters, context, executemany):
        if check.needle in statement and "FROM" in statement and not statement.startswith("EXPLAIN"):
            rows = cursor.connection.execute(prefix + statement, parameters).fetchall()
            check.plans.append(" | ".join(str(r[-1] if dialect == "sqlite" else r[0]) for r in rows))

    event.listen(engine, "after_cursor_execute", explain)
    try:
        yield
    finally:
        event.remove(engine, "after_cursor_execute", explain)


def run_checks(engine, start_ns: int, end_ns: int) -> list[Check]:
    from sqlalchemy import func, select, update

    from modalscope.models import Rollup, Span, Trace
    from modalscope.models.dialect import keys_clause, rows_with_keys
    from modalscope.models.reader import StoreReader
    from modalscope.models.reader import calls as calls_module
    from modalscope.models.reader.spans import SpanQuery
    from modalscope.models.reader.walks import KIND_CLIENT_CODE
    from modalscope.app.params import Window
    from modalscope.app.queries.stage_time import stage_time_at

    reader = StoreReader(engine)
    with engine.connect() as conn:
        counts = conn.execute(select(Span.service, func.count()).group_by(Span.service)
                              .order_by(func.count().desc())).all()
        caller = conn.execute(select(Span.service).where(Span.kind == KIND_CLIENT_CODE)
                              .group_by(Span.service).order_by(func.count().desc()).limit(1)).scalar_one()
        keys = [tuple(r) for r in conn.execute(select(Rollup.minute, Rollup.series_id).limit(2)).all()]
        input_type = conn.execute(select(Trace.input_type).group_by(Trace.input_type)
                                  .order_by(func.count().desc()).limit(1)).scalar_one()
    busiest, smallest = counts[0][0], counts[-1][0]
    checks = []

    walk = Check("the slowest spans of a service over a long window, bucket by bucket", "duration_bucket =",
                 ["ix_spans_duration_walk (service=? AND duration_bucket=? AND start_ns>? AND start_ns<?)"])
    with explained(engine, walk):
        reader.spans.slowest(SpanQuery(start_ns, end_ns, service=busiest, limit=5))
    checks.append(walk)

    spans_of = Check(f"a service's spans of a window ({smallest}, the fewest)", "CASE WHEN",
                     ["ix_spans_duration_walk"], ["ix_spans_start_ns"], checked_on=("sqlite", "postgresql"))
    with explained(engine, spans_of):
        reader.attributes.spans(start_ns, end_ns, (), kinds=(2, 5), service=smallest)
    checks.append(spans_of)

    by_key = Check("rollup rows by (minute, series) key", "rollups",
                   ["sqlite_autoindex_rollups_1 (minute=? AND series_id=?)"], ["SCAN rollups", "SCAN r "])
    with explained(engine, by_key), engine.connect() as conn:
        list(rows_with_keys(conn, Rollup.__table__, "minute", keys))
        conn.execute(select(func.count()).select_from(Rollup).where(
            keys_clause(conn, Rollup.__table__, "minute", keys))).scalar_one()
    checks.append(by_key)

    # An input type's tail through its partial index; a short window's traces of one input
    # type through the start index, never drawn to that index by the input type's equality.
    tails = Check("each input type's P99 tail (the Stages page's time at P99)", "contributions IS NOT NULL",
                  ["ix_traces_input_type_tail (input_type=? AND duration_ns>?)"])
    with explained(engine, tails):
        stage_time_at(reader, Window(start_ns, end_ns))
    checks.append(tails)
    minute = Check("a minute's slowest traces of one input type (a regression's exemplars)",
                   "ORDER BY traces.duration_ns DESC",
                   ["ix_traces_start_ns (start_ns>? AND start_ns<?)"], ["ix_traces_input_type_tail"])
    with explained(engine, minute):
        reader.calls.slowest_traces(end_ns - 3 * MIN, end_ns - 2 * MIN, input_type=input_type, min_ns=MS, limit=5)
    checks.append(minute)

    # Every trace pending (as a burst leaves them): the calls read trace by trace, then walked.
    with engine.begin() as conn:
        conn.execute(update(Trace).values(pending=True))
    # More pending traces than the walk's threshold take the walk; fewer, one trace at a time.
    for walk_after, check in ((10**9, Check("pending traces' calls, trace by trace", "trace_id IN",
                                            ["sqlite_autoindex_spans_1 (trace_id=?)"])),
                              (7, Check("pending traces' calls, through the callers' duration index",
                                        "duration_bucket IN",
                                        ["ix_spans_duration_walk (service=? AND duration_bucket=? AND start_ns>?"],
                                        ["SCAN spans"]))):
        saved, calls_module.PENDING_WALK_AFTER = calls_module.PENDING_WALK_AFTER, walk_after
        try:
            with explained(engine, check):
                reader.calls.pending(start_ns, end_ns, [caller], min_ns=MS, max_ns=DAY_NS)
        finally:
            calls_module.PENDING_WALK_AFTER = saved
        checks.append(check)
    return checks


def fill(url: str, hours: float):
    from modalscope.ingest import demo
    from modalscope.ingest.settle import settle
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade

    upgrade(url)
    engine = make_engine(url, write=True)
    config = demo.DemoConfig(now_ns=time.time_ns() // MIN * MIN, hours=hours, rate=1.0, seed=5)
    benchlib.log(f"filling {hours} h of demo traffic ...")
    filled = demo.fill(engine, config)
    settle(engine, force=True)
    benchlib.log(f"{filled.spans:,} spans in {filled.traces:,} traces, settled")
    return engine, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=0.5, help="demo traffic to fill (default 0.5)")
    parser.add_argument("--database-url", default=None,
                        help="a PostgreSQL server (a database is created and dropped); default a temporary SQLite file")
    args = parser.parse_args(argv)
    from modalscope.models.engine import make_engine

    benchlib.sigterm_as_interrupt()
    print(benchlib.machine_line(benchlib.machine_info(args.database_url)))
    with contextlib.ExitStack() as stack:
        if args.database_url and benchlib.is_postgres(args.database_url):
            url = stack.enter_context(benchlib.temp_postgres_database(args.database_url, "msplans"))
        else:
            url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory()) }/plans.db"
        engine, config = fill(url, args.hours)
        engine.dispose()
        engine = make_engine(url)  # (a reading engine, as the dashboard's: a read may open a second)
        stack.callback(engine.dispose)
        checks = run_checks(engine, config.start_ns - MIN, config.end_ns + MIN)
        dialect = engine.dialect.name
    rows = []
    for c in checks:
        rows.append((c.read, c.verdict(dialect), len(c.plans), " / ".join(c.want) if dialect in c.checked_on else ""))
    print(benchlib.md_table(("read", dialect, "statements", "expected"), rows))
    for c in checks:
        print(f"\n{c.read}:")
        for plan in dict.fromkeys(re.sub(r"'\{[^}]{40,}\}'", "'{…}'", p) for p in c.plans):
            print(f"  {plan}")
    return 0 if all(c.verdict(dialect) in ("ok", "shown") for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
