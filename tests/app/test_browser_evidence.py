"""The Anomalies page's evidence as an on-call engineer sees it in headless Chromium (the
module-scoped ``site`` fixture of tests/app/conftest.py): no number in scientific notation,
and every drawn evidence chart has a legend naming its threshold, ceiling or baseline.
Screenshots go to ``MODALSCOPE_SCREENSHOT_DIR`` (default ``test-output/screenshots/``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from selenium.webdriver.common.by import By

from modalscope.app import ids
from tests.app.browser import waiter

SCIENTIFIC = re.compile(r"\d[eE][+-]\d")
REFERENCE = re.compile(r"threshold|ceiling|baseline|floor|median P99 of the pairs|steady median")
CARDS = f"#{ids.AN_INCIDENTS} .ms-finding-card"
# Per evidence chart of a card: drawn (Plotly's svg with traces or the empty chart's note),
# its legend's entries and the legend's text.
CHARTS_JS = """
return Array.from(document.querySelectorAll('.ms-finding-card .ms-graph')).map(g => ({
  drawn: !!g.querySelector('.main-svg') && (!!g.querySelector('.scatterlayer .trace')
         || !!g.querySelector('.annotation')),
  lines: g.querySelectorAll('.scatterlayer .trace').length,
  entries: g.querySelectorAll('.legend .traces').length,
  legend: Array.from(g.querySelectorAll('.legend .legendtext')).map(t => t.textContent),
}));
"""


def screenshot_dir() -> Path:
    folder = os.environ.get("MODALSCOPE_SCREENSHOT_DIR") or Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_anomalies_evidence_reads_in_units_with_legends(site, clean_log):
    site.open(f"/anomalies?{site.window}")
    cards = site.wait(CARDS, timeout=60)
    assert cards, "no finding card"
    # Each chart is its own request: wait until every one is drawn.
    waiter(site.driver, 60).until(
        lambda d: (lambda cs: cs and all(c["drawn"] for c in cs))(d.execute_script(CHARTS_JS)))
    site.settle()
    charts = site.driver.execute_script(CHARTS_JS)
    with_data = [c for c in charts if c["lines"]]
    assert with_data, charts
    for c in with_data:
        # The measured series and at least one reference line, each named in the legend.
        assert c["entries"] == c["lines"] >= 2, c
        assert any(REFERENCE.search(t) for t in c["legend"]), c["legend"]
    evidence = site.text(f"{CARDS} .ms-evidence")
    assert re.search(r"\d (ms|s)\b", evidence) and "samples" in evidence, evidence
    folder = screenshot_dir()
    for width in (1280, 1440):
        overflow = site.resize(width)
        assert overflow <= 0, (width, overflow)
        text = site.driver.execute_script("return document.body.textContent")  # (SVG text too)
        assert not SCIENTIFIC.search(text), SCIENTIFIC.search(text)
        page = folder / f"anomalies-evidence-{width}.png"
        assert site.driver.save_screenshot(str(page)) and page.stat().st_size > 0
        card = next(c for c in site.driver.find_elements(By.CSS_SELECTOR, CARDS)
                    if c.find_elements(By.CSS_SELECTOR, ".ms-graph .legend"))
        site.driver.execute_script(  # (below the sticky navigation bar)
            "window.scrollTo(0, arguments[0].getBoundingClientRect().top + window.scrollY - 80)", card)
        shot = folder / f"anomalies-evidence-card-{width}.png"
        assert card.screenshot(str(shot)) and shot.stat().st_size > 0
        print(f"screenshots {width}px: {page} {shot}")
