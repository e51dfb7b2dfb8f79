"""What every read of the store shares: the engine reads go through (``ReadContext``), the
retention boundary and the series filters (plain functions over a connection)."""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Iterator

from sqlalchemy import Connection, Engine, and_, func, or_, select

from .. import MINUTE_BOUNDARY_CURSOR, Cursor, Series
from .. import packs
from ..engine import dict_rows, plain_rows  # noqa: F401  (re-exported: the readers fetch rows with them)
from ...durations import MINUTE_NS as NS_PER_MINUTE  # noqa: F401  (for the readers by concern)


@dataclass(frozen=True)
class Filters:
    """Filters that narrow any query; None means "any"."""

    service: str | None = None
    caller: str | None = None
    callee: str | None = None
    stage: str | None = None
    input_type: str | None = None
    # A pair's model (the series' ``name``: a model call's requested model, '' otherwise).
    model: str | None = None


# Pair series written before they carried the calling span's stage have '' there: every
# call was a CLIENT span then, counted as network.
PAIR_STAGE_BEFORE = ""


class ReadContext:
    """The state every concern's reader holds: the engine, the engine reads go through and
    the pack cache (one context a ``StoreReader``, shared by its readers)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Reads on PostgreSQL run in autocommit: under READ COMMITTED each statement takes its
        # own snapshot anyway, and a transaction costs two more round trips a checkout (its
        # BEGIN and the pool's ROLLBACK, as much as a short read's own time).
        # The same pool; ``engine`` itself is untouched for the callers that write through it.
        # On SQLite reads begin deferred, also through a write engine (the settler's
        # evaluations): a read takes no write lock.
        self.reads = (engine.execution_options(isolation_level="AUTOCOMMIT")
                      if engine.dialect.name == "postgresql" else engine.execution_options(modalscope_deferred=True))
        self.pack_cache = packs.PackCache()  # decoded hour packs kept between reads
        self._pinned = threading.local()

    def connect(self):
        """A connection for one read: the one ``pinned`` holds on this thread, else one from
        the pool (closed at the end of the ``with`` block)."""
        conn = getattr(self._pinned, "conn", None)
        return contextlib.nullcontext(conn) if conn is not None else self.reads.connect()

    def transaction(self):
        """A connection for a read that sets ``SET LOCAL`` options (a transaction of its own on
        PostgreSQL); on SQLite, the pinned one when there is one."""
        if self.engine.dialect.name == "sqlite":
            return self.connect()
        return self.engine.connect()

    @contextlib.contextmanager
    def pinned(self, memo: dict | None = None) -> Iterator[None]:
        """Every read on this thread inside the block goes through one connection: an
        evaluation's few hundred reads pay one checkout (and on SQLite one ``BEGIN``) instead
        of one each, and on SQLite they read one snapshot. Nested blocks share the outer one.
        ``memo``: another block's ``memo()``, so a block on a helper thread shares what its
        evaluation already looked up (``once_per_block``)."""
        if getattr(self._pinned, "conn", None) is not None:
            yield
            return
        with self.reads.connect() as conn:
            self._pinned.conn, self._pinned.memo = conn, ({} if memo is None else memo)
            try:
                yield
            finally:
                self._pinned.conn = self._pinned.memo = None

    def memo(self) -> dict | None:
        """This thread's pinned block's memo (None outside a block), to hand to ``pinned``."""
        return getattr(self._pinned, "memo", None)

    def once_per_block(self, key, read, conn: Connection | None = None):
        """``read(conn)``, looked up once per pinned block under ``key`` (every time outside
        one): for the small facts an evaluation's look-ups each ask again. ``conn``: the
        connection the caller already holds, to read through (none: ``connect``)."""
        memo = getattr(self._pinned, "memo", None)
        if memo is not None and key in memo:
            return memo[key]
        with contextlib.nullcontext(conn) if conn is not None else self.connect() as held:
            found = read(held)
        if memo is not None:
            memo[key] = found
        return found

    def time_range(self, model) -> tuple[int | None, int | None]:
        """The first and last ``start_ns`` ``model``'s table holds (a trace row written before
        its trace settles starts at 0 and is left out); looked up once per pinned block."""
        # Two scalar subqueries: SQLite answers a lone min() or max() from the index's ends,
        # but min() and max() in one SELECT scan the whole index (slow on a large store).
        return self.once_per_block(("time_range", model),
                                   lambda conn: tuple(conn.execute(_time_range_statement(model)).one()))


@functools.cache
def _time_range_statement(model):
    return select(select(func.min(model.start_ns)).where(model.start_ns > 0).scalar_subquery(),
                  select(func.max(model.start_ns)).scalar_subquery())


def minutes_kept_from(conn) -> int | None:
    """The oldest minute whose minute rollups retention keeps (it records the boundary
    when it prunes; MODALSCOPE_MINUTE_ROLLUP_DAYS): windows before it are answered
    from hourly rows. One primary-key lookup; None when nothing was ever pruned."""
    return conn.execute(select(Cursor.position).where(Cursor.name == MINUTE_BOUNDARY_CURSOR)).scalar()


def series_filter(kind: str, f: Filters):
    """The condition on ``Series`` of the ``kind`` series ``f`` selects."""
    conds = [Series.kind == kind]
    if kind == "pair":
        if f.service:
            conds.append(or_(Series.caller == f.service, Series.callee == f.service))
    elif f.service:
        conds.append(Series.service == f.service)
    if f.caller and kind == "pair":
        conds.append(Series.caller == f.caller)
    if f.callee and kind == "pair":
        conds.append(Series.callee == f.callee)
    if f.stage and kind in ("op", "tstage"):
        conds.append(Series.stage == f.stage)
    if f.stage and kind == "pair":
        # the calling span's stage
        conds.append(Series.stage.in_((f.stage, PAIR_STAGE_BEFORE)) if f.stage == "network"
                     else Series.stage == f.stage)
    if f.model and kind == "pair":
        conds.append(Series.name == f.model)
    if f.input_type:
        conds.append(Series.input_type == f.input_type)
    return and_(*conds)


def services_in(conn: Connection, kind: str, filters: Filters) -> list[str]:
    """``RollupReader.services_of`` over a connection the caller already holds."""
    col = Series.caller if kind == "pair" else Series.service
    stmt = select(col).where(series_filter(kind, filters)).distinct()
    return sorted(v for v in conn.execute(stmt).scalars() if v)
