"""The Cloud Trace (v1 API) poller behind `modalscope ingest cloud-trace`.

Spans become ``SpanRecord`` in ``cloud_trace_spans.py`` (docs/design.md, "Cloud Trace
mapping"); its names are re-exported here.

The poller reads ``ListTraces`` (``view=COMPLETE``) window by window:

* The first pass starts ``backfill`` ago; later passes at the watermark minus ``overlap``
  (late-indexed spans); every pass stops at now minus ``lag`` (indexing lag). Re-fetched
  spans are deduplicated by the writer, so overlap costs quota, never correctness.
* The watermark (``cursors.position``) moves only after a whole slice of the window (at
  most ``chunk`` seconds of trace time, every page of it) is written and settled: a crash
  mid-slice re-reads that slice, never skips it. Spans ending before the watermark have
  all been asked for.
* Quota: ListTraces costs 25 read units and a project gets about 300 a minute, so calls
  are spaced ``60 / calls_per_minute`` seconds apart (default 10 a minute: 250 units,
  headroom for the console). RESOURCE_EXHAUSTED / UNAVAILABLE / DEADLINE_EXCEEDED back off
  exponentially with jitter; the client's own retry is off (it retries for 45 s by
  default) and each call has its own timeout. PERMISSION_DENIED, UNAUTHENTICATED and
  friends stop the poller with one line.
* When the traffic needs more calls than the quota allows, the poller says so (log and
  ``poller_health``); ``min_latency_ms`` asks only for traces at least that slow
  (``latency:`` filter) and records that the data is sampled.
* One active poller per project: a lease on the cursor row (``ingest/cursors.py``).

The Google client libraries are imported when a client is made or a request built: the
dashboard, which imports this module's health check, never loads them.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable

from sqlalchemy import Engine

from .cursors import Lease, LeaseLost, read_cursors
from .google_api import Backoff, api_errors, call_with_retries, error_line, google_client
from ..core.spans import SpanRecord
from ..durations import NS
from .cloud_trace_spans import trace_records
from .cloud_trace_spans import (  # noqa: F401 - re-exported: the mapping is named from here
    BOOL_KEYS, NUMERIC_KEYS, SOURCE, coerce_label, instance_of, normalize_trace_id, service_of, span_record)

log = logging.getLogger(__name__)

CURSOR_PREFIX = "cloud-trace:"
UNITS_PER_CALL = 25  # ListTraces read-quota cost
DEFAULT_QUOTA_UNITS = 300  # per minute and project

# -- client -----------------------------------------------------------------------------------

class PollError(Exception):
    """The poller cannot go on (bad credentials, permission, quota never recovering): one line."""


def make_trace_client(endpoint: str = ""):
    """A ``TraceServiceClient`` (see :func:`google_client`)."""
    from google.cloud.trace_v1 import TraceServiceClient
    from google.cloud.trace_v1.services.trace_service.transports import TraceServiceGrpcTransport

    return google_client(TraceServiceClient, TraceServiceGrpcTransport, endpoint, PollError)


def parse_duration(text: str) -> float:
    """'90', '90s', '500ms', '2m', '6h', '1d' -> seconds."""
    t = text.strip().lower()
    for suffix, mult in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86400.0)):
        if t.endswith(suffix) and not (suffix == "s" and t.endswith("ms")):
            number = t[: -len(suffix)]
            break
    else:
        number, mult = t, 1.0
    try:
        value = float(number) * mult
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 500ms, 2m, 6h)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 500ms, 2m, 6h)")
    return value


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / NS, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- poller -----------------------------------------------------------------------------------

@dataclass
class PollerConfig:
    project: str
    interval: float = 60.0  # seconds between passes
    backfill: float = 3600.0  # first pass looks back this far
    overlap: float = 120.0  # later passes re-read this much before the watermark
    lag: float = 10.0  # and stop this long before now (indexing lag)
    page_size: int = 100  # the API's maximum
    calls_per_minute: float = 10.0  # 10 x 25 units = 250 of the ~300 a minute
    min_latency_ms: float | None = None  # only traces at least this slow (sampled data)
    timeout: float = 30.0  # per call
    backoff_initial: float = 5.0
    backoff_max: float = 300.0
    max_attempts: int = 8  # per call in --once mode (about 10 minutes of backing off)
    chunk: float = 1800.0  # seconds of trace time per checkpointed slice (an empty one costs a call)
    lease_ttl: float = 0.0  # 0: max(120 s, 3 intervals)

    def ttl(self) -> float:
        return self.lease_ttl or max(120.0, 3 * self.interval, 2 * self.backoff_max)


@dataclass
class PassResult:
    window_start_ns: int
    window_end_ns: int
    calls: int = 0
    traces: int = 0
    spans: int = 0
    new_spans: int = 0
    retries: int = 0
    falling_behind: bool = False
    behind_seconds: float = 0.0
    calls_needed_per_minute: float = 0.0

    def summary(self, project: str) -> str:
        return (f"cloud-trace {project}: {self.spans} spans ({self.new_spans} new) in {self.traces} traces, "
                f"{rfc3339(self.window_start_ns)} .. {rfc3339(self.window_end_ns)}, {self.calls} calls"
                + (f", {self.retries} retried" if self.retries else ""))


class CloudTracePoller:
    """Polls one project; ``run_pass()`` is one complete pass (lease must be held)."""

    def __init__(self, engine: Engine, client, config: PollerConfig, rules=None, *,
                 stop: threading.Event | None = None, once: bool = False, holder: str | None = None,
                 clock: Callable[[], int] = time.time_ns, rng: random.Random | None = None) -> None:
        if rules is None:
            from .rules_file import load_rules

            rules = load_rules(None)
        self.engine = engine
        self.client = client
        self.cfg = config
        self.rules = rules
        self.stop = stop or threading.Event()
        self.once = once
        self.clock = clock
        self.backoff = Backoff(config.backoff_initial, config.backoff_max, rng or random.Random())
        self.lease = Lease(engine, CURSOR_PREFIX + config.project, config.ttl(), holder)
        self._next_call = 0.0  # monotonic time before which no call is made
        self.last_error: str | None = None

    # -- pacing and retries --------------------------------------------------------------
    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self.stop.wait(seconds):
            raise PollError("stopped")

    def _pace(self) -> None:
        self._sleep(self._next_call - time.monotonic())
        self._next_call = time.monotonic() + 60.0 / max(self.cfg.calls_per_minute, 1e-6)

    def _request(self, start_ns: int, end_ns: int, page_token: str):
        from google.cloud.trace_v1 import ListTracesRequest
        from google.protobuf.timestamp_pb2 import Timestamp

        req = ListTracesRequest(
            project_id=self.cfg.project,
            view=ListTracesRequest.ViewType.COMPLETE,
            page_size=self.cfg.page_size,
            page_token=page_token,
            start_time=Timestamp(seconds=start_ns // NS, nanos=start_ns % NS),
            end_time=Timestamp(seconds=end_ns // NS, nanos=end_ns % NS),
        )
        if self.cfg.min_latency_ms:
            req.filter = f"latency:{int(round(self.cfg.min_latency_ms))}ms"
        return req

    def _call(self, request, result: PassResult):
        _, api_error = api_errors()

        def attempt():
            self._pace()
            self.lease.renew()
            result.calls += 1

        def transient(line: str) -> None:
            result.retries += 1
            self.last_error = line

        try:
            page = call_with_retries(
                lambda: self.client.list_traces(request=request, retry=None, timeout=self.cfg.timeout),
                api="Cloud Trace", backoff=self.backoff, stop=self.stop,
                give_up_after=self.cfg.max_attempts if self.once else None,
                stopped=lambda: PollError("stopped"), on_error=transient, before_attempt=attempt,
                failed=lambda line, n: PollError(f"Cloud Trace did not recover after {n} attempts: {line}"))
        except api_error as exc:
            self.last_error = error_line(exc)
            raise PollError(f"Cloud Trace refused project {self.cfg.project!r}: {self.last_error}") from None
        self.last_error = None
        return page

    # -- one pass ------------------------------------------------------------------------
    def window(self, now_ns: int | None = None) -> tuple[int, int]:
        now_ns = self.clock() if now_ns is None else now_ns
        position = self.lease.state().position
        end = now_ns - int(self.cfg.lag * NS)
        start = position - int(self.cfg.overlap * NS) if position else now_ns - int(self.cfg.backfill * NS)
        return start, end

    def _write(self, traces: Iterable, result: PassResult, touched: set[str]) -> None:
        from .writer import write_spans

        records: list[SpanRecord] = []
        for trace in traces:
            recs = trace_records(trace)
            if recs:
                result.traces += 1
                records.extend(recs)
                touched.add(recs[0].trace_id)
        if records:
            self.rules.tag(records)
            res = write_spans(self.engine, records)
            result.spans += res.received
            result.new_spans += res.inserted
            self._newest_end = max(self._newest_end, max(r.end_ns for r in records))

    def run_pass(self) -> PassResult:
        from .settle import settle

        pass_started = time.monotonic()
        start, end = self.window()
        state = self.lease.state()
        info = dict(state.info)
        self._newest_end = int(info.get("newest_span_end_ns", 0) or 0)
        result = PassResult(start, end)
        if end <= start:
            return result
        slice_start = start
        while slice_start < end:
            slice_end = min(end, slice_start + int(self.cfg.chunk * NS))
            touched: set[str] = set()
            token = ""
            while True:
                page = self._call(self._request(slice_start, slice_end, token), result)
                self._write(page.traces, result, touched)
                token = page.next_page_token
                if not token:
                    break
            if touched:
                settle(self.engine, trace_ids=sorted(touched), force=True)
            info.update(self._info(result, pass_started, slice_end, done=slice_end >= end))
            self.lease.save(position=slice_end, info=info)
            slice_start = slice_end
        return result

    def _info(self, result: PassResult, pass_started: float, position: int, done: bool) -> dict:
        """State for /api/v1/health, and the falling-behind verdict."""
        now = self.clock()
        behind = max(0.0, (now - int(self.cfg.lag * NS) - position) / NS)
        window_s = max((min(position, result.window_end_ns) - result.window_start_ns) / NS, 1e-3)
        # At this traffic, a steady pass (interval + overlap of traces) needs this many calls
        # a minute, against what the quota spacing allows.
        per_pass = result.traces / window_s * (self.cfg.interval + self.cfg.overlap) / self.cfg.page_size
        needed = math.ceil(per_pass) * 60.0 / self.cfg.interval if result.traces >= self.cfg.page_size else 0.0
        falling = behind > max(2 * self.cfg.interval, 300.0) or needed > self.cfg.calls_per_minute
        result.falling_behind = falling
        result.behind_seconds = behind
        result.calls_needed_per_minute = needed
        out = {
            "project": self.cfg.project,
            "last_pass_calls": result.calls,
            "last_pass_spans": result.spans,
            "last_pass_seconds": round(time.monotonic() - pass_started, 3),
            "newest_span_end_ns": self._newest_end,
            "behind_seconds": round(behind, 1),
            "falling_behind": falling,
            "calls_needed_per_minute": round(needed, 2),
            "calls_per_minute": self.cfg.calls_per_minute,
            "sampled": bool(self.cfg.min_latency_ms),
            "min_latency_ms": self.cfg.min_latency_ms,
            "last_error": self.last_error,
        }
        if done:
            out["last_pass_ns"] = now
        return out

    def warn_if_behind(self, result: PassResult) -> None:
        if result.falling_behind:
            log.warning(
                "Cloud Trace project %s: traffic is more than the read quota can pull: about %.0f ListTraces "
                "calls a minute needed (%.0f units), %g allowed (%g units; 25 units a call); %.0fs behind. "
                "Raise the quota or --interval, or pass --min-latency to pull only slow traces (the data is "
                "then sampled).", self.cfg.project, result.calls_needed_per_minute,
                result.calls_needed_per_minute * UNITS_PER_CALL, self.cfg.calls_per_minute,
                self.cfg.calls_per_minute * UNITS_PER_CALL, result.behind_seconds)

    # -- the loop ------------------------------------------------------------------------
    def run(self, on_pass: Callable[[PassResult], None] | None = None) -> PassResult | None:
        """``once``: one pass (PollError if the lease is held elsewhere); else poll until ``stop``."""
        last: PassResult | None = None
        waiting_logged = False
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                if not self.lease.acquire():
                    st = self.lease.state()
                    line = (f"another poller ({st.holder}) holds the Cloud Trace lease for project "
                            f"{self.cfg.project!r} until {rfc3339(st.lease_expires_ns)}")
                    if self.once:
                        raise PollError(line + "; nothing polled")
                    if not waiting_logged:
                        log.info("%s; standing by", line)
                        waiting_logged = True
                else:
                    waiting_logged = False
                    try:
                        last = self.run_pass()
                    except LeaseLost as exc:
                        if self.once:
                            raise PollError(str(exc)) from None
                        log.warning("%s; standing by", exc)
                        last = None
                    else:
                        self.warn_if_behind(last)
                        if on_pass is not None:
                            on_pass(last)
                    if self.once:
                        return last
                wait = self.cfg.interval - (time.monotonic() - started)
                if self.stop.wait(max(wait, 1.0 if self.lease.held else self.cfg.interval)):
                    break
            return last
        except PollError as exc:
            if str(exc) == "stopped":
                return last
            raise
        finally:
            try:
                self.lease.release()
            except Exception:  # noqa: BLE001 - the lease expires on its own
                log.exception("releasing the Cloud Trace lease failed")


# -- health -----------------------------------------------------------------------------------

def poller_health(engine: Engine, now_ns: int | None = None) -> dict | None:
    """State of the Cloud Trace pollers from their cursor rows, for ``/api/v1/health``; None if none ran.

    ``{"pollers": [{"project", "active", "holder", "watermark", "last_pass", "behind_seconds",
    "falling_behind", "sampled", "min_latency_ms", "last_error"}], "falling_behind": bool,
    "sampled": bool}``
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    rows = read_cursors(engine, CURSOR_PREFIX)
    if not rows:
        return None
    pollers = []
    for st in rows:
        info = st.info
        last_pass = info.get("last_pass_ns")
        pollers.append({
            "project": st.name[len(CURSOR_PREFIX):],
            "active": bool(st.holder) and st.lease_expires_ns > now_ns,
            "holder": st.holder if st.lease_expires_ns > now_ns else None,
            "watermark": rfc3339(st.position) if st.position else None,
            "last_pass": rfc3339(last_pass) if last_pass else None,
            "behind_seconds": info.get("behind_seconds"),
            "falling_behind": bool(info.get("falling_behind")),
            "sampled": bool(info.get("sampled")),
            "min_latency_ms": info.get("min_latency_ms"),
            "last_error": info.get("last_error"),
        })
    return {"pollers": pollers, "falling_behind": any(p["falling_behind"] for p in pollers),
            "sampled": any(p["sampled"] for p in pollers)}
