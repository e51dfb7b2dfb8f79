"""The dashboard bench's store (part of ``dashboard_bench.py``, not a script): demo traffic
filled into SQLite and settled, its closed hours packed, and the same store copied into
PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time

import benchlib as bl

SPANS_PER_TRACE = 27.3  # the demo's average (217,724 spans in 7,983 traces)
COPY_TABLES = ("series", "spans", "pair_calls", "traces", "rollups", "rollups_15m", "rollups_hourly", "cursors")


def default_db(spans: int) -> str:
    return os.path.join(bl.BENCH_DIR, f"store-{spans}.db")


def _sqlite_files(path: str) -> list[str]:
    return [path + suffix for suffix in ("", "-wal", "-shm")]


def pack_store(url: str) -> float:
    """Pack the store's closed hours of rollups (``models/packs.py``), as the receivers' settler
    does a few minutes after each hour ends, and verify them at once (nothing else writes to
    the bench's store). Returns the seconds it took."""
    from tqdm import tqdm

    from modalscope.models import packs
    from modalscope.models.engine import make_engine

    engine = make_engine(url, write=True)
    try:
        t0 = time.perf_counter()
        with tqdm(desc="packing hours", unit=" packs", file=sys.stderr, mininterval=1) as bar:
            built = packs.pack_everything(engine, progress=lambda done, total: (setattr(bar, "total", total),
                                                                                bar.update(1)))
        took = time.perf_counter() - t0
    finally:
        engine.dispose()
    if built:
        bl.log(f"packed {built} hours of rollups in {took:.1f} s")
    return took


def fill_sqlite(path: str, spans: int, hours: float) -> dict:
    """Fill ``path`` with demo traffic (unless it already holds ~``spans``) and settle it.
    Returns what the fill took (from ``<path>.fill.json`` when the store was reused).

    The fill goes to ``<path>.filling`` and is renamed when complete, so an interrupted fill
    leaves nothing behind that a later run would mistake for a store."""
    from sqlalchemy import func, select
    from tqdm import tqdm

    from modalscope.ingest import demo
    from modalscope.ingest.settle import settle
    from modalscope.models import Span, Trace
    from modalscope.models.engine import make_engine
    from modalscope.models.schema import ensure_schema

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    sidecar = path + ".fill.json"
    if os.path.exists(path):
        ensure_schema(f"sqlite:///{path}", create=False)
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            have = conn.execute("SELECT count(*) FROM spans").fetchone()[0]
        if have < spans * 0.95:
            raise SystemExit(f"{path} holds {have:,} spans, fewer than --spans {spans:,}: remove it or pick another --db")
        if have > spans * 1.5:
            bl.log(f"note: {path} holds {have:,} spans, more than --spans {spans:,}; measuring it as it is")
        bl.log(f"reusing {path}: {have:,} spans")
        if os.path.exists(sidecar):
            with open(sidecar) as fh:
                return {**json.load(fh), "reused": True}
        return {"spans": have, "reused": True}
    partial = path + ".filling"
    for f in _sqlite_files(partial):
        if os.path.exists(f):
            os.remove(f)
    url = f"sqlite:///{partial}"
    done = False
    try:
        ensure_schema(url)
        engine = make_engine(url, write=True)
        try:
            rate = spans / SPANS_PER_TRACE / (hours * 3600)
            config = demo.DemoConfig(now_ns=time.time_ns(), seed=7, hours=hours, rate=rate)
            bl.log(f"filling {path}: {hours:g} h of demo traffic at {rate:.2f} requests/s (~{spans:,} spans)")
            t0 = time.perf_counter()
            with tqdm(total=int(rate * hours * 3600), desc="generating", unit=" traces", file=sys.stderr,
                      mininterval=1) as bar:
                result = demo.fill(engine, config, progress=bar.update)
            t1 = time.perf_counter()
            with engine.connect() as conn:
                pending = conn.execute(select(func.count()).select_from(Trace).where(Trace.pending.is_(True))).scalar_one()
            with tqdm(total=pending, desc="settling", unit=" traces", file=sys.stderr, mininterval=1) as bar:
                settle(engine, force=True, progress=bar.update)
            t2 = time.perf_counter()
            with engine.connect() as conn:
                stored = conn.execute(select(func.count()).select_from(Span)).scalar_one()
        finally:
            engine.dispose()  # the last connection checkpoints the WAL into the file
        conn = sqlite3.connect(partial)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        os.replace(partial, path)
        for f in _sqlite_files(partial)[1:]:
            if os.path.exists(f):
                os.remove(f)
        done = True
    finally:
        if not done:
            for f in _sqlite_files(partial):
                if os.path.exists(f):
                    os.remove(f)
    info = {"spans": stored, "traces": result.traces, "hours": hours, "generate_write_s": round(t1 - t0, 1),
            "settle_s": round(t2 - t1, 1), "filled_utc": bl.machine_info()["date_utc"]}
    with open(sidecar, "w") as fh:
        json.dump(info, fh)
    bl.log(f"filled {stored:,} spans in {result.traces:,} traces: generate+write {t1 - t0:.0f} s, "
           f"settle {t2 - t1:.0f} s")
    return {**info, "reused": False}


def _pg_index_plan(pg, table: str) -> list[tuple[str, str]]:
    """(drop statement, create statement) for ``table``'s secondary indexes and non-primary
    unique constraints: dropped for the bulk copy, rebuilt afterwards."""
    rows = pg.execute(
        """SELECT i.indexname, i.indexdef, c.contype, pg_get_constraintdef(c.oid)
           FROM pg_indexes i
           LEFT JOIN pg_constraint c ON c.conindid = (quote_ident(i.schemaname) || '.' || quote_ident(i.indexname))::regclass
           WHERE i.schemaname = current_schema() AND i.tablename = %s""", (table,)).fetchall()
    plan = []
    for name, indexdef, contype, condef in rows:
        if contype == "p":
            continue
        if contype == "u":
            plan.append((f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"',
                         f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {condef}'))
        elif contype is None:
            plan.append((f'DROP INDEX "{name}"', indexdef))
    return plan


def copy_to_postgres(sqlite_path: str, pg_url: str) -> dict:
    """Copy every table of the SQLite store into an empty PostgreSQL database (schema by migrations)."""
    import psycopg
    from tqdm import tqdm

    from modalscope.models.schema import ensure_schema

    ensure_schema(pg_url)
    lite = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    timings = {"copy_s": 0.0, "index_s": 0.0, "analyze_s": 0.0}
    counts = {t: lite.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COPY_TABLES}
    try:
        with psycopg.connect(bl.libpq_url(pg_url)) as pg, \
                tqdm(total=sum(counts.values()), desc="copying to PostgreSQL", unit=" rows", unit_scale=True,
                     file=sys.stderr, mininterval=1) as bar:
            for table in COPY_TABLES:
                pg_cols = [r[0] for r in pg.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                    "AND table_name = %s ORDER BY ordinal_position", (table,))]
                lite_cols = {r[1] for r in lite.execute(f"PRAGMA table_info({table})")}
                cols = [c for c in pg_cols if c in lite_cols]
                plan = _pg_index_plan(pg, table)
                for drop, _ in plan:
                    pg.execute(drop)
                t0 = time.perf_counter()
                col_list = ", ".join(f'"{c}"' for c in cols)
                with pg.cursor().copy(f'COPY "{table}" ({col_list}) FROM STDIN') as cp:
                    cur = lite.execute(f"SELECT {col_list} FROM {table}")
                    while True:
                        chunk = cur.fetchmany(20_000)
                        if not chunk:
                            break
                        for row in chunk:
                            cp.write_row(row)
                        bar.update(len(chunk))
                t1 = time.perf_counter()
                for _, create in plan:
                    pg.execute(create)
                if "id" in cols:
                    pg.execute(f"SELECT setval(pg_get_serial_sequence('\"{table}\"', 'id'), "
                               f"(SELECT max(id) FROM \"{table}\")) WHERE EXISTS (SELECT 1 FROM \"{table}\")")
                pg.commit()
                timings["copy_s"] += t1 - t0
                timings["index_s"] += time.perf_counter() - t1
        t0 = time.perf_counter()
        with psycopg.connect(bl.libpq_url(pg_url), autocommit=True) as pg:
            for table in COPY_TABLES:
                pg.execute(f'VACUUM ANALYZE "{table}"')
        timings["analyze_s"] = time.perf_counter() - t0
    finally:
        lite.close()
    out = {k: round(v, 1) for k, v in timings.items()}
    out["rows"] = counts
    bl.log(f"copied to PostgreSQL: COPY {out['copy_s']:.0f} s, indexes {out['index_s']:.0f} s, "
           f"VACUUM ANALYZE {out['analyze_s']:.0f} s")
    return out


def prepare_postgres(url: str, sqlite_path: str) -> dict:
    """Copy the SQLite store into the (empty) PostgreSQL database, or reuse it if it holds the same store."""
    from sqlalchemy import create_engine, inspect, text

    from modalscope.models.engine import normalize_url

    with contextlib.closing(sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)) as lite:
        spans = lite.execute("SELECT count(*) FROM spans").fetchone()[0]
    engine = create_engine(normalize_url(url))
    try:
        tables = inspect(engine).get_table_names()
        have = 0
        if "spans" in tables:
            with engine.connect() as conn:
                have = conn.execute(text("SELECT count(*) FROM spans")).scalar_one()
    finally:
        engine.dispose()
    if tables and have == spans:
        bl.log(f"reusing the PostgreSQL database: {have:,} spans")
        return {"reused": True}
    if tables:
        raise SystemExit(f"the PostgreSQL database holds {have:,} spans, the SQLite store {spans:,}: "
                         "name an empty or new database")
    return copy_to_postgres(sqlite_path, url)
