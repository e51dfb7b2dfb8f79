"""decode -> tag -> write: what every source (receivers, importer, poller, demo) goes through."""

from __future__ import annotations

import logging
from concurrent.futures import Future

from sqlalchemy import Engine

from ..settings import Settings
from .inflight import InflightBytes
from .otlp import set_value_limits
from ..core.spans import SpanRecord
from .retention import RetentionPolicy
from .settler import Settler, SettlerJobs, SettlerProcess
from .stages import StageRules
from .rules_file import load_rules
from .writer import BatchWriter, SettleLag, WriterClosed, WriterFull

log = logging.getLogger(__name__)

__all__ = ["IngestPipeline", "WriterClosed", "WriterFull"]

#: Memory a decoded span takes beyond its request's bytes (measured on SDK spans: about 7.8
#: times the ~95 wire bytes of a span with a handful of attributes).
RECORD_BYTES = 700
#: A body held while it is read, inflated and decoded counts this many times its size (the
#: body, the parser's copy, the attribute bytes); the process holds at most
#: ``max(INFLIGHT_BYTES, 2 * MODALSCOPE_MAX_REQUEST_BYTES)`` of such weight at once.
BODY_WEIGHT = 2
INFLIGHT_BYTES = 64 * 1024 * 1024


class IngestPipeline:
    """Owns the writer thread and the settler thread of one process.

    ``accept(records)`` tags the records' stages and queues them; the returned future
    resolves once they are committed (raise ``WriterFull`` when the queue is at capacity or,
    with ``limit_lag``, while the settler is too far behind).
    """

    def __init__(self, engine: Engine, settings: Settings, rules: StageRules | None = None,
                 *, settle: bool | str = True, settle_interval: float = 0.5, limit_lag: bool = False,
                 evaluations=None) -> None:
        """``settle``: True/"thread" settles in a thread of this process, "process" in a
        process of its own (a second core for ``modalscope ingest otlp``), False not at all.
        ``limit_lag``: refuse spans while the settler is more than
        ``settings.max_settle_lag_s`` behind (receivers, whose spans a settler of some process
        settles; not an import, which settles at its end).
        ``evaluations``: a picklable ``engine -> schedule`` whose ``maybe_run()`` the settler
        calls between passes (the anomaly catalog evaluated ahead of requests; the commands
        pass it, so ingest does not import the analysis layer), or None."""
        self.engine = engine
        self.settings = settings
        self.rules = rules if rules is not None else load_rules(settings.rules_path or None)
        lag = None
        if limit_lag and settings.max_settle_lag_s > 0:
            lag = SettleLag(engine, settings.max_settle_lag_s, settings.settle_seconds)
        self.writer = BatchWriter(engine, max_queue_spans=settings.max_queue_spans,
                                  max_queue_bytes=settings.max_queue_bytes, lag=lag)
        set_value_limits(settings.max_value_bytes, settings.max_value_items)
        self.inflight = InflightBytes(max(INFLIGHT_BYTES, BODY_WEIGHT * settings.max_request_bytes))
        jobs = SettlerJobs(retention=RetentionPolicy.from_settings(settings), pack_every_s=None,
                           evaluations=evaluations)
        if settle == "process":
            self.settler = SettlerProcess(settings.database_url, settings.settle_seconds, interval=settle_interval,
                                          jobs=jobs)
        elif settle:
            self.settler = Settler(engine, settings.settle_seconds, interval=settle_interval, jobs=jobs)
        else:
            self.settler = None

    def start(self) -> "IngestPipeline":
        self.writer.start()
        if self.settler is not None:
            self.settler.start()
        return self

    def accept(self, records: list[SpanRecord], nbytes: int = 0) -> Future:
        """Tag and queue ``records``; ``nbytes``: the size of the request that carried them."""
        self.rules.tag(records)
        return self.writer.submit(records, nbytes + RECORD_BYTES * len(records))

    def retry_after(self) -> float:
        return self.writer.retry_after()

    def close(self) -> None:
        """Write everything queued, then settle what is due, then stop."""
        self.writer.close()
        if self.settler is not None:
            self.settler.stop(final=True)
