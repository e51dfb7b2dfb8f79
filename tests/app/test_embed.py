"""``/embed/<panel>``: every panel alone on a page, its parameters, signed links, headers,
hostile span text, and (headless Chromium) an embed inside another site's iframe and the
pages' Share control."""

from __future__ import annotations

import json
import re
import threading
import time
from html.parser import HTMLParser
from urllib.parse import parse_qsl, urlsplit

import pytest

from modalscope.app import create_app, panels, signing
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
from modalscope.settings import Settings
from tests.demo_stores import PATTERNS

SECRET = "embed-test-secret"
TOKEN = "embed-test-token"
ORIGIN = "https://wiki.example"
MIN = 60_000_000_000
MS = 1_000_000
HOSTILE = "<img src=x onerror=alert(1)>"
JS_URL = "javascript:alert(1)"
RLO = "gnp.\u202eexe"
CONTROL = "bell\x07nul\x00esc\x1b"
BIG = "A" * (1 << 20) + "<script>alert(1)</script>"
ALLOWED_TAGS = {"html", "head", "meta", "title", "link", "script", "body", "main", "header", "span", "a", "div",
                "table", "thead", "tbody", "tr", "th", "td"}


def _window() -> str:
    return f"start={PATTERNS.start_ns / 1e9}&end={PATTERNS.end_ns / 1e9 + 120}"


class Page(HTMLParser):
    """Every tag and attribute of a page, the text of its script elements, and its links."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: dict[str, str] = {}
        self._script: str | None = None
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        self.tags.append((tag, a))
        if tag == "script":
            self._script = a.get("id") or a.get("src") or ""
            self.scripts[self._script] = ""

    def handle_endtag(self, tag):
        if tag == "script":
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            self.scripts[self._script] += data
        else:
            self.text.append(data)

    def find(self, tag: str, **attrs) -> list[dict]:
        return [a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())]

    def figure(self) -> dict:
        return json.loads(self.scripts["ms-embed-data"])


def _inert(page: Page, raw: str) -> None:
    """Only the embed's own markup: known tags, no handlers, one link to our own page,
    scripts only from our own assets, data JSON that cannot close its element."""
    assert len(page.find("a")) <= 1
    for tag, attrs in page.tags:
        assert tag in ALLOWED_TAGS, tag
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        if tag == "a":
            href = attrs["href"]
            assert href.startswith("/") and not href.startswith("//") and attrs.get("id") == "ms-embed-open"
            assert not re.search(r"[\s<>\"'\\]", href)
        if tag == "script":
            assert attrs.get("src", "/embed-assets/").startswith("/embed-assets/")
            assert attrs.get("type") in (None, "application/json")
        if tag == "link":
            assert attrs["href"].startswith("/embed-assets/")
    assert "<script" not in page.scripts.get("ms-embed-data", "")
    assert len(re.findall(r"<script\b", raw, flags=re.I)) == len(page.find("script"))
    assert "javascript:" not in "".join(a.get("href", "") + a.get("src", "") for _, a in page.tags)


# -- apps ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def apps(pattern_store):
    """The pattern store served three ways: open, with a secret key and embed origins, and
    behind a token (with the secret key)."""
    made = {
        "open": create_app(Settings(database_url=pattern_store.url)),
        "signed": create_app(Settings(database_url=pattern_store.url, secret_key=SECRET, embed_origins=(ORIGIN,))),
        "auth": create_app(Settings(database_url=pattern_store.url, secret_key=SECRET, auth_token=TOKEN)),
    }
    yield made
    for app in made.values():
        app.extensions["modalscope"]["engine"].dispose()


@pytest.fixture(scope="module")
def trace_id(pattern_store):
    return pattern_store.get("traces", limit=1)[0]["trace_id"]


def _query(name: str, trace_id: str) -> str:
    if name == "anomalies":  # the detectors are the slow part: the store's last hour is enough
        return f"start={PATTERNS.end_ns / 1e9 - 3600}&end={PATTERNS.end_ns / 1e9 + 120}"
    return _window() + (f"&trace_id={trace_id}" if name == "trace" else "")


# -- every panel -----------------------------------------------------------------------
@pytest.mark.parametrize("name", panels.PANEL_NAMES)
def test_every_panel_embeds_alone(apps, trace_id, name):
    client = apps["open"].test_client()
    query = _query(name, trace_id)
    resp = client.get(f"/embed/{name}?{query}")
    assert resp.status_code == 200, resp.get_data(as_text=True)[-400:]
    raw = resp.get_data(as_text=True)
    page = Page(raw)
    panel = panels.PANELS[name]
    assert page.find("nav") == [] and "ms-nav" not in raw  # the panel alone
    assert page.find("html")[0]["class"] == "ms-embed-light"
    q = panels.parse_query(panel, dict(parse_qsl(query)))
    (open_link,) = page.find("a", id="ms-embed-open")
    assert open_link["href"] == panels.open_href(q) and open_link["target"] == "_blank"
    assert open_link["href"].startswith(panel.page) and "start=" in open_link["href"]
    if name == "trace":
        assert open_link["href"].startswith(f"/trace/{trace_id}?")
    # What the page shows, built by the same functions.
    built = panels.build(name, apps["open"].extensions["modalscope"]["reader"], dict(parse_qsl(query)))
    if panel.kind == "figure":
        assert page.figure() == json.loads(panels.figure_json(built.figure))
        assert page.find("script", src=f"/embed-assets/plotly.min.js?v={_plotly_version()}")
        assert len(page.figure()["data"]) >= 1
    else:
        assert page.find("table", id="ms-embed-table") and "ms-embed-data" not in page.scripts
        cells = [t for t in page.text if t.strip()]
        for row in built.table.rows[:5]:
            for value in row.values():
                assert not value or value in cells
        assert len(page.find("tr")) == len(built.table.rows) + 1
    assert page.find("script", src=f"/embed-assets/embed.js?v={_version()}")
    _inert(page, raw)
    # theme=dark
    dark = client.get(f"/embed/{name}?{query}&theme=dark")
    assert dark.status_code == 200
    dark_page = Page(dark.get_data(as_text=True))
    assert dark_page.find("html")[0]["class"] == "ms-embed-dark"
    if panel.kind == "figure":
        assert dark_page.figure()["layout"]["paper_bgcolor"] == panels.DARK["paper"]


def _plotly_version() -> str:
    import plotly

    return plotly.__version__


def _version() -> str:
    from modalscope import __version__

    return __version__


def test_embed_json_form_for_the_refresh(apps):
    client = apps["open"].test_client()
    html = Page(client.get(f"/embed/stages?{_window()}").get_data(as_text=True))
    resp = client.get(f"/embed/stages?{_window()}", headers={"Accept": "application/json"})
    assert resp.status_code == 200 and resp.mimetype == "application/json" and resp.headers["Vary"] == "Accept"
    body = resp.get_json()
    assert body["figure"] == html.figure() and body["window"].startswith("2025-11-30")
    table = client.get(f"/embed/pair-table?{_window()}", headers={"Accept": "application/json"}).get_json()
    assert table["table"]["columns"][0] == ["caller", "caller"] and len(table["table"]["rows"]) > 3
    bad = client.get("/embed/stages?range=soon", headers={"Accept": "application/json"})
    assert bad.status_code == 400 and bad.get_json()["parameter"] == "range"


def test_relative_windows_refresh_and_absolute_ones_do_not(apps):
    client = apps["open"].test_client()
    main = Page(client.get("/embed/stages?range=7d").get_data(as_text=True)).find("main")[0]
    assert main["data-refresh"] == "900"
    assert Page(client.get(f"/embed/stages?{_window()}").get_data(as_text=True)).find("main")[0]["data-refresh"] == "0"


@pytest.mark.parametrize("path, status, needle", [
    ("/embed/no-such-panel?range=1h", 404, "unknown panel &#39;no-such-panel&#39;"),
    ("/embed/stages?range=7x", 400, "range: range must look like 15m, 1h, 24h or 7d"),
    ("/embed/stages?caller=api", 400, "the stages panel does not take &#39;caller&#39;"),
    ("/embed/stages?theme=blue", 400, "theme: theme must be light or dark"),
    ("/embed/trace?range=1h", 400, "trace_id: the trace panel needs trace_id"),
    ("/embed/trace?trace_id=" + "ab" * 16, 404, "Trace " + "ab" * 16 + " is not stored."),
    ("/embed/cache?group_by=%3Cb%3E", 400, "group_by: group_by must be an attribute key"),
])
def test_errors_are_one_readable_line(apps, path, status, needle):
    resp = apps["open"].test_client().get(path)
    assert resp.status_code == status
    text = resp.get_data(as_text=True)
    assert needle in text and "Traceback" not in text
    assert resp.mimetype == "text/html"


def test_embed_headers(apps):
    resp = apps["signed"].test_client().get(f"/embed/stages?{_window()}")
    csp = dict(d.strip().split(" ", 1) for d in resp.headers["Content-Security-Policy"].split(";"))
    assert csp["frame-ancestors"] == f"'self' {ORIGIN}"
    assert csp["script-src"] == "'self'" and csp["object-src"] == "'none'"  # no inline script at all
    assert "X-Frame-Options" not in resp.headers
    assert resp.headers["Cache-Control"] == "public, max-age=60"
    page = apps["signed"].test_client().get(f"/stages?{_window()}")
    assert page.headers["X-Frame-Options"] == "DENY"
    assets = apps["auth"].test_client()  # no credentials: the embed's scripts are public
    js = assets.get(f"/embed-assets/embed.js?v={_version()}")
    assert js.status_code == 200 and js.mimetype == "text/javascript" and b"Plotly.react" in js.data
    plotly_js = assets.get(f"/embed-assets/plotly.min.js?v={_plotly_version()}")
    assert plotly_js.status_code == 200 and len(plotly_js.data) > 1_000_000
    assert "max-age=86400" in plotly_js.headers["Cache-Control"]
    for name in ("embed.html", "__init__.py", "render.py"):  # three files, by name, nothing else
        assert assets.get(f"/embed-assets/{name}").status_code == 404


# -- signed links ----------------------------------------------------------------------
def _signed(name: str, params: dict, ttl: int = 3600, now: float | None = None) -> str:
    pairs = signing.sign(SECRET, name, list(params.items()), ttl, now=now)
    return "&".join(f"{k}={v}" for k, v in pairs)


@pytest.mark.parametrize("app_name", ["signed", "auth"])
def test_signed_embed_opens_its_panel_and_nothing_else(apps, app_name):
    client = apps[app_name].test_client()
    window = dict(parse_qsl(_window()))
    ok = _signed("stages", window)
    resp = client.get(f"/embed/stages?{ok}")
    assert resp.status_code == 200 and "ms-embed-data" in resp.get_data(as_text=True)
    assert resp.headers["Cache-Control"] == ("private, max-age=60" if app_name == "auth" else "public, max-age=60")
    assert client.get(f"/embed/stages?{ok}&theme=dark").status_code == 200  # presentation is free
    assert client.get(f"/embed/stages?{ok}", headers={"Accept": "application/json"}).status_code == 200
    expired = _signed("stages", window, ttl=60, now=time.time() - 3600)
    assert client.get(f"/embed/stages?{expired}").status_code == 403
    assert client.get(f"/embed/cache?{ok}").status_code == 403  # another panel
    changed = ok.replace(f"start={window['start']}", f"start={float(window['start']) - 3600}")
    assert changed != ok and client.get(f"/embed/stages?{changed}").status_code == 403
    assert client.get(f"/embed/stages?{ok}&service=gateway").status_code == 403  # an added filter
    forged = re.sub(r"sig=[0-9a-f]+", "sig=" + "0" * 64, ok)
    assert client.get(f"/embed/stages?{forged}").status_code == 403
    if app_name == "auth":  # without the signature: the login form
        unsigned = client.get(f"/embed/stages?{_window()}")
        assert unsigned.status_code == 302 and "/login?next=" in unsigned.headers["Location"]


def test_a_signature_is_checked_even_when_everything_is_open(apps):
    """No MODALSCOPE_AUTH_TOKEN: embeds are open, but a link that carries a bad or
    unverifiable signature shows nothing (it was changed, or made by another server)."""
    ok = _signed("stages", dict(parse_qsl(_window())))
    open_client = apps["open"].test_client()  # no secret key: cannot check any signature
    assert open_client.get(f"/embed/stages?{_window()}").status_code == 200
    resp = open_client.get(f"/embed/stages?{ok}")
    assert resp.status_code == 403 and "MODALSCOPE_SECRET_KEY" in resp.get_data(as_text=True)
    signed_client = apps["signed"].test_client()
    assert signed_client.get(f"/embed/stages?{ok}").status_code == 200
    assert signed_client.get(f"/embed/stages?{_window()}&exp=99999999999").status_code == 403  # exp, no sig


# -- hostile span text -----------------------------------------------------------------
def hostile_spans(now_ns: int) -> list[SpanRecord]:
    """Traces whose names, services, attribute values, input type and cache groups are
    hostile: markup, javascript: URLs, a 1 MiB value, control and bidi characters."""
    from tests.app.browser import big_trace, xss_trace
    from tests.factories import rules

    _, xss = xss_trace(now_ns - 20 * MIN)
    _, big = big_trace(now_ns - 25 * MIN)
    spans = xss + big
    long_service = ("svc" + RLO + CONTROL + HOSTILE) * 40
    for i in range(12):
        tid = f"{0xabc00000 + i:08x}" * 4
        t = now_ns - (30 - i) * MIN
        root, call, cache = f"{i + 1:016x}", f"{i + 101:016x}", f"{i + 201:016x}"
        res = {"service.name": long_service[:1024]}
        spans += [
            SpanRecord(tid, root, None, long_service[:1024], HOSTILE + RLO, KIND_SERVER, t, t + 300 * MS, 0,
                       attributes={"mm.input_type": HOSTILE, "note": BIG}, resource=res),
            SpanRecord(tid, call, root, long_service[:1024], JS_URL, KIND_CLIENT, t + 5 * MS, t + 200 * MS, 0,
                       attributes={"peer.service": JS_URL + CONTROL}, resource=res),
            SpanRecord(tid, cache, root, long_service[:1024], "cache.get", KIND_INTERNAL, t + 210 * MS,
                       t + 220 * MS, 0, attributes={"cache.name": HOSTILE, "cache.hit": i % 3 == 0,
                                                    "user_tier": [JS_URL, BIG, RLO + CONTROL][i % 3]},
                       resource=res),
        ]
    rules().tag(spans)
    return spans


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    from modalscope.ingest.settle import settle
    from modalscope.ingest.writer import write_spans
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade

    url = f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'store.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)
    now = time.time_ns() // MIN * MIN
    write_spans(engine, hostile_spans(now))
    settle(engine, force=True)
    engine.dispose()
    app = create_app(Settings(database_url=url))
    yield app, "range=1h"
    app.extensions["modalscope"]["engine"].dispose()


HOSTILE_TRACES = ("0badc0de" * 4, "b19b19b1" * 4, "abc00000" * 4)


@pytest.mark.parametrize("name", panels.PANEL_NAMES)
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_hostile_text_is_inert_in_every_embed(hostile, name, theme):
    app, window = hostile
    client = app.test_client()
    queries = [f"{window}&trace_id={t}" for t in HOSTILE_TRACES] if name == "trace" else [window]
    if name == "cache":
        queries.append(f"{window}&cache=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    if name == "anomalies":
        queries.append(f"{window}&service=%3Cimg%20src%3Dx%3E")
    for query in queries:
        resp = client.get(f"/embed/{name}?{query}&theme={theme}")
        assert resp.status_code == 200, (query, resp.get_data(as_text=True)[-300:])
        raw = resp.get_data(as_text=True)
        page = Page(raw)
        _inert(page, raw)
        assert len(raw) < 400_000  # the 1 MiB value is cut, not shipped
        assert "\u202e" not in raw and "\x07" not in raw and "\x00" not in raw
        if "ms-embed-data" in page.scripts:
            strings = json.dumps(page.figure())
            assert "<img" not in strings and "<script" not in strings and "<svg" not in strings
    # The hostile values are there, as text: escaped in a table cell, entity-escaped for
    # Plotly (which shows entities as literal text) in a figure.
    shown = {"pair-table": "&lt;img src=x onerror=window.__xss=1&gt;",
             "pair-heatmap": "&lt;img src=x onerror=window.__xss=1&gt;",
             "cache": "javascript:alert(1)",
             "trace": "&lt;img src=x onerror=alert(1)&gt;"}
    if name in shown:
        page = Page(client.get(f"/embed/{name}?{queries[0]}").get_data(as_text=True))
        text = json.dumps(page.figure(), ensure_ascii=False) if "ms-embed-data" in page.scripts else "".join(page.text)
        expected = shown[name] if "ms-embed-data" in page.scripts else shown[name].replace("&lt;", "<").replace("&gt;", ">")
        assert expected in text


# -- in a browser ----------------------------------------------------------------------
HOST_PAGE = """<!doctype html><html><head><title>wiki</title></head><body><h1>Inference latency</h1>
<iframe id="panel" src="{src}" width="900" height="480" style="border:0"></iframe></body></html>"""


@pytest.fixture(scope="module")
def wiki_and_site(tmp_path_factory):
    """A 'wiki' (another origin, serving a page with an iframe) and modalscope with a token,
    a secret key and the wiki as its one embed origin, in one headless Chromium."""
    from werkzeug.serving import make_server
    from werkzeug.wrappers import Request, Response

    from tests.app.browser import running_site, shared_demo_store

    frames: dict[str, str] = {}

    @Request.application
    def wiki(request):
        return Response(HOST_PAGE.format(src=frames.get("src", "about:blank")), mimetype="text/html")

    wiki_server = make_server("127.0.0.1", 0, wiki, threaded=True)
    threading.Thread(target=wiki_server.serve_forever, daemon=True).start()
    allowed = f"http://localhost:{wiki_server.server_port}"
    demo = shared_demo_store(tmp_path_factory, tmp_path_factory.mktemp("embed-browser"))
    app = create_app(Settings(database_url=demo.url, auth_token=TOKEN, secret_key=SECRET, embed_origins=(allowed,)))
    try:
        with running_site(app, demo) as site:
            yield site, frames, allowed, f"http://127.0.0.1:{wiki_server.server_port}"
    finally:
        wiki_server.shutdown()
        app.extensions["modalscope"]["engine"].dispose()


def test_signed_embed_renders_in_an_allowed_origins_iframe(wiki_and_site):
    from selenium.webdriver.common.by import By
    from tests.app.browser import waiter

    site, frames, allowed, refused = wiki_and_site
    d = site.driver
    d.get_log("browser")
    share = panels.share_urls(site.base, "stages", dict(parse_qsl(site.window)), secret=SECRET, ttl_seconds=3600)
    frames["src"] = share["embed_url"]
    d.get(f"{allowed}/wiki")  # no session anywhere: the signature is the only credential
    d.switch_to.frame(d.find_element(By.ID, "panel"))
    try:
        waiter(d, 30).until(lambda drv: drv.find_elements(By.CSS_SELECTOR, "#ms-embed-figure .main-svg"))
        assert d.find_elements(By.CSS_SELECTOR, "nav") == []
        bars = d.find_elements(By.CSS_SELECTOR, "#ms-embed-figure .barlayer .point")
        assert len(bars) > 10
        box = d.find_element(By.ID, "ms-embed-figure").rect
        svg = d.find_element(By.CSS_SELECTOR, "#ms-embed-figure .main-svg").rect
        assert abs(svg["width"] - box["width"]) <= 2 and svg["height"] > 300  # fills the iframe
        link = d.find_element(By.ID, "ms-embed-open").get_attribute("href")
        assert link.startswith(f"{site.base}/stages?start=")
    finally:
        d.switch_to.default_content()
    assert site.severe() == []
    # From an origin that MODALSCOPE_EMBED_ORIGINS does not name, the browser refuses the frame.
    d.get(f"{refused}/wiki")
    d.switch_to.frame(d.find_element(By.ID, "panel"))
    try:
        time.sleep(1.0)  # the refusal is the absence of the page: give it the time a load takes
        assert d.find_elements(By.ID, "ms-embed") == []
    finally:
        d.switch_to.default_content()
    logs = site.severe()
    assert logs and all("frame-ancestors" in m or "Refused to frame" in m for m in logs), logs


def test_share_control_link_reopens_the_view_and_signs_the_embed(wiki_and_site):
    from selenium.webdriver.common.by import By
    from tests.app.browser import waiter

    from modalscope.app import ids

    site, _, _, _ = wiki_and_site
    d = site.driver
    site.open("/login")
    d.find_element(By.ID, "token").send_keys(TOKEN)
    d.find_element(By.ID, "login-submit").click()
    site.wait_url(lambda u: "/login" not in u)
    d.get_log("browser")
    view = f"/stages?{site.window}&input_type=image"
    site.open(view)
    site.wait("#stages-stack .main-svg")

    def field(kind):
        return d.find_element(By.CSS_SELECTOR, _css_id(ids.share_id(kind, "stages")))

    d.find_element(By.CSS_SELECTOR, _css_id(ids.share_id(ids.SHARE, "stages")) + " > summary").click()
    link = field(ids.SHARE_LINK).get_attribute("value")
    assert link.startswith(site.base + "/stages?")
    assert dict(parse_qsl(urlsplit(link).query)) == dict(parse_qsl(urlsplit(site.base + view).query))
    assert "/render/stages.png?" in field(ids.SHARE_IMAGE).get_attribute("value")
    assert "sig=" not in field(ids.SHARE_EMBED).get_attribute("value")
    # Signed, 7 days: the server signs (the callback), the fields change.
    d.find_element(By.CSS_SELECTOR, _css_id(ids.share_id(ids.SHARE_TTL, "stages")) + " input[value='604800']").click()
    waiter(d, 20).until(lambda _: "sig=" in field(ids.SHARE_EMBED).get_attribute("value"))
    embed = field(ids.SHARE_EMBED).get_attribute("value")
    params = dict(parse_qsl(urlsplit(embed).query))
    assert abs(int(params["exp"]) - (time.time() + 7 * 86400)) < 120
    assert signing.verify(SECRET, "stages", parse_qsl(urlsplit(embed).query))
    assert embed in field(ids.SHARE_IFRAME).get_attribute("value").replace("&amp;", "&")
    assert "sig=" in field(ids.SHARE_IMAGE).get_attribute("value")
    assert field(ids.SHARE_NOTE).text.startswith("Signed: opens this panel read-only without a login until ")
    # The link reopens the same view.
    d.get(link)
    site.wait("#stages-stack .main-svg")
    assert d.find_element(By.ID, ids.START).get_attribute("value") == dict(parse_qsl(site.window))["start"]
    assert "image" in site.text(f"#{ids.INPUT_TYPE}")
    # The signed embed opens the panel (in this browser, signed in or not, it must verify).
    d.get(embed)
    waiter(d, 30).until(lambda drv: drv.find_elements(By.CSS_SELECTOR, "#ms-embed-figure .main-svg"))
    assert site.severe() == []


def _css_id(component_id: dict) -> str:
    """A CSS selector for the element Dash renders for a dict id (its DOM id is the JSON of
    the id, keys sorted, no spaces)."""
    return f"[id='{json.dumps(component_id, sort_keys=True, separators=(',', ':'))}']"
