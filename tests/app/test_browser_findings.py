"""The Cache, Anomalies and Compare pages in headless Chromium, on the same kind of store as
tests/app/test_browser.py (the module-scoped ``site`` fixture of tests/app/conftest.py: demo
traffic plus the hostile traces, one server and one browser for this module)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

from selenium.webdriver.common.by import By

from modalscope.app import ids
from tests.app.browser import no_injection as _no_injection

NAV = ["Overview", "Service pairs", "Drilldown", "Trace", "Stages", "Cache", "Anomalies", "Compare"]


def test_new_pages_load_without_console_errors(site, clean_log):
    pages = [
        (f"/cache?{site.window}&group_by=user_tier", f"#{ids.CA_RATE} .main-svg"),
        (f"/anomalies?{site.window}", f"#{ids.AN_LIST} .ms-finding-card, #{ids.AN_LIST} .ms-empty"),
        (f"/compare?{site.window}", "#compare-stage-rows"),
        (f"/?{site.window}", f"#{ids.OV_FINDINGS} .ms-finding, #{ids.OV_FINDINGS} .ms-empty"),
    ]
    for path, css in pages:
        site.open(path)
        site.wait(css, timeout=40)
        nav = site.driver.find_elements(By.CSS_SELECTOR, "nav a")
        assert [a.text for a in nav] == NAV, path
        _no_injection(site)
        assert site.severe() == [], path
    # The Anomalies page draws each finding's chart after the list, in its own request.
    site.open(f"/anomalies?{site.window}")
    site.wait(f"#{ids.AN_LIST} .ms-finding-card .js-plotly-plot .scatterlayer .trace", timeout=40)
    assert site.severe() == []
    site.open(f"/cache?{site.window}&group_by=user_tier")
    site.wait("#cache-table-rows")
    assert "bronze" in site.text("#cache-table-rows") and "gold" in site.text("#cache-table-rows")


def test_compare_this_window_from_the_drilldown(site, clean_log):
    site.open(f"/drilldown?{site.window}&input_type=image")
    site.wait(f"#{ids.DD_TIME} .js-plotly-plot")
    link = site.driver.find_element(By.ID, ids.DD_COMPARE)
    link.click()
    url = site.wait_url(lambda u: "/compare?" in u)
    q = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
    full = {k: v[0] for k, v in parse_qs(site.window).items()}
    assert q["start"] == full["start"] and q["end"] == full["end"] and q["input_type"] == "image"
    site.wait("#compare-stage-rows", timeout=40)
    assert "preprocessing" in site.text("#compare-stage-rows")
    _no_injection(site)
