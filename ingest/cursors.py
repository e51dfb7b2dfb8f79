"""Named watermarks with leases, in the ``cursors`` table (Cloud Trace poller, metrics exporter).

One row a job (``cloud-trace:<project>``, ``export-metrics:<project>``): ``position`` is the
watermark, ``holder``/``lease_expires_ns`` the lease that makes one process the active one
when several run, ``info`` a JSON object of state for ``/api/v1/health``.

A lease is taken with one conditional UPDATE (free, expired or already ours), so two
processes racing for it cannot both win on SQLite or PostgreSQL. Every watermark move is
fenced by the holder: a process that lost its lease (paused past expiry, another took
over) cannot move the watermark back or forward.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, or_, select, update

from ..models import Cursor
from ..models.dialect import insert_ignore


def new_holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_is_dead(holder: str | None, me: str | None = None) -> bool:
    """Is ``holder`` (``host:pid:nonce``) a process of this host that no longer runs?

    A killed poller (SIGKILL, OOM) cannot release its lease; its restart on the same host
    takes the lease over at once instead of idling until it expires. Only a certain death
    counts: another host, a live pid, or a pid we may not signal keep the lease.
    """
    if not holder or holder == me:
        return False
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True  # an earlier run of this pid (a restarted container's pid 1): not us
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    try:  # a zombie (killed, not yet reaped by its parent) is dead too
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except OSError:
        return False


@dataclass
class CursorState:
    name: str
    position: int
    holder: str | None
    lease_expires_ns: int
    updated_ns: int
    info: dict[str, Any]


def _state(row) -> CursorState:
    try:
        info = json.loads(row.info) if row.info else {}
    except ValueError:
        info = {}
    return CursorState(row.name, row.position or 0, row.holder, row.lease_expires_ns or 0, row.updated_ns or 0,
                       info if isinstance(info, dict) else {})


def read_cursor(engine: Engine, name: str) -> CursorState | None:
    with engine.connect() as conn:
        row = conn.execute(select(Cursor.__table__).where(Cursor.name == name)).first()
    return None if row is None else _state(row)


def read_cursors(engine: Engine, prefix: str) -> list[CursorState]:
    with engine.connect() as conn:
        rows = conn.execute(select(Cursor.__table__).where(Cursor.name.startswith(prefix, autoescape=True))
                            .order_by(Cursor.name)).all()
    return [_state(r) for r in rows]


class LeaseLost(Exception):
    """Another process holds the lease now; this one must stop working on the cursor."""


class Lease:
    """The lease on one cursor row, held by ``holder`` for ``ttl`` seconds at a time."""

    def __init__(self, engine: Engine, name: str, ttl: float, holder: str | None = None) -> None:
        self.engine = engine
        self.name = name
        self.ttl = ttl
        self.holder = holder or new_holder_id()
        self.held = False

    def _ensure_row(self, conn) -> None:
        conn.execute(insert_ignore(conn, Cursor.__table__, ["name"]),
                     [{"name": self.name, "position": 0, "holder": None, "lease_expires_ns": 0,
                       "updated_ns": 0, "info": None}])

    def acquire(self, now_ns: int | None = None) -> bool:
        """Take (or renew) the lease if it is free, expired, ours, or held by a dead process
        of this host (:func:`holder_is_dead`). True when held."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self.engine.begin() as conn:
            self._ensure_row(conn)
            res = conn.execute(
                update(Cursor)
                .where(Cursor.name == self.name,
                       or_(Cursor.holder.is_(None), Cursor.holder == self.holder, Cursor.lease_expires_ns < now_ns))
                .values(holder=self.holder, lease_expires_ns=now_ns + int(self.ttl * 1e9))
            )
            self.held = res.rowcount == 1
        if not self.held:
            current = read_cursor(self.engine, self.name)
            if current is not None and holder_is_dead(current.holder, self.holder):
                with self.engine.begin() as conn:  # fenced on the dead holder: one taker wins
                    res = conn.execute(
                        update(Cursor).where(Cursor.name == self.name, Cursor.holder == current.holder)
                        .values(holder=self.holder, lease_expires_ns=now_ns + int(self.ttl * 1e9))
                    )
                    self.held = res.rowcount == 1
        return self.held

    def renew(self, now_ns: int | None = None) -> None:
        """Extend the lease; LeaseLost if another process has taken it."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self.engine.begin() as conn:
            res = conn.execute(
                update(Cursor).where(Cursor.name == self.name, Cursor.holder == self.holder)
                .values(lease_expires_ns=now_ns + int(self.ttl * 1e9))
            )
        if res.rowcount != 1:
            self.held = False
            raise LeaseLost(f"lease on {self.name} was taken by another process")

    def release(self) -> None:
        if not self.held:
            return
        with self.engine.begin() as conn:
            conn.execute(update(Cursor).where(Cursor.name == self.name, Cursor.holder == self.holder)
                         .values(holder=None, lease_expires_ns=0))
        self.held = False

    def state(self) -> CursorState:
        st = read_cursor(self.engine, self.name)
        assert st is not None
        return st

    def save(self, *, position: int | None = None, info: dict[str, Any] | None = None,
             now_ns: int | None = None) -> None:
        """Move the watermark and/or replace ``info``, only while we hold the lease (fenced)."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        values: dict[str, Any] = {"updated_ns": now_ns, "lease_expires_ns": now_ns + int(self.ttl * 1e9)}
        if position is not None:
            values["position"] = position
        if info is not None:
            values["info"] = json.dumps(info, separators=(",", ":"), sort_keys=True)
        with self.engine.begin() as conn:
            res = conn.execute(update(Cursor).where(Cursor.name == self.name, Cursor.holder == self.holder)
                               .values(**values))
        if res.rowcount != 1:
            self.held = False
            raise LeaseLost(f"lease on {self.name} was taken by another process")
