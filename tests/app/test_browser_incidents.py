"""The Anomalies page grouped by incident and the overview's top incidents in headless
Chromium (the module-scoped ``site`` fixture of tests/app/conftest.py: demo traffic plus
the hostile traces, one server and one browser for this module; and the shared store of
every injected pattern, served the same way, for incidents whose cause is unknown)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from selenium.webdriver.common.by import By

from modalscope.app import ids
from modalscope.app.params import rfc3339
from tests.app.browser import DemoStore, no_injection, running_site, waiter
from tests.demo_stores import PATTERNS, pattern_store  # noqa: F401 - a fixture

MIN = 60_000_000_000

SECTIONS = f"#{ids.AN_INCIDENTS} section.ms-incident-section[id^='incident-']"


def test_anomalies_incident_sections_and_links(site, clean_log, tmp_path):
    site.open(f"/anomalies?{site.window}")
    sections = site.wait(SECTIONS, timeout=60)
    assert sections, "no incident section"
    first = sections[0]
    assert first.find_elements(By.CSS_SELECTOR, ".ms-incident-title .ms-severity")
    assert first.find_elements(By.CSS_SELECTOR, ".ms-incident-findings .ms-finding-card")
    no_injection(site)
    for width in (1280, 1440):
        overflow = site.resize(width)
        assert overflow <= 0, (width, overflow)
        path = tmp_path / f"anomalies-incidents-{width}.png"
        assert site.driver.save_screenshot(str(path)) and path.stat().st_size > 0
        print(f"screenshot {width}px: {path}")
    site.driver.set_window_size(1400, 1000)
    # The last incident's link opens the page with it first and marked.
    last_id = site.driver.find_elements(By.CSS_SELECTOR, SECTIONS)[-1].get_attribute("id")
    site.open(f"/anomalies?{site.window}&incident={last_id.removeprefix('incident-')}")
    site.wait(SECTIONS + ".ms-incident-selected", timeout=60)
    assert site.driver.find_elements(By.CSS_SELECTOR, SECTIONS)[0].get_attribute("id") == last_id
    # The severity filter is a link: clicking it keeps the window and narrows the sections.
    chip = next(a for a in site.driver.find_elements(By.CSS_SELECTOR, f"#{ids.AN_SEVERITY_FILTER} a")
                if a.text != "all")
    sev = chip.text
    chip.click()
    url = site.wait_url(lambda u: "severity=" in u)
    q = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
    assert q["severity"] == sev and q["start"] == parse_qs(site.window)["start"][0]
    site.wait(f"#{ids.AN_SEVERITY_FILTER} a.active", timeout=60)
    badges = site.driver.find_elements(By.CSS_SELECTOR, f"{SECTIONS} .ms-incident-title .ms-severity")
    assert all(b.text == sev for b in badges)


def test_overview_links_to_the_incident(site, clean_log):
    site.open(f"/?{site.window}")
    cards = site.wait(f"#{ids.OV_INCIDENTS} li.ms-incident, #{ids.OV_INCIDENTS} .ms-empty", timeout=60)
    assert cards and "ms-incident" in cards[0].get_attribute("class")
    link = cards[0].find_element(By.CSS_SELECTOR, "a.ms-incident-link")
    incident = parse_qs(urlparse(link.get_attribute("href")).query)["incident"][0]
    link.click()
    site.wait_url(lambda u: "/anomalies?" in u and f"incident={incident}" in u)
    site.wait(SECTIONS + ".ms-incident-selected", timeout=60)
    # (the same id unless judging it over its own span changed its headline: then the one holding it)
    first = site.driver.find_elements(By.CSS_SELECTOR, SECTIONS)[0]
    assert "ms-incident-selected" in first.get_attribute("class")
    no_injection(site)


@pytest.fixture(scope="module")
def pattern_site(pattern_store):  # noqa: F811
    """The shared store of every injected pattern, served: its incidents include some whose
    cause is unknown (the page tests' hour of demo traffic has none)."""
    with running_site(pattern_store.app, DemoStore(pattern_store.url, PATTERNS.end_ns // MIN * MIN, "", "")) as s:
        yield s


def test_incidents_whose_cause_is_unknown_get_their_suspects_after_the_list(pattern_site):
    """The Anomalies page lists incidents at once; each one whose cause is unknown says it is
    comparing, and its suspects arrive in a request of its own and replace that line."""
    window = f"start={rfc3339(PATTERNS.start_ns // MIN * MIN)}&end={rfc3339(PATTERNS.end_ns // MIN * MIN + 2 * MIN)}"
    pattern_site.driver.get_log("browser")
    pattern_site.open(f"/anomalies?{window}&kind=baseline_regression")  # (fewer sections, still some unknown)
    assert pattern_site.wait(SECTIONS, timeout=90)
    lines = f"{SECTIONS} .ms-incident-cause[id*='{ids.INCIDENT_SUSPECTS}']"
    assert pattern_site.driver.find_elements(By.CSS_SELECTOR, lines), "no incident with its cause unknown"
    waiter(pattern_site.driver, 90).until(
        lambda d: all("comparing" not in e.text for e in d.find_elements(By.CSS_SELECTOR, lines)))
    texts = [e.text for e in pattern_site.driver.find_elements(By.CSS_SELECTOR, lines)]
    assert all(t.startswith("Cause unknown — suspects: ") and "not available" not in t for t in texts), texts
    assert pattern_site.severe() == []
