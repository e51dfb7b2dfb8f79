"""The app factory: Flask + Dash pages, nothing heavy at import, debug off by default."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from modalscope.app import create_app
from modalscope.settings import Settings

PAGES = ("/", "/pairs", "/drilldown", "/trace", "/stages", "/cache", "/anomalies", "/compare")


@pytest.fixture
def sqlite_url(tmp_path, _sqlite_template):
    import shutil

    path = tmp_path / "app.db"
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite:///{path}"


def _dash_config(html: str) -> dict:
    m = re.search(r'<script id="_dash-config" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def test_importing_the_app_package_loads_no_dash():
    code = "import sys, modalscope.app; print('dash' in sys.modules, 'plotly' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False"]


def test_every_app_gets_all_its_callbacks(sqlite_url):
    apps = [create_app(Settings(database_url=sqlite_url)) for _ in range(2)]
    try:
        outputs = []
        for app in apps:
            client = app.test_client()
            client.get("/")  # Dash sets itself up on the first request
            deps = client.get("/_dash-dependencies").get_json()
            outputs.append(sorted(d["output"] for d in deps))
        assert outputs[0] == outputs[1]
        flat = " ".join(outputs[0])
        for component in ("pairs-heatmap.figure", "overview-table.children", "drilldown-exemplars.children",
                          "trace-waterfall.figure", "stages-stack.figure", "filter-service.options", "url.href"):
            assert component in flat
    finally:
        for app in apps:
            app.extensions["modalscope"]["engine"].dispose()


def test_pages_nav_headers_and_debug_off(sqlite_url):
    app = create_app(Settings(database_url=sqlite_url))
    client = app.test_client()
    try:
        for path in PAGES + ("/trace/" + "ab" * 16, "/trace/not-a-trace-id"):
            r = client.get(path)
            assert r.status_code == 200 and r.mimetype == "text/html", path
            assert r.headers["X-Frame-Options"] == "DENY"
            assert "frame-ancestors 'self'" in r.headers["Content-Security-Policy"]
        config = _dash_config(client.get("/").get_data(as_text=True))
        assert config["ui"] is False and config["props_check"] is False
        layout = json.dumps(client.get("/_dash-layout").get_json())
        nav = re.findall(r'"href": "([^"]*)", "className": "ms-nav-link"', layout)
        assert nav == list(PAGES)
        assert client.get("/assets/modalscope.css").status_code == 200
        assert client.get("/api/v1/health").get_json()["status"] == "ok"
    finally:
        app.extensions["modalscope"]["engine"].dispose()
    debug = create_app(Settings(database_url=sqlite_url, debug=True))
    try:
        assert _dash_config(debug.test_client().get("/").get_data(as_text=True))["ui"] is True
    finally:
        debug.extensions["modalscope"]["engine"].dispose()


def test_callbacks_answer_on_an_empty_store(sqlite_url):
    """Each page's data callback, called as the browser calls it, on a store with nothing in it."""
    app = create_app(Settings(database_url=sqlite_url))
    client = app.test_client()
    client.get("/")
    calls = {
        "overview-state": ["overview-table.children", "overview-traffic.figure"],
        "pairs-state": ["pairs-heatmap.figure", "pairs-heatmap-data.data", "pairs-table.children",
                        "pairs-empty.children"],
        "drilldown-state": ["drilldown-summary.children", "drilldown-histogram.figure",
                            "drilldown-timeseries.figure", "drilldown-exemplars.children"],
        "stages-state": ["stages-stack.figure", "stages-timeseries.figure", "stages-vit.figure",
                         "stages-table.children"],
    }
    try:
        for store, outs in calls.items():
            body = {
                "output": ".." + "...".join(outs) + "..",
                "outputs": [{"id": o.split(".")[0], "property": o.split(".")[1]} for o in outs],
                "inputs": [{"id": store, "property": "data", "value": {"range": "1h"}}],
                "changedPropIds": [f"{store}.data"], "state": [],
            }
            r = client.post("/_dash-update-component", json=body)
            assert r.status_code == 200, (store, r.get_data(as_text=True)[:500])
            text = r.get_data(as_text=True)
            assert "modalscope demo" in text or "No " in text, store
    finally:
        app.extensions["modalscope"]["engine"].dispose()
