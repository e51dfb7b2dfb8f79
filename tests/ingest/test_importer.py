"""`import_files` streams JSON lines: requests are read a line at a time, progress follows
the bytes read, and .gz and plain files give the same store."""

from __future__ import annotations

import gzip
import random
import time

import pytest
from sqlalchemy import func, select

from modalscope.ingest.importer import import_files, iter_requests
from modalscope.ingest.otlp import decode_json
from modalscope.models import Span
from tests.factories import multimodal_trace, rules
from tests.otlp_payloads import json_line, request_protobuf

MIN = 60_000_000_000


def _lines(n: int) -> list[str]:
    rng = random.Random(5)
    base = (time.time_ns() // MIN - 30) * MIN
    return [json_line(multimodal_trace(rng, base + i * 1_000_000_000)) for i in range(n)]


def test_json_lines_are_streamed_with_progress(engine, tmp_path):
    lines = _lines(40)
    plain = tmp_path / "spans.jsonl"
    plain.write_text("\n\n" + "\n".join(lines) + "\n")
    got = list(iter_requests(str(plain)))
    assert [g[0] for g in got] == list(range(3, 43))  # line numbers: two blank lines first
    assert all(g[2] == "json" for g in got)
    reads = [g[3] for g in got]
    assert reads == sorted(reads) and reads[-1] == plain.stat().st_size

    steps: list[int] = []
    report = import_files(engine, [str(plain)], rules(), progress=steps.append)
    assert report.requests == 40 and not report.skipped
    assert sum(steps) == plain.stat().st_size
    # buffered reads: progress moves during the file, not only once at its end
    assert len(steps) >= 2, steps

    packed = tmp_path / "spans.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    steps.clear()
    again = import_files(engine, [str(packed)], rules(), progress=steps.append)
    assert again.requests == 40 and again.new_spans == 0
    assert sum(steps) == packed.stat().st_size
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar_one() == report.spans


def test_a_single_line_request_and_an_empty_file(tmp_path):
    one = tmp_path / "one.json"
    one.write_text(_lines(1)[0])
    assert [(g[0], g[2]) for g in iter_requests(str(one))] == [(1, "json")]
    empty = tmp_path / "empty.pb"
    empty.write_bytes(b"")
    assert [(g[0], g[1], g[2]) for g in iter_requests(str(empty))] == [(1, b"", "protobuf")]


def test_settling_in_background_gives_the_same_store(db_url, tmp_path, monkeypatch):
    """A big import settles in a settler process while it reads: the store ends exactly as a
    serial import leaves it (every trace settled, the same rollups), a trace whose spans
    come in two far-apart lines (settled, then re-settled) included."""
    from modalscope.ingest import importer
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade
    from tests.ingest.test_writer import snapshot

    monkeypatch.setattr(importer, "BACKGROUND_SETTLE_SECONDS", 0.0)  # settle whatever it sees
    rng = random.Random(9)
    split = multimodal_trace(rng, (time.time_ns() // MIN - 40) * MIN, images=2)
    lines = [json_line(split[:3])] + _lines(300) + [json_line(split[3:])]
    f = tmp_path / "spans.jsonl"
    f.write_text("\n".join(lines) + "\n")
    serial_url = f"sqlite:///{tmp_path / 'serial.db'}"
    upgrade(serial_url)
    serial = make_engine(serial_url, write=True)
    import_files(serial, [str(f)], rules(), settle_in_background=False)
    engine = make_engine(db_url, write=True)
    report = import_files(engine, [str(f)], rules(), settle_in_background=True)
    assert report.requests == 302
    a, b = snapshot(serial), snapshot(engine)
    assert a["spans"] == b["spans"] and a["traces"] == b["traces"] and a["rollups"] == b["rollups"]
    assert not any(t[-1] for t in b["traces"].values())  # nothing left pending
    serial.dispose()
    engine.dispose()


@pytest.mark.parametrize("fmt", ["json", "protobuf"])
def test_decoding_runs_ahead_of_a_slow_store_by_a_bound(engine, tmp_path, monkeypatch, fmt):
    """Files are decoded while the writer thread commits earlier requests, but never more
    than ``MAX_QUEUED_SPANS`` (``MAX_QUEUED_JSON_SPANS`` for OTLP/JSON) ahead of it (a slow
    store must not fill memory), and every span still arrives, counted once."""
    from modalscope.ingest import importer, writer

    lines = _lines(60)
    if fmt == "json":
        f = tmp_path / "spans.jsonl"
        f.write_text("\n".join(lines) + "\n")
        files = [str(f)]
        # the other format's bound is far off: this one is what holds the decoder back
        monkeypatch.setattr(importer, "MAX_QUEUED_JSON_SPANS", 40)
        monkeypatch.setattr(importer, "MAX_QUEUED_SPANS", 1_000_000)
    else:
        files = []
        for i, line in enumerate(lines):
            path = tmp_path / f"request-{i:03d}.pb"
            path.write_bytes(request_protobuf(decode_json(line.encode(), source="import").spans))
            files.append(str(path))
        monkeypatch.setattr(importer, "MAX_QUEUED_SPANS", 40)
        monkeypatch.setattr(importer, "MAX_QUEUED_JSON_SPANS", 1_000_000)
    real_write, queued = writer.write_spans, []

    def slow_write(eng, records, *a, **k):
        time.sleep(0.01)
        return real_write(eng, records, *a, **k)

    real_submit = writer.BatchWriter.submit

    def watched_submit(self, records):
        queued.append(self.queued_spans)  # spans still waiting when the next request comes
        return real_submit(self, records)

    monkeypatch.setattr(writer, "write_spans", slow_write)
    monkeypatch.setattr(writer.BatchWriter, "submit", watched_submit)
    report = import_files(engine, files, rules())
    assert report.requests == 60 and not report.skipped
    assert max(queued) > 0  # the decoder did run ahead of the writer
    # at most the bound plus the one request that crossed it
    assert max(queued) < 40 + max(len(decode_json(x.encode(), source="import").spans) for x in lines)
    assert report.written_s <= report.settled_s
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar_one() == report.spans == report.new_spans


def test_a_failed_write_stops_the_import_with_committed_requests_whole(engine, tmp_path, monkeypatch):
    """When the store refuses a write (not an outage: a broken row), the import stops with
    that error; what was committed before it is whole requests, and nothing is half-written."""
    from modalscope.ingest import importer, writer

    lines = _lines(30)
    f = tmp_path / "spans.jsonl"
    f.write_text("\n".join(lines) + "\n")
    real_write, calls = writer.write_spans, []

    def failing_write(eng, records, *a, **k):
        calls.append(len(records))
        if len(calls) >= 2:
            raise ValueError("disk says no")
        return real_write(eng, records, *a, **k)

    monkeypatch.setattr(importer, "BATCH_SPANS", 10)  # commits of a few requests: several of them
    monkeypatch.setattr(writer, "write_spans", failing_write)
    try:
        import_files(engine, [str(f)], rules())
    except ValueError as exc:
        assert "disk says no" in str(exc)
    else:
        raise AssertionError("the import went on after a failed write")
    sizes = {}
    for line in lines:
        spans = decode_json(line.encode(), source="import").spans
        sizes[spans[0].trace_id] = len(spans)
    with engine.connect() as conn:
        stored = dict(conn.execute(select(Span.trace_id, func.count()).group_by(Span.trace_id)).all())
    assert stored  # the first writes were committed
    assert all(stored[t] == sizes[t] for t in stored)  # each stored trace is whole


def test_tune_gc_raises_the_young_threshold_and_never_lowers_it():
    import gc

    from modalscope.ingest.runtime import YOUNG_COLLECTION_ALLOCATIONS, tune_gc

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        tune_gc()
        assert gc.get_threshold() == (YOUNG_COLLECTION_ALLOCATIONS, 10, 10)
        gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS * 2, 5, 7)
        tune_gc()
        assert gc.get_threshold() == (YOUNG_COLLECTION_ALLOCATIONS * 2, 5, 7)
        gc.set_threshold(0)  # a process that turned the collector off keeps it off
        tune_gc()
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*saved)
