"""The history window: requests per minute, the OTLP requests built in blocks of whole
minutes, and filling a store with them (optionally generated in a child process).

The pipeline's decoder and writer are imported by ``fill``: the generator's child process
builds requests without them.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue as queues
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .draws import _daily_curve, _minute_rng, _poisson
from .factory import _Factory
from .plan import DemoConfig, _Plan
from .profiles import LB_GIANT_PER_MINUTE, MIN_NS, NS
from .protobuf import _Request


class _Schedule:
    """Requests per minute of the history window: the daily curve, normalised so the
    window averages ``rate``, with the batching-failure surge when injected."""

    def __init__(self, config: DemoConfig, plan: _Plan) -> None:
        self.config = config
        self.plan = plan
        t0, t1 = plan.t0, config.end_ns
        mids = []
        for m in range(plan.total_min):
            a = t0 + m * MIN_NS
            b = min(a + MIN_NS, t1)
            mids.append((a, b, _daily_curve((a + b) // 2)))
        weight = sum((b - a) * c for a, b, c in mids)
        norm = (t1 - t0) / weight if weight > 0 else 1.0
        self.minutes = []  # (start_ns, end_ns, expected count, load)
        surge = plan.windows.get("batching_failure")
        for a, b, c in mids:
            load = c * norm
            if surge is not None and surge[0] <= a < surge[1]:
                load *= 1.5
            self.minutes.append((a, b, config.rate * (b - a) / NS * load, load))

    def counts(self) -> list[tuple[int, int]]:
        """Per minute: (requests, giant requests of the LB-truncation pattern)."""
        giants = [0] * len(self.minutes)
        if "lb_timeout_truncation" in self.plan.windows:
            # A fixed number over the window (at least 3, to make a pile), in random minutes.
            first, last = self.plan.window_min["lb_timeout_truncation"]
            last = min(last, len(self.minutes))
            if last > first:
                rng = _minute_rng(self.config.seed, "giants", first)
                for _ in range(max(3, round(LB_GIANT_PER_MINUTE * (last - first)))):
                    giants[rng.randrange(first, last)] += 1
        return [(_poisson(_minute_rng(self.config.seed, "count", m), lam), giants[m])
                for m, (_, _, lam, _) in enumerate(self.minutes)]


@dataclass
class FillResult:
    traces: int = 0  # every trace, the usage event consumers' included
    spans: int = 0
    requests: int = 0  # OTLP export requests
    inserted: int = 0
    seconds: float = 0.0
    user_requests: int = 0  # the users' requests (what expected_traces counts)


#: Requests never span a block of this many minutes: a block can be generated on its own
#: (and the requests' bytes do not depend on how a run is cut up).
BLOCK_MINUTES = 10


def _block_requests(config: DemoConfig, factory: _Factory, schedule: _Schedule, counts: list[tuple[int, int]],
                    first: int, last: int) -> list[tuple[bytes, int, int, int]]:
    """The OTLP requests of minutes [first, last) of the history window: (payload, traces,
    spans, user requests)."""
    out = []
    req = _Request()
    for m in range(first, min(last, len(counts))):
        a, b, _lam, load = schedule.minutes[m]
        n, n_giants = counts[m]
        if not n and not n_giants:
            continue
        rng = _minute_rng(config.seed, "traffic", m)
        # (start, giant?): the giants of the LB-truncation pattern come on top of the traffic.
        starts = sorted([(a + int(rng.random() * (b - a)), False) for _ in range(n)]
                        + [(a + int(rng.random() * (b - a)), True) for _ in range(n_giants)])
        for t_ns, giant in starts:
            if giant:
                factory.trace(rng, t_ns, "multi_image", req, load, giant=True)
            else:
                factory.trace(rng, t_ns, factory.pick_type(rng), req, load)
            if req.n_spans >= config.spans_per_request:
                out.append((req.serialize(), req.n_traces, req.n_spans, req.n_requests))
                req = _Request()
    if req.n_spans:
        out.append((req.serialize(), req.n_traces, req.n_spans, req.n_requests))
    return out


def _iter_blocks(config: DemoConfig) -> Iterator[tuple[bytes, int, int, int]]:
    plan = _Plan(config)
    factory = _Factory(config, plan)
    schedule = _Schedule(config, plan)
    counts = schedule.counts()
    for first in range(0, plan.total_min, BLOCK_MINUTES):
        yield from _block_requests(config, factory, schedule, counts, first, first + BLOCK_MINUTES)


def iter_requests(config: DemoConfig) -> Iterator[tuple[bytes, int, int]]:
    """``(serialized ExportTraceServiceRequest, traces, spans)`` for the history window,
    in time order, each of about ``config.spans_per_request`` spans (whole traces: a user
    request's and its usage event consumer's travel together)."""
    for payload, n_traces, n_spans, _ in _iter_blocks(config):
        yield payload, n_traces, n_spans


def export_requests(config: DemoConfig) -> Iterator[bytes]:
    """The history window as serialized ``ExportTraceServiceRequest`` messages."""
    for payload, _, _ in iter_requests(config):
        yield payload


def expected_traces(config: DemoConfig) -> int:
    """How many user requests (one trace each) the history window holds, the usage event
    consumers' traces not counted (cheap: no trace is built)."""
    plan = _Plan(config)
    return sum(n + g for n, g in _Schedule(config, plan).counts())


_DONE = b""


def _generate_to(queue, config: DemoConfig) -> None:
    """A child process's work: the history window's requests onto ``queue``, then _DONE (or
    the error's text, as a str)."""
    try:
        for item in _iter_blocks(config):
            queue.put(item)
        queue.put(_DONE)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        queue.put(f"{type(exc).__name__}: {exc}")


def _generated(config: DemoConfig, background: bool) -> Iterator[tuple[bytes, int, int, int]]:
    """``_iter_blocks(config)``, from a child process when ``background`` (generating is a
    tenth of a fill's time, and the writer leaves a second core idle): the same items in the
    same order. Where no child starts, or it dies, this process generates the rest."""
    if not background:
        yield from _iter_blocks(config)
        return
    ctx = multiprocessing.get_context("spawn")  # no fork: the caller may hold threads and connections
    q = ctx.Queue(maxsize=8)
    child = ctx.Process(target=_generate_to, args=(q, config), name="modalscope-demo-generate", daemon=True)
    received = 0
    try:
        try:
            child.start()
        except (OSError, RuntimeError):  # RuntimeError: a __main__ that spawn cannot re-import
            yield from _iter_blocks(config)
            return
        while True:
            try:
                item = q.get(timeout=1.0)
            except queues.Empty:
                if child.is_alive():
                    continue
                # Died without a word (killed, or its start failed): deterministic, so
                # generate what it did not send.
                yield from itertools.islice(_iter_blocks(config), received, None)
                return
            if item == _DONE:
                break
            if isinstance(item, str):
                raise RuntimeError(f"demo traffic generation failed: {item}")
            received += 1
            yield item
        child.join()
    finally:
        if child.is_alive():
            child.terminate()
            child.join()


def fill(engine, config: DemoConfig, rules=None, progress: Callable[[int], Any] | None = None,
         background: bool = False) -> FillResult:
    """Generate the history window into ``engine``: decode -> tag -> write, request by
    request (as a receiver would). Settle afterwards (``settle(engine, force=True)``).
    ``progress`` is called with the user requests each OTLP request held; ``background``
    generates in a child process (spawned: call it from a guarded ``__main__``)."""
    from ..otlp import decode_protobuf
    from ..rules_file import default_rules
    from ..writer import write_spans

    rules = rules or default_rules()
    result = FillResult()
    t0 = time.perf_counter()
    for payload, n_traces, n_spans, n_requests in _generated(config, background):
        decoded = decode_protobuf(payload, source="otlp")
        rules.tag(decoded.spans)
        written = write_spans(engine, decoded.spans, now_ns=config.now_ns)
        result.requests += 1
        result.traces += n_traces
        result.spans += len(decoded.spans)
        result.inserted += written.inserted
        result.user_requests += n_requests
        if progress is not None:
            progress(n_requests)
    result.seconds = time.perf_counter() - t0
    return result
