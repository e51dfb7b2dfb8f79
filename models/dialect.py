"""The one place that knows which SQL engine is underneath.

Everything else uses SQLAlchemy Core/ORM constructs that run anywhere; these helpers pick
the dialect's spelling of "insert, ignoring duplicates" and "upsert".
"""

from __future__ import annotations

import orjson
from sqlalchemy import (Connection, String, Table, and_, any_, bindparam, case, cast, func, literal, literal_column, or_,
                        select, text, tuple_)
from sqlalchemy.dialects import postgresql, sqlite

from . import Span, Trace


def _insert_for(conn: Connection):
    name = conn.dialect.name
    if name == "postgresql":
        return postgresql.insert
    if name == "sqlite":
        return sqlite.insert
    raise NotImplementedError(f"unsupported dialect {name}")


def insert_ignore(conn: Connection, table: Table, index_elements: list[str]):
    """INSERT that skips rows colliding on ``index_elements`` (idempotent span writes)."""
    return _insert_for(conn)(table).on_conflict_do_nothing(index_elements=index_elements)


def upsert(conn: Connection, table: Table, index_elements: list[str], update_columns: list[str]):
    """INSERT ... ON CONFLICT (...) DO UPDATE SET col = excluded.col for ``update_columns``."""
    stmt = _insert_for(conn)(table)
    return stmt.on_conflict_do_update(
        index_elements=index_elements,
        set_={c: stmt.excluded[c] for c in update_columns},
    )


def index_by_bitmap(conn: Connection) -> None:
    """For the rest of this transaction, PostgreSQL reads indexes as bitmaps only (no plain
    index scans); nothing elsewhere.

    For a read through the walk index ``(service, duration_bucket, start_ns, ...)`` whose
    result is ordered by start: PostgreSQL's planner prefers the ``start_ns`` index for its
    order and filters every span of the window to keep one service's, where a bitmap of the
    walk index and a sort read only that service's and are much cheaper."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL enable_indexscan = off"))


def no_sequential_scans(conn: Connection) -> None:
    """For the rest of this transaction, PostgreSQL reads a table through an index where it
    has one; nothing elsewhere.

    For reads whose every statement has an index that fits, where the planner's estimate of
    two correlated conditions is far off: an input type's P99 tail of a day (estimated at
    many times its traces from input type and duration taken apart) was read by scanning the
    whole traces table, far slower than through its tail index."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL enable_seqscan = off"))


def plan_for_parameters(conn: Connection) -> None:
    """For the rest of this transaction, PostgreSQL plans every statement for its own
    parameters; nothing elsewhere.

    psycopg prepares a statement it has run five times, and PostgreSQL may then keep one
    generic plan for any parameters. For reads whose best plan depends on the window (a
    Compare's stretches of one service's spans) that plan was the wrong one: a day's Compare
    of one pair was far slower on every call after the first than planned each time. Not for
    every read: planning each statement anew made the raw-span reads slower (docs/benchmarks.md)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))


def one_of(conn: Connection, column, values: list, item_type):
    """``column`` equals one of ``values`` (of SQL type ``item_type``). On PostgreSQL ``=
    ANY(array)``, the values bound as one array: a whole-trace Compare's root look-up,
    thousands of start times and as many trace ids, binds, plans and runs much faster as two
    arrays than as two ``IN`` lists there. On SQLite ``IN`` the rows of ``json_each`` of one
    JSON text: the same plan as an ``IN`` list, without expanding thousands of parameters
    into the statement on every call."""
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam(None, list(values), type_=postgresql.ARRAY(item_type)))
    if conn.dialect.name == "sqlite":
        listed = func.json_each(bindparam(None, orjson.dumps(list(values)).decode(), type_=String))
        return column.in_(select(literal_column("value")).select_from(listed).scalar_subquery())
    return column.in_(values)


def supports_skip_locked(conn: Connection) -> bool:
    # SQLite serialises writers with BEGIN IMMEDIATE; row locks exist only on PostgreSQL.
    return conn.dialect.name == "postgresql"


#: A temporary table of each PostgreSQL connection that a write's spans are copied into
#: (emptied at every commit), then inserted from in one statement.
SPANS_IN = "modalscope_spans_in"


def insert_spans(conn: Connection, columns: tuple[str, ...], rows: list[tuple]) -> tuple[int, set[str]]:
    """Insert span rows (tuples in ``columns`` order; trace_id first), skipping stored ones.

    Returns (spans inserted, trace ids of the inserted spans). SQLite takes a plain
    ``executemany`` (its rowcount is exact); the trace ids then are all the batch's — a
    resent trace merely settles again to the same result. PostgreSQL copies the rows into
    a temporary table and inserts from there with RETURNING.
    """
    if conn.dialect.name == "sqlite":
        cols = ", ".join(columns)
        marks = ", ".join("?" * len(columns))
        sql = f"INSERT INTO spans ({cols}) VALUES ({marks}) ON CONFLICT (trace_id, span_id) DO NOTHING"
        cursor = conn.connection.driver_connection.cursor()
        try:
            cursor.executemany(sql, rows)
            inserted = cursor.rowcount
        finally:
            cursor.close()
        return inserted, ({r[0] for r in rows} if inserted else set())
    # COPY into a temporary table, then one INSERT ... SELECT that skips stored spans and
    # returns the new ones' trace ids (the driver's executemany rowcount also counts skipped
    # rows). Faster than psycopg's pipelined INSERTs, new spans or resent ones, and nothing
    # held per row: a pipeline kept every row's result until read, a lot for a large batch.
    # Each write creates the table when its connection has none (one cheap statement; no
    # flag to go stale when the transaction that created it rolls back). A write in the same
    # transaction as another copies its rows after the first's, which then conflict and are
    # skipped, so the counts stay exact.
    cols = ", ".join(columns)
    cursor = conn.connection.driver_connection.cursor()
    try:
        cursor.execute(f"CREATE TEMPORARY TABLE IF NOT EXISTS {SPANS_IN} ON COMMIT DELETE ROWS AS "
                       f"SELECT {cols} FROM {Span.__tablename__} WITH NO DATA")
        with cursor.copy(f"COPY {SPANS_IN} ({cols}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(f"INSERT INTO {Span.__tablename__} ({cols}) SELECT {cols} FROM {SPANS_IN} "
                       "ON CONFLICT (trace_id, span_id) DO NOTHING RETURNING trace_id")
        new_ids = [r[0] for r in cursor.fetchall()]
    finally:
        cursor.close()
    return len(new_ids), set(new_ids)


def mark_traces_pending(conn: Connection, traces: list[tuple[str, int]], now_ns: int) -> None:
    """Create or re-open trace rows: pending, last seen now; ``traces`` is (trace id, earliest
    start of its spans in this write), kept as ``first_start_ns`` (the earlier of the stored
    and the new; an unknown, NULL, stays unknown).

    The driver's own executemany: SQLAlchemy's bound values a row cost too much on the
    writer's hot path (one row a trace a request).
    """
    mark = "?" if conn.dialect.name == "sqlite" else "%s"
    true, false = ("1", "0") if conn.dialect.name == "sqlite" else ("true", "false")
    t = Trace.__tablename__
    sql = (f"INSERT INTO {t} (trace_id, pending, last_seen_ns, first_start_ns, version, start_ns, duration_ns, "
           f"span_count, error, input_type) VALUES ({mark}, {true}, {mark}, {mark}, 1, 0, 0, 0, {false}, 'unknown') "
           "ON CONFLICT (trace_id) DO UPDATE SET pending = excluded.pending, "
           f"last_seen_ns = excluded.last_seen_ns, version = {t}.version + 1, "
           f"first_start_ns = CASE WHEN excluded.first_start_ns < {t}.first_start_ns "
           f"THEN excluded.first_start_ns ELSE {t}.first_start_ns END")
    cursor = conn.connection.driver_connection.cursor()
    try:
        cursor.executemany(sql, [(tid, now_ns, first) for tid, first in traces])
    finally:
        cursor.close()


def contains_text(conn: Connection, column, needle: str):
    """A plain substring test: ``instr`` on SQLite (cheaper than LIKE), LIKE elsewhere."""
    return contains_text_in(conn.dialect.name, column, needle)


def contains_text_in(dialect_name: str, column, needle: str):
    """``contains_text`` for a dialect named ``dialect_name``."""
    if dialect_name == "sqlite":
        return func.instr(column, needle) > 0
    return column.contains(needle, autoescape=True)


def json_member(conn: Connection, column, key: str, scalar_types: bool = False, strings_only: bool = False):
    """The value of top-level ``key`` in a JSON-object text column, NULL when absent or JSON
    null; other values as the engine gives them (SQLite: its SQL type, objects as JSON text;
    PostgreSQL: text). ``scalar_types``: only numbers and strings, anything else NULL;
    ``strings_only``: only strings. The JSON is parsed only in rows whose text mentions the key."""
    mentioned = contains_text(conn, column, f'"{key}"')  # keys here are plain names
    if conn.dialect.name == "sqlite":
        path = '$."' + key + '"'
        value = func.json_extract(column, path)
        if scalar_types or strings_only:
            types = ("text",) if strings_only else ("integer", "real", "text")
            mentioned = and_(mentioned, func.json_type(column, path).in_(types))
    else:
        doc = cast(column, postgresql.JSONB)
        value = doc[key].astext
        if scalar_types or strings_only:
            types = ("string",) if strings_only else ("number", "string")
            mentioned = and_(mentioned, func.jsonb_typeof(doc[key]).in_(types))
    return case((mentioned, value), else_=literal(None))


def rows_with_keys(conn: Connection, table: Table, time_col: str, keys: list[tuple[int, int]], *,
                   lock: bool = False):
    """Rows (mappings) of a rollup table whose ``(time_col, series_id)`` is one of ``keys``
    (at most a few hundred). SQLite 3.40 answers ``(a, b) IN (VALUES ...)`` by scanning the
    whole table (a settle batch's look-up slowed the settler as the store grew); joined from
    a VALUES list it looks each key up in the primary key. ``lock``: FOR UPDATE (PostgreSQL),
    in key order."""
    if not keys:
        return iter(())
    if conn.dialect.name == "sqlite":
        # (table and column names are the models' own, never input; through the driver: a
        # text() of 800 named parameters cost more to parse than the look-up)
        sql = (f"WITH k(t, s) AS (VALUES {', '.join(['(?, ?)'] * len(keys))}) SELECT r.* FROM k "
               f"JOIN {table.name} AS r ON r.{time_col} = k.t AND r.series_id = k.s")
        return conn.exec_driver_sql(sql, tuple(int(v) for key in keys for v in key)).mappings()
    q = select(table).where(tuple_(table.c[time_col], table.c.series_id).in_(keys)).order_by(
        table.c[time_col], table.c.series_id)
    return conn.execute(q.with_for_update() if lock else q).mappings()


def write_many(conn: Connection, table: Table, columns: list[str], rows: list[tuple]) -> None:
    """INSERT ``rows`` (tuples in ``columns`` order). On SQLite straight through the
    driver's ``executemany``: a settle batch writes tens of thousands of rollup rows, and
    building a parameter dict a row through SQLAlchemy cost more than SQLite's own insert."""
    if not rows:
        return
    if conn.dialect.name == "sqlite":
        # (table and column names are the models' own, never input)
        conn.exec_driver_sql(f"INSERT INTO {table.name} ({', '.join(columns)}) "
                             f"VALUES ({', '.join('?' * len(columns))})", rows)
        return
    conn.execute(table.insert(), [dict(zip(columns, r)) for r in rows])


def update_many(conn: Connection, table: Table, columns: list[str], keys: list[str], rows: list[tuple]) -> None:
    """UPDATE ``columns`` of the rows whose ``keys`` match, from tuples of ``columns`` then
    ``keys`` values (as ``write_many``, through the driver on SQLite)."""
    if not rows:
        return
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"UPDATE {table.name} SET {', '.join(f'{c} = ?' for c in columns)} "
                             f"WHERE {' AND '.join(f'{k} = ?' for k in keys)}", rows)
        return
    stmt = (table.update().where(*(table.c[k] == bindparam(f"k_{k}") for k in keys))
            .values({c: bindparam(f"v_{c}") for c in columns}))
    names = [f"v_{c}" for c in columns] + [f"k_{k}" for k in keys]
    conn.execute(stmt, [dict(zip(names, r)) for r in rows])


def keys_clause(conn: Connection, table: Table, time_col: str, keys: list[tuple[int, int]]):
    """WHERE ``(time_col, series_id)`` is one of ``keys`` (at most a few hundred: SQLite nests
    each OR one level deeper, up to 1,000). On SQLite an OR of key equalities, which it
    answers with a primary-key lookup each (a row-value IN scans the table, see
    ``rows_with_keys``)."""
    if conn.dialect.name == "sqlite":
        return or_(*[and_(table.c[time_col] == int(t), table.c.series_id == int(sid)) for t, sid in keys])
    return tuple_(table.c[time_col], table.c.series_id).in_(keys)
