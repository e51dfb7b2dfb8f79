"""Hostile traffic against the dashboard as it runs in production: gunicorn started with
``modalscope.gunicorn_conf`` (the Docker image's command), real sockets and ``requests``.

Slow-header clients hold no worker thread and are closed after the head timeout; a body
larger than the limit is a 413 before it is read and the worker's memory does not grow; a
stalled body is a 408; a signed-out session cookie is refused by every worker. Throughout,
a well-behaved client is answered, and while the slow-header clients are all still
connected. The checks are orders of events, not latencies: a busy machine slows them
without failing them.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from modalscope.models.migrate import upgrade
from tests.faults.helpers import Proc, clean_env, free_port, rss_mb, wait_listening, wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hostile-dashboard-token"
SECRET = "hostile-dashboard-secret"
HEAD_TIMEOUT_S = 4
#: The wait for an answer that should come at once: a bound on a hang, not a latency.
ANSWER_S = 30
SLOW_CLIENTS = 64


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """gunicorn with the production config (2 workers x 4 threads), auth on, a fresh store."""
    folder = tmp_path_factory.mktemp("hostile-dashboard")
    url = f"sqlite:///{folder / 'store.db'}"
    upgrade(url)
    port = free_port()
    env = clean_env(MODALSCOPE_DATABASE_URL=url, MODALSCOPE_PORT=str(port), MODALSCOPE_AUTH_TOKEN=TOKEN,
                    MODALSCOPE_SECRET_KEY=SECRET, MODALSCOPE_HEAD_TIMEOUT_S=str(HEAD_TIMEOUT_S),
                    MODALSCOPE_FINDINGS_EVERY_S="0", WEB_CONCURRENCY="2", MODALSCOPE_THREADS="4")
    proc = Proc(["-c", "python:modalscope.gunicorn_conf", "modalscope.app:create_app()"], env, folder, "gunicorn",
                entry=["-m", "gunicorn"])
    try:
        wait_listening(proc, port, timeout=60)
        base = f"http://127.0.0.1:{port}"
        # Both workers have built their app once each answers (the master listens before).
        wait_until(lambda: len(_workers(proc.pid)) == 2 and _health(base), 60, "two booted workers")
        yield SimpleNamespace(base=base, port=port, proc=proc)
    finally:
        proc.signal_group(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _health(base: str) -> bool:
    try:
        return requests.get(f"{base}/api/v1/health", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _workers(master: int) -> list[int]:
    """The gunicorn master's child processes (its workers)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            out.append(int(stat.parent.name))
    return out


def well_behaved(d) -> float:
    """One authenticated API request on a new connection: its latency, after checking the answer."""
    started = time.monotonic()
    resp = requests.get(f"{d.base}/api/v1/pairs?range=1h", headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=ANSWER_S)
    took = time.monotonic() - started
    assert resp.status_code == 200 and resp.json() == [], resp.text[:200]
    return took


def _open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` open (nothing to read, no end of stream)."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)


def _closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _status(sock: socket.socket, timeout: float) -> int:
    """The status code of the response arriving on ``sock``."""
    sock.settimeout(timeout)
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed before a status line ({head!r})"
        head += chunk
    return int(head.split(b" ", 2)[1])


def test_slow_header_clients_hold_no_thread(dashboard):
    """64 clients trickling their headers (more than the 8 threads of both workers): the
    well-behaved client's requests are answered meanwhile, and each slow client is closed
    after the head timeout with one log line."""
    baseline = well_behaved(dashboard)
    slow = []
    for _ in range(SLOW_CLIENTS):
        s = socket.create_connection(("127.0.0.1", dashboard.port), timeout=5)
        s.sendall(b"GET /api/v1/pairs HTTP/1.1\r\nHost: dashboard\r\n")
        slow.append(s)
    stop = threading.Event()

    def drip():
        while not stop.wait(0.2):
            for s in slow:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        # Were the slow clients holding the threads, this answer would wait for the head
        # timeout to close them; answered with all of them still connected, it did not.
        latencies = [well_behaved(dashboard)]
        held = sum(_open(s) for s in slow)
        latencies += [well_behaved(dashboard) for _ in range(11)]
    finally:
        stop.set()
        dripper.join(5)
    print(f"well-behaved latency under {SLOW_CLIENTS} slow-header clients: max {max(latencies) * 1000:.0f} ms, "
          f"median {sorted(latencies)[6] * 1000:.0f} ms (alone {baseline * 1000:.0f} ms)")
    assert held == SLOW_CLIENTS, "the slow clients were not all still connected while the others were served"
    closed = [_closed_by_server(s, HEAD_TIMEOUT_S + 5) for s in slow]
    for s in slow:
        s.close()
    assert all(closed), f"{closed.count(False)} slow clients still connected past the head timeout"
    log = dashboard.proc.stderr
    assert len(re.findall(r"request head not complete within", log)) >= SLOW_CLIENTS
    assert "Traceback" not in log
    well_behaved(dashboard)


def test_a_huge_body_is_refused_before_it_is_read(dashboard):
    """A 400 MiB sign-in form: 413 at once, while the body is still coming; the client is cut
    off, and no worker's memory grows by the body."""
    workers = _workers(dashboard.proc.pid)
    before = {pid: rss_mb(pid)[0] for pid in workers}
    declared = 400 * 1024 * 1024
    s = socket.create_connection(("127.0.0.1", dashboard.port), timeout=10)
    s.sendall(b"POST /login HTTP/1.1\r\nHost: dashboard\r\nContent-Type: application/x-www-form-urlencoded\r\n"
              b"Content-Length: " + str(declared).encode() + b"\r\n\r\ntoken=" + b"a" * 65536)
    # 64 KiB of the 400 MiB sent and no more until the answer: a 413 at all is one before the body.
    assert _status(s, ANSWER_S) == 413
    well_behaved(dashboard)
    # The client keeps sending: the server has closed the connection, it cannot deliver the rest.
    sent, cut_off = 65536, False
    chunk = b"a" * (1 << 20)
    s.settimeout(10)
    try:
        while sent < declared:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        cut_off = True
    finally:
        s.close()
    assert cut_off and sent < 64 * (1 << 20), f"the server took {sent >> 20} MiB of a refused body"
    grown = {pid: rss_mb(pid)[0] - before[pid] for pid in workers}
    print(f"worker RSS before {before}, growth after a {declared >> 20} MiB body (MiB): {grown}")
    assert max(grown.values()) < 40, grown


def test_a_chunked_body_past_the_limit_is_a_413(dashboard):
    """No Content-Length (chunked): read up to the limit (4 MiB), then 413."""
    s = socket.create_connection(("127.0.0.1", dashboard.port), timeout=10)
    s.sendall(b"POST /_dash-update-component HTTP/1.1\r\nHost: dashboard\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + TOKEN.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"a" * (256 * 1024)
    try:
        for _ in range(24):  # 6 MiB, past the 4 MiB limit
            s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
    except OSError:
        pass  # refused and closed while we were still sending
    try:
        assert _status(s, ANSWER_S) == 413
    except (ConnectionResetError, BrokenPipeError):
        pytest.fail("the connection was reset before the 413 arrived")
    finally:
        s.close()
    well_behaved(dashboard)


def test_a_stalled_body_is_a_408(dashboard):
    """A body that stops arriving holds a thread for at most the head timeout."""
    s = socket.create_connection(("127.0.0.1", dashboard.port), timeout=10)
    s.sendall(b"POST /login HTTP/1.1\r\nHost: dashboard\r\nContent-Type: application/x-www-form-urlencoded\r\n"
              b"Content-Length: 1000\r\n\r\ntoken=abc")
    started = time.monotonic()
    well_behaved(dashboard)  # another client is served meanwhile
    # The upper bound tells the head timeout from gunicorn's own worker timeout (120 s).
    assert _status(s, HEAD_TIMEOUT_S + ANSWER_S) == 408
    waited = time.monotonic() - started
    s.close()
    assert waited >= HEAD_TIMEOUT_S - 1, waited
    assert "Traceback" not in dashboard.proc.stderr


def test_a_signed_out_session_is_refused_by_every_worker(dashboard):
    browser = requests.Session()
    resp = browser.post(f"{dashboard.base}/login", data={"token": TOKEN, "next": "/"}, allow_redirects=False,
                        timeout=10)
    assert resp.status_code == 303
    copied = browser.cookies.get("modalscope_session")
    assert copied
    assert browser.get(f"{dashboard.base}/api/v1/input-types", timeout=10).status_code == 200
    other = requests.Session()  # another browser, signed in on its own
    assert other.post(f"{dashboard.base}/login", data={"token": TOKEN}, allow_redirects=False,
                      timeout=10).status_code == 303
    assert browser.get(f"{dashboard.base}/logout", timeout=10).status_code == 200
    # The copied cookie, replayed on fresh connections (either worker takes each): refused.
    for _ in range(12):
        replay = requests.get(f"{dashboard.base}/api/v1/input-types", cookies={"modalscope_session": copied},
                              headers={"Connection": "close"}, timeout=10)
        assert replay.status_code == 401
    assert other.get(f"{dashboard.base}/api/v1/input-types", timeout=10).status_code == 200


def test_the_docker_image_runs_this_configuration():
    """The image's default command is gunicorn with ``modalscope.gunicorn_conf``, whose
    worker reads request heads off-thread."""
    cmd = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    assert len(cmd) == 1
    args = json.loads(cmd[0][4:])
    assert args[:3] == ["gunicorn", "-c", "python:modalscope.gunicorn_conf"], args
    from modalscope import gunicorn_conf

    assert gunicorn_conf.worker_class == "modalscope.gunicorn_worker.HeadFirstWorker"
    assert gunicorn_conf.keepalive <= 10 and gunicorn_conf.timeout <= 120


def test_one_address_cannot_fill_the_workers_with_unfinished_heads(dashboard):
    """Past 128 unfinished heads per worker from one address, more connections from it are
    closed at once; the workers' connection slots stay for others, and once the slow clients
    are gone the address is served again."""
    from modalscope.gunicorn_worker import MAX_HEADING_PER_CLIENT

    per_address = 2 * MAX_HEADING_PER_CLIENT  # two workers
    slow = []
    try:
        for _ in range(per_address + 40):
            s = socket.create_connection(("127.0.0.1", dashboard.port), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\nHost: dashboard\r\n")
            slow.append(s)
        # Each connection is accepted (or refused) in order; wait for the last one's fate.
        wait_until(lambda: not _open(slow[-1]) or sum(not _open(s) for s in slow) >= 40, 10,
                   "connections past the cap to be closed")
        held = sum(_open(s) for s in slow)
        assert held <= per_address, held
    finally:
        for s in slow:
            s.close()
    wait_until(lambda: _answered(dashboard), HEAD_TIMEOUT_S + ANSWER_S, "the address to be served again")
    assert "already sending a head" in dashboard.proc.stderr


def _answered(d) -> bool:
    try:
        well_behaved(d)
        return True
    except (requests.RequestException, AssertionError):
        return False
