"""Traces of thousands of spans: the waterfall stays a few hundred rows, each one row tall,
each naming its service; the page draws in a browser and the PNG renders; a render that
times out answers 504 and the renderer draws the next picture.

Big traces go through the real ingest path (``write_spans`` + ``settle``) on a temporary
SQLite store. ``python -m tests.app.test_big_traces 500 1000 2000`` measures the page's
open time in headless Chromium and the PNG's render time (numbers, not assertions).
"""

from __future__ import annotations

import json
import random
import struct
import time
from types import SimpleNamespace

import pytest

from modalscope.app import figures, ids
from modalscope.core.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, STATUS_ERROR, STATUS_UNSET, SpanRecord

MS = 1_000_000
MIN = 60_000_000_000
BIG_SERVICES = ("gateway", "auth", "image-store", "vision-encoder", "audio-encoder", "text-encoder", "fusion",
                "llm", "kv-cache", "safety", "ranker", "tokenizer", "billing", "feature-store", "media-cdn")
_WORK = ("image.decode", "image.resize", "vit.forward", "text.tokenize", "fusion.cross_attn", "llm.generate",
         "kv.lookup", "embed.lookup", "audio.decode", "safety.check")


def wide_trace(n: int, start_ns: int, seed: int = 11, error_every: int = 37,
               total_ms: float = 15_000.0) -> tuple[str, list[SpanRecord]]:
    """One trace of exactly ``n`` spans (``n`` >= 1) lasting ``total_ms``: a gateway root fanning
    out to every service in :data:`BIG_SERVICES` in four parallel lanes, each call a CLIENT
    span, the callee's SERVER span and 1-4 internal steps; every ``error_every``-th span fails."""
    from tests.factories import rules

    rng = random.Random(seed)
    tid = f"{rng.getrandbits(128):032x}"
    counter = iter(range(1, 10 * n + 10))

    def sid() -> str:
        return f"{(seed % 4096) << 48 | next(counter):016x}"

    root = sid()
    spans = [SpanRecord(tid, root, None, "gateway", "POST /v1/batch", KIND_SERVER, start_ns,
                        start_ns + int(total_ms * MS), 0, attributes={"mm.image_count": 3},
                        resource={"service.name": "gateway"})]
    lanes = [5.0, 5.0, 5.0, 5.0]
    call = 0
    while len(spans) < n:
        lane = call % len(lanes)
        service = BIG_SERVICES[1 + call % (len(BIG_SERVICES) - 1)]
        steps = 1 + rng.randrange(4)
        size = min(2 + steps, n - len(spans))
        dur = min(rng.uniform(1, 4) * 4 * total_ms * 0.95 / max(n, 1), total_ms * 0.6)
        t = min(lanes[lane], total_ms - dur - 1)
        lanes[lane] = t + dur + 0.2
        c = sid()
        spans.append(SpanRecord(tid, c, root, "gateway", f"{service}.Call", KIND_CLIENT, start_ns + int(t * MS),
                                start_ns + int((t + dur) * MS), 0, attributes={"peer.service": service},
                                resource={"service.name": "gateway"}))
        if size >= 2:
            s = sid()
            spans.append(SpanRecord(tid, s, c, service, f"{service}/Handle", KIND_SERVER,
                                    start_ns + int((t + 0.1) * MS), start_ns + int((t + dur - 0.1) * MS), 0,
                                    resource={"service.name": service}))
            step_t, step = t + 0.2, (dur - 0.4) / max(size - 2, 1)
            for k in range(size - 2):
                spans.append(SpanRecord(tid, sid(), s, service, _WORK[(call + k) % len(_WORK)], KIND_INTERNAL,
                                        start_ns + int(step_t * MS), start_ns + int((step_t + step * 0.9) * MS), 0,
                                        resource={"service.name": service}))
                step_t += step
        call += 1
    for i, span in enumerate(spans):
        if i and i % error_every == 0:
            span.status, span.status_message = STATUS_ERROR, "upstream failed"
        else:
            span.status = STATUS_UNSET
    rules().tag(spans)
    return tid, spans


def big_store(folder, n: int, more: tuple[tuple[int, float], ...] = ()) -> tuple[str, list[str], int]:
    """A migrated SQLite store in ``folder`` holding a settled ``n``-span trace of 15 s and one
    more trace per (spans, milliseconds) in ``more``: (database url, trace ids, start in unix ns)."""
    from modalscope.ingest.settle import settle
    from modalscope.ingest.writer import write_spans
    from modalscope.models.engine import make_engine
    from modalscope.models.migrate import upgrade

    url = f"sqlite:///{folder / 'big.db'}"
    upgrade(url)
    engine = make_engine(url, write=True)
    start = time.time_ns() // MIN * MIN - 10 * MIN
    tids = []
    for i, (size, ms) in enumerate(((n, 15_000.0), *more)):
        tid, spans = wide_trace(size, start + i * MS, seed=11 + i, total_ms=ms)
        write_spans(engine, spans)
        tids.append(tid)
    settle(engine, force=True)
    engine.dispose()
    return url, tids, start


# -- figures ------------------------------------------------------------------------------------
SIZES = (5, 500, 2000)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """One store: the 2,000-span trace (15 s), a 500-span one (15 s) and a 5-span one (800 ms);
    ``traces`` maps a size to its ``trace_view``."""
    from modalscope.app import create_app, queries
    from modalscope.app.params import Window, rfc3339
    from modalscope.settings import Settings

    url, tids, start = big_store(tmp_path_factory.mktemp("big"), 2000, ((500, 15_000.0), (5, 800.0)))
    app = create_app(Settings(database_url=url))
    window = Window(start - 30 * MIN, start + 30 * MIN)
    ids = dict(zip((2000, 500, 5), tids))
    traces = {n: queries.trace_view(app.extensions["modalscope"]["reader"], tid, window) for n, tid in ids.items()}
    yield SimpleNamespace(url=url, app=app, start=start, ids=ids, traces=traces,
                          window=f"start={rfc3339(window.start_ns)}&end={rfc3339(window.end_ns)}")
    app.extensions["modalscope"]["engine"].dispose()


def _rows(fig) -> dict[int, str]:
    """Row -> span id, from every bar that carries one."""
    out: dict[int, str] = {}
    for d in fig.data:
        if d.type == "bar" and d.customdata is not None:
            for y, (sid,) in zip(d.y, d.customdata):
                assert out.setdefault(y, sid) == sid, (y, sid)  # one span a row
    return out


@pytest.mark.parametrize("n", SIZES)
def test_the_waterfall_has_bounded_one_row_tall_labelled_rows(big, n):
    trace = big.traces[n]
    assert len(trace["spans"]) == n
    fig = figures.waterfall(trace)
    rows = _rows(fig)
    shown = min(n, figures.WATERFALL_ROWS - 1) if n > figures.WATERFALL_ROWS else n
    assert sorted(rows) == list(range(shown))  # rows 0..shown-1, each one span
    n_rows = shown + (1 if n > figures.WATERFALL_ROWS else 0)
    assert n_rows <= figures.WATERFALL_ROWS
    # Every row one row tall: an explicit width of at most one row on every bar, fixed rows
    # top to bottom, and enough pixels a row for its label.
    for d in fig.data:
        if d.type == "bar":
            assert d.width is not None and 0 < (d.width if isinstance(d.width, (int, float)) else max(d.width)) <= 1
    assert list(fig.layout.yaxis.range) == [n_rows - 0.5, -0.5]
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert plot_px / n_rows >= 16 and fig.layout.height <= 4000
    # Each row names its service and span; critical rows start with the mark.
    by_id = {s["span_id"]: s for s in trace["spans"]}
    notes = fig.layout.annotations
    for y, sid in rows.items():
        s = by_id[sid]
        assert notes[y].y == y
        assert figures.plot_text(s["service"], 22) in notes[y].text and " · " in notes[y].text
        assert figures.plot_text(s["name"], 8)[:6] in notes[y].text
        assert notes[y].text.startswith("● ") == bool(s.get("critical"))
    crit = next(d for d in fig.data if d.name == "critical path")
    assert sorted(crit.y) == sorted(y for y, sid in rows.items() if by_id[sid]["critical"])
    if n > figures.WATERFALL_ROWS:
        hidden = [s for s in trace["spans"] if s["span_id"] not in set(rows.values())]
        services = len({s["service"] for s in hidden})
        assert len(notes) == shown + 1 and notes[-1].y == shown
        assert f"{n - shown:,} more spans in {services} services" in notes[-1].text
    else:
        assert len(notes) == n


@pytest.mark.parametrize("n", SIZES)
def test_time_reads_in_seconds_past_ten_seconds(big, n):
    fig = figures.waterfall(big.traces[n])
    x = fig.layout.xaxis
    unit = "s" if big.traces[n]["duration_ms"] >= 10_000 else "ms"
    assert (n == 5) == (unit == "ms")
    assert x.ticksuffix == f" {unit}" and x.title.text == f"{unit} since trace start"
    assert x.exponentformat == "none"  # never "15k ms"
    assert x.range[1] == pytest.approx(big.traces[n]["duration_ms"] / (1000 if unit == "s" else 1) * 1.02)
    bars = [d for d in fig.data if d.type == "bar"]
    assert max(b + w for d in bars for b, w in zip(d.base, d.x)) <= x.range[1]


@pytest.mark.parametrize("n", (500, 2000))
def test_error_spans_stand_out(big, n):
    fig = figures.waterfall(big.traces[n])
    rows = _rows(fig)
    by_id = {s["span_id"]: s for s in big.traces[n]["spans"]}
    failed = {y for y, sid in rows.items() if by_id[sid]["status"] == "ERROR"}
    assert failed  # the slowest errors get rows of their own
    marks = next(d for d in fig.data if d.name == "error")
    assert marks.type == "scatter" and marks.marker.color == figures.DANGER and marks.showlegend is not False
    assert set(marks.y) == failed
    outline = next(d for d in fig.data if d.name == "error outline")
    assert set(outline.y) == failed and outline.marker.line.color == figures.DANGER and outline.marker.line.width > 0
    assert outline.width == figures.BAR_WIDTH and outline.showlegend is False
    for y in failed:
        assert figures.DANGER in fig.layout.annotations[y].text


def test_the_selected_span_and_its_ancestors_get_rows(big):
    trace = big.traces[2000]
    spans = trace["spans"]
    # A quick, off-path, error-free leaf: the last span the row choice would keep on its own.
    leaf = min((s for s in spans if not s["critical"] and s["status"] != "ERROR" and s["depth"] == 3),
               key=lambda s: s["duration_ms"])
    assert leaf["span_id"] not in {s["span_id"] for s in figures.waterfall_rows(spans)[0]}
    shown, hidden = figures.waterfall_rows(spans, leaf["span_id"])
    ids = {s["span_id"] for s in shown}
    assert leaf["span_id"] in ids and len(shown) == figures.WATERFALL_ROWS - 1
    assert len(shown) + len(hidden) == len(spans)
    assert all(s["parent_span_id"] in ids for s in shown if s["parent_span_id"])  # the tree holds
    order = [s["span_id"] for s in spans]
    assert [s["span_id"] for s in shown] == [sid for sid in order if sid in ids]  # the spans' own order
    fig = figures.waterfall(trace, leaf["span_id"])
    outline = next(d for d in fig.data if d.name == "selected")
    assert _rows(fig)[outline.y[0]] == leaf["span_id"] and outline.width == figures.BAR_WIDTH


def test_the_waterfall_validates_as_plotly_would_build_it(big, monkeypatch):
    """The builder skips plotly's validation (figures.dict_figure): every property it
    writes must still be one plotly accepts."""
    fast = figures.waterfall(big.traces[500], big.traces[500]["spans"][3]["span_id"]).to_plotly_json()
    monkeypatch.setattr(figures, "VALIDATE", True)
    slow = figures.waterfall(big.traces[500], big.traces[500]["spans"][3]["span_id"]).to_plotly_json()
    assert json.dumps(fast, sort_keys=True, default=str) == json.dumps(slow, sort_keys=True, default=str)


@pytest.mark.parametrize("n", SIZES)
def test_the_flame_graph_merges_same_name_siblings_of_big_traces(big, n):
    trace = big.traces[n]
    ic = figures.icicle(trace).data[0]
    if n <= figures.WATERFALL_ROWS:
        assert sorted(ic.ids) == sorted(s["span_id"] for s in trace["spans"])
        return
    assert len(ic.ids) < figures.WATERFALL_ROWS
    counts = [int(t.split("<br>")[-1].split(" spans merged")[0]) for t in ic.text]
    assert sum(counts) == n  # every span is in exactly one node
    parents = set(ic.parents) - {""}
    assert parents <= set(ic.ids)
    values = dict(zip(ic.ids, ic.values))
    for node, parent in zip(ic.ids, ic.parents):
        if parent:
            assert values[parent] >= values[node]


# -- images ---------------------------------------------------------------------------------------
def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_a_2000_span_trace_renders_as_png(big):
    from modalscope.app import render

    render.renderer().warm()
    resp = big.app.test_client().get(f"/render/trace.png?trace_id={big.ids[2000]}&{big.window}")
    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
    assert resp.mimetype == "image/png"
    height = figures.waterfall(big.traces[2000]).layout.height
    assert _png_size(resp.data) == (2 * 1200, 2 * height)


def test_a_render_timeout_is_a_504_and_the_renderer_recovers(big, monkeypatch):
    from modalscope.app import render

    slow = render.Renderer(render_timeout=0.05, start_timeout=30)
    monkeypatch.setattr(render, "_renderer", slow)
    url = f"/render/trace.png?trace_id={big.ids[2000]}&{big.window}"
    try:
        slow.warm()  # the limit is on drawing: a browser still starting on a busy machine is another case
        resp = big.app.test_client().get(url)
        assert resp.status_code == 504 and resp.mimetype == "application/json"
        body = resp.get_json()
        assert set(body) == {"error"} and "longer than 0.05 s" in body["error"] and "Chromium" not in body["error"]
        assert resp.headers["Cache-Control"] == "no-store"
        kept = slow.browser_pid()
        assert kept is not None  # kaleido abandoned the picture and gave its tab back: the browser stays
        slow.render_timeout = 60  # the next picture is drawn by the same browser
        again = big.app.test_client().get(url + "&scale=1")
        assert again.status_code == 200 and again.mimetype == "image/png" and slow.starts == 1
        assert slow.browser_pid() == kept
    finally:
        slow.close()


def test_a_timeout_that_cuts_a_message_in_flight_keeps_the_browser(big, monkeypatch):
    """On a busy machine kaleido's timeout can cancel a message to the browser mid-write,
    and choreographer reports that as a closed channel, not as a timeout: kaleido has still
    given its tab back, so the picture is a 504 and the same browser draws the next one."""
    import asyncio

    from choreographer.channels import ChannelClosedError

    from modalscope.app import render

    slow = render.Renderer(render_timeout=0.05, start_timeout=30)
    monkeypatch.setattr(render, "_renderer", slow)
    url = f"/render/trace.png?trace_id={big.ids[5]}&{big.window}"
    try:
        slow.warm()
        kept = slow.browser_pid()
        real = slow._kaleido.calc_fig

        async def cut_mid_write(*args, **kwargs):
            await asyncio.sleep(2 * slow.render_timeout)  # past kaleido's own limit
            try:
                raise asyncio.CancelledError
            except asyncio.CancelledError as exc:
                raise ChannelClosedError("Executor is closed.") from exc  # what choreographer raises

        monkeypatch.setattr(slow._kaleido, "calc_fig", cut_mid_write)
        resp = big.app.test_client().get(url)
        assert resp.status_code == 504 and "longer than 0.05 s" in resp.get_json()["error"]
        assert slow.browser_pid() == kept is not None
        monkeypatch.setattr(slow._kaleido, "calc_fig", real)
        slow.render_timeout = 60
        again = big.app.test_client().get(url + "&scale=1")
        assert again.status_code == 200 and again.mimetype == "image/png"
        assert slow.starts == 1 and slow.browser_pid() == kept
    finally:
        slow.close()


def test_a_renderer_busy_past_the_timeout_is_a_504(big, monkeypatch):
    from modalscope.app import render

    busy = render.Renderer(render_timeout=0.01, start_timeout=30)
    monkeypatch.setattr(render, "_renderer", busy)
    assert busy._lock.acquire()  # another picture holds the one browser
    try:
        resp = big.app.test_client().get(f"/render/trace.png?trace_id={big.ids[5]}&{big.window}")
    finally:
        busy._lock.release()
    assert resp.status_code == 504 and "busy" in resp.get_json()["error"]
    assert busy.starts == 0


# -- the page in a browser ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_site(big):
    from tests.app.browser import DemoStore, running_site

    with running_site(big.app, DemoStore(big.url, big.start, "", "")) as s:
        yield s


def test_a_2000_span_trace_page_draws_its_rows(big, big_site):
    from selenium.webdriver.common.by import By

    from modalscope.app.pages import trace as trace_page

    site = big_site
    site.driver.get_log("browser")
    site.open(f"/trace/{big.ids[2000]}?{big.window}")
    site.wait("#trace-span-table tbody tr", timeout=60)
    site.wait(f"#{ids.TR_WATERFALL} .barlayer path", timeout=60)
    drawn = site.driver.execute_script(f"""
        const gd = document.querySelector('#{ids.TR_WATERFALL} .js-plotly-plot');
        const rows = new Set();
        gd.data.forEach(d => {{ if (d.type === 'bar' && d.customdata) d.y.forEach(y => rows.add(y)); }});
        return [rows.size, gd.querySelectorAll('.annotation-text').length, gd._fullLayout.height];""")
    assert drawn[0] == figures.WATERFALL_ROWS - 1 and drawn[1] == figures.WATERFALL_ROWS
    assert "1,801 more spans in " in site.text(f"#{ids.TR_WATERFALL} .annotation-text")
    assert "The waterfall shows 199 of 2,000 spans" in site.text(f"#{ids.TR_HEADER}")
    table = site.driver.find_elements(By.CSS_SELECTOR, "#trace-span-table tbody tr")
    assert len(table) == trace_page.SPANS_PAGE
    assert f"spans 1–{trace_page.SPANS_PAGE} of 2,000" in site.text("#trace-span-pager")
    assert site.severe() == []
    # The rest is a page away, in the URL; a span picked there gets its row in the waterfall.
    site.driver.find_element(By.LINK_TEXT, "next ›").click()
    site.wait_url(lambda u: "page=2" in u)
    site.wait("#trace-span-pager")
    page = trace_page.SPANS_PAGE
    assert f"spans {page + 1}–{2 * page} of 2,000" in site.text("#trace-span-pager")
    k = page - 3  # a row near the end of page 2
    want = big.traces[2000]["spans"][page + k]
    link = site.driver.find_elements(By.CSS_SELECTOR, "#trace-span-table a.ms-span-link")[k]
    link.click()
    url = site.wait_url(lambda u: f"span={want['span_id']}" in u)
    assert "page=2" in url
    site.wait("#trace-span-table tr.ms-row-selected")
    site.wait(f"#{ids.TR_WATERFALL} .barlayer path", timeout=60)
    picked = site.driver.execute_script(f"""
        const gd = document.querySelector('#{ids.TR_WATERFALL} .js-plotly-plot');
        return gd.data.filter(d => d.name === 'selected').map(d => d.customdata[0][0]);""")
    assert picked == [want["span_id"]]
    assert site.severe() == []


# -- the benchmark (python -m tests.app.test_big_traces 500 1000 2000) ---------------------------
def _bench(sizes: list[int], wait_s: float = 180) -> None:
    import tempfile
    from pathlib import Path

    from selenium.webdriver.common.by import By
    from tests.app.browser import waiter

    from modalscope.app import create_app, render
    from modalscope.app.params import rfc3339
    from modalscope.settings import Settings
    from tests.app.browser import DemoStore, running_site

    render.renderer().warm()
    for n in sizes:
        with tempfile.TemporaryDirectory() as folder:
            url, (tid,), start = big_store(Path(folder), n)
            window = f"start={rfc3339(start - 30 * MIN)}&end={rfc3339(start + 30 * MIN)}"
            app = create_app(Settings(database_url=url))
            t = time.monotonic()
            resp = app.test_client().get(f"/render/trace.png?trace_id={tid}&{window}")
            print(f"{n:>5} spans: PNG {resp.status_code} {resp.mimetype} {len(resp.data) / 1024:.0f} KiB "
                  f"in {time.monotonic() - t:.2f} s", flush=True)
            with running_site(app, DemoStore(url, start, "", "")) as site:
                site.driver.set_page_load_timeout(wait_s)
                site.driver.set_script_timeout(wait_s)
                for cache in ("cold browser", "warm browser"):  # a fresh Chromium, then the same page again
                    if cache == "warm browser":
                        site.driver.get("about:blank")
                    t = time.monotonic()
                    try:
                        site.open(f"/trace/{tid}?{window}")
                        waiter(site.driver, wait_s).until(
                            lambda d: d.find_elements(By.CSS_SELECTOR, "#trace-waterfall .barlayer path")
                            and d.find_elements(By.CSS_SELECTOR, "#trace-span-table tbody tr"))
                        print(f"{n:>5} spans: page open, {cache} (waterfall and table drawn) in "
                              f"{time.monotonic() - t:.2f} s", flush=True)
                    except Exception as exc:  # noqa: BLE001 - a benchmark reports, never stops
                        print(f"{n:>5} spans: page not drawn after {time.monotonic() - t:.0f} s "
                              f"({type(exc).__name__})", flush=True)
                        break
            app.extensions["modalscope"]["engine"].dispose()
    render.renderer().close()


if __name__ == "__main__":
    import sys

    _bench([int(a) for a in sys.argv[1:]] or [500, 1000, 2000])
