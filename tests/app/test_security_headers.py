"""Security headers on every response: framing, the Content-Security-Policy (whose script
hashes must match the inline scripts Dash really serves), nosniff, Referrer-Policy, and
``Cache-Control: private`` for what needed credentials. (That the policy breaks nothing in
a real browser is what the headless-Chromium tests check: they fail on any console error,
and tests/app/test_auth.py shows an injected inline script is refused.)"""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from flask import Response

from modalscope.app import auth, create_app
from modalscope.models.migrate import upgrade
from modalscope.settings import Settings

TOKEN = "header-test-token"
ORIGINS = ("https://wiki.example", "https://docs.example:8443")


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('headers') / 'store.db'}"
    upgrade(url)
    return url


@pytest.fixture
def make_app(store_url):
    apps = []

    def _make(**changes):
        app = create_app(Settings(database_url=store_url, **changes))
        apps.append(app)
        return app

    yield _make
    for app in apps:
        app.extensions["modalscope"]["engine"].dispose()


def policy(resp) -> dict[str, list[str]]:
    """The Content-Security-Policy as {directive: [sources]}; each directive exactly once."""
    out: dict[str, list[str]] = {}
    for part in resp.headers["Content-Security-Policy"].split(";"):
        if part.strip():
            name, *sources = part.split()
            assert name not in out, f"{name} twice in {resp.headers['Content-Security-Policy']}"
            out[name] = sources
    return out


def inline_scripts(html: str) -> list[str]:
    """The inline scripts a browser would run: no src, a JavaScript type, outside comments."""
    html = re.sub(r"<!--.*?-->", "", html, flags=re.S)
    found = []
    for attrs, body in re.findall(r"<script([^>]*)>(.*?)</script>", html, flags=re.S):
        if "src=" in attrs:
            continue
        kind = re.search(r'type="([^"]+)"', attrs)
        if kind and kind.group(1) not in ("application/javascript", "text/javascript", "module"):
            continue  # e.g. Dash's config, type="application/json": data, never run
        found.append(body)
    return found


def sha256_source(script: str) -> str:
    return f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"


NON_EMBED_PATHS = ["/", "/pairs?range=1h", "/trace/" + "ab" * 16, "/_dash-layout", "/_dash-dependencies",
                   "/api/v1/pairs", "/api/v1/health", "/api/v1/no-such-endpoint", "/assets/modalscope.css",
                   "/login", "/logout", "/render/stages.gif", "/embed-assets/embed.js", "/embedded"]


@pytest.mark.parametrize("auth_on", [False, True])
def test_every_non_embed_response_refuses_framing(make_app, auth_on):
    app = make_app(auth_token=TOKEN if auth_on else "", secret_key="k", embed_origins=ORIGINS)
    client = app.test_client()
    statuses = set()
    for path in NON_EMBED_PATHS:
        for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
            resp = client.get(path, headers=headers)
            statuses.add(resp.status_code)
            assert resp.headers["X-Frame-Options"] == "DENY", path
            assert policy(resp)["frame-ancestors"] == ["'self'"], path
            assert resp.headers["X-Content-Type-Options"] == "nosniff", path
            assert resp.headers["Referrer-Policy"] == "same-origin", path
    # Successes, redirects, refusals and errors all carry them.
    assert {200, 404} <= statuses and (not auth_on or {302, 401} <= statuses)


def test_page_policy_allows_dash_and_nothing_from_elsewhere(make_app):
    app = make_app()
    client = app.test_client()
    resp = client.get("/pairs?range=1h")
    csp = policy(resp)
    assert csp["default-src"] == ["'self'"]
    assert csp["style-src"] == ["'self'", "'unsafe-inline'"]
    assert csp["img-src"] == ["'self'", "data:"]
    assert csp["connect-src"] == ["'self'"]
    assert csp["object-src"] == ["'none'"]
    assert csp["base-uri"] == ["'self'"] and csp["form-action"] == ["'self'"]
    script_src = csp["script-src"]
    assert script_src[0] == "'self'"
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src
    assert not any(s.startswith(("http:", "https:", "data:", "blob:", "*")) for s in script_src)
    # Every inline script the page carries (the renderer's start, the pages router's
    # clientside callback) is allowed by its hash, and nothing else is.
    scripts = inline_scripts(resp.get_data(as_text=True))
    assert any("new DashRenderer" in s for s in scripts) and len(scripts) >= 2
    assert sorted(script_src[1:]) == sorted({sha256_source(s) for s in scripts})
    # Every external script is served by this site.
    for src in re.findall(r'<script[^>]*src="([^"]+)"', resp.get_data(as_text=True)):
        assert src.startswith("/") and not src.startswith("//"), src
    # The same policy on every page of the app.
    for path in ("/", "/stages", "/anomalies", "/trace/" + "cd" * 16):
        assert policy(client.get(path))["script-src"] == script_src, path


def test_embeds_may_be_framed_by_the_configured_origins_only(make_app):
    app = make_app(embed_origins=ORIGINS)
    client = app.test_client()
    for path in ("/embed/pair-heatmap?range=1h", "/embed/stages?range=1h", "/embed/no-such-panel"):
        resp = client.get(path)
        assert "X-Frame-Options" not in resp.headers, path
        assert policy(resp)["frame-ancestors"] == ["'self'", *ORIGINS], path
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
    # Unset: the same origin only.
    resp = make_app().test_client().get("/embed/pair-heatmap?range=1h")
    assert policy(resp)["frame-ancestors"] == ["'self'"] and "X-Frame-Options" not in resp.headers
    # Only /embed/…: a look-alike path is a page like any other.
    resp = client.get("/embedx/pair-heatmap")
    assert resp.headers["X-Frame-Options"] == "DENY" and policy(resp)["frame-ancestors"] == ["'self'"]


def test_a_views_own_policy_is_kept_but_frame_ancestors_is_ours(make_app):
    app = make_app(auth_token=TOKEN, embed_origins=ORIGINS)
    own = "default-src 'none'; script-src 'self'; frame-ancestors *"

    @app.get("/embed/probe-own-policy")
    def _probe():
        resp = Response("<p>probe</p>", mimetype="text/html")
        resp.headers["Content-Security-Policy"] = own
        resp.headers["X-Frame-Options"] = "SAMEORIGIN"
        return resp

    @app.get("/probe-own-policy")
    def _page_probe():
        resp = Response("<p>probe</p>", mimetype="text/html")
        resp.headers["Content-Security-Policy"] = own
        return resp

    client = app.test_client()
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    embed = client.get("/embed/probe-own-policy", headers=bearer)
    assert policy(embed) == {"default-src": ["'none'"], "script-src": ["'self'"],
                             "frame-ancestors": ["'self'", *ORIGINS]}
    assert "X-Frame-Options" not in embed.headers
    page = client.get("/probe-own-policy", headers=bearer)
    assert policy(page)["frame-ancestors"] == ["'self'"] and page.headers["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize("auth_on", [True, False])
def test_images_are_private_behind_auth_and_keep_their_etag(make_app, auth_on):
    app = make_app(auth_token=TOKEN if auth_on else "")

    @app.get("/render/probe-cache.png")
    def _probe():
        return Response(b"\x89PNG probe", mimetype="image/png",
                        headers={"Cache-Control": "public, max-age=300", "ETag": '"abc"'})

    resp = app.test_client().get("/render/probe-cache.png", headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 200 and resp.headers["ETag"] == '"abc"'
    expected = "private, max-age=300" if auth_on else "public, max-age=300"
    assert resp.headers["Cache-Control"] == expected


def test_a_real_image_through_the_gate(make_app):
    """The gate keeps app/render's ETag and conditional answer; behind auth it is private."""
    app = make_app(auth_token=TOKEN, secret_key="k")
    client = app.test_client()
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    first = client.get("/render/stages.svg?range=1h&width=400&height=300", headers=bearer)
    assert first.status_code == 200, first.get_data(as_text=True)[:300]
    assert "private" in first.headers["Cache-Control"] and "public" not in first.headers["Cache-Control"]
    etag = first.headers["ETag"]
    again = client.get("/render/stages.svg?range=1h&width=400&height=300", headers={**bearer, "If-None-Match": etag})
    assert again.status_code == 304 and again.headers["ETag"] == etag


def test_policy_helpers():
    settings = Settings(embed_origins=ORIGINS)
    page = auth.content_security_policy(settings, hashes=["'sha256-x'"])
    assert "script-src 'self' 'sha256-x';" in page and page.endswith("frame-ancestors 'self'")
    embed = auth.content_security_policy(settings, embed=True)
    assert embed.endswith("frame-ancestors 'self' https://wiki.example https://docs.example:8443")
    assert auth.with_frame_ancestors("default-src 'none'; Frame-Ancestors *;", "'self'") == \
        "default-src 'none'; frame-ancestors 'self'"
    assert auth.with_frame_ancestors("img-src data:", "'none'") == "img-src data:; frame-ancestors 'none'"
    resp = Response("x", headers={"X-Frame-Options": "DENY"})
    auth.embed_headers(resp, settings)
    assert "X-Frame-Options" not in resp.headers
    assert resp.headers["Content-Security-Policy"].endswith("frame-ancestors 'self' https://wiki.example "
                                                            "https://docs.example:8443")
    for before, after in (("public, max-age=60", "private, max-age=60"), ("", "private"),
                          ("no-store", "no-store"), ("private, max-age=5", "private, max-age=5"),
                          ("max-age=5, PUBLIC", "private, max-age=5")):
        r = Response("x", headers={"Cache-Control": before} if before else {})
        auth._make_private(r)  # noqa: SLF001
        assert r.headers["Cache-Control"] == after, before
    assert auth.script_hashes(["var renderer = new DashRenderer();"]) == [
        sha256_source("var renderer = new DashRenderer();")]
