"""`import_files` streams JSON lines: requests are read a line at a time, progress follows
the bytes read, and .gz and plain files give the same store."""

from __future__ import annotations

import base64
import gzip
import json
import random
import time

import pytest
from sqlalchemy import func, select

from modalscope.ingest.importer import import_files, iter_requests
from modalscope.ingest.otlp import decode_json
from modalscope.models import Span
from tests.factories import multimodal_trace, rules
from tests.otlp_payloads import (
    json_line,
    logs_request_json,
    metrics_request_json,
    request_json,
    request_protobuf,
    snake_case,
)

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


# --------------------------------------------------------------------------- files as producers write them


def _write_lines(path, objs) -> None:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))


def _stored(engine) -> dict[str, tuple]:
    with engine.connect() as conn:
        return {r.span_id: r for r in conn.execute(select(Span.span_id, Span.links, Span.attributes, Span.source))}


def test_snake_case_lines_with_keyless_attributes_and_links_are_imported(engine, tmp_path):
    rng = random.Random(21)
    base = (time.time_ns() // MIN - 30) * MIN
    producer, consumer = multimodal_trace(rng, base), multimodal_trace(rng, base + 2_000_000_000)
    consumer[0].links = [{"trace_id": producer[1].trace_id, "span_id": producer[1].span_id,
                          "attributes": {"messaging.operation": "receive"}}]
    camel = request_json(consumer)
    camel["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append({"value": {"stringValue": "anon"}})
    f = tmp_path / "collector.jsonl"
    _write_lines(f, [snake_case(request_json(producer)), snake_case(camel)])
    assert '"resource_spans"' in f.read_text() and '"trace_id"' in f.read_text()

    report = import_files(engine, [str(f)], rules())
    assert not report.failed and not report.notes, (report.skipped, report.no_spans)
    assert report.spans == len(producer) + len(consumer)
    rows = _stored(engine)
    root = rows[consumer[0].span_id]
    assert json.loads(root.links) == consumer[0].links
    assert json.loads(root.attributes)[""] == "anon"
    assert all(rows[s.span_id].links is None for s in producer + consumer[1:])


def test_logs_and_metrics_lines_are_counted_once_a_file(engine, tmp_path):
    spans = multimodal_trace(random.Random(4), (time.time_ns() // MIN - 30) * MIN)
    mixed = tmp_path / "otel.jsonl"
    _write_lines(mixed, [logs_request_json(), json_line(spans), metrics_request_json(), snake_case(logs_request_json())])
    only_logs = tmp_path / "logs.jsonl"
    _write_lines(only_logs, [logs_request_json(), metrics_request_json()])

    report = import_files(engine, [str(mixed), str(only_logs)], rules())
    assert report.spans == len(spans) and report.requests == 1 and not report.skipped
    assert report.notes == [f"{mixed}: 3 lines are OTLP logs/metrics, not traces"]
    assert report.no_spans == [f"{only_logs}: no spans: 2 lines are OTLP logs/metrics, not traces"]
    assert report.failed  # a file without spans fails the import
    assert "1 files without spans" in report.summary()


def test_a_file_without_spans_says_why(engine, tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    blank = tmp_path / "blank.pb"
    blank.write_bytes(b"\n\n")
    hollow = tmp_path / "hollow.jsonl"
    _write_lines(hollow, [{"resourceSpans": []}, {}])
    bad = tmp_path / "bad.jsonl"
    _write_lines(bad, [{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "x"}]}]}]}, '{"resourceSpans": ['])

    report = import_files(engine, [str(p) for p in (empty, blank, hollow, bad)], rules())
    assert report.spans == 0 and report.failed
    assert report.no_spans == [
        f"{empty}: no spans: the file is empty",
        f"{blank}: no spans: the file is empty",
        f"{hollow}: no spans: 2 requests without spans (no resourceSpans in it)",
        f"{bad}: no spans: 2 requests skipped (above), none imported",
    ]
    assert [line.split(": ")[0] for line in report.skipped] == [f"{bad}:1", f"{bad}:2"]


def test_base64_ids_are_skipped_with_a_hint(engine, tmp_path):
    spans = multimodal_trace(random.Random(6), (time.time_ns() // MIN - 30) * MIN)
    body = request_json(spans)
    for sp in body["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        sp["traceId"] = base64.b64encode(bytes.fromhex(sp["traceId"])).decode()
        sp["spanId"] = base64.b64encode(bytes.fromhex(sp["spanId"])).decode()
        sp.pop("parentSpanId", None)
    f = tmp_path / "converted.json"
    f.write_text(json.dumps(body, indent=1))
    report = import_files(engine, [str(f)], rules())
    (line,) = report.skipped
    assert line.startswith(f"{f}:1: ") and "looks like base64; OTLP/JSON wants hex" in line
    assert report.spans == 0 and report.failed


# --------------------------------------------------------------------------- retention


def _old_and_new_files(tmp_path, days_old: float) -> tuple[list[str], int]:
    rng = random.Random(8)
    now = time.time_ns()
    fresh = multimodal_trace(rng, now - 3_600_000_000_000)
    old = multimodal_trace(rng, now - int(days_old * 86_400_000_000_000))
    new_file = tmp_path / "new.jsonl"
    _write_lines(new_file, [json_line(fresh), metrics_request_json(start_ns=1)])  # ancient metrics do not count
    old_file = tmp_path / "old.pb.gz"
    old_file.write_bytes(gzip.compress(request_protobuf(old)))
    return [str(new_file), str(old_file)], len(fresh) + len(old)


def test_spans_past_the_retention_are_refused_before_anything_is_written(engine, tmp_path):
    from modalscope.ingest.importer import ImportRefused, check_retention

    paths, total = _old_and_new_files(tmp_path, days_old=10.2)
    with pytest.raises(ImportRefused) as err:
        import_files(engine, paths, rules(), retention_days=7)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{paths[1]}:1: ")
    assert "10.2 days ago" in msg and "MODALSCOPE_RETENTION_DAYS=12 or more" in msg and "Nothing was imported" in msg
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar_one() == 0

    check_retention(paths, 12)  # long enough: no refusal
    check_retention(paths, 0)  # 0 keeps spans forever
    report = import_files(engine, paths, rules(), retention_days=12)
    assert report.spans == total and not report.failed

    # JSON is checked as well as protobuf, snake_case included.
    old_json = tmp_path / "old.jsonl"
    old = multimodal_trace(random.Random(9), time.time_ns() - 9 * 86_400_000_000_000)
    _write_lines(old_json, [snake_case(request_json(old))])
    with pytest.raises(ImportRefused, match=r"old\.jsonl:1: .*9\.0 days ago"):
        check_retention([str(old_json)], 7)


def _cli(args, env_extra):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "modalscope", "import", *args], capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_cli_refuses_old_spans_in_one_line_and_creates_nothing(tmp_path):
    paths, total = _old_and_new_files(tmp_path, days_old=29.5)
    db = tmp_path / "store.db"
    r = _cli(paths, {"MODALSCOPE_DATABASE_URL": f"sqlite:///{db}"})  # the default retention: 7 days
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("modalscope: error: "), r.stderr
    assert "MODALSCOPE_RETENTION_DAYS=31 or more" in r.stderr and "Traceback" not in r.stderr
    assert not db.exists()  # refused before the store was opened

    r = _cli(paths, {"MODALSCOPE_DATABASE_URL": f"sqlite:///{db}", "MODALSCOPE_RETENTION_DAYS": "31"})
    assert r.returncode == 0, r.stderr
    assert f"imported {total} spans ({total} new)" in r.stdout


@pytest.mark.slow
def test_cli_reports_files_that_are_not_traces(tmp_path):
    spans = multimodal_trace(random.Random(12), (time.time_ns() // MIN - 30) * MIN)
    mixed = tmp_path / "mixed.jsonl"
    _write_lines(mixed, [json_line(spans), logs_request_json()])
    env = {"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}"}
    r = _cli([str(mixed)], env)
    assert r.returncode == 0, r.stderr
    assert f"{mixed}: 1 line is OTLP logs/metrics, not traces" in r.stderr

    logs = tmp_path / "logs.jsonl"
    _write_lines(logs, [logs_request_json()] * 12)
    r = _cli([str(logs)], env)
    assert r.returncode == 1
    assert f"{logs}: no spans: 12 lines are OTLP logs/metrics, not traces" in r.stderr.splitlines()
    assert "imported 0 spans" in r.stdout and "Traceback" not in r.stderr
