"""The dashboard's edge against hostile requests, through Flask's test client: body limits,
Dash's routes answering bad requests with a 4xx and one log line, the embed assets, image
sizes inside a share signature and capped outside one, the render queue's bound and time
limit, server-side sign-out, the budget of new absolute anomaly windows, and share links
built from ``MODALSCOPE_PUBLIC_URL`` instead of the ``Host`` header.

Images go through a stand-in drawing function (``extensions["modalscope"]["render_fn"]``)
except in the tests of the real renderer (one warm Chromium)."""

from __future__ import annotations

import json
import logging
import random
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest

from modalscope.app import create_app, figures, panels, render, signing, window_budget
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models.engine import make_engine
from modalscope.models.migrate import upgrade
from modalscope.settings import Settings, SettingsError
from tests.factories import multimodal_trace

MIN = 60_000_000_000
TOKEN = "edge-dashboard-token"
SECRET = "edge-signing-key"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('edge') / 'store.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)
    rng = random.Random(5)
    base = (time.time_ns() // MIN - 30) * MIN
    traces = [multimodal_trace(rng, base + i * 20_000_000_000, images=1 + i % 2) for i in range(8)]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def make_app(store_url):
    apps = []

    def _make(url: str | None = None, **changes):
        app = create_app(Settings(database_url=url or store_url, **changes))
        apps.append(app)
        return app

    yield _make
    for app in apps:
        app.extensions["modalscope"]["engine"].dispose()


@pytest.fixture(scope="module")
def app(make_app):
    return make_app(auth_token=TOKEN, secret_key=SECRET)


def _refusals(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("modalscope")]


# -- bodies --------------------------------------------------------------------------------
def test_bodies_over_the_limit_are_a_413_before_they_are_read(app):
    class Unreadable:
        """A body that fails the test if anyone reads it."""

        def read(self, *a):
            raise AssertionError("the body was read")

        readline = readinto = read

    client = app.test_client()
    for path, length in (("/login", 16 * 1024 + 1), ("/_dash-update-component", 4 * 1024 * 1024 + 1),
                         ("/logout", 400 * 1024 * 1024), ("/api/v1/pairs", 5 * 1024 * 1024)):
        resp = client.post(path, headers={"Content-Type": "application/json", **BEARER},
                           environ_overrides={"wsgi.input": Unreadable(), "CONTENT_LENGTH": str(length)})
        assert resp.status_code == 413, (path, resp.status_code)
        assert "too large" in resp.get_json()["error"]
    # Within the limit: the sign-in form works as before.
    ok = client.post("/login", data={"token": TOKEN, "next": "/"})
    assert ok.status_code == 303


# -- Dash's routes ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/_dash-component-suites/dash/nope.js", "/_dash-component-suites/nope/x.js",
                                  "/_dash-component-suites/dash/deps/react@18.v1_0m.js",
                                  "/_dash-component-suites/", "/_dash-component-suites/dash",
                                  "/embed-assets/a/b", "/embed-assets/", "/embed-assets/../auth.py"])
def test_unknown_static_paths_are_a_404_without_the_page(app, path, caplog):
    with caplog.at_level(logging.INFO):
        resp = app.test_client().get(path)  # public paths: no credentials
    assert resp.status_code == 404, resp.status_code
    assert b"<html" not in resp.data.lower() and b"dash_renderer" not in resp.data
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert len(_refusals(caplog)) <= 1


def test_known_static_files_still_load(app):
    client = app.test_client()
    assert client.get("/embed-assets/embed.js").status_code == 200
    layout = client.get("/_dash-layout", headers=BEARER)
    assert layout.status_code == 200
    index = client.get("/", headers=BEARER).get_data(as_text=True)
    suite = next(part.split('"')[0] for part in index.split('src="')[1:] if "_dash-component-suites" in part)
    assert client.get(suite).status_code == 200


MALFORMED = [b"{", b"[]", b"null", b'"text"', b'{"output": 5}', b'{"output": "nope.children"}',
             b'{"output": "x", "inputs": 5}']


@pytest.mark.parametrize("body", MALFORMED)
def test_malformed_callback_requests_are_a_400(app, body, caplog):
    with caplog.at_level(logging.INFO):
        resp = app.test_client().post("/_dash-update-component", data=body, content_type="application/json",
                                      headers=BEARER)
    assert resp.status_code == 400 and "malformed callback request" in resp.get_json()["error"]
    assert len(_refusals(caplog)) == 1 and not caplog.records[-1].exc_info


def _callback_bodies(app, value):
    """A request for every callback of the app, each input and state set to ``value``."""
    deps = app.test_client().get("/_dash-dependencies", headers=BEARER).get_json()

    def dep_id(raw: str):
        return json.loads(raw) if raw.startswith("{") else raw

    def out(o: str) -> dict:
        i, _, p = o.rpartition(".")
        return {"id": dep_id(i), "property": p}

    for dep in deps:
        name = dep["output"]
        outputs = [out(o) for o in name.strip(".").split("...")] if name.startswith("..") else out(name)
        yield {"output": name, "outputs": outputs,
               "inputs": [{"id": dep_id(x["id"]), "property": x["property"], "value": value} for x in dep["inputs"]],
               "state": [{"id": dep_id(x["id"]), "property": x["property"], "value": value}
                         for x in dep.get("state", [])],
               "changedPropIds": [f'{x["id"]}.{x["property"]}' for x in dep["inputs"][:1]]}


@pytest.mark.parametrize("value", [{}, [1, {}], 7, None, True, "x" * 300])
def test_every_callback_answers_type_confused_values_without_a_500(app, value, caplog):
    """Values no page sends (a number where a dropdown sends a string): a 2xx/4xx each, at
    most one log line each and never a traceback."""
    client = app.test_client()
    n = 0
    with caplog.at_level(logging.INFO):
        for body in _callback_bodies(app, value):
            resp = client.post("/_dash-update-component", json=body, headers=BEARER)
            assert resp.status_code < 500, (body["output"], resp.status_code, resp.data[:200])
            n += 1
    assert n > 20
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert len(_refusals(caplog)) <= n


# -- image sizes and the renderer ------------------------------------------------------------
class Drawn:
    """A stand-in for the renderer: records each picture, optionally waits for a release."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.calls: list[tuple] = []
        self.hold = hold
        self.entered = threading.Semaphore(0)

    def __call__(self, figure, fmt, width, height, scale):
        self.calls.append((figure, fmt, width, height, scale))
        self.entered.release()
        if self.hold is not None:
            assert self.hold.wait(30), "never released"
        return b"<svg xmlns='http://www.w3.org/2000/svg'/>" if fmt == "svg" else b"\x89PNG\r\n\x1a\nstand-in"


def _window(app) -> dict:
    now = time.time()
    return {"start": str(int(now - 3600)), "end": str(int(now + 60))}


def test_a_signed_link_draws_only_the_size_it_was_signed_for(app):
    drawn = app.extensions["modalscope"]["render_fn"] = Drawn()
    try:
        client = app.test_client()  # no credentials: the signature is the only one
        window = list(_window(app).items())
        plain = urlencode(signing.sign(SECRET, "stages", window, 600))
        assert client.get(f"/render/stages.png?{plain}").status_code == 200
        default = drawn.calls[-1][2:]
        assert default[0] == panels.PANELS["stages"].size[0] and default[2] == 2  # the panel's default size
        for extra in ("width=1900", "height=1900", "scale=1", "width=400&height=300"):
            resp = client.get(f"/render/stages.png?{plain}&{extra}")
            assert resp.status_code == 403, extra
        assert client.get(f"/render/stages.png?{plain}&theme=dark").status_code == 200  # theme is free
        sized = urlencode(signing.sign(SECRET, "stages", [*window, ("width", "640"), ("height", "360"),
                                                          ("scale", "1")], 600))
        assert client.get(f"/render/stages.png?{sized}").status_code == 200
        assert drawn.calls[-1][2:] == (640, 360, 1)
        assert client.get(f"/render/stages.png?{sized.replace('width=640', 'width=641')}").status_code == 403
        assert len(drawn.calls) == 3 and default != (640, 360, 1)
    finally:
        del app.extensions["modalscope"]["render_fn"]


def test_sizes_past_the_caps_are_refused(make_app):
    capped = make_app(render_max_px=1000, render_max_scale=1)
    drawn = capped.extensions["modalscope"]["render_fn"] = Drawn()
    client = capped.test_client()
    w = urlencode(_window(capped))
    for query, parameter in (("width=1001", "width"), ("height=4000", "height"), ("scale=2", "scale"),
                             ("width=99999999999999999999", "width"), ("width=%EF%BC%91%EF%BC%90%EF%BC%90", "width")):
        resp = client.get(f"/render/stages.png?{w}&{query}")
        assert resp.status_code == 400 and resp.get_json()["parameter"] == parameter, query
    assert client.get(f"/render/stages.png?{w}&width=1000&height=1000").status_code == 200
    assert drawn.calls[-1][2:] == (1000, 1000, 1)  # the default scale follows the cap
    # Defaults (16 concurrent 4000 x 4000 at 3x stalled a dashboard): 2000 px, scale 2.
    default = make_app()
    default.extensions["modalscope"]["render_fn"] = Drawn()
    dc = default.test_client()
    assert dc.get(f"/render/stages.png?{w}&width=2000&height=2000&scale=2").status_code == 200
    for query in ("width=4000", "height=2001", "scale=3"):
        assert dc.get(f"/render/stages.png?{w}&{query}").status_code == 400, query


def test_the_render_queue_is_bounded(make_app):
    """``MODALSCOPE_RENDER_QUEUE`` pictures drawing or waiting; the next is a 503 with
    Retry-After at once, and once they finish the renderer takes pictures again."""
    queued = make_app(render_queue=2)
    release = threading.Event()
    drawn = queued.extensions["modalscope"]["render_fn"] = Drawn(hold=release)
    w = urlencode(_window(queued))
    answers: list[int] = []

    def fetch(i: int) -> None:
        answers.append(queued.test_client().get(f"/render/stages.svg?{w}&width={300 + i}").status_code)

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in threads:
            assert drawn.entered.acquire(timeout=30), "a picture never started"
        started = time.monotonic()
        busy = queued.test_client().get(f"/render/stages.svg?{w}&width=900")
        assert time.monotonic() - started < 5  # refused at once, not queued
        assert busy.status_code == 503 and int(busy.headers["Retry-After"]) > 0
        assert "busy" in busy.get_json()["error"] and busy.headers["Cache-Control"] == "no-store"
        assert queued.extensions["modalscope"]["render_gate"].refused == 1
    finally:
        release.set()
        for t in threads:
            t.join(30)
    assert answers == [200, 200]
    assert queued.test_client().get(f"/render/stages.svg?{w}&width=901").status_code == 200


def test_a_huge_trace_renders_its_summarised_waterfall(make_app, tmp_path):
    """5,000 spans: the image is drawn from the capped waterfall (its rows and a summary row),
    not from 5,000 bars."""
    from tests.app.test_big_traces import big_store

    url, (tid,), start = big_store(tmp_path, 5000)
    big = make_app(url)
    drawn = big.extensions["modalscope"]["render_fn"] = Drawn()
    window = urlencode({"start": str(start // 10**9 - 1800), "end": str(start // 10**9 + 1800)})
    resp = big.test_client().get(f"/render/trace.png?trace_id={tid}&{window}")
    assert resp.status_code == 200, resp.data[:300]
    figure, _, width, height, _ = drawn.calls[-1]
    rows = {y for d in figure.data if d.type == "bar" and d.customdata is not None for y in d.y}
    assert 50 <= len(rows) <= figures.WATERFALL_ROWS
    notes = " ".join(a.text or "" for a in figure.layout.annotations)
    assert "more spans" in notes
    assert height <= 4000


@pytest.mark.slow
def test_a_render_past_its_time_limit_is_a_504_and_the_browser_stays(make_app, monkeypatch):
    """A real Chromium: a picture given 50 ms is abandoned with a 504 "render timed out";
    the same browser draws the next picture."""
    app = make_app()
    # a loaded machine may take seconds to give the tab back; only a browser that never does is wedged
    monkeypatch.setattr(render, "GIVE_BACK_S", 60.0)
    slow = render.Renderer(render_timeout=30, start_timeout=30)
    monkeypatch.setattr(render, "_renderer", slow)
    try:
        slow.warm()
        pid = slow.browser_pid()
        slow.render_timeout = 0.05
        w = urlencode(_window(app))
        resp = app.test_client().get(f"/render/pair-heatmap.png?{w}&width=1800&height=1800")
        assert resp.status_code == 504 and resp.get_json()["error"].startswith("render timed out")
        assert slow.browser_pid() == pid
        slow.render_timeout = 30
        again = app.test_client().get(f"/render/stages.png?{w}&width=300&height=200&scale=1")
        assert again.status_code == 200 and again.data[:8] == b"\x89PNG\r\n\x1a\n"
        assert slow.browser_pid() == pid and slow.starts == 1
    finally:
        slow.close()


# -- sign-out --------------------------------------------------------------------------------
def test_sign_out_revokes_the_session_on_every_worker(db_url):
    """Two apps on one store stand for two gunicorn workers: a cookie copied before sign-out
    opens nothing on either afterwards; another browser's session stays signed in."""
    settings = Settings(database_url=db_url, auth_token=TOKEN, secret_key=SECRET)
    first, second = create_app(settings), create_app(settings)
    try:
        browser, other = first.test_client(), second.test_client()
        assert browser.post("/login", data={"token": TOKEN}).status_code == 303
        assert other.post("/login", data={"token": TOKEN}).status_code == 303
        copied = browser.get_cookie("modalscope_session").value
        replay = second.test_client()
        replay.set_cookie("modalscope_session", copied)
        assert replay.get("/api/v1/input-types").status_code == 200
        assert browser.get("/logout").status_code == 200
        for app in (first, second):
            thief = app.test_client()
            thief.set_cookie("modalscope_session", copied)
            assert thief.get("/api/v1/input-types").status_code == 401
            assert thief.get("/_dash-layout").status_code == 401
        assert other.get("/api/v1/input-types").status_code == 200
        # Signing out twice (a second tab) is fine; signing in again gives a new session.
        assert replay.get("/logout").status_code == 200
        assert browser.post("/login", data={"token": TOKEN}).status_code == 303
        assert browser.get_cookie("modalscope_session").value != copied
        assert browser.get("/api/v1/input-types").status_code == 200
    finally:
        for app in (first, second):
            app.extensions["modalscope"]["engine"].dispose()


# -- new absolute anomaly windows ---------------------------------------------------------------
def test_window_budget_refills():
    budget = window_budget.WindowBudget(per_hour=60, burst=2)
    assert budget.take("a", now=0) == 0 and budget.take("a", now=0) == 0
    wait = budget.take("a", now=0)
    assert 59 <= wait <= 60
    assert budget.take("b", now=0) == 0  # one client's spending is its own
    assert budget.take("a", now=61) == 0
    small = window_budget.WindowBudget(per_hour=60, burst=1, max_clients=3)
    for n in range(10):
        small.take(f"client-{n}", now=0)
    assert len(small._buckets) <= 4  # noqa: SLF001 - bounded memory


def test_new_absolute_windows_are_rate_limited_per_client(make_app, caplog):
    limited = make_app()
    limited.extensions["modalscope"]["window_budget"] = window_budget.WindowBudget(per_hour=3600, burst=2)
    now = int(time.time())

    def anomalies(i: int, addr: str = "10.0.0.1"):
        return limited.test_client().get(f"/api/v1/anomalies?start={now - 7200 - i * 60}&end={now - i * 60}",
                                         environ_base={"REMOTE_ADDR": addr})

    assert anomalies(1).status_code == 200 and anomalies(2).status_code == 200
    with caplog.at_level(logging.INFO):
        refused = anomalies(3)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert "anomaly windows" in refused.get_json()["error"]
    assert len([r for r in caplog.records if "refused a new absolute anomaly window" in r.getMessage()]) == 1
    assert anomalies(1).status_code == 200  # already evaluated and stored: free
    assert anomalies(3, addr="10.0.0.2").status_code == 200  # another client
    assert limited.test_client().get("/api/v1/anomalies?range=2h",
                                     environ_base={"REMOTE_ADDR": "10.0.0.1"}).status_code == 200
    # The incidents list of a window spends at most one token however many incidents it has.
    assert limited.test_client().get(f"/api/v1/incidents?start={now - 9000}&end={now - 1800}",
                                     environ_base={"REMOTE_ADDR": "10.0.0.3"}).status_code == 200


# -- share links -----------------------------------------------------------------------------------
def test_share_links_use_the_public_url_not_the_host_header(make_app):
    public = make_app(secret_key=SECRET, public_url="https://scope.example.com/")
    body = public.test_client().get("/api/v1/share?panel=stages&range=1h", headers={"Host": "evil.example"}).get_json()
    for key in ("link", "embed_url", "image_url", "svg_url"):
        parts = urlsplit(body[key])
        assert (parts.scheme, parts.netloc) == ("https", "scope.example.com"), body[key]
    assert "evil.example" not in json.dumps(body)
    signed = dict(parse_qsl(urlsplit(body["image_url"]).query))
    assert signing.verify(SECRET, "stages", signed)
    # Unset: as before, from the request.
    plain = make_app(secret_key=SECRET)
    body = plain.test_client().get("/api/v1/share?panel=stages&range=1h", headers={"Host": "dash.internal:8050"})
    assert urlsplit(body.get_json()["link"]).netloc == "dash.internal:8050"
    with pytest.raises(SettingsError, match="MODALSCOPE_PUBLIC_URL"):
        make_app(public_url="javascript:alert(1)")


def test_share_signs_the_image_size_it_is_asked_for(app):
    client = app.test_client()
    body = client.get("/api/v1/share?panel=stages&range=1h&width=800&height=400&scale=1&ttl=600",
                      headers=BEARER).get_json()
    assert body["signed"]
    png, svg = (urlsplit(body[k]) for k in ("image_url", "svg_url"))
    assert dict(parse_qsl(png.query))["width"] == "800" and "scale" not in dict(parse_qsl(svg.query))
    drawn = app.extensions["modalscope"]["render_fn"] = Drawn()
    try:
        anonymous = app.test_client()
        assert anonymous.get(f"{png.path}?{png.query}").status_code == 200
        assert drawn.calls[-1][2:] == (800, 400, 1)
        assert anonymous.get(f"{svg.path}?{svg.query}").status_code == 200
        assert drawn.calls[-1][1:4] == ("svg", 800, 400)
        assert anonymous.get(f"{png.path}?{png.query.replace('width=800', 'width=2000')}").status_code == 403
        embed = urlsplit(body["embed_url"])
        assert "width" not in embed.query and anonymous.get(f"{embed.path}?{embed.query}").status_code == 200
    finally:
        del app.extensions["modalscope"]["render_fn"]
    for query, parameter in (("width=2001", "width"), ("scale=3", "scale"), ("height=tall", "height")):
        resp = client.get(f"/api/v1/share?panel=stages&range=1h&{query}", headers=BEARER)
        assert resp.status_code == 400 and resp.get_json()["parameter"] == parameter, query


def test_a_new_app_answers_concurrent_first_requests(make_app):
    """Dash finishes setting itself up in its first request, which two first requests at once
    raced (a 500: the callback map changed size while iterated); the factory does it."""
    app = make_app()
    assert app.extensions["modalscope"]["dash"]._got_first_request["setup_server"]  # noqa: SLF001
    paths = ["/_dash-layout", "/_dash-dependencies", "/stages", "/pairs"] * 2
    with ThreadPoolExecutor(len(paths)) as pool:
        codes = list(pool.map(lambda p: app.test_client().get(p).status_code, paths))
    assert all(code != 500 for code in codes), codes
