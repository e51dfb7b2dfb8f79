"""``GET /api/v1/share`` and the pages' Share control (the layout; the browser test in
tests/app/test_embed.py clicks it): absolute URLs from the request's host, signed with
MODALSCOPE_SECRET_KEY, and every refusal a 400 naming its parameter."""

from __future__ import annotations

import json
import time
from html.parser import HTMLParser
from urllib.parse import parse_qsl, urlsplit

import pytest

from modalscope.app import create_app, ids, panels, signing
from modalscope.settings import Settings
from tests.demo_stores import PATTERNS

SECRET = "share-test-secret"
TOKEN = "share-test-token"
HOST = "http://wiki-host.example:8050"


def _window() -> dict[str, str]:
    return {"start": str(PATTERNS.start_ns / 1e9), "end": str(PATTERNS.end_ns / 1e9 + 120)}


@pytest.fixture(scope="module")
def apps(pattern_store):
    made = {
        "open": create_app(Settings(database_url=pattern_store.url)),
        "signed": create_app(Settings(database_url=pattern_store.url, secret_key=SECRET)),
        "auth": create_app(Settings(database_url=pattern_store.url, secret_key=SECRET, auth_token=TOKEN)),
    }
    yield made
    for app in made.values():
        app.extensions["modalscope"]["engine"].dispose()


def _share(app, headers=None, **params):
    return app.test_client().get("/api/v1/share", query_string=params, base_url=HOST, headers=headers or {})


def _local(url: str) -> str:
    """The path and query of one of our absolute URLs (for the test client)."""
    assert url.startswith(HOST + "/")
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def test_unsigned_without_a_secret_key(apps):
    resp = _share(apps["open"], panel="stages", range="7d", input_type="image", ttl="86400")
    assert resp.status_code == 200
    body = resp.get_json()
    assert set(body) == {"panel", "link", "embed_url", "image_url", "svg_url", "iframe", "signed", "expires"}
    assert body["signed"] is False and body["expires"] is None
    assert body["link"] == f"{HOST}/stages?range=7d&input_type=image"
    assert body["embed_url"] == f"{HOST}/embed/stages?range=7d&input_type=image"
    assert body["image_url"] == f"{HOST}/render/stages.png?range=7d&input_type=image"
    assert body["svg_url"] == f"{HOST}/render/stages.svg?range=7d&input_type=image"
    embed = apps["open"].test_client().get(_local(body["embed_url"]))
    assert embed.status_code == 200 and "ms-embed-data" in embed.get_data(as_text=True)


def test_signed_links_open_one_panel_until_they_expire(apps):
    before = time.time()
    body = _share(apps["signed"], panel="pair-table", ttl="3600", sort="p99_ms:desc", **_window()).get_json()
    assert body["signed"] is True
    for key in ("embed_url", "image_url", "svg_url"):
        query = parse_qsl(urlsplit(body[key]).query)
        exp = int(dict(query)["exp"])
        assert before + 3600 - 1 <= exp <= time.time() + 3600
        assert signing.verify(SECRET, "pair-table", query)
        assert not signing.verify(SECRET, "pair-table", query, now=exp + 1)
    assert body["expires"].endswith("Z") and "sig=" not in body["link"]
    client = apps["signed"].test_client()
    assert client.get(_local(body["embed_url"])).status_code == 200
    assert client.get(_local(body["embed_url"]).replace("/embed/pair-table", "/embed/pair-heatmap").replace(
        "sort=p99_ms%3Adesc&", "").replace("&sort=p99_ms%3Adesc", "")).status_code == 403
    # The default lifetime: 30 days.
    default = _share(apps["signed"], panel="stages", range="7d").get_json()
    exp = int(dict(parse_qsl(urlsplit(default["embed_url"]).query))["exp"])
    assert abs(exp - (time.time() + 30 * 86400)) < 60


def test_behind_a_token(apps):
    app = apps["auth"]
    assert _share(app, panel="stages", range="7d").status_code == 401
    body = _share(app, {"Authorization": f"Bearer {TOKEN}"}, panel="stages", range="7d").get_json()
    client = app.test_client()  # no credentials from here on
    embed = client.get(_local(body["embed_url"]))
    assert embed.status_code == 200 and embed.headers["Cache-Control"].startswith("private")
    page = client.get(_local(body["link"]))
    assert page.status_code == 302 and page.headers["Location"].startswith("/login?next=")
    assert client.get(_local(body["embed_url"]).replace("range=7d", "range=24h")).status_code == 403


def test_the_iframe_snippet(apps):
    body = _share(apps["signed"], panel="input-types", range="7d", service='a"b<c>').get_json()

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.found = []

        def handle_starttag(self, tag, attrs):
            self.found.append((tag, dict(attrs)))

    parser = Tags()
    parser.feed(body["iframe"])
    (tag, attrs), = parser.found
    assert tag == "iframe" and attrs["src"] == body["embed_url"] and attrs["width"] == "100%"
    assert "modalscope" in attrs["title"] and "<c>" not in body["iframe"]


def test_the_trace_panel_is_shared_with_its_trace(apps, pattern_store):
    tid = pattern_store.get("traces", limit=1)[0]["trace_id"]
    body = _share(apps["signed"], panel="trace", trace_id=tid, **_window()).get_json()
    assert body["link"].startswith(f"{HOST}/trace/{tid}?start=")
    assert dict(parse_qsl(urlsplit(body["embed_url"]).query))["trace_id"] == tid
    assert apps["signed"].test_client().get(_local(body["embed_url"])).status_code == 200


@pytest.mark.parametrize("params, parameter", [
    ({}, "panel"),
    ({"panel": "nope"}, "panel"),
    ({"panel": "stages", "ttl": "soon"}, "ttl"),
    ({"panel": "stages", "ttl": "10"}, "ttl"),
    ({"panel": "stages", "ttl": str(signing.MAX_TTL_SECONDS + 1)}, "ttl"),
    ({"panel": "stages", "range": "7x"}, "range"),
    ({"panel": "stages", "caller": "api"}, "caller"),
    ({"panel": "stages", "width": "20000"}, "width"),  # a size is taken (and signed), within the caps
    ({"panel": "cache", "group_by": "<b>"}, "group_by"),
    ({"panel": "trace", "range": "1h"}, "trace_id"),
])
def test_refusals_name_the_parameter(apps, params, parameter):
    resp = _share(apps["signed"], **params)
    assert resp.status_code == 400
    body = resp.get_json()
    assert body["parameter"] == parameter and body["error"]


# -- the Share control's layout --------------------------------------------------------
def _components(tree) -> list[dict]:
    """Every component of a Dash layout, as plotly JSON dicts."""
    out, stack = [], [json.loads(json.dumps(tree, default=lambda o: o.to_plotly_json()))]
    while stack:
        node = stack.pop()
        if isinstance(node, dict) and "props" in node:
            out.append(node)
            stack.append(node["props"].get("children"))
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _by_id(tree, kind: str, panel: str) -> dict | None:
    wanted = ids.share_id(kind, panel)
    return next((n for n in _components(tree) if n["props"].get("id") == wanted), None)


def test_share_control_shows_the_panels_addresses(apps):
    from modalscope.app import components as c

    state = {"range": "7d", "caller": "api", "input_type": "image", "min_ms": "5"}
    with apps["open"].test_request_context("/stages", base_url=HOST):
        tree = c.share_control("stages", state)
    link = _by_id(tree, ids.SHARE_LINK, "stages")["props"]
    assert link["value"] == f"{HOST}/stages?range=7d&input_type=image" and link["readOnly"] is True
    assert _by_id(tree, ids.SHARE_EMBED, "stages")["props"]["value"] == f"{HOST}/embed/stages?range=7d&input_type=image"
    assert _by_id(tree, ids.SHARE_IMAGE, "stages")["props"]["value"].startswith(f"{HOST}/render/stages.png?")
    assert 'src="' in _by_id(tree, ids.SHARE_IFRAME, "stages")["props"]["value"]
    clipboards = [n for n in _components(tree) if n["type"] == "Clipboard"]
    assert {json.dumps(n["props"]["target_id"], sort_keys=True) for n in clipboards} == {
        json.dumps(ids.share_id(k, "stages"), sort_keys=True)
        for k in (ids.SHARE_LINK, ids.SHARE_EMBED, ids.SHARE_IFRAME, ids.SHARE_IMAGE)}
    assert _by_id(tree, ids.SHARE_TTL, "stages") is None  # no secret key: nothing to sign with
    assert "MODALSCOPE_SECRET_KEY" in _by_id(tree, ids.SHARE_NOTE, "stages")["props"]["children"]
    with apps["signed"].test_request_context("/stages", base_url=HOST):
        signed_tree = c.share_control("stages", state)
        values, note = c.share_values("stages", {"range": "7d"}, 7 * 86400)
        bad, why = c.share_values("stages", {"range": "7x"}, 0)
    ttl = _by_id(signed_tree, ids.SHARE_TTL, "stages")["props"]
    assert [o["value"] for o in ttl["options"]] == [0, 86400, 7 * 86400, 30 * 86400] and ttl["value"] == 0
    assert values["signed"] and signing.verify(SECRET, "stages", parse_qsl(urlsplit(values["embed_url"]).query))
    assert note.startswith("Signed:") and bad is None and why.startswith("range:")


def test_every_panel_has_its_share_control_on_its_page(apps, pattern_store):
    """The pages place the control beside each chart (layouts rendered as Dash serves them)."""
    from modalscope.app.pages import anomalies, cache, drilldown, overview, pairs, stages, trace

    tid = pattern_store.get("traces", limit=1)[0]["trace_id"]
    with apps["open"].test_request_context("/", base_url=HOST):
        placed = {
            "input-types": overview.layout(range="7d"),
            "pair-heatmap": pairs.layout(range="7d"),
            "pair-table": pairs.layout(range="7d"),
            "stages": stages.layout(range="7d"),
            "latency-timeline": drilldown.layout(range="7d", caller="gateway", callee="userdb"),
            "cache": cache.layout(range="7d", group_by="user_tier"),
            "anomalies": anomalies.layout(range="7d"),
            "trace": trace.layout(trace_id=tid, range="7d"),
        }
        no_trace = trace.layout(range="7d")
    for panel, tree in placed.items():
        assert _by_id(tree, ids.SHARE, panel) is not None, panel
        store = _by_id(tree, ids.SHARE_QUERY, panel)["props"]["data"]
        assert store["panel"] == panel and store["params"]["range"] == "7d"
    assert _by_id(placed["trace"], ids.SHARE_QUERY, "trace")["props"]["data"]["params"]["trace_id"] == tid
    assert _by_id(placed["latency-timeline"], ids.SHARE_QUERY, "latency-timeline")["props"]["data"]["params"] == {
        "range": "7d", "caller": "gateway", "callee": "userdb"}
    assert _by_id(no_trace, ids.SHARE, "trace") is None  # no trace chosen: nothing to share yet
