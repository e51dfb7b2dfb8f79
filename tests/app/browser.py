"""Headless Chromium for the page tests (Debian's ``chromium`` + ``chromium-driver``).

:func:`running_site` serves an app (werkzeug in a thread, an ephemeral port) to one browser;
:func:`demo_store` fills a store with demo traffic plus the hostile traces every page test
checks, and :func:`shared_demo_store` copies one built once a test run. The module-scoped
``site`` and ``clean_log`` fixtures in ``tests/app/conftest.py`` put the two together; tests
that need another configuration (``tests/app/test_auth.py``, with a token) call them with
their own settings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

MIN = 60_000_000_000
MS = 1_000_000
XSS_NAME = "<img src=x onerror=alert(1)>"
XSS_SERVICE = "<img src=x onerror=window.__xss=1>"
XSS_CALLEE = "<b onmouseover=window.__xss=2>db</b>"
# Attribute keys and values a hostile (or just careless) instrumentation may send.
XSS_ATTRIBUTES = {
    "mm.image_count": 1,
    "note": "<script>window.__xss=3</script>",
    "link": "javascript:window.__xss=4",
    "url.full": "JaVaScRiPt:window.__xss=6",
    "http.url": "data:text/html,<script>window.__xss=7</script>",
    "<i>key</i>": "<b>v</b>",
    '"><img src=x onerror=window.__xss=8>': "attribute key breaking out of a quote",
    "bidi.\u202etxt": "gnp.\u202eexe",  # right-to-left override: shown, not obeyed as markup
    "ctl": "bell\x07 tab\t newline\n end",
}
XSS_PEER_ATTRIBUTES = {"peer.service": XSS_CALLEE, "server.address": "javascript:window.__xss=9"}
BIG_VALUE_CHARS = 1 << 20  # a 1 MiB attribute value
CHROME_ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-dev-shm-usage", "--window-size=1400,1000")


#: How often a wait looks again. Selenium's default, 500 ms, adds a quarter second on average
#: to every wait, and a page test is a chain of them.
POLL_S = 0.05


def waiter(driver, timeout: float) -> WebDriverWait:
    return WebDriverWait(driver, timeout, poll_frequency=POLL_S)


def need(condition: bool, why: str) -> None:
    # A missing browser fails, never skips: scripts/test.sh installs Debian's chromium and
    # chromium-driver (the only skip the suite allows is the PostgreSQL half).
    if not condition:
        pytest.fail(why + " (scripts/test.sh installs chromium and chromium-driver when run as root; "
                    "otherwise: apt-get install chromium chromium-driver)", pytrace=False)


def chrome_paths() -> tuple[str | None, str | None]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    return browser, shutil.which("chromedriver")


def xss_trace(start_ns: int):
    """A trace whose every piece of text is hostile: names, services, attribute keys and values."""
    from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
    from tests.factories import rules

    tid = "0badc0de" * 4
    res = {"service.name": XSS_SERVICE}
    spans = [
        SpanRecord(tid, "00000000000000a1", None, XSS_SERVICE, XSS_NAME, KIND_SERVER, start_ns, start_ns + 900 * MS, 0,
                   attributes=dict(XSS_ATTRIBUTES), resource=res),
        SpanRecord(tid, "00000000000000a2", "00000000000000a1", XSS_SERVICE, "<svg onload=window.__xss=5>",
                   KIND_CLIENT, start_ns + 10 * MS, start_ns + 400 * MS, 0,
                   attributes=dict(XSS_PEER_ATTRIBUTES), resource=res),
        SpanRecord(tid, "00000000000000a3", "00000000000000a1", XSS_SERVICE, "image.decode", KIND_INTERNAL,
                   start_ns + 400 * MS, start_ns + 800 * MS, 0, attributes={"mm.layer": "mlp"}, resource=res),
    ]
    rules().tag(spans)
    return tid, spans


def big_trace(start_ns: int):
    """A trace whose root carries one 1 MiB attribute value (ending in ``<END>``)."""
    from modalscope.core.spans import KIND_INTERNAL, KIND_SERVER, SpanRecord
    from tests.factories import rules

    tid = "b19b19b1" * 4
    res = {"service.name": "bulky"}
    spans = [
        SpanRecord(tid, "00000000000000b1", None, "bulky", "POST /upload", KIND_SERVER, start_ns, start_ns + 300 * MS,
                   0, attributes={"mm.prompt_chars": 10, "payload": "A" * (BIG_VALUE_CHARS - 5) + "<END>"},
                   resource=res),
        SpanRecord(tid, "00000000000000b2", "00000000000000b1", "bulky", "text.tokenize", KIND_INTERNAL,
                   start_ns + 10 * MS, start_ns + 200 * MS, 0, resource=res),
    ]
    rules().tag(spans)
    return tid, spans


def shared_demo_store(tmp_path_factory, folder) -> "DemoStore":
    """:func:`demo_store`'s default store, built once a test run and copied into ``folder``:
    each module's server gets a store of its own to write (its evaluations, its sign-ins)."""
    from tests.demo_stores import shared_file

    def build(into) -> None:
        into.mkdir()
        store = demo_store(into)
        with contextlib.closing(sqlite3.connect(into / "store.db")) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # all in the file that is copied
        (into / "store.json").write_text(json.dumps([store.now_ns, store.xss_trace, store.big_trace]))

    shared = shared_file(tmp_path_factory, "browser-demo", build)
    shutil.copyfile(shared / "store.db", folder / "store.db")
    now_ns, xss_id, big_id = json.loads((shared / "store.json").read_text())
    return DemoStore(f"sqlite:///{folder / 'store.db'}", now_ns, xss_id, big_id)


@dataclass
class DemoStore:
    url: str
    now_ns: int
    xss_trace: str
    big_trace: str

    @property
    def window(self) -> str:
        """``start=…&end=…`` covering the data: absolute, so views are stable."""
        from modalscope.app.params import rfc3339

        return f"start={rfc3339(self.now_ns - 70 * MIN)}&end={rfc3339(self.now_ns + MIN)}"


def demo_store(folder, hours: float = 1.0, rate: float = 0.6) -> DemoStore:
    """A migrated SQLite store in ``folder``: demo traffic up to now, the hostile trace and
    the 1 MiB one, all settled."""
    from modalscope.ingest import demo
    from modalscope.ingest.settle import settle
    from modalscope.ingest.writer import write_spans
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade

    url = f"sqlite:///{folder / 'store.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)
    now = time.time_ns() // MIN * MIN
    demo.fill(engine, demo.DemoConfig(now_ns=now, hours=hours, rate=rate))
    xss_id, xss_spans = xss_trace(now - 20 * MIN)
    big_id, big_spans = big_trace(now - 25 * MIN)
    write_spans(engine, xss_spans + big_spans)
    settle(engine, force=True)
    engine.dispose()
    return DemoStore(url, now, xss_id, big_id)


@dataclass
class Site:
    base: str
    driver: webdriver.Chrome
    window: str  # "start=...&end=..." covering the data: absolute, so views are stable
    xss_trace: str
    big_trace: str = ""

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def wait(self, css: str, timeout: float = 20):
        waiter(self.driver, timeout).until(lambda d: d.find_elements(By.CSS_SELECTOR, css))
        self.settle()
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def settle(self, timeout: float = 20) -> None:
        """Until Dash has no request in flight and nothing is loading, three looks in a row."""
        js = ("return document.readyState === 'complete' && !document.querySelector('[data-dash-is-loading]')"
              " && !document.querySelector('._dash-loading') && !document.querySelector('.dash-spinner')")
        end = time.monotonic() + timeout
        quiet = 0
        while time.monotonic() < end:
            quiet = quiet + 1 if self.driver.execute_script(js) else 0
            if quiet >= 3:
                return
            time.sleep(POLL_S)
        raise TimeoutException("the page kept loading")

    def resize(self, width: int, height: int = 1000, timeout: float = 10) -> int:
        """Set the window's size, settle, and return the page's sideways overflow (0 or less:
        nothing to scroll) once there is none, or what is left after ``timeout``. Plotly
        redraws a graph for its new width a moment after the window changes, so the first
        look can still see the old width."""
        self.driver.set_window_size(width, height)
        self.settle()
        js = "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        with contextlib.suppress(TimeoutException):
            waiter(self.driver, timeout).until(lambda d: d.execute_script(js) <= 0)
        return self.driver.execute_script(js)

    def wait_url(self, predicate, timeout: float = 20) -> str:
        waiter(self.driver, timeout).until(lambda d: predicate(d.current_url))
        return self.driver.current_url

    def severe(self) -> list[str]:
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def text(self, css: str) -> str:
        return " ".join(e.text for e in self.driver.find_elements(By.CSS_SELECTOR, css))


@contextmanager
def running_site(app, store: DemoStore) -> Iterator[Site]:
    """Serve ``app`` on an ephemeral port and open one headless Chromium on it."""
    browser, chromedriver = chrome_paths()
    need(bool(browser and chromedriver), "chromium and chromedriver are needed (apt-get install chromium chromium-driver)")
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line a request otherwise
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in CHROME_ARGS:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    except BaseException:
        server.shutdown()
        raise
    driver.set_page_load_timeout(30)
    try:
        yield Site(f"http://127.0.0.1:{server.server_port}", driver, store.window, store.xss_trace, store.big_trace)
    finally:
        driver.quit()
        server.shutdown()


def no_injection(site: Site) -> None:
    """Nothing hostile became markup or ran: no injected element or handler, no marker, no alert."""
    d = site.driver
    assert d.find_elements(By.CSS_SELECTOR, 'img[src="x"], [onerror], [onload], [onmouseover]') == []
    assert d.execute_script("return window.__xss === undefined")
    with pytest.raises(NoAlertPresentException):
        d.switch_to.alert.text  # noqa: B018 - raises when no alert is open
