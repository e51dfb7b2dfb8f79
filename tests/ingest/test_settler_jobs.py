"""The settler's periodic jobs: evaluations ahead of requests in short-lived helper processes,
held back while the settler works off a backlog; what a receiver process imports."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

import pytest
from sqlalchemy import func, select

from modalscope.command_kit import settler_evaluations
from modalscope.ingest import settler as settler_mod
from modalscope.ingest.helper_process import PeriodicProcess
from modalscope.ingest.settle import SettlePass
from modalscope.ingest.settler import Settler, SettlerJobs, settle_loop
from modalscope.models import FindingEvaluation
from modalscope.settings import Settings


def _write_pid(path: str, sleep_s: float = 0.0) -> None:
    time.sleep(sleep_s)
    with open(path, "a") as fh:
        fh.write(f"{os.getpid()}\n")


def _wait(cond, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
def test_a_periodic_helper_runs_in_a_process_of_its_own_one_at_a_time(tmp_path):
    out = tmp_path / "pids"
    helper = PeriodicProcess(functools.partial(_write_pid, str(out), 1.0), every_s=0.01, first_delay_s=0.2)
    assert not helper.maybe_run()  # not due yet
    time.sleep(0.25)
    assert helper.maybe_run() and helper.running
    time.sleep(0.05)
    assert not helper.maybe_run()  # due again, but the first still runs
    assert _wait(lambda: out.exists())
    assert _wait(lambda: not helper.running)
    assert helper.maybe_run()  # the finished one is reaped, the next starts
    helper.close()
    pids = out.read_text().split()
    assert len(pids) == 2 and str(os.getpid()) not in pids and helper.runs == 2


@pytest.mark.slow
def test_closing_ends_a_helper_that_does_not_finish(tmp_path):
    helper = PeriodicProcess(functools.partial(_write_pid, str(tmp_path / "pids"), 60.0), every_s=60)
    assert helper.maybe_run()
    t = time.monotonic()
    helper.close(grace=0.2)
    assert time.monotonic() - t < 10 and not helper.running and not (tmp_path / "pids").exists()


class _Schedule:
    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def maybe_run(self) -> None:
        self.calls += 1

    def close(self) -> None:
        self.closed = True


def test_evaluations_wait_while_the_settler_works_off_a_backlog(engine, monkeypatch):
    schedule = _Schedule()
    passes = iter([SettlePass(100, False, True)] * 3 + [SettlePass(5, False, False)] + [SettlePass(0, False, False)] * 100)
    monkeypatch.setattr("modalscope.ingest.settle.settle_pass", lambda *a, **k: next(passes))
    turns = iter(range(4))
    seen = []

    def stopping(wait: float) -> bool:
        if wait == 0:
            return False
        turn = next(turns, None)
        seen.append(schedule.calls)
        return turn is None

    settle_loop(engine, 1.0, 0.01, SettlerJobs(evaluations=lambda e: schedule), stopping=stopping)
    # three passes with full batches: held back; then a trickle: run at once
    assert seen == [0, 0, 0, 0, 1] and schedule.closed


def test_a_long_backlog_holds_evaluations_back_for_a_bounded_time(engine, monkeypatch):
    schedule = _Schedule()
    monkeypatch.setattr("modalscope.ingest.settle.settle_pass", lambda *a, **k: SettlePass(100, False, True))
    monkeypatch.setattr(settler_mod, "EVALUATION_WAIT_S", 0.2)
    started = time.monotonic()

    def stopping(wait: float) -> bool:
        if wait:
            time.sleep(0.02)
        return schedule.calls >= 3 or time.monotonic() - started > 30

    settle_loop(engine, 1.0, 0.01, SettlerJobs(evaluations=lambda e: schedule), stopping=stopping)
    assert schedule.calls >= 3 and time.monotonic() - started >= 0.2


@pytest.mark.slow
def test_the_commands_settler_evaluates_ahead_in_a_helper_process(engine, db_url):
    settings = Settings(database_url=db_url, findings_ranges_s=(3600,), findings_every_s=4.0, retention_days=1)
    plan = settler_evaluations(settings)
    schedule = plan(engine)
    assert isinstance(schedule, PeriodicProcess)  # nothing of the analysis layer runs here
    settler = Settler(engine, 5.0, interval=0.05, jobs=SettlerJobs(evaluations=plan)).start()

    def rows() -> int:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(FindingEvaluation)
                                .where(FindingEvaluation.range_s == 3600)).scalar_one()

    try:
        assert _wait(lambda: rows() > 0, timeout=90)
    finally:
        settler.stop(final=False)
    with engine.connect() as conn:
        end_ns = conn.execute(select(func.max(FindingEvaluation.end_ns))).scalar_one()
    assert abs(end_ns - time.time_ns()) < 90 * 10**9  # fresh enough to answer a request


@pytest.mark.slow
def test_a_receiver_process_does_not_import_numpy_or_the_analysis_layer():
    code = ("import sys; import modalscope.cli, modalscope.command_kit, modalscope.ingest.receivers, "
            "modalscope.ingest.otlp_http, modalscope.ingest.otlp_grpc, modalscope.ingest.pipeline, "
            "modalscope.ingest.settler; "
            "print(sorted(m for m in ('numpy', 'pandas', 'modalscope.app') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
