"""A budget for the dashboard's first evaluations of absolute anomaly windows: each costs
seconds of detector time and a stored row, so a client choosing a new ``start``/``end`` on
every request is refused (429 with ``Retry-After``) once its tokens are spent."""

from __future__ import annotations

import logging
import math
import threading
import time

import orjson
from flask import current_app, g, has_request_context, request, session
from werkzeug.exceptions import TooManyRequests
from werkzeug.wrappers import Response

log = logging.getLogger(__name__)


class WindowBudget:
    """Token buckets, one per client, for first evaluations of absolute windows: each costs
    seconds of detector time and a stored row, and a client choosing a new ``start``/``end``
    on every request must not be able to buy them without bound. ``per_hour`` tokens an hour,
    at most ``burst`` saved; per process (each gunicorn worker keeps its own), at most
    ``max_clients`` buckets (the fullest are forgotten first: a full bucket is a fresh one)."""

    def __init__(self, per_hour: float, burst: int = 10, max_clients: int = 10_000) -> None:
        self.rate = per_hour / 3600.0
        self.burst = float(burst)
        self.max_clients = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at monotonic s)
        self._lock = threading.Lock()

    def take(self, client: str, now: float | None = None) -> float:
        """0 when ``client`` may start one more evaluation now (a token is spent), else the
        seconds until it may."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, at = self._buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1:
                self._buckets[client] = (tokens - 1, now)
                self._forget(now)
                return 0.0
            self._buckets[client] = (tokens, now)
            return (1 - tokens) / self.rate if self.rate > 0 else 3600.0

    def _forget(self, now: float) -> None:
        if len(self._buckets) <= self.max_clients:
            return
        full = sorted(self._buckets, key=lambda c: -(self._buckets[c][0] + (now - self._buckets[c][1]) * self.rate))
        for c in full[: len(self._buckets) - self.max_clients]:
            del self._buckets[c]


def admit() -> None:
    """In a web request, spend one of the client's tokens (``WindowBudget``) before the
    detectors run for a new absolute window; once per request (an incident list's own windows
    come from the data, not the caller). None left: a 429 with ``Retry-After``. Outside a
    request (the worker's settler, the CLI) nothing is limited."""
    if not has_request_context():
        return
    budget = current_app.extensions.get("modalscope", {}).get("window_budget")
    if budget is None or g.get("modalscope_window_admitted"):
        return
    client = _client_key()
    wait = budget.take(client)
    if wait > 0:
        log.info("refused a new absolute anomaly window for %s: retry in %d s", client, math.ceil(wait))
        raise TooManyWindows(math.ceil(wait))
    g.modalscope_window_admitted = True


def _client_key() -> str:
    """Who pays: the signed-in session (its id), else the client's address."""
    data = session.get("ms_auth") if session else None
    if isinstance(data, dict) and isinstance(data.get("sid"), str):
        return f"session:{data['sid']}"
    return f"addr:{request.remote_addr}"


class TooManyWindows(TooManyRequests):
    """A 429 ``{"error"}`` with ``Retry-After``: this client started too many new absolute
    anomaly windows lately."""

    def __init__(self, retry_after: int) -> None:
        seconds = max(1, int(retry_after))
        super().__init__(description=(
            "too many new anomaly windows from this client: each fixed start/end is evaluated once "
            f"and stored; try again in {seconds} s, or use a relative range (range=24h)"))
        self.retry_after = seconds

    def get_response(self, environ=None, scope=None) -> Response:  # noqa: ARG002 - werkzeug's signature
        return Response(orjson.dumps({"error": self.description}), 429, mimetype="application/json",
                        headers={"Retry-After": str(self.retry_after), "Cache-Control": "no-store"})
