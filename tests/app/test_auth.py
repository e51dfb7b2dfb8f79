"""Access: the auth matrix (credentials × routes), the login form, the session cookie, signed
panel links, the trusted proxy header, OTLP ingest tokens, and sign-in in headless Chromium.

Apps are built through ``create_app(Settings(...))`` on a temporary SQLite store; ingest runs
the real OTLP/HTTP app and a real gRPC server and channel.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from html import unescape
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import grpc
import pytest
from flask import Flask

from modalscope.app import auth, create_app, signing
from modalscope.ingest.pipeline import IngestPipeline
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans
from modalscope.models.engine import make_engine
from modalscope.models.migrate import upgrade
from modalscope.settings import Settings
from tests.factories import multimodal_trace
from tests.otlp_payloads import request_protobuf

MIN = 60_000_000_000
TOKEN = "s3cret-dashboard-token"
SECRET = "s3cret-signing-key"
PROXY_HEADER = "X-Goog-Authenticated-User-Email"
PROXY_USER = "accounts.google.com:alice@example.com"


# -- a store and apps over it ------------------------------------------------------------
@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('auth') / 'store.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)
    rng = random.Random(11)
    base = (time.time_ns() // MIN - 30) * MIN
    traces = [multimodal_trace(rng, base + i * 20_000_000_000, images=1 + i % 2) for i in range(12)]
    write_spans(engine, [s for t in traces for s in t])
    settle(engine, force=True)
    engine.dispose()
    return url, traces[0][0].trace_id


@pytest.fixture(scope="module")
def make_app(store_url):
    apps = []

    def _make(**changes) -> Flask:
        app = create_app(Settings(database_url=store_url[0], **changes))
        apps.append(app)
        return app

    yield _make
    for app in apps:
        app.extensions["modalscope"]["engine"].dispose()


@pytest.fixture(scope="module")
def app(make_app):
    return make_app(auth_token=TOKEN, secret_key=SECRET, trusted_proxy_header=PROXY_HEADER,
                    embed_origins=("https://wiki.example",))


@pytest.fixture(scope="module")
def trace_id(store_url):
    return store_url[1]


def login(client, token: str = TOKEN, next_path: str = "/", **headers):
    return client.post("/login", data={"token": token, "next": next_path}, headers=headers)


def signed_query(panel: str, params: dict, ttl: int = 600, now: float | None = None, secret: str = SECRET) -> str:
    return urlencode(signing.sign(secret, panel, list(params.items()), ttl, now=now))


def has_route(app: Flask, rule: str) -> bool:
    return any(r.rule == rule for r in app.url_map.iter_rules())


# -- the matrix ----------------------------------------------------------------------------
def _router_callback_body(app: Flask) -> dict:
    """A real ``/_dash-update-component`` request: Dash Pages' router rendering /pairs."""
    deps = app.test_client().get("/_dash-dependencies", headers={"Authorization": f"Bearer {TOKEN}"}).get_json()
    dep = next(d for d in deps if "_pages_content.children" in d["output"])
    values = {"pathname": "/pairs", "search": "?range=1h"}
    return {"output": dep["output"],
            "outputs": [dict(zip(("id", "property"), o.split("."))) for o in dep["output"].strip(".").split("...")],
            "inputs": [{**i, "value": values.get(i["property"])} for i in dep["inputs"]],
            "changedPropIds": ["_pages_location.pathname"], "state": dep["state"]}


def _routes(trace_id: str) -> list[tuple[str, str, str]]:
    """(method, path, kind) of everything that needs credentials, one or more of each kind."""
    return [
        ("GET", "/", "page"),
        ("GET", "/pairs?range=1h&service=gateway", "page"),
        ("GET", f"/trace/{trace_id}?range=1h", "page"),
        ("GET", "/_dash-layout", "dash"),
        ("GET", "/_dash-dependencies", "dash"),
        ("POST", "/_dash-update-component", "dash"),
        ("GET", "/api/v1/pairs?range=1h", "api"),
        ("GET", "/api/v1/input-types", "api"),
        ("GET", "/api/v1/stages", "api"),
        ("GET", "/api/v1/traces?range=1h", "api"),
        ("GET", f"/api/v1/traces/{trace_id}", "api"),
        ("GET", "/api/v1/cache?group_by=user_tier", "api"),
        ("GET", "/embed/pair-heatmap?range=7d", "embed"),
        ("GET", "/render/pair-heatmap.png?range=7d", "render"),
        ("GET", "/render/stages.svg?range=7d", "render"),
    ]


def _request(client, method: str, path: str, body: dict, headers: dict):
    if method == "POST":
        return client.post(path, json=body, headers=headers)
    return client.get(path, headers=headers)


def _assert_refused(resp, method: str, path: str, kind: str) -> None:
    if kind in ("page", "embed"):
        assert resp.status_code == 302, (path, resp.status_code)
        location = resp.headers["Location"]
        assert location.startswith("/login?next="), location
        assert unquote(parse_qs(urlsplit(location).query)["next"][0]) == path  # back to the same view
    else:
        assert resp.status_code == 401, (path, resp.status_code)
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert "authentication required" in resp.get_json()["error"]
    assert "modalscope_session" not in resp.headers.get("Set-Cookie", "")


def _assert_allowed(app: Flask, resp, path: str, kind: str) -> None:
    if kind in ("embed", "render"):
        # The gate lets it through; what the route answers is the embed code's business
        # (200 once app/embed.py serves it, 404 before).
        rule = "/embed/<panel>" if kind == "embed" else "/render/<image>"
        assert resp.status_code not in (302, 401, 403), (path, resp.status_code)
        if has_route(app, rule):
            assert resp.status_code == 200, (path, resp.status_code)
        return
    assert resp.status_code == 200, (path, resp.status_code, resp.get_data(as_text=True)[:300])
    if kind == "page":
        assert resp.mimetype == "text/html" and "_dash-config" in resp.get_data(as_text=True)
    else:
        resp.get_json()  # JSON, not a login form


CREDENTIALS = {  # name: (headers, needs a login first, allowed)
    "nothing": ({}, False, False),
    "wrong bearer": ({"Authorization": "Bearer wrong-token"}, False, False),
    "token as Basic": ({"Authorization": f"Basic {TOKEN}"}, False, False),
    "token without scheme": ({"Authorization": TOKEN}, False, False),
    "longer token": ({"Authorization": f"Bearer {TOKEN}x"}, False, False),
    "empty proxy header": ({PROXY_HEADER: "   "}, False, False),
    "right bearer": ({"Authorization": f"Bearer {TOKEN}"}, False, True),
    "lower-case scheme": ({"Authorization": f"bearer {TOKEN}"}, False, True),
    "session cookie": ({}, True, True),
    "trusted proxy header": ({PROXY_HEADER: PROXY_USER}, False, True),
}


@pytest.mark.parametrize("credential", list(CREDENTIALS))
def test_auth_matrix(app, trace_id, credential):
    headers, with_login, allowed = CREDENTIALS[credential]
    body = _router_callback_body(app)
    client = app.test_client()
    if with_login:
        assert login(client).status_code == 303
    for method, path, kind in _routes(trace_id):
        resp = _request(client, method, path, body, headers)
        if allowed:
            _assert_allowed(app, resp, path, kind)
        else:
            _assert_refused(resp, method, path, kind)
        # Whatever the answer, what needed credentials is never in a shared cache.
        assert "private" in resp.headers.get("Cache-Control", "") or "no-store" in resp.headers.get("Cache-Control", "")
    # Public whatever the credentials: health, Dash's static files, the login form.
    for path in ("/api/v1/health", "/assets/modalscope.css", "/assets/auth.css", "/_favicon.ico"):
        resp = client.get(path, headers=headers)
        assert resp.status_code == 200, path
        assert "private" not in resp.headers.get("Cache-Control", ""), path
    bundle = re.search(r'src="(/_dash-component-suites/[^"]+)"', app.test_client().get(
        "/", headers={"Authorization": f"Bearer {TOKEN}"}).get_data(as_text=True)).group(1)
    assert client.get(bundle, headers=headers).status_code == 200
    assert client.get("/login", headers=headers).status_code in (200, 302)


def test_proxy_header_means_nothing_when_not_configured(make_app, trace_id):
    app = make_app(auth_token=TOKEN, secret_key=SECRET)  # no MODALSCOPE_TRUSTED_PROXY_HEADER
    body = _router_callback_body(app)
    client = app.test_client()
    for method, path, kind in _routes(trace_id):
        _assert_refused(_request(client, method, path, body, {PROXY_HEADER: PROXY_USER}), method, path, kind)


def test_without_a_token_everything_is_open(make_app, trace_id):
    app = make_app()
    client = app.test_client()
    for path in ("/", "/pairs?range=1h", f"/api/v1/traces/{trace_id}", "/_dash-layout"):
        assert client.get(path).status_code == 200, path
    assert client.get("/login?next=/pairs").headers["Location"] == "/pairs"
    assert "Set-Cookie" not in client.post("/login", data={"token": "x"}).headers


def test_a_non_get_to_a_page_is_401_not_a_redirect(app):
    resp = app.test_client().post("/pairs", data={"a": "b"})
    assert resp.status_code == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")


# -- signed panel links ---------------------------------------------------------------------
SIGNED_PATHS = [("/embed/pair-heatmap", "pair-heatmap", "embed"), ("/render/pair-heatmap.png", "pair-heatmap", "render"),
                ("/render/stages.svg", "stages", "render")]


@pytest.mark.parametrize("path,panel,kind", SIGNED_PATHS)
def test_signed_links_open_their_one_panel(app, path, panel, kind):
    client = app.test_client()
    data = {"range": "7d", "service": "gateway"}
    ok = signed_query(panel, data)
    _assert_allowed(app, client.get(f"{path}?{ok}"), path, kind)
    # The theme is free; an image's size is signed (it sets what drawing it costs).
    _assert_allowed(app, client.get(f"{path}?{ok}&theme=dark"), path, kind)
    if kind == "render":
        sized = signed_query(panel, {**data, "width": "800", "height": "300"})
        _assert_allowed(app, client.get(f"{path}?{sized}&theme=dark"), path, kind)
        refused_size = client.get(f"{path}?{ok}&width=800&height=300")
        assert refused_size.status_code == 403, "a size the link was not signed for"

    def refused_403(query: str, why: str):
        resp = client.get(f"{path}?{query}")
        assert resp.status_code == 403, (why, resp.status_code)
        text = resp.get_data(as_text=True)
        assert "expired" in text and "changed" in text, why
        assert "modalscope_session" not in resp.headers.get("Set-Cookie", "")

    refused_403(signed_query(panel, data, ttl=60, now=time.time() - 3600), "expired")
    other = "input-types"
    refused_403(signed_query(other, data), "signed for another panel")
    changed = ok.replace("service=gateway", "service=llm")
    assert changed != ok
    refused_403(changed, "a data parameter changed")
    refused_403(ok + "&stage=encoder", "a data parameter added")
    refused_403(ok.replace("range=7d&", ""), "a data parameter dropped")
    refused_403(signed_query(panel, data, secret="another-key"), "signed with another key")
    refused_403(re.sub(r"sig=[0-9a-f]+", "sig=" + "0" * 64, ok), "a made-up signature")
    # A link without any signature is a plain unauthenticated request.
    _assert_refused(client.get(f"{path}?range=7d&service=gateway"), "GET", f"{path}?range=7d&service=gateway", kind)
    # The signature opens that GET and nothing else: not another method, not the API, a page or Dash.
    assert client.post(f"{path}?{ok}").status_code in (401, 403)
    assert client.get(f"/api/v1/pairs?{ok}").status_code == 401
    assert client.get(f"/pairs?{ok}").status_code == 302
    assert client.get(f"/_dash-layout?{ok}").status_code == 401
    assert client.get(f"/embed/{other}?{ok}").status_code == 403
    # A session opens the panel without any signature; a broken signature stays refused
    # (app/embed.py: a changed or expired link never shows anything, signed in or not).
    assert login(client).status_code == 303
    _assert_allowed(app, client.get(f"{path}?range=7d&service=llm"), path, kind)
    assert client.get(f"{path}?{changed}").status_code == 403


def test_signed_links_need_the_secret_key(make_app):
    # Without MODALSCOPE_SECRET_KEY nothing verifies (the session key derived from the
    # token is never a link key).
    app = make_app(auth_token=TOKEN)
    query = signed_query("pair-heatmap", {"range": "7d"})
    assert app.test_client().get(f"/embed/pair-heatmap?{query}").status_code == 403
    query = signed_query("pair-heatmap", {"range": "7d"}, secret=auth.session_key(Settings(auth_token=TOKEN)))
    assert app.test_client().get(f"/render/pair-heatmap.png?{query}").status_code == 403


def test_is_signed_panel_request_names_the_one_panel(app):
    settings = app.extensions["modalscope"]["settings"]
    query = signed_query("cache", {"range": "24h", "group_by": "user_tier"})
    cases = [
        ("GET", f"/embed/cache?{query}", "cache"),
        ("HEAD", f"/render/cache.png?{query}&theme=dark", "cache"),
        ("HEAD", f"/render/cache.png?{query}&width=640", None),  # a size it was not signed for
        ("GET", f"/render/cache.svg?{query}", "cache"),
        ("POST", f"/embed/cache?{query}", None),
        ("GET", f"/embed/stages?{query}", None),
        ("GET", f"/render/cache.gif?{query}", None),
        ("GET", f"/embed/cache/extra?{query}", None),
        ("GET", f"/cache?{query}", None),
        ("GET", f"/_dash-layout?{query}", None),
        ("GET", f"/embed/cache?{query.replace('24h', '7d')}", None),
    ]
    for method, url, expected in cases:
        with app.test_request_context(url, method=method):
            from flask import request

            assert auth.is_signed_panel_request(request, settings) == expected, (method, url)
    with app.test_request_context(f"/embed/cache?{query}"):
        from flask import request

        no_key = settings.with_(secret_key="")
        assert auth.is_signed_panel_request(request, no_key) is None
        assert auth.is_signed_panel_request(request, settings, now=time.time() + 3600) is None


# -- the login form and the session cookie ----------------------------------------------------
def _set_cookie(resp) -> str:
    cookies = [c for c in resp.headers.getlist("Set-Cookie") if c.startswith("modalscope_session=")]
    assert len(cookies) == 1, resp.headers.getlist("Set-Cookie")
    return cookies[0]


def _hidden_next(resp) -> str:
    m = re.search(r'<input type="hidden" name="next" value="([^"]*)">', resp.get_data(as_text=True))
    assert m, resp.get_data(as_text=True)
    return unescape(m.group(1))


def test_login_round_trip_lands_on_the_page_it_came_from(app):
    client = app.test_client()
    target = "/pairs?range=24h&service=gateway&caller=a%20b"
    first = client.get(target)
    assert first.status_code == 302
    form = client.get(first.headers["Location"])
    assert form.status_code == 200 and form.mimetype == "text/html"
    html = form.get_data(as_text=True)
    assert '<form class="ms-panel ms-login-form" method="post" action="/login">' in html
    assert 'href="/assets/modalscope.css"' in html and 'type="password"' in html
    assert form.headers["Cache-Control"] == "no-store"
    assert _hidden_next(form) == target
    done = login(client, next_path=_hidden_next(form))
    assert done.status_code == 303 and done.headers["Location"] == target
    page = client.get(target)
    assert page.status_code == 200 and "_dash-config" in page.get_data(as_text=True)
    # Signed in, the form sends you on.
    assert client.get("/login?next=/stages").headers["Location"] == "/stages"
    # The shell offers "Sign out" to a session (and no proxy identity).
    layout = json.dumps(client.get("/_dash-layout").get_json())
    assert "Sign out" in layout and "/logout" in layout and "Signed in as" not in layout


def test_wrong_token_shows_the_form_again_with_401(app, caplog):
    client = app.test_client()
    for token in ("wrong", "", TOKEN + " ", TOKEN.upper()):
        with caplog.at_level(logging.INFO, logger="modalscope.app.auth"):
            resp = login(client, token=token, next_path="/cache")
        assert resp.status_code == 401, token
        html = resp.get_data(as_text=True)
        assert "That token is not right." in html and 'id="login-message"' in html
        assert _hidden_next(resp) == "/cache"
        assert "Set-Cookie" not in resp.headers
        assert TOKEN not in html
    assert "wrong token" in caplog.text and TOKEN not in caplog.text
    assert client.get("/").status_code == 302


def test_session_cookie_flags(app):
    resp = login(app.test_client())
    cookie = _set_cookie(resp)
    attrs = {a.strip().split("=")[0].lower(): (a.strip().split("=", 1) + [""])[1] for a in cookie.split(";")[1:]}
    assert "httponly" in attrs and attrs["samesite"] == "Lax" and attrs["path"] == "/"
    assert "secure" not in attrs  # plain http: a Secure cookie would never come back
    expires = time.mktime(time.strptime(attrs["expires"], "%a, %d %b %Y %H:%M:%S GMT")) - time.timezone
    assert abs(expires - (time.time() + auth.SESSION_LIFETIME.total_seconds())) < 120
    # The cookie carries no token, only a keyed fingerprint of it.
    assert TOKEN not in unquote(cookie)
    # https, directly or as the TLS-terminating proxy says: Secure.
    https = app.test_client().post("/login", data={"token": TOKEN}, base_url="https://localhost")
    assert "; Secure" in _set_cookie(https)
    forwarded = login(app.test_client(), **{"X-Forwarded-Proto": "https"})
    assert "; Secure" in _set_cookie(forwarded)
    # A spoofed "http" never takes Secure away from an https request.
    downgraded = app.test_client().post("/login", data={"token": TOKEN}, base_url="https://localhost",
                                        headers={"X-Forwarded-Proto": "http"})
    assert "; Secure" in _set_cookie(downgraded)


def _forge(app: Flask, payload: dict) -> str:
    return app.session_interface.get_signing_serializer(app).dumps(payload)


def test_session_lifetime_and_token_binding(app, make_app):
    settings = app.extensions["modalscope"]["settings"]
    now = int(time.time())
    fp = auth.token_fingerprint(settings)
    life = int(auth.SESSION_LIFETIME.total_seconds())
    cases = {
        "fresh": ({"ms_auth": {"iat": now, "v": fp, "sid": "a1" * 16}}, True),
        "almost expired": ({"ms_auth": {"iat": now - life + 120, "v": fp, "sid": "b2" * 16}}, True),
        "no session id": ({"ms_auth": {"iat": now, "v": fp}}, False),
        "a malformed session id": ({"ms_auth": {"iat": now, "v": fp, "sid": ["a1" * 16]}}, False),
        "expired": ({"ms_auth": {"iat": now - life - 60, "v": fp}}, False),
        "issued in the future": ({"ms_auth": {"iat": now + 86400, "v": fp}}, False),
        "for another token": ({"ms_auth": {"iat": now, "v": "0" * 24}}, False),
        "no issue time": ({"ms_auth": {"v": fp}}, False),
        "not a login": ({"something": "else"}, False),
    }
    for name, (payload, ok) in cases.items():
        client = app.test_client()
        client.set_cookie("modalscope_session", _forge(app, payload))
        assert (client.get("/api/v1/input-types").status_code == 200) is ok, name
    # Tampered, or signed with another key: refused.
    good = _forge(app, cases["fresh"][0])
    for value in (good[:-2] + ("AA" if not good.endswith("AA") else "BB"),
                  _forge(make_app(auth_token=TOKEN, secret_key="other-secret"), cases["fresh"][0])):
        client = app.test_client()
        client.set_cookie("modalscope_session", value)
        assert client.get("/api/v1/input-types").status_code == 401
    # Rotating MODALSCOPE_AUTH_TOKEN (same secret key) signs every session out.
    client = app.test_client()
    login(client)
    cookie = client.get_cookie("modalscope_session").value
    rotated = make_app(auth_token="a-new-token", secret_key=SECRET)
    other = rotated.test_client()
    other.set_cookie("modalscope_session", cookie)
    assert other.get("/api/v1/input-types").status_code == 401


def test_without_a_secret_key_workers_derive_the_same_session_key(make_app, caplog):
    with caplog.at_level(logging.WARNING, logger="modalscope.app.auth"):
        first = make_app(auth_token=TOKEN)
    warnings = [r for r in caplog.records if "MODALSCOPE_SECRET_KEY is not set" in r.getMessage()]
    assert len(warnings) == 1
    client = first.test_client()
    assert login(client).status_code == 303
    cookie = client.get_cookie("modalscope_session").value
    second = make_app(auth_token=TOKEN)  # another gunicorn worker
    c2 = second.test_client()
    c2.set_cookie("modalscope_session", cookie)
    assert c2.get("/api/v1/input-types").status_code == 200
    stranger = make_app(auth_token="another-token").test_client()
    stranger.set_cookie("modalscope_session", cookie)
    assert stranger.get("/api/v1/input-types").status_code == 401
    # With a secret key the session key no longer depends on the token alone.
    assert auth.session_key(Settings(auth_token=TOKEN)) != auth.session_key(Settings(auth_token=TOKEN, secret_key=SECRET))


def test_logout_clears_the_session(app):
    client = app.test_client()
    login(client)
    assert client.get("/api/v1/input-types").status_code == 200
    resp = client.get("/logout")
    assert resp.status_code == 200 and "You are signed out." in resp.get_data(as_text=True)
    cleared = _set_cookie(resp)
    assert cleared.startswith("modalscope_session=;") and "Expires=Thu, 01 Jan 1970" in cleared
    assert client.get_cookie("modalscope_session") is None
    assert client.get("/api/v1/input-types").status_code == 401
    assert client.get("/pairs").status_code == 302


OPEN_REDIRECTS = ["//evil.example", "//evil.example/pairs", "https://evil.example", "http://evil.example/",
                  "/\\evil.example", "\\\\evil.example", "/\\/evil.example", "\\/evil.example", "/\t/evil.example",
                  "/\n/evil.example", "javascript:alert(1)", "evil.example", "", "/login", "/logout",
                  "/login?next=//evil.example", "///evil.example", "https:/evil.example", "/" + "a" * 5000]


@pytest.mark.parametrize("target", OPEN_REDIRECTS)
def test_next_never_leaves_the_site(app, target):
    form = app.test_client().get("/login?" + urlencode({"next": target}))
    assert _hidden_next(form) == "/"
    resp = login(app.test_client(), next_path=target)
    assert resp.status_code == 303 and resp.headers["Location"] == "/"
    assert auth.safe_next(target) == "/"


def test_next_keeps_local_views():
    for target in ("/", "/pairs", "/pairs?range=1h&service=a%20b", "/trace/" + "ab" * 16 + "?span=" + "cd" * 8,
                   "/drilldown?caller=gateway&callee=vision-encoder&min_ms=100&max_ms=200", "/embed/stages?range=7d"):
        assert auth.safe_next(target) == target
    # Hostile but local: stays a path, and the form escapes it.
    assert auth.safe_next('/"><script>alert(1)</script>') == '/"><script>alert(1)</script>'


def test_hostile_next_is_escaped_in_the_form(app):
    target = '/pairs?x="><script>window.__xss=1</script>'
    html = app.test_client().get("/login?" + urlencode({"next": target})).get_data(as_text=True)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert _hidden_next(app.test_client().get("/login?" + urlencode({"next": target}))) == target


@pytest.mark.parametrize("headers,ok", [
    ({"Origin": "https://evil.example"}, False),
    ({"Origin": "http://localhost.evil.example"}, False),
    ({"Origin": "null"}, False),
    ({"Referer": "https://evil.example/login"}, False),
    ({"Origin": "https://evil.example", "Referer": "http://localhost/login"}, False),  # Origin decides
    ({"Origin": "http://localhost"}, True),
    ({"Referer": "http://localhost/login?next=/pairs"}, True),
    ({"Origin": "https://dash.example.com", "X-Forwarded-Host": "dash.example.com"}, True),  # behind a proxy
    ({}, True),  # no header (old clients): SameSite=Lax and the token still guard it
])
def test_login_csrf(app, headers, ok):
    resp = login(app.test_client(), **headers)
    if ok:
        assert resp.status_code == 303 and "modalscope_session=" in resp.headers.get("Set-Cookie", "")
    else:
        assert resp.status_code == 403
        assert "from another site" in resp.get_data(as_text=True)
        assert "Set-Cookie" not in resp.headers


def test_login_without_auth_configured_just_redirects(make_app):
    app = make_app(secret_key=SECRET)
    assert app.test_client().get("/login?next=/cache").headers["Location"] == "/cache"
    assert app.test_client().get("/logout").status_code == 303


# -- the trusted proxy header ----------------------------------------------------------------
def test_trusted_proxy_identity_is_shown_and_logged_once(app, caplog):
    client = app.test_client()
    user = "accounts.google.com:<b>mallory</b>@example.com\x1b[31m"
    with caplog.at_level(logging.INFO, logger="modalscope.app.auth"):
        for _ in range(3):
            resp = client.get("/_dash-layout", headers={PROXY_HEADER: user})
            assert resp.status_code == 200
    layout = resp.get_json()
    text = json.dumps(layout)
    # Shown as the text it is (control characters replaced); React renders it as text.
    assert "Signed in as accounts.google.com:<b>mallory</b>@example.com?[31m" in text
    assert "Sign out" not in text  # the proxy owns that session
    lines = [r.getMessage() for r in caplog.records if "trusted proxy header" in r.getMessage()]
    assert len(lines) == 1 and "\x1b" not in lines[0] and "mallory" in lines[0]
    # Bearer clients see no account links at all.
    bearer = json.dumps(client.get("/_dash-layout", headers={"Authorization": f"Bearer {TOKEN}"}).get_json())
    assert "Signed in as" not in bearer and "Sign out" not in bearer


# -- OTLP ingest tokens -------------------------------------------------------------------------
@pytest.fixture
def ingest(tmp_path):
    url = f"sqlite:///{tmp_path / 'ingest.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)
    settings = Settings(database_url=url, settle_seconds=0, ingest_token="s3cret-ingest", auth_token=TOKEN)
    pipeline = IngestPipeline(engine, settings, settle=False).start()
    yield engine, settings, pipeline
    pipeline.close()
    engine.dispose()


def _span_count(engine) -> int:
    from sqlalchemy import func, select

    from modalscope.models import Span

    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Span)).scalar_one()


def _otlp_body(seed: int) -> bytes:
    return request_protobuf(multimodal_trace(random.Random(seed), time.time_ns() - 60 * 10**9))


INGEST_REFUSED = [None, "Bearer wrong", "s3cret-ingest", "Basic s3cret-ingest", "Bearer s3cret-ingest-and-more",
                  f"Bearer {TOKEN}"]  # the dashboard token is not an ingest token


def test_ingest_token_over_http(ingest):
    from modalscope.ingest.otlp_http import create_ingest_app

    engine, settings, pipeline = ingest
    client = create_ingest_app(pipeline, settings).test_client()
    for value in INGEST_REFUSED:
        headers = {"Content-Type": "application/x-protobuf"} | ({"Authorization": value} if value else {})
        resp = client.post("/v1/traces", data=_otlp_body(1), headers=headers)
        assert resp.status_code == 401, value
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert _span_count(engine) == 0
    body = _otlp_body(2)
    resp = client.post("/v1/traces", data=body, headers={"Content-Type": "application/x-protobuf",
                                                         "Authorization": "Bearer s3cret-ingest"})
    assert resp.status_code == 200
    assert _span_count(engine) == len(multimodal_trace(random.Random(2), 0))
    # ...and the ingest token opens nothing on the dashboard.
    dashboard = create_app(settings)
    try:
        assert dashboard.test_client().get("/api/v1/pairs", headers={"Authorization": "Bearer s3cret-ingest"}
                                           ).status_code == 401
    finally:
        dashboard.extensions["modalscope"]["engine"].dispose()


def test_ingest_token_over_grpc(ingest):
    from modalscope.ingest.otlp_grpc import serve_grpc

    engine, settings, pipeline = ingest
    server = serve_grpc(pipeline, settings, "127.0.0.1", 0, max_workers=2)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        for value in INGEST_REFUSED:
            metadata = (("authorization", value),) if value else ()
            with pytest.raises(grpc.RpcError) as info:
                export(_otlp_body(3), timeout=10, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, value
            assert "ingest token" in info.value.details()
        assert _span_count(engine) == 0
        export(_otlp_body(4), timeout=10, metadata=(("authorization", "Bearer s3cret-ingest"),))
        assert _span_count(engine) == len(multimodal_trace(random.Random(4), 0))
    finally:
        channel.close()
        server.stop(None)


# -- sign-in in headless Chromium --------------------------------------------------------------
@pytest.fixture(scope="module")
def auth_site(tmp_path_factory):
    from tests.app.browser import running_site, shared_demo_store

    demo = shared_demo_store(tmp_path_factory, tmp_path_factory.mktemp("auth-browser"))
    app = create_app(Settings(database_url=demo.url, auth_token=TOKEN, secret_key=SECRET))
    try:
        with running_site(app, demo) as site:
            yield site
    finally:
        app.extensions["modalscope"]["engine"].dispose()


def test_browser_signs_in_and_lands_on_the_heatmap(auth_site):
    from selenium.webdriver.common.by import By

    from modalscope.app import ids

    site = auth_site
    site.driver.get_log("browser")
    target = f"/pairs?{site.window}"
    site.open(target)
    url = site.wait_url(lambda u: "/login?next=" in u)
    assert unquote(parse_qs(urlsplit(url).query)["next"][0]) == target
    site.wait("#token")
    # A wrong token: the form again, saying so (the 401 is expected in the console).
    site.driver.find_element(By.ID, "token").send_keys("wrong")
    site.driver.find_element(By.ID, "login-submit").click()
    site.wait("#login-message")
    assert "not right" in site.text("#login-message")
    assert all("401" in m for m in site.severe())
    site.driver.find_element(By.ID, "token").send_keys(TOKEN)
    site.driver.find_element(By.ID, "login-submit").click()
    site.wait_url(lambda u: u == site.base + target or unquote(u) == site.base + unquote(target))
    site.wait(f"#{ids.PAIRS_HEATMAP} .main-svg")
    assert site.driver.find_elements(By.CSS_SELECTOR, f"#{ids.PAIRS_HEATMAP} .heatmaplayer, "
                                                      f"#{ids.PAIRS_HEATMAP} .hm, #{ids.PAIRS_HEATMAP} image")
    assert site.severe() == []
    # The session cookie is HttpOnly: page script cannot read it.
    assert "modalscope_session" not in site.driver.execute_script("return document.cookie")
    cookie = site.driver.get_cookie("modalscope_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    # The CSP holds in the real browser: an inline script injected at run time does not run.
    site.driver.execute_script("""
        window.__violations = [];
        document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));
        const s = document.createElement('script'); s.textContent = 'window.__csp_probe = 1';
        document.head.appendChild(s);""")
    site.settle()
    assert site.driver.execute_script("return window.__csp_probe === undefined")
    assert site.driver.execute_script("return window.__violations") == ["script-src-elem"]
    # ...and says so in the console, which is how every browser test's "no console errors"
    # also means "no CSP violation" on the pages it opens.
    assert any("Content Security Policy" in m for m in site.severe())
    # "Sign out" in the header ends the session.
    link = site.driver.find_element(By.CSS_SELECTOR, ".ms-account a")
    assert link.text == "Sign out"
    link.click()
    site.wait("#login-message")
    assert "signed out" in site.text("#login-message")
    site.open(f"/stages?{site.window}")
    site.wait_url(lambda u: "/login?next=" in u)
    assert site.severe() == []
