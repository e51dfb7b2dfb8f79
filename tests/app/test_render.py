"""``/render/<panel>.png|svg`` through kaleido and the system Chromium: real images of the
requested size, ETag and Cache-Control, signed links, hostile text in SVG, a renderer that
recovers from a dead browser, and a 503 (not a traceback) when there is no browser.

Every test shares this process's one warm renderer (``app/render.py``): Chromium starts once."""

from __future__ import annotations

import os
import signal
import struct
import time
import xml.etree.ElementTree as ET
from urllib.parse import parse_qsl

import pytest

from modalscope.app import create_app, panels, render, signing
from modalscope.settings import Settings
from tests.demo_stores import PATTERNS

SECRET = "render-test-secret"
TOKEN = "render-test-token"
SVG_NS = "{http://www.w3.org/2000/svg}"


def _window() -> str:
    return f"start={PATTERNS.start_ns / 1e9}&end={PATTERNS.end_ns / 1e9 + 120}"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def apps(pattern_store):
    made = {
        "open": create_app(Settings(database_url=pattern_store.url, secret_key=SECRET)),
        "auth": create_app(Settings(database_url=pattern_store.url, secret_key=SECRET, auth_token=TOKEN)),
    }
    render.renderer().warm()  # one Chromium for the module (and the process)
    yield made
    for app in made.values():
        app.extensions["modalscope"]["engine"].dispose()


@pytest.fixture(scope="module")
def trace_id(pattern_store):
    return pattern_store.get("traces", limit=1)[0]["trace_id"]


def test_png_is_drawn_at_twice_the_requested_size(apps):
    client = apps["open"].test_client()
    resp = client.get(f"/render/stages.png?{_window()}&width=640&height=360")
    assert resp.status_code == 200 and resp.mimetype == "image/png"
    assert png_size(resp.data) == (1280, 720)
    assert resp.headers["Cache-Control"] == "public, max-age=60"
    one = client.get(f"/render/stages.png?{_window()}&width=640&height=360&scale=1")
    assert png_size(one.data) == (640, 360)


@pytest.mark.parametrize("name", panels.PANEL_NAMES)
def test_every_panel_renders_as_svg_of_the_requested_size(apps, trace_id, name):
    query = _window() + (f"&trace_id={trace_id}" if name == "trace" else "")
    if name == "anomalies":  # the detectors are the slow part: the store's last hour is enough
        query = f"start={PATTERNS.end_ns / 1e9 - 3600}&end={PATTERNS.end_ns / 1e9 + 120}"
    resp = apps["open"].test_client().get(f"/render/{name}.svg?{query}&width=900&height=500&theme=dark")
    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
    assert resp.mimetype == "image/svg+xml"
    assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    root = ET.fromstring(resp.data)
    assert root.tag == f"{SVG_NS}svg" and (root.get("width"), root.get("height")) == ("900", "500")
    texts = " ".join("".join(t.itertext()) for t in root.iter(f"{SVG_NS}text"))
    if panels.PANELS[name].kind == "table":  # drawn as a Plotly Table: its headers are text
        empty = {"pair-table": panels.pair_table([]), "input-types": panels.input_types_table([], 0.1),
                 "anomalies": panels.anomalies_table([])}[name]
        assert all(header in texts for _, header in empty.columns[:3])
    else:
        assert len(list(root.iter(f"{SVG_NS}path"))) > 3


def test_default_sizes_and_bounds(apps):
    client = apps["open"].test_client()
    resp = client.get(f"/render/pair-table.png?{_window()}&scale=1")
    width, height = png_size(resp.data)
    assert width == panels.PANELS["pair-table"].size[0] and height > 300  # a table as tall as its rows
    built = panels.build("pair-table", apps["open"].extensions["modalscope"]["reader"], dict(parse_qsl(_window())))
    assert height == panels.image_size(built)[1]
    for query, parameter in (("width=100", "width"), ("height=5000", "height"), ("width=wide", "width"),
                             ("scale=9", "scale"), ("theme=sepia", "theme"), ("caller=x", "caller")):
        bad = client.get(f"/render/stages.png?{_window()}&{query}")
        assert bad.status_code == 400 and bad.get_json()["parameter"] == parameter, query
    assert client.get(f"/render/stages.svg?{_window()}&scale=2").get_json()["parameter"] == "scale"
    assert client.get("/render/stages.gif?range=1h").status_code == 404
    assert client.get("/render/no-such-panel.png?range=1h").status_code == 404
    missing = client.get("/render/trace.png?trace_id=" + "ab" * 16)
    assert missing.status_code == 404 and missing.get_json()["parameter"] == "trace_id"


def test_etag_and_cache_control(apps):
    client = apps["open"].test_client()
    url = f"/render/stages.png?{_window()}&width=500&height=300"
    first = client.get(url)
    etag = first.headers["ETag"]
    again = client.get(url, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.data == b"" and again.headers["ETag"] == etag
    assert client.get(url, headers={"If-None-Match": '"other"'}).status_code == 200
    for changed in (url.replace("width=500", "width=501"), url.replace(".png", ".svg"), url + "&theme=dark",
                    url + "&input_type=image"):
        assert client.get(changed).headers["ETag"] != etag, changed
    authed = apps["auth"].test_client().get(url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert authed.status_code == 200 and authed.headers["Cache-Control"] == "private, max-age=60"
    assert apps["auth"].test_client().get(url).status_code == 401  # an image fetcher: no redirect


def test_signed_image_urls(apps):
    window = dict(parse_qsl(_window()))
    pairs = signing.sign(SECRET, "stages", list(window.items()), 3600)
    ok = "&".join(f"{k}={v}" for k, v in pairs)
    sized = "&".join(f"{k}={v}" for k, v in signing.sign(SECRET, "stages", [*window.items(), ("width", "400"),
                                                                           ("height", "250")], 3600))
    for app_name in ("open", "auth"):
        client = apps[app_name].test_client()
        resp = client.get(f"/render/stages.png?{sized}&theme=dark")  # the signed size; theme is free
        assert resp.status_code == 200 and png_size(resp.data) == (800, 500)
        # the size is part of the signature: no other size, no added or dropped one
        assert client.get(f"/render/stages.png?{sized.replace('width=400', 'width=1900')}").status_code == 403
        assert client.get(f"/render/stages.png?{ok}&width=400&height=250").status_code == 403
        assert client.get(f"/render/stages.png?{ok}&scale=1").status_code == 403
        assert client.get(f"/render/stages.svg?{ok}").status_code == 200
        assert client.get(f"/render/cache.png?{ok}").status_code == 403
        assert client.get(f"/render/stages.png?{ok.replace('start=', 'start=1')}").status_code == 403
        expired = signing.sign(SECRET, "stages", list(window.items()), 60, now=time.time() - 600)
        assert client.get("/render/stages.png?" + "&".join(f"{k}={v}" for k, v in expired)).status_code == 403


@pytest.fixture(scope="module")
def hostile_app(tmp_path_factory):
    from modalscope.ingest.settle import settle
    from modalscope.ingest.writer import write_spans
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade
    from tests.app.test_embed import MIN, hostile_spans

    url = f"sqlite:///{tmp_path_factory.mktemp('hostile-render') / 'store.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)
    write_spans(engine, hostile_spans(time.time_ns() // MIN * MIN))
    settle(engine, force=True)
    engine.dispose()
    app = create_app(Settings(database_url=url))
    yield app
    app.extensions["modalscope"]["engine"].dispose()


XLINK = "{http://www.w3.org/1999/xlink}href"


@pytest.mark.parametrize("path", [
    "/render/trace.svg?range=1h&trace_id=" + "0badc0de" * 4,
    "/render/trace.svg?range=1h&trace_id=" + "abc00000" * 4,
    "/render/pair-table.svg?range=1h",
    "/render/pair-heatmap.svg?range=1h",
    "/render/cache.svg?range=1h",
])
def test_hostile_text_is_inert_in_svg(hostile_app, path):
    resp = hostile_app.test_client().get(path)
    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
    assert b"<script" not in resp.data.lower() and b"\xe2\x80\xae" not in resp.data  # no U+202E
    root = ET.fromstring(resp.data)
    tags = {el.tag.split("}")[-1] for el in root.iter()}
    assert not tags & {"script", "foreignObject", "iframe", "img", "a", "use"}, tags
    for el in root.iter():
        for key, value in el.attrib.items():
            name = key.split("}")[-1].lower()
            assert not name.startswith("on"), (el.tag, key)
            if name == "href" or key == XLINK:
                # Only the heatmap's own raster (Plotly draws heatmap cells as a PNG data URI).
                assert el.tag == f"{SVG_NS}image" and value.startswith("data:image/png;base64,"), (el.tag, value[:60])
    texts = " ".join("".join(el.itertext()) for el in root.iter(f"{SVG_NS}text"))
    assert "<img" in texts or "javascript:" in texts  # the hostile names are shown, as text
    assert len(resp.data) < 3_000_000


def test_a_dead_browser_is_replaced(apps):
    r = render.renderer()
    r.warm()
    pid, starts = r.browser_pid(), r.starts
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)  # the browser this process's renderer started
    time.sleep(0.2)
    resp = apps["open"].test_client().get(f"/render/stages.png?{_window()}&width=300&height=200&scale=1")
    assert resp.status_code == 200 and png_size(resp.data) == (300, 200)
    assert r.starts == starts + 1 and r.browser_pid() not in (None, pid)


def test_no_browser_is_a_503_not_a_hang(apps, monkeypatch):
    """A renderer that cannot find Chromium answers in seconds with one JSON line."""
    broken = render.Renderer(render_timeout=10, start_timeout=10)
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chromium")
    monkeypatch.setattr(render, "_renderer", broken)
    started = time.monotonic()
    resp = apps["open"].test_client().get(f"/render/stages.png?{_window()}")
    assert time.monotonic() - started < 10
    assert resp.status_code == 503 and resp.mimetype == "application/json"
    body = resp.get_json()
    assert set(body) == {"error"} and "Chromium" in body["error"] and "\n" not in body["error"]
    assert broken.browser_pid() is None
