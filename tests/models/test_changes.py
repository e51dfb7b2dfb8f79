"""The rollup change log (models/changes.py), on SQLite and PostgreSQL: writes over nearby
minutes logged close together share a row (its range and stamp widened, never narrowed), so
the log of live traffic stays a few rows an hour and every question about it is one short
read; writes far apart in minutes or in time keep rows of their own."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from modalscope.models import RollupChange, changes

S = 1_000_000_000


def _rows(engine) -> list[tuple[int, int, int]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(RollupChange.first_minute, RollupChange.last_minute,
                                                      RollupChange.changed_ns).order_by(RollupChange.id))]


def test_nearby_writes_logged_close_together_share_a_row_that_says_what_each_said(engine):
    now = time.time_ns()
    m = now // (60 * S)
    with engine.begin() as conn:
        changes.record(conn, m - 1, m - 1, now_ns=now - 4 * S)
    with engine.begin() as conn:
        changes.record(conn, m, m, now_ns=now - 2 * S)
    assert _rows(engine) == [(m - 1, m, now - 2 * S)]
    with engine.connect() as conn:
        # A result computed between the two writes: the second touched minute m (and the
        # merged row says m - 1 too: more than was, never less).
        assert changes.changed_since(conn, now - 3 * S, m, m)
        assert changes.changed_since(conn, now - 3 * S, m - 1, m - 1)
        assert not changes.changed_since(conn, now - 3 * S, m + 1, m + 5)
        assert not changes.changed_since(conn, now - S, m - 1, m)
        assert changes.changes_since(conn, now - 3 * S, 10) == [(m - 1, m)]
    # A late trace from hours ago, logged at once: a row of its own (it would otherwise mark
    # every minute between changed); and the next live write still merges with its row.
    with engine.begin() as conn:
        changes.record(conn, m - 180, m - 180, now_ns=now - S)
        changes.record(conn, m, m + 1, now_ns=now)
    assert _rows(engine) == [(m - 1, m + 1, now), (m - 180, m - 180, now - S)]
    # Past MERGE_S, or past MERGE_SPAN_MINUTES, a new row.
    later = now + (changes.MERGE_S + 1) * S
    with engine.begin() as conn:
        changes.record(conn, m + 1, m + 1, now_ns=later)
        changes.record(conn, m + 2 + changes.MERGE_SPAN_MINUTES, m + 2 + changes.MERGE_SPAN_MINUTES,
                       now_ns=later + S)
    far = m + 2 + changes.MERGE_SPAN_MINUTES
    assert _rows(engine)[2:] == [(m + 1, m + 1, later), (far, far, later + S)]
    # Retention and retag (every minute up to a point) never merge with live minutes.
    with engine.begin() as conn:
        changes.record(conn, 0, m - 10_000, now_ns=later + 2 * S)
    assert _rows(engine)[-1] == (0, m - 10_000, later + 2 * S)


def test_a_settler_committing_every_second_for_a_quarter_hour_logs_a_few_rows(engine):
    """Live traffic: a batch a second over the current minute and the one before. The log
    keeps every change (a question about any of those minutes since any moment before the
    last write says changed) in a few rows, read at once."""
    start = time.time_ns() - 900 * S
    for i in range(900):
        t = start + i * S
        m = t // (60 * S)
        with engine.begin() as conn:
            changes.record(conn, m - 1, m, now_ns=t)
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(RollupChange)).scalar_one()
        logged = changes.changes_since(conn, start, changes.READ_AT_MOST)
        assert 900 // 60 // changes.MERGE_SPAN_MINUTES <= n <= 4 and logged is not None and len(logged) == n
        for i in range(0, 900, 37):  # every minute written after moment i is still said changed
            t = start + i * S
            m = t // (60 * S)
            assert changes.changed_since(conn, t, m, m), i
