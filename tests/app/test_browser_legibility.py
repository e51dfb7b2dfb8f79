"""Tables an on-call engineer reads at 1280 and 1440 px in headless Chromium (the
module-scoped ``site`` fixture of tests/app/conftest.py: a demo store): no word of any table
cell is broken across lines, no table runs past its panel, and the pair table's errors column
shows beside the heatmap without scrolling. One full-page screenshot per page and width goes
to ``MODALSCOPE_SCREENSHOT_DIR`` (default ``test-output/screenshots/``)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from modalscope.app import ids
from tests.app.browser import waiter

WIDTHS = (1280, 1440)

# Every whitespace-separated word of every visible table cell, measured with a DOM Range:
# a word whose boxes sit on more than one line was broken mid-word (CSS overflow-wrap:
# anywhere broke "preprocessing" as "prepr/ocess/ing"). Key/value tables' values are span
# data shown whole, wrapped anywhere on purpose: left out.
SPLIT_WORDS_JS = """
const out = [];
for (const cell of document.querySelectorAll('table td, table th')) {
  if (!cell.getClientRects().length) continue;
  if (cell.closest('.ms-kv') && cell.classList.contains('col-value')) continue;
  const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  let node;
  while ((node = walk.nextNode())) {
    const re = /\\S+/g;
    let m;
    while ((m = re.exec(node.textContent))) {
      if (m[0].length < 2) continue;
      const r = document.createRange();
      r.setStart(node, m.index);
      r.setEnd(node, m.index + m[0].length);
      const tops = new Set(Array.from(r.getClientRects()).filter(b => b.width > 0).map(b => Math.round(b.top)));
      if (tops.size > 1) out.push(m[0]);
    }
  }
}
return out;
"""
# Tables wider than their panel (overflowing it, or scrolled inside it).
WIDE_TABLES_JS = """
return Array.from(document.querySelectorAll('.ms-panel table')).filter(t => t.getClientRects().length).map(t => {
  const p = t.closest('.ms-panel'), tr = t.getBoundingClientRect(), pr = p.getBoundingClientRect();
  return {id: t.id || t.className, over: Math.round(tr.right - pr.right), scroll: p.scrollWidth - p.clientWidth};
}).filter(x => x.over > 1 || x.scroll > 1);
"""


def screenshot_dir() -> Path:
    folder = Path(os.environ.get("MODALSCOPE_SCREENSHOT_DIR")
                  or Path(__file__).resolve().parents[2] / "test-output" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _last_half_hour(site) -> str:
    """The window's last half hour: its baseline (the half hour before) holds demo data too."""
    from urllib.parse import parse_qs

    from modalscope.app.params import parse_time, rfc3339

    end = parse_time(parse_qs(site.window)["end"][0], "end")
    return f"start={rfc3339(end - 31 * 60 * 10**9)}&end={rfc3339(end)}"


def _viewport(site, width: int) -> None:
    # Exactly ``width`` CSS pixels of page (a window size would include the browser's frame).
    site.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})


def _full_page(site, path: Path) -> None:
    shot = site.driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.stat().st_size > 0


def test_tables_keep_words_whole_at_1280_and_1440(site, clean_log):
    trace_link = None
    site.open(f"/trace?{site.window}")
    trace_link = site.wait("#trace-pick-table a.ms-trace-link")[0].get_attribute("title")
    pages = {
        "overview": (f"/?{site.window}", "#overview-input-types tbody tr"),
        "pairs": (f"/pairs?{site.window}", "#pairs-table-rows tbody tr"),
        "drilldown": (f"/drilldown?{site.window}&input_type=image", "#drilldown-exemplar-table tbody tr"),
        "compare": (f"/compare?{_last_half_hour(site)}&input_type=image", "#compare-attribute-rows tbody tr"),
        "stages": (f"/stages?{site.window}", "#stages-table-rows tbody tr"),
        "cache": (f"/cache?{site.window}", "#cache-table-rows tbody tr"),
        "trace": (f"/trace/{trace_link}?{site.window}", "#trace-span-table tbody tr"),
    }
    folder = screenshot_dir()
    try:
        for name, (path, css) in pages.items():
            # One load a page, read at each width: tables reflow when the viewport changes.
            site.open(path)
            site.wait(css, timeout=30)
            for width in WIDTHS:
                _viewport(site, width)
                site.settle()
                assert site.driver.execute_script("return window.innerWidth") == width
                _full_page(site, folder / f"{name}-{width}.png")
                split = site.driver.execute_script(SPLIT_WORDS_JS)
                assert split == [], (name, width, split[:20])
                assert site.driver.execute_script(WIDE_TABLES_JS) == [], (name, width)
                if name == "pairs":
                    _pairs_errors_in_view(site, width)
                if name == "drilldown":
                    _drilldown_controls_apart(site)
    finally:
        site.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def _pairs_errors_in_view(site, width: int) -> None:
    """The errors column's header and cells lie inside the viewport and inside the table's
    panel, with nothing to scroll sideways."""
    head = site.driver.find_element(By.CSS_SELECTOR, "#pairs-table-rows th.col-error_rate")
    assert head.text.startswith("errors")
    box = site.driver.execute_script("""
        const th = arguments[0], p = th.closest('.ms-panel'), r = th.getBoundingClientRect(),
              pr = p.getBoundingClientRect(), doc = document.documentElement;
        return {right: r.right, left: r.left, panel: pr.right, vw: window.innerWidth,
                page: doc.scrollWidth - doc.clientWidth, inner: p.scrollWidth - p.clientWidth};
    """, head)
    assert box["left"] >= 0 and box["right"] <= box["vw"] and box["right"] <= box["panel"] + 1, (width, box)
    assert box["page"] <= 0 and box["inner"] <= 1, (width, box)
    # The extrapolated figure says so where it shows.
    calls = site.driver.find_element(By.CSS_SELECTOR, "#pairs-table-rows td.col-count")
    assert "extrapolated" in calls.get_attribute("title")


def _drilldown_controls_apart(site) -> None:
    """The box-select hint, "Compare this window" and Share do not overlap."""
    boxes = site.driver.execute_script("""
        const link = document.getElementById(arguments[0]);
        const parts = Array.from(link.closest('.ms-panel-actions').children);
        return parts.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; });
    """, ids.DD_COMPARE)
    assert len(boxes) >= 2
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            apart = a[2] <= b[0] + 0.5 or b[2] <= a[0] + 0.5 or a[3] <= b[1] + 0.5 or b[3] <= a[1] + 0.5
            assert apart, (a, b)


HIST_JS = """
const gd = document.querySelector('#%s .js-plotly-plot');
if (!gd || !gd.layout || !gd.data || !gd.data.length) return null;
return {type: gd.layout.yaxis.type || 'linear',
        bands: (gd.layout.shapes || []).filter(s => s.type === 'rect').map(s => [s.x0, s.x1]),
        bars: gd.data[0].y.length};
""" % ids.DD_HIST


def test_drilldown_histogram_log_counts_and_band_in_the_url(site, clean_log):
    site.open(f"/drilldown?{site.window}&input_type=image&min_ms=1000&max_ms=4000")
    site.wait(f"#{ids.DD_HIST} .js-plotly-plot")
    hist = waiter(site.driver, 20).until(lambda d: d.execute_script(HIST_JS))
    assert hist["type"] == "linear" and hist["bands"] == [[3.0, pytest.approx(3.60206)]], hist
    site.driver.find_element(By.XPATH, "//div[@id='drilldown-counts']//label[normalize-space()='log counts']").click()
    url = site.wait_url(lambda u: "counts=log" in u)
    assert "min_ms=1000" in url and "input_type=image" in url
    waiter(site.driver, 20).until(lambda d: (d.execute_script(HIST_JS) or {}).get("type") == "log")
    site.settle()
    assert site.driver.execute_script(HIST_JS)["bands"], "the band stays shaded on the log axis"
    # A reload keeps it: the state is the URL.
    site.driver.get(url)
    site.wait(f"#{ids.DD_HIST} .js-plotly-plot")
    waiter(site.driver, 20).until(lambda d: (d.execute_script(HIST_JS) or {}).get("type") == "log")
    checked = site.driver.find_element(By.CSS_SELECTOR, "#drilldown-counts input:checked")
    assert checked.get_attribute("value") == "log"
    site.settle()
    _full_page(site, screenshot_dir() / "drilldown-log-counts-band.png")
