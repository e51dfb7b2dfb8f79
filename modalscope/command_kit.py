"""What the command modules share: one-line errors, settings, opening the store, the stage
rules, progress bars, stop signals, and starting the servers.

Heavy packages (SQLAlchemy engines, the Dash app, the receivers) are imported inside the
functions that need them, so `modalscope --help` and a mistyped flag answer at once.
"""

from __future__ import annotations

import functools
import random
import signal
import sys
import threading


class CommandError(Exception):
    """A failure the user can act on; printed as one line, exit status 2."""


def load_settings():
    from .settings import Settings

    return Settings.from_env()


def open_store(settings, *, create: bool = True, writes: bool = True):
    from .models.engine import check_writable, make_engine
    from .models.schema import ensure_schema

    ensure_schema(settings.database_url, create=create)
    engine = make_engine(settings.database_url, write=True)
    if writes:
        try:
            check_writable(engine)  # a read-only store is one line now, not a failed write later
        except BaseException:
            engine.dispose()
            raise
    return engine


def load_rules(settings):
    from .ingest.rules_file import load_rules

    return load_rules(settings.rules_path or None)


def progress(total: int | None, desc: str, unit: str = "it", unit_scale: bool = False):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                dynamic_ncols=True, mininterval=0.5, disable=None if sys.stderr.isatty() else False)


STOP = threading.Event()


def install_stop_handlers() -> None:
    """From here on, SIGINT and SIGTERM ask the running servers to stop cleanly.

    Called before servers start, so a signal that arrives during start-up is not lost
    (nor kills the process half-started): ``wait_for_signal`` then returns at once.
    """
    def handler(signum, frame):
        STOP.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def wait_for_signal() -> None:
    install_stop_handlers()
    while not STOP.wait(1.0):
        pass


def settler_evaluations(settings):
    """What the settler evaluates between passes (``app.evaluations.settler_evaluations``),
    as a picklable ``engine -> schedule``: each evaluation runs in a short-lived process of
    its own (``ingest.helper_process``), so neither a receiver nor its settler keeps the
    analysis layer (the detectors, pandas) in memory between evaluations."""
    if not settings.findings_every_s or not settings.findings_ranges_s:
        return None
    return functools.partial(_evaluation_schedule, settings)


def _evaluation_schedule(settings, engine):
    from .ingest.helper_process import PeriodicProcess

    every_s = float(settings.findings_every_s)
    # a random first delay, as app.evaluations' own schedule takes: receivers started
    # together fall out of step, so one evaluation serves all
    return PeriodicProcess(functools.partial(evaluate_ahead_once, settings), every_s,
                           first_delay_s=random.uniform(0, min(every_s / 4, 15)), name="findings evaluation")


def evaluate_ahead_once(settings) -> int:
    """One turn of the settler's evaluations (the ranges ending now, one past day if stale),
    in the process that calls it; returns the windows evaluated."""
    from .app.evaluations import EvaluationSchedule, settler_evaluations as evaluations
    from .models.engine import make_engine

    plan = evaluations(settings)
    if plan is None:
        return 0
    engine = make_engine(settings.database_url, write=True)
    try:
        return EvaluationSchedule(engine, **plan.keywords).maybe_run()
    finally:
        engine.dispose()


def start_receivers(settings, engine, rules=None, settle="process"):
    """Start the pipeline and both OTLP receivers of this process, with the settler evaluating
    the anomaly catalog ahead of requests; returns a stop() callable."""
    from .ingest.receivers import start_receivers as start

    return start(settings, engine, rules, settle=settle, evaluations=settler_evaluations(settings)).stop


def serve_dashboard(settings, port: int | None = None):
    """Start the dashboard on a thread; returns the server (``.shutdown()``, ``.url``)."""
    from .app import create_app
    from .ingest.otlp_http import serve_http

    app = create_app(settings)
    return serve_http(app, settings.bind, port or settings.port, what="dashboard")


def catalog_window(args):
    """The window of ``--since``/``--range`` (one of them; default 1 h), checked as the API
    checks ``range``, with the settings and thresholds: what both catalog commands read."""
    from .app.params import ParamError, parse_window
    from .settings import Settings

    if args.since and args.range:
        raise CommandError("give either --since or --range, not both")
    flag = "--range" if args.range else "--since"
    try:
        window = parse_window({"range": args.range or args.since or "1h"})
    except ParamError as exc:
        raise CommandError(f"{flag}: {exc.message.replace('range', flag)}") from None
    # The catalog (and pandas) once the flags are known good: a typo fails at once.
    from .app.detectors import Thresholds
    from .app.findings import MAX_WINDOW_S

    if window.seconds > MAX_WINDOW_S:
        raise CommandError(f"{flag}: at most {MAX_WINDOW_S // 86400}d (the detectors judge minute by minute)")
    return window, Settings.from_env(), Thresholds.from_env()


def open_reading_store(settings):
    """The store's engine for reading, refusing one that is missing or not upgraded (one-line errors)."""
    from .models.engine import make_engine
    from .models.schema import ensure_schema

    ensure_schema(settings.database_url, create=False)
    return make_engine(settings.database_url)
