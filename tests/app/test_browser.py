"""The dashboard in headless Chromium (Debian's ``chromium`` + ``chromium-driver``), against a
store filled by the demo generator plus a hostile trace and one with a 1 MiB attribute.

One store, one server (werkzeug in a thread) and one browser for the module; every test
drives the real pages: no console errors, heatmap cell -> drilldown -> trace, a copied URL
reopens the same view, box-select narrows the window, span text stays text.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, quote, urlparse

from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from modalscope.app import ids
from tests.app.browser import BIG_VALUE_CHARS, XSS_ATTRIBUTES, XSS_CALLEE, XSS_NAME, XSS_PEER_ATTRIBUTES, XSS_SERVICE, Site, waiter
from tests.app.browser import no_injection as _no_injection

# The ``site`` and ``clean_log`` fixtures live in tests/app/conftest.py, the helpers in
# tests/app/browser.py (shared with test_browser_findings.py and test_auth.py).


def test_every_page_loads_without_console_errors(site, clean_log):
    pages = [
        (f"/?{site.window}", "#overview-input-types"),
        (f"/pairs?{site.window}", f"#{ids.PAIRS_HEATMAP} .main-svg"),
        (f"/drilldown?{site.window}&input_type=image", "#drilldown-exemplar-table"),
        (f"/trace/{site.xss_trace}?{site.window}", "#trace-span-table"),
        (f"/trace?{site.window}", "#trace-pick-table"),
        (f"/stages?{site.window}", "#stages-table-rows"),
    ]
    for path, css in pages:
        site.open(path)
        site.wait(css)
        nav = site.driver.find_elements(By.CSS_SELECTOR, "nav a")
        assert [a.text for a in nav] == ["Overview", "Service pairs", "Drilldown", "Trace", "Stages", "Cache",
                                        "Anomalies", "Compare"]
        start = parse_qs(site.window)["start"]
        assert all(parse_qs(urlparse(a.get_attribute("href")).query).get("start") == start for a in nav), (
            path, start, [a.get_attribute("href") for a in nav])
        assert site.severe() == [], path
    # A window with no data: every page says so, and what to do, without errors.
    empty = "start=2020-01-01T00:00:00Z&end=2020-01-01T01:00:00Z"
    for path, what in (("/", "No traces in this window."), ("/pairs", "No service-pair calls in this window."),
                       ("/drilldown", "No samples for this selection in this window."),
                       ("/stages", "No settled traces in this window.")):
        site.open(f"{path}?{empty}")
        site.wait(".ms-empty")
        assert what in site.text(".ms-empty-title"), path
        assert "modalscope demo" in site.text(".ms-empty"), path
        assert site.severe() == [], path
    # The box opens any trace id (and says why not when it cannot).
    site.open(f"/trace?{site.window}")
    site.wait("#trace-pick-table")
    box = site.driver.find_element(By.ID, ids.TR_OPEN_INPUT)
    box.send_keys("not-a-trace")
    site.driver.find_element(By.ID, ids.TR_OPEN_BUTTON).click()
    waiter(site.driver, 10).until(lambda d: "32 hexadecimal" in d.find_element(By.ID, ids.TR_OPEN_ERROR).text)
    box.send_keys(Keys.CONTROL, "a")  # (clear() bypasses React's onChange)
    box.send_keys(site.xss_trace.upper() + Keys.ENTER)
    site.wait_url(lambda u: f"/trace/{site.xss_trace}?" in u)
    site.wait("#trace-span-table")
        # The overview computes the seed's table live.
    site.open(f"/?{site.window}")
    table = site.wait("#overview-input-types")[0].text
    for it in ("text", "image", "multi_image"):
        assert it in table
    assert "320 ms / 410 ms" in table


def _heatmap_cell(site: Site):
    """Viewport coordinates of a populated cell, away from the markers (the graph scrolled
    into view first)."""
    return site.driver.execute_script("""
        const gd = document.querySelector('#pairs-heatmap .js-plotly-plot');
        gd.scrollIntoView({block: 'center'});
        const heat = gd.data[0], xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        let busiest = heat.x.length - 1;  // busiest pair on the right
        let best = null;
        for (let j = 0; j < heat.z.length; j++) {
          const c = heat.z[j][busiest];
          if (c === null) continue;
          const yc = (heat.y[j] + heat.y[j + 1]) / 2;
          const px = xa._offset + xa.l2p(busiest), py = ya._offset + ya.l2p(yc);
          let far = 1e9;
          for (let k = 1; k < gd.data.length; k++) {
            const my = gd.data[k].y[busiest];
            if (my !== null) far = Math.min(far, Math.abs(ya._offset + ya.l2p(my) - py));
          }
          if (far < 16) continue;  // a P50/P90/P99 marker would take the click
          if (best === null || c > best.c) best = {px, py, c, j};
        }
        const r = gd.getBoundingClientRect();
        return [r.left + best.px, r.top + best.py, best.j];
    """)


def test_heatmap_cell_leads_through_drilldown_to_a_trace(site, clean_log):
    site.open(f"/pairs?{site.window}")
    site.wait(f"#{ids.PAIRS_HEATMAP} .js-plotly-plot")
    x, y, _ = _heatmap_cell(site)
    # Viewport coordinates, not an offset from the element: WebDriver measures that from the
    # centre of the element's *visible* part, so a graph running past the window's bottom
    # edge (how far depends on the data) moved the click onto a P50 marker.
    clicker = ActionBuilder(site.driver)
    clicker.pointer_action.move_to_location(int(x), int(y)).pause(0.3).click()
    clicker.perform()
    url = site.wait_url(lambda u: "/drilldown" in u and "min_ms=" in u)
    q = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
    assert q["caller"] and q["callee"] and float(q["min_ms"]) < float(q["max_ms"])
    assert "start" in q and "end" in q  # the window travels with the click
    site.wait("#drilldown-exemplar-table")
    assert f"calls {q['caller']} → {q['callee']}" in site.text(f"#{ids.DD_TITLE}")
    # Every exemplar's matched call lies in the band.
    rows = site.driver.find_elements(By.CSS_SELECTOR, "#drilldown-exemplar-table tbody tr")
    assert rows
    link = site.driver.find_element(By.CSS_SELECTOR, "#drilldown-exemplar-table a.ms-trace-link")
    trace_id = link.get_attribute("title")
    link.click()
    url = site.wait_url(lambda u: f"/trace/{trace_id}" in u)
    site.wait("#trace-span-table")
    assert site.driver.find_elements(By.CSS_SELECTOR, f"#{ids.TR_WATERFALL} .main-svg")
    assert trace_id in site.text(f"#{ids.TR_HEADER}")
    # The matched call is selected, and ranked against its own operation.
    detail = site.text(f"#{ids.TR_DETAIL}")
    assert "for " in detail and " in the window" in detail
    assert "span=" in url


def test_copied_url_reopens_the_same_view(site, clean_log):
    site.open(f"/drilldown?{site.window}&input_type=multi_image")
    hist = site.wait(f"#{ids.DD_HIST} .js-plotly-plot")[0]
    site.wait("#drilldown-exemplar-table")
    # Select the slowest band by clicking its bar (through Plotly, as a user's click arrives).
    site.driver.execute_script("""
        const gd = arguments[0]; const bars = gd.data[0];
        let i = bars.y.length - 1; while (i > 0 && !bars.y[i]) i--;
        const pt = {curveNumber: 0, pointNumber: i, customdata: bars.customdata[i], x: bars.x[i], y: bars.y[i]};
        gd.emit('plotly_click', {points: [pt], event: {}});
    """, hist)
    url = site.wait_url(lambda u: "min_ms=" in u)
    site.wait("#drilldown-exemplar-table")
    before = (site.text(f"#{ids.DD_TITLE}"), site.text(f"#{ids.DD_SUMMARY}"),
              site.text("#drilldown-exemplar-table tbody tr:first-child"),
              site.driver.find_element(By.CSS_SELECTOR, f"#{ids.INPUT_TYPE}").text)
    assert "band" in before[1]
    # Paste the link into a fresh page load.
    site.driver.get("about:blank")
    site.driver.get(url)
    site.wait("#drilldown-exemplar-table")
    after = (site.text(f"#{ids.DD_TITLE}"), site.text(f"#{ids.DD_SUMMARY}"),
             site.text("#drilldown-exemplar-table tbody tr:first-child"),
             site.driver.find_element(By.CSS_SELECTOR, f"#{ids.INPUT_TYPE}").text)
    assert after == before
    # The time picker writes the URL too, and the preset survives a reload.
    site.driver.find_element(By.XPATH, f"//div[@id='{ids.RANGE}']//label[normalize-space()='24h']").click()
    url = site.wait_url(lambda u: "range=24h" in u and "start=" not in u)
    assert "input_type=multi_image" in url and "min_ms=" in url
    site.wait("#drilldown-exemplar-table")
    site.driver.get(url)
    site.wait("#drilldown-exemplar-table")
    checked = site.driver.find_element(By.CSS_SELECTOR, f"#{ids.RANGE} input:checked")
    assert checked.get_attribute("value") == "24h"


def test_box_select_on_the_time_chart_narrows_the_window(site, clean_log):
    site.open(f"/drilldown?{site.window}")
    gd = site.wait(f"#{ids.DD_TIME} .js-plotly-plot")[0]
    site.driver.execute_script("""
        const gd = arguments[0]; const xs = gd.data[0].x;
        gd.emit('plotly_selected', {points: [], range: {x: [xs[2], xs[xs.length - 3]], y: [0, 1]}});
    """, gd)
    url = site.wait_url(lambda u: "start=" in u and u != site.base + f"/drilldown?{site.window}")
    q = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
    full = {k: v[0] for k, v in parse_qs(site.window).items()}
    assert "range" not in q and full["start"] < q["start"] < q["end"] < full["end"]
    site.wait(f"#{ids.DD_TIME} .js-plotly-plot")


def _only_local_links(site: Site) -> None:
    """Nothing from a span became a link target: every href is an http(s) link on this site."""
    hrefs = [a.get_attribute("href") or "" for a in site.driver.find_elements(By.CSS_SELECTOR, "a[href]")]
    assert hrefs and all(h.startswith(site.base + "/") for h in hrefs), [h for h in hrefs if not h.startswith(site.base)]
    assert site.driver.find_elements(By.CSS_SELECTOR, '[href^="javascript:" i], [href^="data:" i], [src^="javascript:" i]') == []


def test_hostile_span_text_shows_as_text(site, clean_log):
    site.open(f"/trace/{site.xss_trace}?{site.window}")
    site.wait("#trace-span-table")
    spans = site.text("#trace-span-table")
    assert XSS_NAME in spans and "<svg onload=window.__xss=5>" in spans
    attributes = site.text("#trace-attributes")
    assert "<script>window.__xss=3</script>" in attributes and "javascript:window.__xss=4" in attributes
    assert "<i>key</i>" in attributes
    # Every hostile attribute key and value is there, as text (bidi override and control
    # characters included), and the service name too.
    for key, value in XSS_ATTRIBUTES.items():
        assert key in attributes, key
        if isinstance(value, str):
            assert value.split()[0] in attributes, value
    assert "gnp.\u202eexe" in attributes and "bidi.\u202etxt" in attributes
    assert XSS_SERVICE in site.text(f"#{ids.TR_HEADER}, #trace-span-table")
    _only_local_links(site)
    # The client span's attributes (peer.service markup, a javascript: server.address).
    site.open(f"/trace/{site.xss_trace}?{site.window}&span=00000000000000a2")
    site.wait("#trace-attributes")
    attributes = site.text("#trace-attributes")
    for value in XSS_PEER_ATTRIBUTES.values():
        assert value in attributes, value
    _only_local_links(site)
    _no_injection(site)
    site.open(f"/trace/{site.xss_trace}?{site.window}")
    site.wait("#trace-span-table")
    # The waterfall and flame graph labels are text too (Plotly draws them in SVG).
    labels = site.text(f"#{ids.TR_WATERFALL} .annotation-text, #{ids.TR_ICICLE} text")
    assert XSS_NAME in labels
    _no_injection(site)
    # The hostile pair in the heatmap, the table and the filter pickers.
    site.open(f"/pairs?{site.window}&service={quote(XSS_SERVICE)}")
    site.wait(f"#{ids.PAIRS_HEATMAP} .main-svg")
    assert XSS_CALLEE in site.text(f"#{ids.PAIRS_HEATMAP} .xtick text")
    assert XSS_CALLEE in site.text(f"#{ids.PAIRS_TABLE}")
    _no_injection(site)


def test_a_1mib_attribute_does_not_hang_the_trace_page(site, clean_log):
    started = time.monotonic()
    site.open(f"/trace/{site.big_trace}?{site.window}")
    site.wait("#trace-attributes", timeout=30)
    loaded = time.monotonic() - started
    assert loaded < 20, f"the trace page took {loaded:.1f} s with a 1 MiB attribute"
    # The value is there, whole, as text; the page still answers and navigates.
    length = site.driver.execute_script(
        "const cells = [...document.querySelectorAll('#trace-attributes td')];"
        "const big = cells.find(td => td.textContent.endsWith('<END>'));"
        "return big ? big.textContent.length : -1;")
    assert length == BIG_VALUE_CHARS
    site.driver.find_element(By.CSS_SELECTOR, "nav a[href^='/stages']").click()
    site.wait_url(lambda u: "/stages" in u)
    site.wait("#stages-table-rows")
