"""Periodic work run in a short-lived process of its own, started from the settler's loop.

The settler evaluates the anomaly catalog ahead of requests every minute or so; the analysis
layer it needs (the detectors, pandas) would stay in the settler's memory for good once
imported. Run in a child that exits when done, that memory is held only while it runs.
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import time
from typing import Callable

from ..core.every import Every

__all__ = ["PeriodicProcess", "end_process"]

log = logging.getLogger(__name__)

# The child reads its picklable target from stdin and calls it. Ctrl-C reaches the whole
# process group; the settler decides when its helper stops.
_RUNNER = """\
import logging, pickle, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
pickle.load(sys.stdin.buffer)()
"""

#: Seconds a stopping settler gives a running helper to finish before ending it.
STOP_GRACE = 5.0


class PeriodicProcess:
    """Calls ``target`` (picklable, no arguments) in a new Python process every ``every_s``
    seconds, the first after ``first_delay_s``; never two at once. ``maybe_run()`` is called
    between settle passes: it reaps a finished helper and starts the next one when due."""

    def __init__(self, target: Callable[[], object], every_s: float, *, first_delay_s: float = 0.0,
                 name: str = "helper") -> None:
        self.target = target
        self.every_s = every_s
        self.name = name
        self._payload = pickle.dumps(target)
        self._every = Every(every_s, first_delay_s)
        self._proc: subprocess.Popen | None = None
        self.runs = 0

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def maybe_run(self, now: float | None = None) -> bool:
        """Start the helper if it is due and none is running; returns whether it started."""
        self._reap()
        if self._proc is not None or not self._every.due(now):
            return False
        try:
            proc = subprocess.Popen([sys.executable, "-c", _RUNNER], stdin=subprocess.PIPE, close_fds=True)
        except OSError:
            log.exception("could not start the %s process", self.name)
            return False
        try:
            proc.stdin.write(self._payload)
            proc.stdin.close()
        except OSError:  # it died at once: reaped (and its status logged) on the next call
            pass
        self._proc = proc
        self.runs += 1
        return True

    def _reap(self) -> None:
        if self._proc is None or self._proc.poll() is None:
            return
        if self._proc.returncode:
            log.warning("the %s process exited with status %s", self.name, self._proc.returncode)
        self._proc = None

    def close(self, grace: float = STOP_GRACE) -> None:
        """Wait up to ``grace`` seconds for a running helper, then end it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            end_process(proc, grace)


def end_process(proc: subprocess.Popen, grace: float) -> None:
    """Wait up to ``grace`` seconds for ``proc`` to exit, then terminate it (kill it if that
    does not end it within 5 s)."""
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
