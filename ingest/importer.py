"""`modalscope import`: OTLP JSON and protobuf files into the store.

A file is either one OTLP request (JSON object or protobuf ``ExportTraceServiceRequest``)
or JSON lines, one request a line, as the Collector's file exporter writes them; ``.gz``
files are read through gzip. Each request is all or nothing: one that does not decode, or
has any span we would reject, is reported as ``FILE:LINE: reason`` and skipped; the rest
are written. Imported traces are settled before the import returns.

Files as real producers write them: OTLP/JSON in camelCase or snake_case field names, a
KeyValue without ``key`` (the Collector leaves an empty key out) kept with key ``""``. Lines
that are OTLP logs or metrics (a Collector file exporter fed by several pipelines) are not
traces: they are counted and reported once a file (``FILE: 12 lines are OTLP logs/metrics,
not traces``), not errors. A file that yields no span at all gets one line saying why
(``FILE: no spans: ...``) and makes the import's exit status non-zero.

Spans older than the raw-span retention (``MODALSCOPE_RETENTION_DAYS``) would be imported
only to be deleted by the next retention pass (every settler runs one every 10 minutes),
so an import given ``retention_days`` first reads every file for its oldest span start and,
if any starts before the cutoff, refuses with :class:`ImportRefused` before anything is
written: one line naming the file and line, how old the spans are, and the setting value
that keeps them. There is no flag to import them anyway: with the setting unchanged they
would still be pruned, silently, minutes later. The check costs a second read of the
files (a text scan for the start times of JSON, a parse of start times only for protobuf),
a small part of an import's decode and write.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import time
import zlib
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Iterator

from sqlalchemy import Engine

from .otlp import DecodeError, NotTracesError, decode_json, decode_protobuf, oldest_start_ns
from ..core.spans import SpanRecord
from .settle import settle
from .settler import SettlerProcess
from .stages import StageRules
from .writer import BatchWriter
from ..durations import DAY_NS as _DAY_NS

BATCH_SPANS = 5000


@dataclass
class ImportReport:
    files: int = 0
    requests: int = 0
    spans: int = 0
    new_spans: int = 0
    traces: int = 0
    skipped: list[str] = field(default_factory=list)  # "FILE:LINE: reason"
    no_spans: list[str] = field(default_factory=list)  # "FILE: no spans: why", one a file
    notes: list[str] = field(default_factory=list)  # "FILE: 12 lines are OTLP logs/metrics, not traces"
    written_s: float = 0.0  # from the start until the last span was committed
    settled_s: float = 0.0  # ... until every imported trace was settled (the import's end)

    def summary(self) -> str:
        return (f"imported {self.spans} spans ({self.new_spans} new) in {self.traces} traces "
                f"from {self.requests} requests in {self.files} files; {len(self.skipped)} skipped; "
                + (f"{len(self.no_spans)} files without spans; " if self.no_spans else "")
                + f"written in {self.written_s:.1f} s, settled in {self.settled_s:.1f} s")

    @property
    def failed(self) -> bool:
        """Something was skipped or a file held no span: the import's exit status is non-zero."""
        return bool(self.skipped or self.no_spans)


class ImportRefused(ValueError):
    """The import was refused before anything was written; the message is one line."""


# A span start in OTLP/JSON, camelCase or snake_case, as a string or an integer (a number
# in exponent form is left out rather than misread as its first digits).
_JSON_START = re.compile(rb'"start_?[Tt]ime_?[Uu]nix_?[Nn]ano"\s*:\s*"?(\d+)(?![\d.eE])')


def _is_trace_json(payload: bytes) -> bool:
    return b'"resourceSpans"' in payload or b'"resource_spans"' in payload


def check_retention(paths: list[str], retention_days: float, now_ns: int | None = None) -> None:
    """Raise :class:`ImportRefused` when a span in ``paths`` starts before the retention
    cutoff (``retention_days`` before now; 0 or less keeps everything). Unreadable files and
    requests that do not decode are left for the import to report."""
    if retention_days <= 0:
        return
    now_ns = time.time_ns() if now_ns is None else now_ns
    cutoff = now_ns - int(retention_days * _DAY_NS)
    oldest: tuple[int, str, int] | None = None
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            for line_no, payload, fmt, _read in iter_requests(path):
                if fmt == "json":
                    if not _is_trace_json(payload):
                        continue  # logs, metrics (their data points have start times too)
                    starts = _JSON_START.findall(payload)
                    start = min(map(int, starts)) if starts else None
                else:
                    try:
                        start = oldest_start_ns(payload)
                    except DecodeError:
                        continue
                if start is not None and start < cutoff and (oldest is None or start < oldest[0]):
                    oldest = (start, path, line_no)
        except (OSError, EOFError, zlib.error):
            continue
    if oldest is None:
        return
    start, path, line_no = oldest
    age_days = (now_ns - start) / _DAY_NS
    when = time.strftime("%Y-%m-%d", time.gmtime(start / 1e9))
    raise ImportRefused(
        f"{path}:{line_no}: spans start as early as {when} ({age_days:,.1f} days ago), past the raw-span "
        f"retention of {retention_days:g} days: the next retention pass would delete them. Nothing was "
        f"imported; set MODALSCOPE_RETENTION_DAYS={math.ceil(age_days) + 1} or more (0 keeps spans forever) "
        f"and import again")


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def iter_requests(path: str) -> Iterator[tuple[int, bytes | None, str, int]]:
    """Yield (line number, payload, format, bytes of the file read so far) for each request.

    A file whose first non-blank byte is ``{`` is JSON: one object (possibly spread over
    many lines) or JSON lines, read a line at a time (a Collector's file can be larger than
    memory). Anything else is a single protobuf request. ``.gz`` files are read through gzip
    (the byte count is then of the compressed file).
    """
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        fh = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        head: list[bytes] = []
        first = None
        for line in fh:
            head.append(line)
            if line.strip():
                first = line
                break
        first_no = len(head)
        if first is None or not first.lstrip().startswith(b"{"):
            yield 1, b"".join(head) + fh.read(), "protobuf", raw.tell()
            return
        # JSON lines when the first line is a complete object by itself; a pretty-printed
        # single request's first line ("{") is not, so such a file is read whole.
        if not _is_json(first):
            yield first_no, b"".join(head) + fh.read(), "json", raw.tell()
            return
        del head
        yield first_no, first, "json", raw.tell()
        for line_no, line in enumerate(fh, start=first_no + 1):
            if line.strip():
                yield line_no, line, "json", raw.tell()


# Files at least this large are settled while they are read, by a settler process on the
# other core (as `modalscope ingest otlp` does); smaller ones settle at the end.
BACKGROUND_SETTLE_BYTES = 16 << 20
BACKGROUND_SETTLE_SECONDS = 2.0


def import_files(engine: Engine, paths: list[str], rules: StageRules,
                 progress: Callable[[int], None] | None = None,
                 settle_in_background: bool | None = None,
                 retention_days: float = 0.0) -> ImportReport:
    """Import ``paths``; ``progress(bytes)`` is called as each file's requests are read.

    ``settle_in_background``: settle traces idle ``BACKGROUND_SETTLE_SECONDS`` in a settler
    process while importing (None: when the files add up to ``BACKGROUND_SETTLE_BYTES``).
    Either way every imported trace is settled before this returns.
    ``retention_days`` > 0: refuse (:class:`ImportRefused`, nothing written) when a span is
    older than that (:func:`check_retention`)."""
    check_retention(paths, retention_days)
    if settle_in_background is None:
        settle_in_background = sum(os.path.getsize(p) for p in paths if os.path.isfile(p)) >= BACKGROUND_SETTLE_BYTES
    t0 = time.perf_counter()
    settler = None
    if settle_in_background:
        settler = SettlerProcess(engine.url.render_as_string(hide_password=False), BACKGROUND_SETTLE_SECONDS).start()
    try:
        report = _import(engine, paths, rules, progress, settler, t0)
    finally:
        if settler is not None:
            settler.stop()
    report.settled_s = time.perf_counter() - t0
    return report


# Decoded spans waiting for the writer thread at most: decoding runs ahead of the store by
# this much (a few tens of MB), no further.
MAX_QUEUED_SPANS = 40_000
# ... while importing OTLP/JSON, which decodes at about half the writer's pace, so a deeper
# queue only holds memory: a JSON-lines import peaked higher with 40,000 and was written no
# faster (protobuf files, decoded faster than they are written, keep the deeper queue).
MAX_QUEUED_JSON_SPANS = 20_000


def _file_outcome(report: ImportReport, path: str, spans: int, requests: int, not_traces: int,
                  skipped: int) -> None:
    """The file's one line for lines that are not traces, or for yielding no span."""
    other = f"{not_traces} line{'s are' if not_traces != 1 else ' is'} OTLP logs/metrics, not traces"
    if spans:
        if not_traces:
            report.notes.append(f"{path}: {other}")
        return
    if not_traces:
        why = other
    elif skipped:
        why = f"{skipped} request{'s' if skipped != 1 else ''} skipped (above), none imported"
    elif requests:
        why = f"{requests} request{'s' if requests != 1 else ''} without spans (no resourceSpans in it)"
    else:
        why = "the file is empty"
    report.no_spans.append(f"{path}: no spans: {why}")


def _import(engine: Engine, paths: list[str], rules: StageRules, progress, settler, t0: float) -> ImportReport:
    """Decode in this thread while a writer thread commits what was decoded before (the
    receivers' ``BatchWriter``): SQLite's part of a write runs beside the next decode."""
    report = ImportReport()
    trace_ids: set[str] = set()
    # No retry of an unavailable store either: the import stops with its error in one line
    # (re-running it is safe), as it did when it wrote in this thread.
    writer = BatchWriter(engine, max_queue_spans=1 << 62, max_batch_spans=BATCH_SPANS * 4,
                         isolate_failures=False, unavailable_retry_seconds=0).start()
    in_flight: deque[Future] = deque()

    bound = MAX_QUEUED_SPANS

    def settle_done(block: bool) -> None:
        # A write that failed stops the import (what was committed before it stays, whole
        # requests only); the finished ones are dropped from the queue as they complete.
        while in_flight and (in_flight[0].done() or block):
            in_flight.popleft().result()
            block = block and writer.queued_spans >= bound

    try:
        for path in paths:
            if not os.path.isfile(path):
                report.skipped.append(f"{path}:0: no such file")
                continue
            report.files += 1
            size = os.path.getsize(path)
            done = 0  # bytes of this file reported to ``progress``
            file_spans = file_requests = not_traces = 0
            skipped_before = len(report.skipped)
            try:
                for line_no, payload, fmt, read in iter_requests(path):
                    if progress is not None and read > done:
                        progress(min(read, size) - done)
                        done = min(read, size)
                    if fmt == "protobuf" and not payload.strip():
                        break  # an empty (or blank) file: said below
                    try:
                        result = (decode_json(payload, source="import") if fmt == "json"
                                  else decode_protobuf(payload, source="import"))
                    except NotTracesError:
                        not_traces += 1
                        continue
                    except DecodeError as exc:
                        report.skipped.append(f"{path}:{line_no}: {exc}")
                        continue
                    if result.rejected:
                        reason = "; ".join(result.errors[:3]) or "invalid spans"
                        report.skipped.append(f"{path}:{line_no}: {result.rejected} span(s) rejected: {reason}")
                        continue
                    report.requests += 1
                    file_requests += 1
                    file_spans += len(result.spans)
                    rules.tag(result.spans)
                    report.spans += len(result.spans)
                    trace_ids.update(s.trace_id for s in result.spans)
                    if result.spans:
                        in_flight.append(writer.submit(result.spans))
                    bound = MAX_QUEUED_JSON_SPANS if fmt == "json" else MAX_QUEUED_SPANS
                    settle_done(block=writer.queued_spans >= bound)
            except (OSError, EOFError, zlib.error) as exc:
                reason = getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__
                report.skipped.append(f"{path}:0: cannot read: {reason}")
                continue
            finally:
                if progress is not None and size > done:
                    progress(size - done)
            _file_outcome(report, path, file_spans, file_requests, not_traces,
                          len(report.skipped) - skipped_before)
        writer.close(timeout=None)
        settle_done(block=True)
    finally:
        writer.close(timeout=None)  # after a failure: what was queued is still written, then stop
    report.new_spans = writer.spans_written
    report.written_s = time.perf_counter() - t0
    report.traces = len(trace_ids)
    if settler is not None:
        settler.stop()  # its last pass done, the rest is settled here
    if trace_ids:
        settle(engine, trace_ids=sorted(trace_ids), force=True)
    return report
