"""`modalscope demo`: a newcomer's first command.

Creates the store if needed (``MODALSCOPE_DATABASE_URL``, default ``./modalscope.db``),
fills it with the last few hours of synthetic multimodal traffic (``ingest/demo/``,
with the anomaly catalog's patterns injected) when it holds no spans yet, settles it,
then starts the OTLP receivers and the dashboard, keeps live demo traffic flowing and
prints the URL. Ctrl-C (or SIGTERM) stops everything cleanly. ``--generate-only`` fills
the store and exits.

Nothing heavy is imported until the command runs (the parser is built for every command).
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
import time

from .command_kit import (CommandError, install_stop_handlers, load_rules, load_settings, open_store, progress,
                          serve_dashboard, start_receivers, wait_for_signal)

# Kept equal to modalscope.ingest.demo's DEFAULT_SEED / DEFAULT_HOURS / DEFAULT_RATE
# (tests/ingest/test_demo.py checks); repeated here so building the parser stays cheap.
DEFAULT_SEED = 42
DEFAULT_HOURS = 3.0
DEFAULT_RATE = 2.0


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and value < 1e6):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)")
    return value


def add_demo_parser(sub) -> None:
    """Register the `demo` subcommand on the CLI's subparsers."""
    p = sub.add_parser(
        "demo",
        help="fill a store with realistic demo traffic, then serve the dashboard and OTLP receivers",
        description="Create the store if needed (MODALSCOPE_DATABASE_URL, default ./modalscope.db), fill it "
                    "with the last few hours of synthetic multimodal inference traffic (the anomaly "
                    "catalog's patterns injected) when it holds no spans yet, start the OTLP receivers "
                    "and the dashboard, keep live traffic flowing and print the URL. Ctrl-C stops.",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"random seed: one seed, one data set (default {DEFAULT_SEED})")
    p.add_argument("--hours", type=_positive, default=DEFAULT_HOURS,
                   help=f"hours of history up to now (default {DEFAULT_HOURS:g})")
    p.add_argument("--rate", type=_positive, default=DEFAULT_RATE,
                   help=f"requests per second, averaged over the history (default {DEFAULT_RATE:g})")
    p.add_argument("--clean", action="store_true", help="inject no anomaly patterns")
    p.add_argument("--generate-only", action="store_true",
                   help="fill the store and exit (no receivers, no dashboard)")
    p.add_argument("--port", type=_port, default=None,
                   help="dashboard port (default: MODALSCOPE_PORT, 8050)")
    p.add_argument("--otlp-http-port", type=_port, default=None,
                   help="OTLP/HTTP receiver port (default: MODALSCOPE_OTLP_HTTP_PORT, 4318)")
    p.add_argument("--otlp-grpc-port", type=_port, default=None,
                   help="OTLP/gRPC receiver port (default: MODALSCOPE_OTLP_GRPC_PORT, 4317)")
    p.set_defaults(func=cmd_demo)


# --------------------------------------------------------------------------------------


def _check_free(host: str, port: int, what: str) -> None:
    """Fail early, before filling anything, when a port we will listen on is taken."""
    from .ingest.errors import bind_error

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CommandError(f"cannot listen on {host}:{port} ({what}): {exc.strerror}") from None
    family, type_, proto, _, addr = infos[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        raise CommandError(str(bind_error(exc, host, port, what))) from None
    finally:
        sock.close()


def _has_spans(engine) -> bool:
    from sqlalchemy import select

    from .models import Span

    with engine.connect() as conn:
        return conn.execute(select(Span.id).limit(1)).first() is not None


def _fmt_time(ns: int) -> str:
    return time.strftime("%H:%M", time.gmtime(ns / 1e9))


def _subject(subject: dict) -> str:
    parts = []
    for key, value in subject.items():
        if isinstance(value, dict):
            parts.append(f"{value.get('key')}={value.get('value')}")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def _fill(engine, settings, rules, config) -> None:
    from .ingest import demo
    from .ingest.settle import settle

    url = engine.url.render_as_string()
    t0 = time.monotonic()
    bar = progress(demo.expected_traces(config), "generating", unit=" requests")
    try:
        # (generating in a child process: the writer leaves the second core idle)
        result = demo.fill(engine, config, rules, progress=bar.update, background=True)
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted: {url} is only partly filled; delete it for a complete demo", file=sys.stderr)
        raise
    bar.close()
    bar = progress(result.traces, "settling", unit=" traces")
    try:
        settle(engine, force=True, progress=bar.update)
    finally:
        bar.close()
    elapsed = time.monotonic() - t0
    print(f"filled {url}: {result.user_requests:,} requests ({result.traces:,} traces, {result.spans:,} spans), "
          f"the last {config.hours:g} h "
          f"at {config.rate:g} requests/s, seed {config.seed}, in {elapsed:.1f} s", flush=True)
    patterns = demo.injected_patterns(config)
    if patterns:
        print("injected patterns (UTC):")
        for p in sorted(patterns, key=lambda p: (p.start_ns, p.end_ns)):
            print(f"  {_fmt_time(p.start_ns)}-{_fmt_time(p.end_ns)}  {p.kind:<22} {_subject(p.subject)}")
    else:
        print("no patterns injected (--clean)")
    sys.stdout.flush()


def cmd_demo(args) -> int:
    from .ingest import demo

    settings = load_settings()
    ports = {k: v for k, v in (("otlp_http_port", args.otlp_http_port), ("otlp_grpc_port", args.otlp_grpc_port))
             if v is not None}
    if ports:
        settings = dataclasses.replace(settings, **ports)
    rules = load_rules(settings)  # a bad rules file stops us before anything is written
    port = args.port if args.port is not None else settings.port
    if not args.generate_only:
        for p, what in ((port, "dashboard"), (settings.otlp_http_port, "OTLP/HTTP"),
                        (settings.otlp_grpc_port, "OTLP/gRPC")):
            _check_free(settings.bind, p, what)
    engine = open_store(settings)
    try:
        config = demo.DemoConfig(now_ns=time.time_ns(), seed=args.seed, hours=args.hours, rate=args.rate,
                                 clean=args.clean)
        if _has_spans(engine):
            print(f"{engine.url.render_as_string()} already holds spans: not generating demo traffic "
                  "(point MODALSCOPE_DATABASE_URL at a new file for a fresh demo)", flush=True)
        else:
            _fill(engine, settings, rules, config)
        if args.generate_only:
            return 0
        return _serve(engine, settings, rules, config, port)
    finally:
        engine.dispose()


def _serve(engine, settings, rules, config, port: int) -> int:
    from . import __version__
    from .ingest import demo
    from .ingest.errors import ListenError
    from .ingest.pipeline import IngestPipeline
    from .ingest.settle import settle

    install_stop_handlers()
    try:
        dashboard = serve_dashboard(settings, port)
    except ListenError as exc:  # one line naming the port
        raise CommandError(str(exc)) from None
    stop_receivers = live = pipeline = None
    try:
        try:
            stop_receivers = start_receivers(settings, engine, rules)
        except ListenError as exc:
            raise CommandError(str(exc)) from None
        # Live traffic goes through a pipeline of its own (decode -> tag -> writer queue);
        # the receivers' settler settles it with everything else.
        pipeline = IngestPipeline(engine, settings, rules, settle=False).start()
        live = demo.LiveTraffic(pipeline, config).start()
        host = settings.bind if settings.bind not in ("0.0.0.0", "::", "") else "127.0.0.1"
        print(f"modalscope {__version__} demo at http://{host}:{dashboard.port}/  "
              f"(OTLP/HTTP :{settings.otlp_http_port}, OTLP/gRPC :{settings.otlp_grpc_port}; "
              f"live traffic ~{demo.LIVE_RATE:g} requests/s); Ctrl-C stops", flush=True)
        wait_for_signal()
    finally:
        print("stopping ...", file=sys.stderr, flush=True)
        if live is not None:
            live.stop()
        if pipeline is not None:
            pipeline.close()
        if stop_receivers is not None:
            stop_receivers()
        dashboard.shutdown()
    try:
        settle(engine, settle_seconds=settings.settle_seconds, force=True)
    except Exception as exc:  # noqa: BLE001 - what is left settles on the next start
        print(f"note: final settle failed ({exc.__class__.__name__}); it is retried on the next start",
              file=sys.stderr)
    return 0
