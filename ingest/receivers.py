"""Both OTLP receivers of one process, and extra receiver processes sharing their ports.

One Python process decodes, tags and writes on one core (the GIL), so
``modalscope ingest otlp --processes N`` starts N-1 more receiver processes that bind the
same two ports with ``SO_REUSEPORT``: the kernel spreads connections over the processes,
each decodes on its own core and writes through its own writer (the store serialises the
commits; inserts are idempotent). Only the first process runs the settler.

The receivers' servers and the pipeline are imported when a process starts them: a
receiver process imports only what it runs.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Engine

from ..settings import Settings

log = logging.getLogger(__name__)

#: Seconds a stopping receiver waits for requests it took to be committed and answered.
SHUTDOWN_GRACE = 20.0
#: Seconds an extra receiver process may take to start listening.
START_TIMEOUT = 60.0


@dataclass
class Receivers:
    """The OTLP/HTTP and OTLP/gRPC receivers of this process over one pipeline."""

    http_port: int
    grpc_port: int
    stop: Callable[[], None]


def start_receivers(settings: Settings, engine: Engine, rules=None, settle: bool | str = "process",
                    *, reuse_port: bool = False, evaluations=None) -> Receivers:
    """Start the pipeline and both OTLP receivers. ``reuse_port``: bind with SO_REUSEPORT,
    so other receiver processes can share the ports (see :class:`ReceiverProcesses`);
    ``evaluations``: what the settler evaluates between passes (``IngestPipeline``)."""
    from .memory import limit_arenas
    from .otlp_grpc import serve_grpc
    from .otlp_http import IngestGate, create_ingest_app, serve_http
    from .pipeline import IngestPipeline

    limit_arenas()
    pipeline = IngestPipeline(engine, settings, rules, settle=settle, limit_lag=True, evaluations=evaluations).start()
    gate = IngestGate()
    http_server = grpc_server = None
    try:
        http_server = serve_http(create_ingest_app(pipeline, settings, gate=gate), settings.bind,
                                 settings.otlp_http_port, reuse_port=reuse_port)
        grpc_server = serve_grpc(pipeline, settings, settings.bind, settings.otlp_grpc_port, reuse_port=reuse_port)
    except BaseException:
        if http_server is not None:
            http_server.shutdown()
        pipeline.close()
        raise

    def stop() -> None:
        # Drain: take nothing new, answer every request already taken once its spans are
        # committed (the writer still runs), then write whatever is left and stop.
        grpc_stopped = grpc_server.stop(grace=SHUTDOWN_GRACE)
        gate.draining = True
        http_server.shutdown()
        if not gate.drain(SHUTDOWN_GRACE):
            log.warning("stopping with %d OTLP/HTTP request(s) still waiting for the store", gate.inflight)
        grpc_stopped.wait(SHUTDOWN_GRACE)
        pipeline.close()

    return Receivers(http_server.port, grpc_server.port, stop)


class ReceiverProcesses:
    """``count`` receiver processes on the (already bound) ports of ``settings``.

    Each runs :func:`run_receiver_process`: its own engine, pipeline (no settler) and both
    receivers bound with SO_REUSEPORT. ``start`` returns once every one listens, or raises
    the first one's error (and stops the others). ``check`` (called every second by the
    command) replaces a process that died — at most once every ``RESTART_EVERY`` seconds a
    slot, so one that cannot start does not spin. ``stop`` closes the control pipes: each
    process drains as ``modalscope ingest otlp`` does on Ctrl-C, then exits.
    """

    RESTART_EVERY = 10.0

    def __init__(self, settings: Settings, count: int) -> None:
        self.settings = settings
        self.count = count
        self._ctx = multiprocessing.get_context("spawn")  # gRPC does not survive fork
        self._procs: list = []
        self._pipes: list = []
        self._restart_at: list[float] = []
        self.restarts = 0

    def _spawn(self, slot: int):
        ours, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=run_receiver_process, args=(self.settings, theirs),
                                 name=f"modalscope-receiver-{slot + 2}", daemon=True)
        proc.start()
        theirs.close()
        return proc, ours

    @staticmethod
    def _wait_ready(proc, pipe, deadline: float) -> None:
        message = None
        while message is None:
            if pipe.poll(0.2):
                try:
                    message = pipe.recv()
                except EOFError:
                    message = ("error", f"receiver process exited with status {proc.exitcode}")
            elif not proc.is_alive() and not pipe.poll(0):
                message = ("error", f"receiver process exited with status {proc.exitcode}")
            elif time.monotonic() > deadline:
                message = ("error", f"receiver process did not start within {START_TIMEOUT:.0f} s")
        if message[0] != "ready":
            raise ReceiverStartError(message[1])

    def start(self) -> "ReceiverProcesses":
        for slot in range(self.count):
            proc, pipe = self._spawn(slot)
            self._procs.append(proc)
            self._pipes.append(pipe)
            self._restart_at.append(0.0)
        deadline = time.monotonic() + START_TIMEOUT
        try:
            for proc, pipe in zip(self._procs, self._pipes):
                self._wait_ready(proc, pipe, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def check(self) -> None:
        """Replace a receiver process that died (the kernel stopped sending it connections
        when its sockets closed; what it had acknowledged was committed)."""
        for slot, proc in enumerate(self._procs):
            if proc.is_alive() or time.monotonic() < self._restart_at[slot]:
                continue
            self._restart_at[slot] = time.monotonic() + self.RESTART_EVERY
            log.warning("receiver process %d exited with status %s; starting another", proc.pid, proc.exitcode)
            try:
                self._pipes[slot].close()
            except OSError:
                pass
            new, pipe = self._spawn(slot)
            self._procs[slot], self._pipes[slot] = new, pipe
            try:
                self._wait_ready(new, pipe, time.monotonic() + START_TIMEOUT)
            except ReceiverStartError as exc:
                log.warning("the replacement receiver process could not start (retried in %.0f s): %s",
                            self.RESTART_EVERY, exc)
                continue
            self.restarts += 1
            log.info("receiver process %d took over from %d", new.pid, proc.pid)

    def stop(self, wait: bool = True) -> None:
        """Ask every process to drain and exit; ``wait=False`` returns at once (then :meth:`join`)."""
        for pipe in self._pipes:
            try:
                pipe.close()  # the child sees EOF: it drains and exits
            except OSError:
                pass
        if wait:
            self.join()

    def join(self) -> None:
        for proc in self._procs:
            proc.join(SHUTDOWN_GRACE + 30)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


class ReceiverStartError(RuntimeError):
    """An extra receiver process could not start; ``str()`` is its one-line reason."""


def run_receiver_process(settings: Settings, control) -> None:
    """Entry point of an extra receiver process (spawned): serve until ``control`` closes."""
    from ..models.engine import make_engine
    from .runtime import tune_gc
    from .rules_file import load_rules

    tune_gc()
    # Ctrl-C reaches the whole process group; the first process decides when to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    logging.basicConfig(level=logging.DEBUG if os.environ.get("MODALSCOPE_DEBUG") == "1" else logging.INFO,
                        format=f"%(asctime)s %(levelname)s %(name)s[{os.getpid()}]: %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    engine = None
    try:
        engine = make_engine(settings.database_url, write=True)
        receivers = start_receivers(settings, engine, load_rules(settings.rules_path or None), settle=False,
                                    reuse_port=True)
    except Exception as exc:  # noqa: BLE001 - reported to the first process as one line
        text = str(exc).strip().splitlines()
        control.send(("error", text[0] if text else exc.__class__.__name__))
        if engine is not None:
            engine.dispose()
        return
    control.send(("ready", os.getpid()))
    try:
        while not stopping.is_set():
            if control.poll(0.5):
                try:
                    control.recv()
                except (EOFError, OSError):
                    break
    finally:
        receivers.stop()
        engine.dispose()


def with_ports(settings: Settings, http_port: int, grpc_port: int) -> Settings:
    """``settings`` with the ports actually bound (a configured 0 means any free port)."""
    return dataclasses.replace(settings, otlp_http_port=http_port, otlp_grpc_port=grpc_port)
