"""Bodies trickled in to hold the OTLP/HTTP receiver's reading slots are cut off once they
fall below the byte-rate floor, and an exporter sending at a normal pace is answered."""

from __future__ import annotations

import socket

import pytest
import requests
from sqlalchemy import func, select

from modalscope.ingest.otlp_http import MAX_READING, SlowBodyReaper, _BodyProgress, create_ingest_app, serve_http
from modalscope.ingest.pipeline import IngestPipeline
from modalscope.models import Span
from modalscope.settings import Settings
from tests.ingest.test_receivers import pb_request


def test_the_floor_credits_one_read_and_ends_every_body_at_the_ceiling():
    reaper = SlowBodyReaper(min_rate=1000, grace_s=5, max_s=60)
    p = _BodyProgress(sock=None)
    start = p.started
    assert not reaper.too_slow(p, start + 5)  # the grace period
    p.read = 200_000
    assert not reaper.too_slow(p, start + 59)  # ahead of the floor
    assert reaper.too_slow(p, start + 61)  # past the ceiling, however fast
    p.read = 0
    patient = SlowBodyReaper(min_rate=1000, grace_s=5, max_s=600)
    assert not patient.too_slow(p, start + 5 + 65)  # one read (64 KiB) of credit
    assert patient.too_slow(p, start + 5 + 67)


@pytest.fixture
def receiver(engine):
    settings = Settings(settle_seconds=0)
    pipeline = IngestPipeline(engine, settings, settle=False).start()
    app = create_ingest_app(pipeline, settings)
    reaper = app.extensions["modalscope_slow_bodies"]
    # a floor a stalled body falls under two seconds in (the defaults take ~13 s)
    reaper.min_rate, reaper.grace_s, reaper.check_every_s = 64 * 1024, 1.0, 0.1
    server = serve_http(app, "127.0.0.1", 0)
    yield server, reaper
    server.shutdown()
    pipeline.close()


def _trickler(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                 b"Content-Length: 100000\r\n\r\n" + b"\x0a" * 10)
    return sock


def test_stalled_bodies_are_cut_and_an_exporter_is_answered(engine, receiver):
    server, reaper = receiver
    stalled = [_trickler(server.port) for _ in range(MAX_READING + 4)]
    try:
        # Every reading slot is taken by a body that stopped after 10 bytes; without the floor
        # this request would wait for a slot and be answered 503 after 10 s.
        resp = requests.post(f"{server.url}/v1/traces", data=pb_request(3), timeout=30,
                             headers={"Content-Type": "application/x-protobuf"})
        assert resp.status_code == 200, resp.text
        for sock in stalled[:MAX_READING]:
            sock.settimeout(15)
            try:
                data = sock.recv(4096)  # the receiver closes it (any answer, then EOF)
            except OSError:
                data = b""
            assert not data or data.startswith(b"HTTP/1.1 4")
    finally:
        for sock in stalled:
            sock.close()
    assert reaper.cut >= MAX_READING
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar() == 3
