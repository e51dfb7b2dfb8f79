"""End to end as a user runs it: `modalscope ingest otlp` and `modalscope serve` as real
processes, the real OTel SDK exporters sending to them, `/api/v1` reading the result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.ingest.test_receivers import EXPECTED, free_port, multimodal_spans
from modalscope.core.spans import KIND_BY_NAME


def _start(args, env):
    return subprocess.Popen([sys.executable, "-m", "modalscope", *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_http(url, proc, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited: {proc.stderr.read()}")
        try:
            return requests.get(url, timeout=1)
        except requests.ConnectionError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


def _stop(proc):
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out, err


@pytest.fixture
def running(db_url, monkeypatch):
    for k in list(os.environ):
        if k.startswith("OTEL_"):
            monkeypatch.delenv(k)
    http_port, grpc_port, web_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env.update({"MODALSCOPE_DATABASE_URL": db_url, "MODALSCOPE_OTLP_HTTP_PORT": str(http_port),
                "MODALSCOPE_OTLP_GRPC_PORT": str(grpc_port), "MODALSCOPE_PORT": str(web_port),
                "MODALSCOPE_SETTLE_SECONDS": "0.5"})
    ingest = _start(["ingest", "otlp"], env)
    _wait_http(f"http://127.0.0.1:{http_port}/", ingest)
    web = _start(["serve"], env)
    _wait_http(f"http://127.0.0.1:{web_port}/api/v1/health", web)
    procs = {"ingest": ingest, "web": web}
    try:
        yield {"http": http_port, "grpc": grpc_port, "web": f"http://127.0.0.1:{web_port}", "procs": procs}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def _settled_trace(web, trace_id, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = requests.get(f"{web}/api/v1/traces/{trace_id}", timeout=5)
        if r.status_code == 200 and r.json()["settled"]:
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"trace {trace_id} never settled")


def _check_trace(body):
    spans = body["spans"]
    assert len(spans) == 7 and body["input_type"] == "image"
    by_id = {s["span_id"]: s for s in spans}
    for s in spans:
        parent = by_id.get(s["parent_span_id"]) if s["parent_span_id"] else None
        key = (s["name"], KIND_BY_NAME[s["kind"]])
        service, stage, parent_key = EXPECTED[key]
        assert s["service"] == service and s["source"] == "otlp"
        assert (None if parent is None else (parent["name"], KIND_BY_NAME[parent["kind"]])) == parent_key
        if stage:
            assert s["stage"] == stage


def test_real_exporters_to_running_commands(running):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    http_spans = multimodal_spans()
    grpc_spans = multimodal_spans()
    http = HttpExporter(endpoint=f"http://127.0.0.1:{running['http']}/v1/traces")
    grpc_exp = GrpcExporter(endpoint=f"127.0.0.1:{running['grpc']}", insecure=True)
    assert http.export(http_spans) == SpanExportResult.SUCCESS
    assert grpc_exp.export(grpc_spans) == SpanExportResult.SUCCESS
    http.shutdown()
    grpc_exp.shutdown()

    for spans in (http_spans, grpc_spans):
        trace_id = format(spans[0].context.trace_id, "032x")
        _check_trace(_settled_trace(running["web"], trace_id))

    pairs = requests.get(f"{running['web']}/api/v1/pairs?range=15m", timeout=5).json()
    assert [(p["caller"], p["callee"], p["count"]) for p in pairs] == [("gateway", "vision-encoder", 2)]
    types = requests.get(f"{running['web']}/api/v1/input-types?range=15m", timeout=5).json()
    assert [(t["input_type"], t["count"]) for t in types] == [("image", 2)]

    # Ctrl-C stops both cleanly.
    for name in ("ingest", "web"):
        code, _, err = _stop(running["procs"][name])
        assert code == 0, err
        assert "Traceback" not in err


def test_port_taken_is_one_line(running, db_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env.update({"MODALSCOPE_DATABASE_URL": db_url, "MODALSCOPE_OTLP_HTTP_PORT": str(running["http"]),
                "MODALSCOPE_OTLP_GRPC_PORT": str(free_port())})
    r = subprocess.run([sys.executable, "-m", "modalscope", "ingest", "otlp"], env=env, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert str(running["http"]) in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("modalscope: error:")


@pytest.mark.parametrize("command", [["ingest", "otlp"], ["demo", "--hours", "0.05", "--rate", "1"]])
def test_sigterm_to_the_whole_process_group_stops_cleanly(tmp_path, command):
    """systemd, `timeout` and container runtimes signal every process of the group: the
    settler process dies with it, and the parent must still shut down, not hang."""
    http_port, grpc_port, web_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODALSCOPE_")}
    env.update({"MODALSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}",
                "MODALSCOPE_OTLP_HTTP_PORT": str(http_port), "MODALSCOPE_OTLP_GRPC_PORT": str(grpc_port),
                "MODALSCOPE_PORT": str(web_port)})
    proc = subprocess.Popen([sys.executable, "-m", "modalscope", *command], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{http_port}/", proc, timeout=90)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
