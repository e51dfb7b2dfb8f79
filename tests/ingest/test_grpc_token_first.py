"""The OTLP/gRPC receiver checks the ingest token before it reads a request message: callers
without it cannot hold the receiver's worker threads by announcing a message and never
finishing it, while an exporter with the token meanwhile gets its answer."""

from __future__ import annotations

import socket
import threading

import grpc
import pytest
from sqlalchemy import func, select

from modalscope.ingest.otlp_grpc import FULL_METHOD, serve_grpc
from modalscope.ingest.pipeline import IngestPipeline
from modalscope.models import Span
from modalscope.settings import Settings
from tests.ingest.test_receivers import pb_request

TOKEN = "ingest-secret"
WORKERS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def receiver(engine):
    settings = Settings(settle_seconds=0, ingest_token=TOKEN)
    pipeline = IngestPipeline(engine, settings, settle=False).start()
    port = _free_port()
    server = serve_grpc(pipeline, settings, "127.0.0.1", port, max_workers=WORKERS, commit_timeout=10)
    yield port
    server.stop(None)
    pipeline.close()


def test_callers_without_the_token_hold_no_worker_while_an_exporter_is_answered(engine, receiver):
    channel = grpc.insecure_channel(f"127.0.0.1:{receiver}")
    never = threading.Event()

    def headers_only():  # the call's headers go out; its message never does
        never.wait(30)
        return
        yield  # noqa: unreachable - makes this a generator

    stalled = channel.stream_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
    try:
        calls = [stalled.future(headers_only(), timeout=20) for _ in range(2 * WORKERS)]
        # Each is refused from its metadata alone, long before its 20 s deadline.
        for call in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call.result(timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        export = channel.unary_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
        export(pb_request(3), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
    finally:
        never.set()
        channel.close()
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Span)).scalar() == 3


def test_a_wrong_token_is_refused_before_the_message_is_read(receiver):
    with grpc.insecure_channel(f"127.0.0.1:{receiver}") as channel:
        export = channel.unary_unary(FULL_METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            export(pb_request(1), metadata=(("authorization", "Bearer wrong"),), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "ingest token" in refused.value.details()
