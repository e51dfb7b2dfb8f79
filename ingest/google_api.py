"""What the Cloud Trace poller and the Cloud Monitoring exporter share about calling Google
APIs: the client (credentials or a plaintext stand-in), which errors are worth retrying, a
one-line error text, and one retry loop with capped exponential backoff.

The clients' own retry is always off (it would retry for up to 45 s on its own schedule):
our loop paces calls, renews the worker's lease between attempts and stops when asked.

grpc and the Google libraries are imported by the functions that use them (see
``cloud_trace.py``).
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger(__name__)


def google_client(client_cls, transport_cls, endpoint: str, error_cls):
    """A Google API client: Application Default Credentials, or, with ``endpoint``
    (``host:port``), a plaintext channel and no credentials (emulators, tests).

    ``client_options`` with ``api_endpoint`` alone would insist on TLS, hence the injected
    transport. Missing credentials raise ``error_cls`` with one line saying what to do.
    """
    if endpoint:
        import grpc

        return client_cls(transport=transport_cls(channel=grpc.insecure_channel(endpoint)))
    import google.auth.exceptions

    try:
        return client_cls()
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise error_cls("no Google Cloud credentials: run `gcloud auth application-default login` or set "
                        f"GOOGLE_APPLICATION_CREDENTIALS ({str(exc).splitlines()[0] if str(exc) else exc})") from None


def api_errors() -> tuple[tuple[type[BaseException], ...], type[BaseException]]:
    """(errors a later attempt may cure, every API error)."""
    from google.api_core import exceptions as e

    transient = (e.ResourceExhausted, e.ServiceUnavailable, e.DeadlineExceeded, e.InternalServerError,
                 e.Aborted, e.GatewayTimeout, e.TooManyRequests)
    return transient, e.GoogleAPICallError


def error_line(exc) -> str:
    """``CODE: first line of the message``."""
    code = getattr(exc, "grpc_status_code", None) or getattr(exc, "code", None)
    code_name = getattr(code, "name", None) or exc.__class__.__name__
    msg = getattr(exc, "message", None) or str(exc)
    msg = msg.strip().splitlines()[0] if msg and msg.strip() else ""
    return f"{code_name}: {msg}" if msg else code_name


@dataclass
class Backoff:
    """Capped exponential backoff with 'equal jitter' (half fixed, half random), so workers
    that failed together do not retry together."""

    initial_s: float
    max_s: float
    rng: random.Random

    def delay(self, attempt: int) -> float:
        d = min(self.max_s, self.initial_s * (2 ** attempt))
        return d / 2 + self.rng.uniform(0, d / 2)


def call_with_retries(call: Callable[[], Any], *, api: str, backoff: Backoff, stop: threading.Event,
                      give_up_after: int | None, stopped: Callable[[], Exception],
                      on_error: Callable[[str], None], before_attempt: Callable[[], None] = lambda: None,
                      after_backoff: Callable[[], None] = lambda: None,
                      failed: Callable[[str, int], Exception]) -> Any:
    """``call()`` until it succeeds, backing off on transient errors.

    ``before_attempt`` runs before each attempt (pacing, lease renewal), ``after_backoff``
    after each wait; ``on_error`` gets each transient error's line. With ``give_up_after``
    the loop raises ``failed(line, attempts)`` after that many attempts; a set ``stop``
    raises ``stopped()``. Non-transient API errors propagate to the caller.
    """
    transient, _ = api_errors()
    attempt = 0
    while True:
        before_attempt()
        try:
            return call()
        except transient as exc:
            line = error_line(exc)
            on_error(line)
            if give_up_after is not None and attempt + 1 >= give_up_after:
                raise failed(line, attempt + 1) from None
            delay = backoff.delay(attempt)
            log.warning("%s %s (attempt %d); backing off %.1fs", api, line, attempt + 1, delay)
            attempt += 1
            if stop.wait(delay):
                raise stopped()
            after_backoff()
