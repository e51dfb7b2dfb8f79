"""`modalscope ingest cloud-trace` and `modalscope export-metrics` (Google Cloud).

Nothing Google is imported until a command runs (the parser is built for every command).
Failures are one line (``CommandError``): no credentials, permission denied, quota never
recovering in ``--once`` mode, another process holding the project's lease.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .command_kit import STOP, CommandError, install_stop_handlers, load_rules, load_settings, open_store

log = logging.getLogger("modalscope")


def _duration(text: str) -> float:
    from .ingest.cloud_trace import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_duration(text: str) -> float:
    value = _duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than zero")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _page_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1-100 (the API's maximum page)")
    return value


def _project(args, settings) -> str:

    project = args.project or settings.google_cloud_project
    if not project:
        raise CommandError("no Google Cloud project: pass --project ID or set GOOGLE_CLOUD_PROJECT")
    return project


def cmd_cloud_trace(args) -> int:
    from .ingest.cloud_trace import CloudTracePoller, PollError, PollerConfig, make_trace_client

    settings = load_settings()
    project = _project(args, settings)
    rules = load_rules(settings)
    config = PollerConfig(
        project=project, interval=args.interval, backfill=args.backfill, overlap=args.overlap, lag=args.lag,
        page_size=args.page_size, calls_per_minute=args.calls_per_minute,
        min_latency_ms=args.min_latency * 1000 if args.min_latency else None,
    )
    engine = open_store(settings)
    install_stop_handlers()
    try:
        client = make_trace_client(settings.cloud_trace_endpoint)
        poller = CloudTracePoller(engine, client, config, rules, stop=STOP, once=args.once)
        if not args.once:
            print(f"polling Cloud Trace project {project} every {config.interval:g}s "
                  f"({config.calls_per_minute:g} calls/min at most"
                  + (f", traces >= {config.min_latency_ms:g} ms only: sampled" if config.min_latency_ms else "")
                  + f"); store {engine.url.render_as_string()}; Ctrl-C stops", flush=True)
        result = poller.run(on_pass=None if args.once else lambda r: log.info("%s", r.summary(project)))
    except PollError as exc:
        raise CommandError(str(exc)) from None
    finally:
        engine.dispose()
    if args.once:
        if result is None:  # stopped by a signal before the pass finished
            print("stopped before a complete pass", file=sys.stderr)
            return 130
        print(result.summary(project))
        if result.falling_behind:
            print(f"warning: Cloud Trace traffic is more than the read quota can pull ({result.behind_seconds:.0f}s "
                  "behind); see --min-latency", file=sys.stderr)
    return 0


def cmd_export_metrics(args) -> int:
    from .ingest.cloud_monitoring import ExportConfig, ExportError, MetricsExporter, make_monitoring_client

    settings = load_settings()
    project = _project(args, settings)
    config = ExportConfig(project=project, interval=args.interval, delay=args.delay,
                          backfill_minutes=max(1, int(args.backfill // 60)), spacing=args.spacing)
    engine = open_store(settings, create=False)
    install_stop_handlers()
    try:
        client = make_monitoring_client(settings.cloud_monitoring_endpoint)
        exporter = MetricsExporter(engine, client, config, stop=STOP, once=args.once)
        if not args.once:
            print(f"exporting latency metrics to Cloud Monitoring project {project} every {config.interval:g}s; "
                  "Ctrl-C stops", flush=True)
        result = exporter.run(on_pass=None if args.once else lambda r: log.info("%s", r.summary(project)))
    except ExportError as exc:
        raise CommandError(str(exc)) from None
    finally:
        engine.dispose()
    if args.once:
        if result is None:
            print("stopped before a complete pass", file=sys.stderr)
            return 130
        print(result.summary(project))
    return 0


def add_cloud_parsers(sub, ingest_sub) -> None:
    """Register `export-metrics` on ``sub`` and `cloud-trace` on ``ingest_sub``."""
    p = ingest_sub.add_parser(
        "cloud-trace", help="poll Google Cloud Trace (v1 ListTraces) into the store",
        description="Poll Cloud Trace for a project's traces, from a watermark kept in the store, and write "
                    "them through the stage tagger and the idempotent writer (source cloud-trace). One poller "
                    "per project is active at a time (a lease in the store). Credentials: Application Default "
                    "Credentials; MODALSCOPE_CLOUD_TRACE_ENDPOINT=host:port for a plaintext stand-in.")
    p.add_argument("--project", default=None, help="Google Cloud project id (default: GOOGLE_CLOUD_PROJECT)")
    p.add_argument("--once", action="store_true",
                   help="one complete pass, then exit (non-zero with one line if it cannot finish)")
    p.add_argument("--interval", type=_positive_duration, default=60.0, metavar="DURATION",
                   help="time between passes (default 60s)")
    p.add_argument("--backfill", type=_positive_duration, default=3600.0, metavar="DURATION",
                   help="how far back the first pass looks (default 1h; e.g. 6h)")
    p.add_argument("--overlap", type=_duration, default=120.0, metavar="DURATION",
                   help="later passes re-read this much before the watermark, for late spans (default 2m)")
    p.add_argument("--lag", type=_duration, default=10.0, metavar="DURATION",
                   help="stop this long before now: Cloud Trace's indexing lag (default 10s)")
    p.add_argument("--min-latency", type=_positive_duration, default=None, metavar="DURATION",
                   help="pull only traces at least this slow (e.g. 500ms) when traffic exceeds the quota; "
                        "the data is then sampled (recorded in /api/v1/health)")
    p.add_argument("--calls-per-minute", type=_positive, default=10.0, metavar="N",
                   help="ListTraces calls a minute at most (25 read units each; the default 10 uses 250 of "
                        "the usual 300 a minute)")
    p.add_argument("--page-size", type=_page_size, default=100, metavar="N",
                   help="traces a page, 1-100 (default 100)")
    p.set_defaults(func=cmd_cloud_trace)

    p = sub.add_parser(
        "export-metrics", help="export per-minute latency metrics to Google Cloud Monitoring",
        description="Write custom.googleapis.com/modalscope/{pair_latency_ms,pair_requests,pair_errors,"
                    "stage_latency_ms} (GAUGE, one point a minute, resource global) from the rollups, every "
                    "complete minute since the last one exported (at most 24 h). Credentials: Application "
                    "Default Credentials; MODALSCOPE_CLOUD_MONITORING_ENDPOINT=host:port for a stand-in.")
    p.add_argument("--project", default=None, help="Google Cloud project id (default: GOOGLE_CLOUD_PROJECT)")
    p.add_argument("--once", action="store_true", help="export every complete minute not yet exported, then exit")
    p.add_argument("--interval", type=_positive_duration, default=60.0, metavar="DURATION",
                   help="time between exports (default 60s)")
    p.add_argument("--delay", type=_duration, default=120.0, metavar="DURATION",
                   help="a minute is exported this long after it ended, once its traces settled (default 2m)")
    p.add_argument("--backfill", type=_positive_duration, default=3600.0, metavar="DURATION",
                   help="minutes the first export covers (default 1h, at most 24h)")
    p.add_argument("--spacing", type=_duration, default=5.0, metavar="DURATION",
                   help="pause between two minutes' writes when catching up (Cloud Monitoring takes a point a "
                        "series every 5 s; default 5s)")
    p.set_defaults(func=cmd_export_metrics)
