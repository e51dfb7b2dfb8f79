"""Looking rollup rows up by (time, series) key: the settler does it every batch, so on
SQLite it must use the primary key, not scan the table (a row-value IN does, and the
settler slowed as the store grew: 125-1,079 ms a 400-key lookup on a day's rollups)."""

from __future__ import annotations

import random

from sqlalchemy import BigInteger, String, delete, func, insert, select

from modalscope.models import Rollup, Series
from modalscope.models.dialect import keys_clause, one_of, rows_with_keys


def _fill(engine, minutes: int, series: int) -> None:
    with engine.begin() as conn:
        conn.execute(insert(Series.__table__), [
            {"id": 900_000 + s, "key_hash": f"k{s:060d}", "kind": "pair", "service": "a", "name": "",
             "stage": "", "input_type": "", "caller": "a", "callee": f"b{s}"} for s in range(series)])
        conn.execute(insert(Rollup.__table__), [
            {"minute": 29_000_000 + m, "series_id": 900_000 + s, "count": m * 1000 + s, "error_count": 0,
             "sum_ns": 0, "sketch": b""} for m in range(minutes) for s in range(series)])


def test_rows_with_keys_returns_exactly_the_keyed_rows_and_deletes_exactly_them(engine):
    _fill(engine, 60, 7)
    rng = random.Random(1)
    keys = sorted({(29_000_000 + rng.randrange(60), 900_000 + rng.randrange(7)) for _ in range(3000)})[:400]
    keys_plus_missing = keys + [(29_000_000 + 61, 900_000), (29_000_000, 900_000 + 99)]
    table = Rollup.__table__
    with engine.begin() as conn:
        got = {(r["minute"], r["series_id"]): r["count"]
               for r in rows_with_keys(conn, table, "minute", keys_plus_missing, lock=True)}
        assert got == {(m, s): (m - 29_000_000) * 1000 + (s - 900_000) for m, s in keys}
        assert list(rows_with_keys(conn, table, "minute", [])) == []
        assert len(keys) == 400  # the most either is given at once (SQLite nests ORs up to 1,000)
        conn.execute(delete(Rollup).where(keys_clause(conn, table, "minute", keys[:399])))
        left = conn.execute(select(func.count()).select_from(Rollup).where(Rollup.series_id >= 900_000)).scalar_one()
        assert left == 60 * 7 - 399
        assert list(rows_with_keys(conn, table, "minute", keys[:399])) == []
        assert len(list(rows_with_keys(conn, table, "minute", keys[399:]))) == 1


def test_one_of_matches_exactly_the_listed_values_of_either_type(engine):
    """``one_of`` (PostgreSQL: ``= ANY(array)``, SQLite: ``IN``) keeps exactly the rows whose
    value is listed: integers, strings (also through an expression), none."""
    _fill(engine, 30, 4)
    minutes = [29_000_000 + m for m in (0, 7, 29, 45)]  # 45: no such minute
    with engine.connect() as conn:
        rows = conn.execute(select(Rollup.minute, Rollup.series_id).where(
            one_of(conn, Rollup.minute, minutes, BigInteger), Rollup.series_id >= 900_000)).all()
        assert sorted(rows) == [(m, 900_000 + s) for m in minutes[:3] for s in range(4)]
        callees = conn.execute(select(Series.callee).where(
            one_of(conn, Series.callee.concat(""), ["b1", "b3", "nobody"], String))).scalars().all()
        assert sorted(callees) == ["b1", "b3"]
        assert conn.execute(select(Rollup.minute).where(one_of(conn, Rollup.minute, [], BigInteger))).all() == []


def test_one_of_binds_any_text_and_nanosecond_integers_as_they_are(engine):
    """The values are bound, never spliced into the SQL (SQLite: one JSON text): quotes,
    backslashes, JSON-looking text and non-ASCII match only themselves, and integers keep
    every bit up to int64's largest, across thousands of values."""
    odd = ["o'brien", 'say "hi"', "back\\slash", "[1, 2]", "ünïcødé ✓", "", "null"]
    big = [1_764_504_030_123_456_789, 2**63 - 1, -(2**63), 0]
    with engine.begin() as conn:
        conn.execute(insert(Series.__table__), [
            {"id": 910_000 + i, "key_hash": f"odd{i:057d}", "kind": "pair", "service": "a", "name": "",
             "stage": "", "input_type": "", "caller": "odd", "callee": c} for i, c in enumerate(odd)])
        conn.execute(insert(Rollup.__table__), [
            {"minute": m, "series_id": 910_000, "count": 1, "error_count": 0, "sum_ns": v, "sketch": b""}
            for m, v in enumerate(big)])
    with engine.connect() as conn:
        def callees(values):
            return sorted(conn.execute(select(Series.callee).where(
                Series.caller == "odd", one_of(conn, Series.callee, values, String))).scalars().all())

        assert callees(odd) == sorted(odd)
        assert callees(["o'brien", "[1, 2]", "1, 2", "o\\'brien"]) == ["[1, 2]", "o'brien"]
        assert callees(['"null"', "NULL"]) == []
        many = [f"x{i}" for i in range(5_000)] + ["ünïcødé ✓"]
        assert callees(many) == ["ünïcødé ✓"]
        sums = conn.execute(select(Rollup.sum_ns).where(
            Rollup.series_id == 910_000, one_of(conn, Rollup.sum_ns, [big[0], big[1], big[0] + 1], BigInteger))).scalars()
        assert sorted(sums) == [big[0], big[1]]


def test_planner_settings_last_their_transaction_only(engine):
    """``no_sequential_scans`` and its siblings change PostgreSQL's planning for the rest of
    one transaction: the same pooled connection plans as usual afterwards; on SQLite they
    run nothing."""
    from sqlalchemy import event

    from modalscope.models.dialect import index_by_bitmap, no_sequential_scans, plan_for_parameters

    ran: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda c, cur, stmt, *a: ran.append(stmt))
    with engine.connect() as conn:
        for setting in (no_sequential_scans, index_by_bitmap, plan_for_parameters):
            setting(conn)
        if engine.dialect.name != "postgresql":
            assert ran == []
            return
        assert conn.exec_driver_sql("SHOW enable_seqscan").scalar_one() == "off"
        conn.commit()  # (a plain SET would outlive the commit)
        assert [conn.exec_driver_sql(f"SHOW {name}").scalar_one()
                for name in ("enable_seqscan", "enable_indexscan", "plan_cache_mode")] == ["on", "on", "auto"]
