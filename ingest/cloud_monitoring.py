"""`modalscope export-metrics`: per-minute latency metrics from the rollups to Cloud Monitoring.

Metrics (docs/design.md, "Cloud Monitoring export"), GAUGE, one point a minute, monitored
resource ``global``:

* ``custom.googleapis.com/modalscope/pair_latency_ms`` — labels ``caller``, ``callee``,
  ``percentile`` (``p50``/``p95``/``p99``), from the ``pair`` rollups (CLIENT span durations)
* ``custom.googleapis.com/modalscope/pair_requests`` and ``.../pair_errors`` — ``caller``, ``callee``
* ``custom.googleapis.com/modalscope/stage_latency_ms`` — ``stage``, ``input_type``,
  ``percentile``, from the ``op`` rollups (span durations per stage, as the Stages page);
  ``stage="end_to_end"`` carries whole-trace latency per input type (the ``trace`` rollups),
  what an SLO on an input type's P95 alerts on.

A point's interval is the instant at the end of its minute (GAUGE: start = end). Percentiles
come from the merged log-bucket histograms, within 1% of the exact values. A minute is
exported once it ended ``delay`` seconds ago (time for its traces to settle); the watermark
(``cursors`` row ``export-metrics:<project>``, the last minute exported) makes every run,
``--once`` included, export each complete minute since the last one exactly once, at most
the last 24 hours. Cloud Monitoring takes at most 200 series a request, one point a series,
each series' points in time order, a point a series every 5 seconds: a minute with more
series is several requests, and catching up spaces minutes ``spacing`` seconds apart.
Descriptors are created once (remembered in the cursor row; ALREADY_EXISTS counts as done).

The Google client libraries are imported when a client is made or a point written: the
dashboard, which imports this module's health check, never loads them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Engine

from ..durations import MINUTE_NS, NS
from .cloud_trace import PollError, rfc3339
from .cursors import Lease, LeaseLost, read_cursors
from .google_api import Backoff, call_with_retries, error_line, google_client

log = logging.getLogger(__name__)

PREFIX = "custom.googleapis.com/modalscope/"
PAIR_LATENCY = PREFIX + "pair_latency_ms"
PAIR_REQUESTS = PREFIX + "pair_requests"
PAIR_ERRORS = PREFIX + "pair_errors"
STAGE_LATENCY = PREFIX + "stage_latency_ms"
PERCENTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
END_TO_END = "end_to_end"
MAX_SERIES_PER_REQUEST = 200
MAX_BACKLOG_MINUTES = 24 * 60
CURSOR_PREFIX = "export-metrics:"

ExportError = PollError

# type: (value type, unit, labels, description)
METRICS: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    PAIR_LATENCY: ("DOUBLE", "ms", ("caller", "callee", "percentile"),
                   "Latency percentile of caller->callee calls (CLIENT spans) in the minute."),
    PAIR_REQUESTS: ("INT64", "1", ("caller", "callee"), "caller->callee calls in the minute."),
    PAIR_ERRORS: ("INT64", "1", ("caller", "callee"), "caller->callee calls with status ERROR in the minute."),
    STAGE_LATENCY: ("DOUBLE", "ms", ("stage", "input_type", "percentile"),
                    "Latency percentile of spans of a pipeline stage per input type in the minute "
                    "(stage end_to_end: whole traces)."),
}
_LABEL_HELP = {
    "caller": "calling service", "callee": "called service", "percentile": "p50, p95 or p99",
    "stage": "pipeline stage (preprocessing, encoder, fusion, inference, network, other, end_to_end)",
    "input_type": "text, image, multi_image, audio or unknown",
}


def metric_descriptors(project: str) -> list:
    """The four ``google.api.MetricDescriptor`` messages."""
    from google.api import label_pb2, metric_pb2

    out = []
    for mtype, (value_type, unit, labels, description) in METRICS.items():
        out.append(metric_pb2.MetricDescriptor(
            name=f"projects/{project}/metricDescriptors/{mtype}",
            type=mtype,
            metric_kind=metric_pb2.MetricDescriptor.MetricKind.GAUGE,
            value_type=metric_pb2.MetricDescriptor.ValueType.Value(value_type),
            unit=unit,
            description=description,
            display_name="modalscope " + mtype[len(PREFIX):],
            labels=[label_pb2.LabelDescriptor(key=k, value_type=label_pb2.LabelDescriptor.ValueType.STRING,
                                              description=_LABEL_HELP[k]) for k in labels],
        ))
    return out


@dataclass(frozen=True)
class MetricPoint:
    metric_type: str
    labels: tuple[tuple[str, str], ...]  # sorted
    value: float | int


def minute_points(reader, minute: int) -> list[MetricPoint]:
    """Every point of one minute, from the rollups (``reader``: ``StoreReader``)."""
    from ..models.reader import RollupQuery

    start = minute * MINUTE_NS
    end = start + MINUTE_NS
    qs = [q for _, q in PERCENTILES]
    points: list[MetricPoint] = []
    for g in reader.rollups.merged(RollupQuery("pair", start, end, group_by=("caller", "callee"))):
        caller, callee = g.key
        base = (("callee", callee), ("caller", caller))
        points.append(MetricPoint(PAIR_REQUESTS, base, int(g.count)))
        points.append(MetricPoint(PAIR_ERRORS, base, int(g.error_count)))
        for (name, _), v in zip(PERCENTILES, g.histogram.quantiles(qs)):
            if v is not None:
                points.append(MetricPoint(PAIR_LATENCY, base + (("percentile", name),), v / 1e6))
    stage_groups = [(g.key, g)
                    for g in reader.rollups.merged(RollupQuery("op", start, end, group_by=("stage", "input_type")))]
    stage_groups += [((END_TO_END, g.key[0]), g)
                     for g in reader.rollups.merged(RollupQuery("trace", start, end, group_by=("input_type",)))]
    for (stage, input_type), g in stage_groups:
        for (name, _), v in zip(PERCENTILES, g.histogram.quantiles(qs)):
            if v is not None:
                points.append(MetricPoint(STAGE_LATENCY, (("input_type", input_type), ("percentile", name),
                                                          ("stage", stage)), v / 1e6))
    return points


def time_series(project: str, minute: int, points: list[MetricPoint]) -> list:
    """``TimeSeries`` messages, one point each, stamped at the end of ``minute``."""
    from google.cloud import monitoring_v3
    from google.protobuf.timestamp_pb2 import Timestamp

    end = Timestamp(seconds=(minute + 1) * 60)
    out = []
    for p in points:
        value = {"int64_value": int(p.value)} if METRICS[p.metric_type][0] == "INT64" else {"double_value": float(p.value)}
        out.append(monitoring_v3.TimeSeries(
            metric={"type": p.metric_type, "labels": dict(p.labels)},
            resource={"type": "global", "labels": {"project_id": project}},
            points=[monitoring_v3.Point(interval=monitoring_v3.TimeInterval(end_time=end),
                                        value=monitoring_v3.TypedValue(**value))],
        ))
    return out


def make_monitoring_client(endpoint: str = ""):
    """A ``MetricServiceClient`` (see :func:`google_api.google_client`)."""
    from google.cloud.monitoring_v3 import MetricServiceClient
    from google.cloud.monitoring_v3.services.metric_service.transports import MetricServiceGrpcTransport

    return google_client(MetricServiceClient, MetricServiceGrpcTransport, endpoint, ExportError)


@dataclass
class ExportConfig:
    project: str
    interval: float = 60.0
    delay: float = 120.0  # a minute is complete this long after it ended
    backfill_minutes: int = 60  # the first run exports this many minutes (at most 24 h)
    spacing: float = 5.0  # seconds between two minutes' writes (one point a series per 5 s)
    timeout: float = 30.0
    backoff_initial: float = 2.0
    backoff_max: float = 120.0
    max_attempts: int = 6
    lease_ttl: float = 0.0

    def ttl(self) -> float:
        return self.lease_ttl or max(120.0, 3 * self.interval, 2 * self.backoff_max)


@dataclass
class ExportResult:
    first_minute: int | None = None
    last_minute: int | None = None
    minutes: int = 0
    series: int = 0
    requests: int = 0
    skipped: int = 0  # series Cloud Monitoring refused (INVALID_ARGUMENT), e.g. already written

    def summary(self, project: str) -> str:
        if self.first_minute is None:
            return f"export-metrics {project}: nothing new to export"
        return (f"export-metrics {project}: {self.series} series points in {self.minutes} minutes "
                f"({rfc3339(self.first_minute * MINUTE_NS)} .. "
                f"{rfc3339((self.last_minute + 1) * MINUTE_NS)}), {self.requests} requests"
                + (f", {self.skipped} refused" if self.skipped else ""))


class MetricsExporter:
    def __init__(self, engine: Engine, client, config: ExportConfig, *, stop: threading.Event | None = None,
                 once: bool = False, holder: str | None = None, clock: Callable[[], int] = time.time_ns,
                 rng: random.Random | None = None) -> None:
        from ..models.reader import StoreReader

        self.engine = engine
        self.client = client
        self.cfg = config
        self.reader = StoreReader(engine)
        self.stop = stop or threading.Event()
        self.once = once
        self.clock = clock
        self.backoff = Backoff(config.backoff_initial, config.backoff_max, rng or random.Random())
        self.lease = Lease(engine, CURSOR_PREFIX + config.project, config.ttl(), holder)
        self.last_error: str | None = None

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self.stop.wait(seconds):
            raise ExportError("stopped")

    def _call(self, fn, **kwargs):
        """``fn(**kwargs)`` with our timeout, no client retry, and backoff on transient errors."""
        def transient(line: str) -> None:
            self.last_error = line

        return call_with_retries(
            lambda: fn(retry=None, timeout=self.cfg.timeout, **kwargs), api="Cloud Monitoring",
            backoff=self.backoff, stop=self.stop, give_up_after=self.cfg.max_attempts if self.once else None,
            stopped=lambda: ExportError("stopped"), on_error=transient, after_backoff=self.lease.renew,
            failed=lambda line, n: ExportError(f"Cloud Monitoring did not recover after {n} attempts: {line}"))

    def _refused(self, exc) -> ExportError:
        return ExportError(f"Cloud Monitoring refused project {self.cfg.project!r}: {error_line(exc)}")

    def ensure_descriptors(self, info: dict) -> dict:
        """Create the descriptors not yet recorded as created; returns the updated ``info``."""
        from google.api_core import exceptions as e

        done = set(info.get("descriptors", []))
        for d in metric_descriptors(self.cfg.project):
            if d.type in done:
                continue
            try:
                self._call(self.client.create_metric_descriptor, name=f"projects/{self.cfg.project}",
                           metric_descriptor=d)
            except e.AlreadyExists:
                pass
            except e.GoogleAPICallError as exc:
                raise self._refused(exc) from None
            done.add(d.type)
            log.info("created metric descriptor %s", d.type)
        info = dict(info, descriptors=sorted(done))
        self.lease.save(info=info)
        return info

    def pending_minutes(self, position: int, now_ns: int | None = None) -> range:
        now_ns = self.clock() if now_ns is None else now_ns
        last = (now_ns - int(self.cfg.delay * NS)) // MINUTE_NS - 1  # last complete minute
        earliest = last - MAX_BACKLOG_MINUTES + 1
        first = position + 1 if position else last - min(self.cfg.backfill_minutes, MAX_BACKLOG_MINUTES) + 1
        return range(max(first, earliest), last + 1)

    def _write_minute(self, minute: int, points: list[MetricPoint], result: ExportResult) -> None:
        from google.api_core import exceptions as e

        series = time_series(self.cfg.project, minute, points)
        for i in range(0, len(series), MAX_SERIES_PER_REQUEST):
            batch = series[i : i + MAX_SERIES_PER_REQUEST]
            try:
                self._call(self.client.create_time_series, name=f"projects/{self.cfg.project}", time_series=batch)
                result.series += len(batch)
            except e.InvalidArgument as exc:
                # Retrying cannot help (e.g. points already written by a run that crashed
                # before moving the watermark): say so and go on.
                self.last_error = error_line(exc)
                result.skipped += len(batch)
                log.warning("Cloud Monitoring refused %d series of minute %s: %s", len(batch),
                            rfc3339(minute * MINUTE_NS), self.last_error)
            except e.GoogleAPICallError as exc:
                raise self._refused(exc) from None
            result.requests += 1

    def run_pass(self) -> ExportResult:
        state = self.lease.state()
        info = self.ensure_descriptors(state.info)
        result = ExportResult()
        last_write = None
        for minute in self.pending_minutes(state.position):
            points = minute_points(self.reader, minute)
            if points:
                if last_write is not None:
                    self._sleep(self.cfg.spacing - (time.monotonic() - last_write))
                self._write_minute(minute, points, result)
                last_write = time.monotonic()
            if result.first_minute is None:
                result.first_minute = minute
            result.last_minute = minute
            result.minutes += 1
            info = dict(info, last_export_ns=self.clock(), last_error=self.last_error,
                        last_minute=rfc3339((minute + 1) * MINUTE_NS))
            self.lease.save(position=minute, info=info)
        return result

    def run(self, on_pass: Callable[[ExportResult], None] | None = None) -> ExportResult | None:
        last: ExportResult | None = None
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                if not self.lease.acquire():
                    st = self.lease.state()
                    line = (f"another exporter ({st.holder}) holds the export-metrics lease for project "
                            f"{self.cfg.project!r} until {rfc3339(st.lease_expires_ns)}")
                    if self.once:
                        raise ExportError(line + "; nothing exported")
                    log.info("%s; standing by", line)
                else:
                    try:
                        last = self.run_pass()
                    except LeaseLost as exc:
                        if self.once:
                            raise ExportError(str(exc)) from None
                        log.warning("%s; standing by", exc)
                    else:
                        if on_pass is not None:
                            on_pass(last)
                    if self.once:
                        return last
                if self.stop.wait(max(self.cfg.interval - (time.monotonic() - started), 1.0)):
                    break
            return last
        except ExportError as exc:
            if str(exc) == "stopped":
                return last
            raise
        finally:
            try:
                self.lease.release()
            except Exception:  # noqa: BLE001
                log.exception("releasing the export-metrics lease failed")


def exporter_health(engine: Engine, now_ns: int | None = None) -> dict | None:
    """State of the metrics exporters, for ``/api/v1/health``; None when none ran."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    rows = read_cursors(engine, CURSOR_PREFIX)
    if not rows:
        return None
    return {"exporters": [{
        "project": st.name[len(CURSOR_PREFIX):],
        "active": bool(st.holder) and st.lease_expires_ns > now_ns,
        "exported_through": rfc3339((st.position + 1) * MINUTE_NS) if st.position else None,
        "last_export": rfc3339(st.info["last_export_ns"]) if st.info.get("last_export_ns") else None,
        "last_error": st.info.get("last_error"),
    } for st in rows]}
