"""Live traffic: "now" requests sent through a running pipeline while the demo runs.

The pipeline's decoder and writer are imported when live traffic is first sent.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from typing import Callable

from .draws import _daily_curve, _poisson
from .factory import _Factory
from .plan import DemoConfig
from .profiles import LIVE_RATE, NS
from .protobuf import _Request

# Logged under the package's name (``modalscope.ingest.demo``), as one generator.
log = logging.getLogger(__package__)


class LiveTraffic:
    """A thread sending "now" traffic through a pipeline's ``accept`` while the demo runs.

    Traces are generated as they start and handed over once they have ended (as an
    exporter would send them), at ``rate`` requests per second times the daily curve,
    without injected patterns. A full writer queue drops the request (counted in
    ``dropped``); a failed write is logged.
    """

    def __init__(self, pipeline, config: DemoConfig, rate: float = LIVE_RATE, tick: float = 1.0,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.pipeline = pipeline
        self.rate = rate
        self.tick = tick
        self.clock = clock
        live_config = DemoConfig(now_ns=config.now_ns, seed=config.seed, hours=config.hours, rate=config.rate,
                                 clean=True, mix=config.mix)
        self.factory = _Factory(live_config)
        self.rng = random.Random(f"modalscope-demo:{config.seed}:live")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modalscope-demo-live", daemon=True)
        self._pending: list[tuple[int, int, bytes, int]] = []  # (release at, seq, payload, traces)
        self._seq = 0
        self.sent_traces = 0
        self.sent_spans = 0
        self.dropped = 0

    def start(self) -> "LiveTraffic":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def step(self, since_ns: int, until_ns: int) -> None:
        """Generate the traces starting in [since, until) and send those that ended."""
        n = _poisson(self.rng, self.rate * (until_ns - since_ns) / NS * _daily_curve(until_ns))
        if n:
            req = _Request()
            for t_ns in sorted(since_ns + int(self.rng.random() * (until_ns - since_ns)) for _ in range(n)):
                self.factory.trace(self.rng, t_ns, self.factory.pick_type(self.rng), req, 1.0)
            self._seq += 1
            heapq.heappush(self._pending, (req.last_end_ns, self._seq, req.serialize(), req.n_traces))
        self._send_due(until_ns)

    def _send_due(self, now_ns: int) -> None:
        from ..otlp import decode_protobuf
        from ..writer import WriterClosed, WriterFull

        while self._pending and self._pending[0][0] <= now_ns:
            _, _, payload, n_traces = heapq.heappop(self._pending)
            decoded = decode_protobuf(payload, source="otlp")
            try:
                future = self.pipeline.accept(decoded.spans)
            except WriterFull:
                self.dropped += len(decoded.spans)
                continue
            except WriterClosed:
                return
            if future is not None:
                future.add_done_callback(_log_failure)
            self.sent_traces += n_traces
            self.sent_spans += len(decoded.spans)

    def _run(self) -> None:
        last = self.clock()
        while not self._stop.wait(self.tick):
            now = self.clock()
            try:
                self.step(last, now)
            except Exception:  # noqa: BLE001 - the demo goes on; the next tick tries again
                log.exception("live demo traffic failed")
            last = now


def _log_failure(future) -> None:
    exc = future.exception()
    if exc is not None:
        log.warning("live demo traffic: a write failed: %s", exc)
