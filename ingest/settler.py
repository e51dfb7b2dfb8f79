"""Running the settler: its one loop (settle what is due, then the periodic jobs), in a thread
of the ingest process (:class:`Settler`) or a process of its own (:class:`SettlerProcess`).

The receiver imports this module to start the settler: the settling code is imported inside
the functions that run it, so it stays out of the receiver's memory."""

from __future__ import annotations

import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy import Engine, event

from .helper_process import end_process

__all__ = ["Settler", "SettlerJobs", "SettlerProcess", "final_settle", "settle_loop"]

log = logging.getLogger(__name__)

PASS_BATCHES = 20  # settle batches between two turns of the periodic jobs
#: Seconds an evaluation ahead of requests waits while the settler works off a backlog: an
#: evaluation a minute then comes at most this late, within the 90 s a stored one answers for.
EVALUATION_WAIT_S = 15.0


@dataclass(frozen=True)
class SettlerJobs:
    """The periodic work a settler does between passes: retention (a
    ``retention.RetentionPolicy``, every 10 minutes), packing closed hours of rollups every
    ``pack_every_s`` (0 never; None: ``models.packs.EVERY_S``, looked up where the settler
    runs, so a receiver whose settler is a process of its own never imports numpy), and
    ``evaluations``, a picklable ``engine -> schedule`` whose ``maybe_run()`` evaluates the
    anomaly catalog ahead of requests (None: not here)."""

    retention: Any = None
    pack_every_s: float | None = 0.0
    evaluations: Callable[[Engine], Any] | None = None


def settle_loop(engine: Engine, settle_seconds: float, interval: float, jobs: SettlerJobs,
                stopping: Callable[[float], bool], on_settled: Callable[[int], None] = lambda n: None) -> None:
    """The settler's one loop, in a thread or a process of its own: settle what has been idle
    long enough, then the jobs that are due, until ``stopping(wait_s)`` (waits up to
    ``wait_s``) says stop; then one last pass over what is due (the rest stays pending,
    durably, for the next settler)."""
    from ..models.packs import EVERY_S, PackSchedule
    from .retention import PruneSchedule
    from .settle import BatchSizer, settle_pass

    pruning = PruneSchedule(engine, jobs.retention)
    packing = PackSchedule(engine, EVERY_S if jobs.pack_every_s is None else jobs.pack_every_s)
    evaluating = jobs.evaluations(engine) if jobs.evaluations is not None else None
    sizer = BatchSizer()
    wait = interval
    backlog_since = None
    try:
        while not stopping(wait):
            # A pass stops after PASS_BATCHES so the jobs below get their turn; with more due,
            # the next pass starts at once.
            wait = interval
            backlog = False
            try:
                done = settle_pass(engine, settle_seconds=settle_seconds, max_batches=PASS_BATCHES, sizer=sizer)
                on_settled(done.settled)
                backlog = done.full
                if done.more:
                    wait = 0
                else:
                    wait = _until_due(engine, settle_seconds, interval)
            except Exception:  # noqa: BLE001 - keep settling; the next pass retries
                log.exception("settling failed")
            pruning.tick(should_stop=lambda: stopping(0))
            if not stopping(0):
                packing.maybe_run()
            if evaluating is None or stopping(0):
                continue
            # Catching up with a burst comes first (it is what makes spans queryable); an
            # evaluation waits for it, at most EVALUATION_WAIT_S, so it still comes in time
            # for requests to find one fresh.
            now = time.monotonic()
            if backlog:
                backlog_since = now if backlog_since is None else backlog_since
                if now - backlog_since < EVALUATION_WAIT_S:
                    continue
            else:
                backlog_since = None
            evaluating.maybe_run()
    finally:
        close = getattr(evaluating, "close", None)
        if close is not None:
            close()


def _until_due(engine: Engine, settle_seconds: float, interval: float) -> float:
    """Seconds until the oldest pending trace is due, within ``[interval / 5, interval]``: the
    last traces of a burst settle as soon as they have been idle long enough, not up to a
    whole interval later."""
    # (not at the top, where ``select`` is the standard library's module)
    from sqlalchemy import func, select

    from ..models import Trace

    try:
        with engine.connect() as conn:
            conn = conn.execution_options(modalscope_deferred=True)  # a read: no write lock
            oldest = conn.execute(select(func.min(Trace.last_seen_ns)).where(Trace.pending.is_(True))).scalar()
    except Exception:  # noqa: BLE001 - the next pass finds out what is wrong
        return interval
    if oldest is None:
        return interval
    due_in = (oldest + settle_seconds * 1e9 - time.time_ns()) / 1e9
    return min(interval, max(interval / 5, due_in))


def final_settle(engine: Engine, settle_seconds: float) -> int:
    from .settle import settle

    try:
        return settle(engine, settle_seconds=settle_seconds)
    except Exception:  # noqa: BLE001 - what is left settles on the next start
        log.exception("final settle failed")
        return 0


def run_settler_process(database_url: str, settle_seconds: float, interval: float, stop_reader,
                        jobs: SettlerJobs) -> None:
    """The settler process's work (``IngestPipeline(settle="process")``): runs until
    ``stop_reader.poll(wait_s)`` says its parent wrote to, or closed, the stop pipe.
    Ctrl-C goes to the parent, which stops us through the pipe."""
    from ..models.engine import make_engine
    from .runtime import tune_gc

    tune_gc()
    # Acknowledging spans comes first; settling may lag a burst and catch up after it.
    try:
        os.nice(5)
    except OSError:
        pass
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = make_engine(database_url, write=True)
    _small_page_cache(engine)
    try:
        settle_loop(engine, settle_seconds, interval, jobs, stopping=stop_reader.poll)
        final_settle(engine, settle_seconds)
    finally:
        engine.dispose()


class _StdinStop:
    """The stop pipe of a settler process: its stdin, which the parent keeps open while the
    settler should run (readable means a message or end of file: the parent is gone)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def poll(self, timeout: float) -> bool:
        return bool(select.select([self.fd], [], [], max(0.0, timeout))[0])


def _read_exactly(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("the parent closed the settler's stdin before sending its arguments")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def settler_process_main() -> None:
    """Entry point of the settler process: its arguments arrive pickled on stdin (their
    length first, 8 bytes), and stdin then stays open as the stop pipe."""
    fd = sys.stdin.fileno()
    size = int.from_bytes(_read_exactly(fd, 8), "big")
    database_url, settle_seconds, interval, jobs = pickle.loads(_read_exactly(fd, size))
    run_settler_process(database_url, settle_seconds, interval, _StdinStop(fd), jobs)


# Ctrl-C reaches the whole process group: ignored from the first line, the parent stops us.
# (A plain subprocess, not multiprocessing's spawn: no resource-tracker process beside it.)
_SETTLER_RUNNER = """\
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
from modalscope.ingest.settler import settler_process_main
settler_process_main()
"""


#: SQLite page cache of each of the settler process's connections, in MiB.
SETTLER_CACHE_MIB = 4


def _small_page_cache(engine: Engine) -> None:
    """A settler reads each batch's spans once, just after they were written (the operating
    system still caches those pages): a small page cache a connection settles as fast and
    leaves the ingest tree's memory to the receivers."""
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine, "connect")
    def _cache(dbapi_conn, _record):
        dbapi_conn.execute(f"PRAGMA cache_size=-{SETTLER_CACHE_MIB * 1024}")


class SettlerProcess:
    """The settler in its own process, so settling has a core of its own."""

    def __init__(self, database_url: str, settle_seconds: float, interval: float = 0.5,
                 jobs: SettlerJobs = SettlerJobs()) -> None:
        self._args = pickle.dumps((database_url, settle_seconds, interval, jobs))
        self._proc: subprocess.Popen | None = None

    def start(self) -> "SettlerProcess":
        # (the last argument names the process in ps and /proc/PID/cmdline)
        self._proc = subprocess.Popen([sys.executable, "-c", _SETTLER_RUNNER, "modalscope-settler"],
                                      stdin=subprocess.PIPE, close_fds=True)
        try:
            self._proc.stdin.write(len(self._args).to_bytes(8, "big") + self._args)
            self._proc.stdin.flush()
        except OSError:  # it died at once; stop() reaps it
            log.exception("could not start the settler process")
        return self

    def stop(self, final: bool = True) -> None:
        proc = self._proc
        if proc is None:
            return
        # Closing its stdin is enough (the child sees end of file) and never blocks.
        try:
            proc.stdin.close()
        except OSError:
            pass
        end_process(proc, 60)


class Settler:
    """Background thread settling idle traces every ``interval`` seconds (``settle_loop``)."""

    def __init__(self, engine: Engine, settle_seconds: float, interval: float = 0.5,
                 jobs: SettlerJobs = SettlerJobs()) -> None:
        self.engine = engine
        self.settle_seconds = settle_seconds
        self.interval = interval
        self.jobs = jobs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modalscope-settler", daemon=True)
        self.settled = 0

    def start(self) -> "Settler":
        self._thread.start()
        return self

    def _run(self) -> None:
        settle_loop(self.engine, self.settle_seconds, self.interval, self.jobs, stopping=self._stop.wait,
                    on_settled=self._count)

    def _count(self, n: int) -> None:
        self.settled += n

    def stop(self, final: bool = True) -> None:
        self._stop.set()
        self._thread.join(30)
        if final:
            self.settled += final_settle(self.engine, self.settle_seconds)
