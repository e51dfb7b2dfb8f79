"""Static images of panels (PNG, SVG) through kaleido, with one Chromium kept warm per process.

kaleido >= 1.0 draws a Plotly figure in a headless Chrome/Chromium that it drives through
``choreographer``; it finds the browser by ``BROWSER_PATH``, then ``chromium``/``chrome`` on the
``PATH`` and the usual install paths (Debian's ``/usr/bin/chromium``). A cold start costs
seconds, a warm render a fraction of one, so :class:`Renderer` opens one browser lazily, on
the first image a process serves, and keeps it.

Why not ``kaleido.start_sync_server()``: when the browser cannot start (no Chromium, a crash
at start-up) its server thread dies and every later ``calc_fig_sync`` waits forever on its
queue, and concurrent callers can receive each other's results. Here one thread runs an
asyncio loop holding a ``kaleido.Kaleido``; callers hand it coroutines
(``run_coroutine_threadsafe``) one at a time under a lock and wait with a timeout; a browser
found dead before a picture is started afresh, one that dies during a picture is replaced
and the picture tried once more. A browser that cannot start or a second crash is a
:class:`RenderError`: the route answers 503 with one line. A picture not drawn within
``render_timeout`` (or a caller that waited that long for the one browser) is a
:class:`RenderTimeout`, an HTTP 504 "render timed out" of its own. kaleido abandons the
picture and reloads its tab, so the browser stays for the next picture; only a browser that
does not give its tab back within a grace period is killed (the next picture starts a new one).

:class:`RenderGate` bounds the pictures a process draws or holds waiting at once
(``MODALSCOPE_RENDER_QUEUE``): past it a request is a :class:`RenderBusy`, a 503 with
``Retry-After``, answered at once instead of holding a web thread in the queue.

Kaleido's default page fetches MathJax from a CDN; ``mathjax=False`` keeps the renderer
off the network (our figures have no LaTeX). plotly.js comes from the installed ``plotly``.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import signal
import threading
import time
from typing import Any

from werkzeug.exceptions import GatewayTimeout, ServiceUnavailable
from werkzeug.wrappers import Response

log = logging.getLogger(__name__)

RENDER_TIMEOUT_S = 20.0  # a wedged browser answers well within gunicorn's 60 s
START_TIMEOUT_S = 30.0
# How long past its own timeout kaleido may take to reload its tab before the browser counts
# as wedged and is killed.
GIVE_BACK_S = 5.0


class RenderError(RuntimeError):
    """An image could not be drawn (no browser, a crash); the message is one line."""


class RenderTimeout(GatewayTimeout):
    """A picture not drawn in time: a 504 with ``{"error": <one line>}``. A werkzeug
    ``HTTPException`` (Flask answers it as is) rather than a :class:`RenderError`, which the
    image route answers as 503 "no browser": a slow picture is not a missing Chromium."""

    def __init__(self, message: str) -> None:
        super().__init__(description=message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def get_response(self, environ=None, scope=None) -> Response:  # noqa: ARG002 - werkzeug's signature
        return Response(json.dumps({"error": self.message}), 504, mimetype="application/json",
                        headers={"Cache-Control": "no-store"})


class RenderBusy(ServiceUnavailable):
    """Too many pictures in this process already: a 503 with ``Retry-After`` and one line."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(description=message)
        self.message = message
        self.retry_after = retry_after

    def get_response(self, environ=None, scope=None) -> Response:  # noqa: ARG002 - werkzeug's signature
        return Response(json.dumps({"error": self.message}), 503, mimetype="application/json",
                        headers={"Cache-Control": "no-store", "Retry-After": str(self.retry_after)})


class RenderGate:
    """At most ``limit`` pictures drawing or waiting at once; the next caller is refused at
    once (:class:`RenderBusy`) rather than queued behind them."""

    def __init__(self, limit: int, retry_after: int = 5) -> None:
        self.limit = max(1, int(limit))
        self.retry_after = retry_after
        self._slots = threading.BoundedSemaphore(self.limit)
        self.refused = 0

    def __enter__(self) -> "RenderGate":
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            raise RenderBusy(f"the image renderer is busy ({self.limit} images drawing or waiting); "
                             f"try again in {self.retry_after} s", self.retry_after)
        return self

    def __exit__(self, *exc) -> None:
        self._slots.release()


class Renderer:
    """One warm kaleido browser for this process; :meth:`render` is thread-safe."""

    def __init__(self, render_timeout: float = RENDER_TIMEOUT_S, start_timeout: float = START_TIMEOUT_S) -> None:
        self.render_timeout = render_timeout
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._kaleido: Any = None
        self.starts = 0  # browsers started by this renderer (a test sees a restart)

    # -- public --------------------------------------------------------------------------
    def render(self, figure: Any, fmt: str, width: int, height: int, scale: float = 1.0) -> bytes:
        """The figure as ``png`` or ``svg`` bytes, ``width`` x ``height`` CSS pixels (a PNG
        has ``scale`` device pixels per CSS pixel)."""
        opts = {"format": fmt, "width": int(width), "height": int(height), "scale": scale}
        # One picture at a time; a caller waits for the one ahead of it at most a render's time.
        if not self._lock.acquire(timeout=self.render_timeout + 5):
            raise RenderTimeout(f"the image renderer stayed busy for {self.render_timeout + 5:g} s with other "
                                "pictures; try again shortly")
        try:
            return self._render(figure, opts)
        finally:
            self._lock.release()

    def _render(self, figure: Any, opts: dict) -> bytes:
        for attempt in (1, 2):
            try:
                self._ensure_started()
            except Exception as exc:  # noqa: BLE001 - no browser, or it died at start-up
                self._stop()
                raise RenderError(f"the image renderer could not start a browser: {type(exc).__name__}: "
                                  f"{_one_line(exc)}") from None
            self._kaleido._timeout = self.render_timeout  # noqa: SLF001 - kaleido's own per-picture limit
            started = time.monotonic()
            future = asyncio.run_coroutine_threadsafe(self._kaleido.calc_fig(figure, opts=opts), self._loop)
            try:
                out = future.result(timeout=self.render_timeout + GIVE_BACK_S)
            except Exception as exc:  # noqa: BLE001 - reported as RenderError below
                crashed = not self._alive()
                timed_out = isinstance(exc, TimeoutError) or time.monotonic() - started >= self.render_timeout
                # kaleido gave up on its own and gave its tab back: the browser is fine. (When its
                # timeout cancels a message in flight, that surfaces as the channel's error instead.)
                given_back = future.done() and not crashed and timed_out
                log.warning("render failed (%s: %s; browser %s)", type(exc).__name__, _one_line(exc),
                            "gone" if crashed else "kept" if given_back else "wedged, restarting it")
                if not given_back:
                    future.cancel()
                    self._stop()  # dead or wedged: the next picture gets a fresh browser
                if crashed and attempt == 1 and not timed_out:
                    continue  # the browser died under this picture (a crash, an OOM kill): once more
                if timed_out:
                    raise RenderTimeout(f"render timed out: the image took longer than {self.render_timeout:g} s "
                                        "to draw and was abandoned; a smaller width or height, or a shorter "
                                        "window, draws faster") from None
                raise RenderError(f"the image could not be drawn: {type(exc).__name__}: {_one_line(exc)}") from None
            return out.encode("utf-8") if isinstance(out, str) else out
        raise AssertionError("unreachable")

    def warm(self) -> None:
        """Start the browser now (``modalscope serve`` may call it at start-up)."""
        with self._lock:
            self._ensure_started()

    def browser_pid(self) -> int | None:
        """Process id of the running browser (started by this renderer), or None."""
        proc = getattr(self._kaleido, "subprocess", None)
        return proc.pid if proc is not None and proc.poll() is None else None

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -- inside --------------------------------------------------------------------------
    def _alive(self) -> bool:
        proc = getattr(self._kaleido, "subprocess", None)
        return (self._kaleido is not None and self._thread is not None and self._thread.is_alive()
                and proc is not None and proc.poll() is None)

    def _ensure_started(self) -> None:
        if self._alive():
            return
        self._stop()
        import kaleido  # imported here: the app starts without touching a browser

        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="modalscope-renderer", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

        async def open_browser():
            k = kaleido.Kaleido(n=1, timeout=self.render_timeout, mathjax=False)
            await k.open()
            return k

        future = asyncio.run_coroutine_threadsafe(open_browser(), loop)
        try:
            self._kaleido = future.result(timeout=self.start_timeout)
        except BaseException:
            future.cancel()
            raise
        self.starts += 1
        log.info("image renderer started (browser pid %s)", self.browser_pid())

    def _stop(self) -> None:
        """Close the browser and the loop, whatever state they are in."""
        k, loop, thread = self._kaleido, self._loop, self._thread
        self._kaleido = self._loop = self._thread = None
        proc = getattr(k, "subprocess", None)
        if k is not None and loop is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(k.close(), loop).result(timeout=10)
            except Exception as exc:  # noqa: BLE001 - closing a broken browser may fail; it is killed below
                log.debug("renderer close: %s", _one_line(exc))
        if proc is not None and proc.poll() is None:
            try:  # the browser runs in its own session (choreographer starts it so): end the group
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                pass
        if loop is not None and loop.is_running():
            try:  # the browser's own tasks (its watchdog): cancelled, not left pending
                asyncio.run_coroutine_threadsafe(_cancel_tasks(), loop).result(timeout=5)
            except Exception as exc:  # noqa: BLE001
                log.debug("renderer tasks: %s", _one_line(exc))
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=5)
            if not loop.is_running():
                loop.close()


async def _cancel_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _one_line(exc: BaseException | None) -> str:
    text = " ".join(str(exc or "").split())
    return text[:300] or "no detail"


_renderer: Renderer | None = None
_renderer_lock = threading.Lock()


_render_timeout = RENDER_TIMEOUT_S


def configure(render_timeout: float) -> None:
    """The time limit of this process's renderer (``MODALSCOPE_RENDER_TIMEOUT_S``), before
    its first picture; the app factory calls it."""
    global _render_timeout
    with _renderer_lock:
        _render_timeout = float(render_timeout)
        if _renderer is not None and _renderer.starts == 0:
            _renderer.render_timeout = _render_timeout


def renderer() -> Renderer:
    """This process's renderer (created on first use; each gunicorn worker has its own)."""
    global _renderer
    with _renderer_lock:
        if _renderer is None:
            _renderer = Renderer(render_timeout=_render_timeout)
            atexit.register(_renderer.close)
        return _renderer


__all__ = ["RenderBusy", "RenderError", "RenderGate", "RenderTimeout", "Renderer", "configure", "renderer"]
