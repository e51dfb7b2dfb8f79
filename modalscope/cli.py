"""The `modalscope` command: one entry point, one clear line on every failure.

Each command imports what it needs when it runs, so `--help`, `--version` and a mistyped
flag answer at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import __version__
from .anomalies_cmd import add_anomalies_parser
from .cloud_cmd import add_cloud_parsers
from .command_kit import (STOP, CommandError, install_stop_handlers, load_rules, load_settings, open_store,
                          progress, serve_dashboard, wait_for_signal)
from .demo_cmd import add_demo_parser
from .incidents_cmd import add_incidents_parser

log = logging.getLogger("modalscope")


# -- commands -----------------------------------------------------------------------------
def cmd_db_prune(args) -> int:
    from .ingest.retention import RetentionPolicy, prune
    from .models.engine import make_engine
    from .models.schema import ensure_schema

    settings = load_settings()
    ensure_schema(settings.database_url, create=False)
    engine = make_engine(settings.database_url, write=True)
    policy = RetentionPolicy.from_settings(settings)
    try:
        with progress(None, "pruning", unit=" rows") as bar:
            result = prune(engine, policy, progress=bar.update)
    finally:
        engine.dispose()
    print(f"deleted {result.spans:,} spans and {result.traces:,} traces older than {policy.span_days:g} days, "
          f"{result.minute_rollups:,} minute and {result.quarter_rollups:,} quarter-hour rollup rows older than "
          f"{policy.minute_rollup_days:g} days, "
          f"{result.hourly_rollups:,} hourly rollup rows older than {policy.hourly_rollup_days:g} days")
    return 0


def cmd_db_upgrade(args) -> int:
    from .models.engine import make_engine
    from .models.migrate import pending_steps, upgrade
    from .models.schema import current_revision, known_revision, newer_release_error

    settings = load_settings()
    engine = make_engine(settings.database_url)  # validates the URL and directory first
    try:
        before = current_revision(engine)
    finally:
        engine.dispose()
    if before is not None and not known_revision(settings.database_url, before):
        raise newer_release_error(settings.database_url, before)
    steps = pending_steps(settings.database_url, before)
    if steps:
        # A step may rewrite every span (0007): say what runs, then each step as it ends.
        print(f"upgrading from revision {before or 'none (empty database)'}: {len(steps)} step"
              f"{'s' if len(steps) != 1 else ''} ({', '.join(steps)})", flush=True)
    upgrade(settings.database_url,
            on_step=lambda rev, title, seconds: print(f"  {rev} done in {seconds:.1f} s: {title}", flush=True))
    engine = make_engine(settings.database_url)
    print(f"database at revision {current_revision(engine)}")
    engine.dispose()
    return 0


def cmd_import(args) -> int:
    from .ingest.importer import ImportRefused, check_retention, import_files

    settings = load_settings()
    rules = load_rules(settings)  # a bad rules file stops us before anything is written
    try:
        # Spans past the retention would be pruned minutes later: refused before the store
        # is even opened (created), so a refused import leaves no trace.
        check_retention(args.files, settings.retention_days)
    except ImportRefused as exc:
        raise CommandError(str(exc)) from None
    engine = open_store(settings)
    total = sum(os.path.getsize(p) for p in args.files if os.path.isfile(p))
    bar = progress(total, "importing", unit="B", unit_scale=True)
    try:
        report = import_files(engine, args.files, rules, progress=bar.update)
    finally:
        bar.close()
        engine.dispose()
    for line in report.skipped + report.no_spans + report.notes:
        print(line, file=sys.stderr)
    print(report.summary())
    return 1 if report.failed else 0


def cmd_retag(args) -> int:
    from .ingest.retag import retag

    settings = load_settings()
    rules = load_rules(settings)
    engine = open_store(settings, create=False)
    try:
        bar = progress(None, "retagging", unit=" spans", unit_scale=True)
        bars = {}

        def settling(n: int, total: int) -> None:
            if "settle" not in bars:
                bar.close()
                bars["settle"] = progress(total, "re-settling", unit=" traces", unit_scale=True)
            bars["settle"].update(n)

        try:
            changed, traces = retag(engine, rules, progress=bar.update, settle_progress=settling)
        finally:
            bar.close()
            if "settle" in bars:
                bars["settle"].close()
    finally:
        engine.dispose()
    print(f"retagged: {changed} spans changed stage; {traces} traces re-settled")
    return 0


def cmd_ingest_otlp(args) -> int:
    from .command_kit import settler_evaluations
    from .ingest.receivers import ReceiverProcesses, ReceiverStartError, start_receivers as start, with_ports

    settings = load_settings()
    rules = load_rules(settings)
    if args.processes < 1:
        raise CommandError(f"--processes {args.processes}: need at least 1")
    engine = open_store(settings)
    install_stop_handlers()
    shared = args.processes > 1
    receivers = start(settings, engine, rules, reuse_port=shared, evaluations=settler_evaluations(settings))
    others = None
    try:
        if shared:
            try:
                others = ReceiverProcesses(with_ports(settings, receivers.http_port, receivers.grpc_port),
                                           args.processes - 1).start()
            except ReceiverStartError as exc:
                raise CommandError(f"a receiver process could not start: {exc}") from None
        print(f"OTLP/HTTP on http://{settings.bind}:{receivers.http_port}/v1/traces, "
              f"OTLP/gRPC on {settings.bind}:{receivers.grpc_port}"
              f"{f' ({args.processes} processes)' if shared else ''}; "
              f"store {engine.url.render_as_string()}; Ctrl-C stops", flush=True)
        while not STOP.wait(1.0):
            if others is not None:
                others.check()
    finally:
        print("stopping: writing what was received ...", file=sys.stderr, flush=True)
        if others is not None:
            others.stop(wait=False)  # all processes drain at once
        receivers.stop()
        if others is not None:
            others.join()
        engine.dispose()
    return 0


def cmd_serve(args) -> int:
    settings = load_settings()
    engine = open_store(settings, writes=False)  # the dashboard may read a replica
    engine.dispose()
    install_stop_handlers()
    server = serve_dashboard(settings, args.port)
    print(f"modalscope {__version__} at http://{settings.bind}:{server.port}/ (development server; "
          "use gunicorn in production); Ctrl-C stops", flush=True)
    try:
        wait_for_signal()
    finally:
        server.shutdown()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="modalscope",
        description="Trace explorer for multimodal inference latency: receive or pull spans, tag each with "
                    "its pipeline stage, and explore them in the dashboard, the JSON API or these commands. "
                    "Settings come from the environment (MODALSCOPE_DATABASE_URL and friends; see the README).")
    p.add_argument("--version", action="version", version=f"modalscope {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="what to do (modalscope COMMAND --help describes each)")

    add_demo_parser(sub)
    add_anomalies_parser(sub)
    add_incidents_parser(sub)

    s = sub.add_parser(
        "serve", help="the dashboard and /api/v1 (development server)",
        description="Serve the Dash dashboard and the /api/v1 JSON API from the store "
                    "(MODALSCOPE_DATABASE_URL) with the development server. In production run gunicorn "
                    "'modalscope.app:create_app()' instead. Ctrl-C stops.")
    s.add_argument("--port", type=int, default=None, help="port to listen on (default: MODALSCOPE_PORT, 8050)")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("ingest", help="receive or pull spans",
                       description="Receive spans from OpenTelemetry exporters (otlp) or pull them from "
                                   "Google Cloud Trace (cloud-trace), tag their stages and store them.")
    isub = s.add_subparsers(dest="source", required=True, metavar="SOURCE",
                            help="where the spans come from (modalscope ingest SOURCE --help describes each)")
    o = isub.add_parser(
        "otlp", help="OTLP/HTTP (:4318) and OTLP/gRPC (:4317) receivers",
        description="Receive OTLP trace exports: POST /v1/traces on MODALSCOPE_OTLP_HTTP_PORT (4318, protobuf "
                    "or JSON, gzip or not) and TraceService/Export on MODALSCOPE_OTLP_GRPC_PORT (4317). With "
                    "MODALSCOPE_INGEST_TOKEN set both need Authorization: Bearer <token>. Ctrl-C writes what "
                    "was received, then stops.")
    o.add_argument("--processes", type=int, default=1, metavar="N",
                   help="receiver processes sharing both ports (SO_REUSEPORT): one decodes on one core; "
                        "default 1")
    o.set_defaults(func=cmd_ingest_otlp)
    add_cloud_parsers(sub, isub)

    s = sub.add_parser(
        "import", help="import OTLP JSON / JSON lines / protobuf files",
        description="Import OTLP trace files: OTLP JSON (one request a file, or JSON lines as the Collector's "
                    "file exporter writes them) and OTLP protobuf. Each request is all or nothing; a bad one "
                    "is reported as FILE:LINE: reason and skipped. The exit status is 1 when anything was "
                    "skipped.")
    s.add_argument("files", nargs="+", metavar="FILE",
                   help="an OTLP JSON, JSON lines or protobuf file (ExportTraceServiceRequest)")
    s.set_defaults(func=cmd_import)

    s = sub.add_parser(
        "retag", help="re-apply the stage rules to stored spans and rebuild the rollups",
        description="Tag every stored span again with the current stage rules (MODALSCOPE_RULES, else the "
                    "built-in defaults) and re-settle the traces whose stages changed. A rules file that is "
                    "not valid TOML stops it before anything changes.")
    s.set_defaults(func=cmd_retag)

    s = sub.add_parser("db", help="database maintenance",
                       description="Maintain the store (MODALSCOPE_DATABASE_URL): migrate its schema, or "
                                   "prune data past its retention.")
    dsub = s.add_subparsers(dest="db_command", required=True, metavar="ACTION",
                            help="the maintenance to run (modalscope db ACTION --help describes each)")
    u = dsub.add_parser("upgrade", help="migrate the database to the current schema",
                        description="Migrate the store to this release's schema, one revision at a time, "
                                    "printing each step as it ends. An empty database gets the whole schema.")
    u.set_defaults(func=cmd_db_upgrade)
    pr = dsub.add_parser("prune", help="delete spans and rollups past their retention now (the settler "
                         "also does it every 10 minutes)",
                         description="Delete spans, traces and rollup rows older than their retention "
                                     "(MODALSCOPE_RETENTION_DAYS and the rollup tiers' own limits) now, "
                                     "rather than waiting for the settler's next pass.")
    pr.set_defaults(func=cmd_db_prune)
    _describe_all(p)
    return p


def _describe_all(parser: argparse.ArgumentParser) -> None:
    """A subcommand registered without a description gets its one-line help as one, so every
    ``--help`` says what the command does."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            helps = {a.dest: a.help for a in action._choices_actions}  # noqa: SLF001
            for name, child in action.choices.items():
                if not child.description and helps.get(name):
                    text = helps[name]
                    child.description = text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")
                _describe_all(child)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.DEBUG if os.environ.get("MODALSCOPE_DEBUG") == "1" else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    from .ingest.runtime import tune_gc

    tune_gc()  # every command decodes, writes or reads spans in bulk
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

    from .ingest.rules_file import RulesError
    from .models.engine import DatabaseURLError
    from .models.schema import SchemaError
    from .settings import SettingsError

    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except (CommandError, DatabaseURLError, SchemaError, SettingsError, RulesError) as exc:
        print(f"modalscope: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except DBAPIError as exc:
        print(f"modalscope: error: database: {_one_line(exc.orig or exc)}", file=sys.stderr)
        return 2
    except SQLAlchemyError as exc:
        print(f"modalscope: error: database: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"modalscope: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - never a traceback; MODALSCOPE_DEBUG=1 shows it
        if os.environ.get("MODALSCOPE_DEBUG") == "1":
            raise
        print(f"modalscope: error: unexpected {exc.__class__.__name__}: {_one_line(exc)} "
              "(MODALSCOPE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
