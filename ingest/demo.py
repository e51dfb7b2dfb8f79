"""The demo traffic generator: a multimodal inference service, as real OTLP requests.

``modalscope demo`` fills a store with the last few hours of traffic of an imaginary
multimodal service (the source document's): a ``gateway`` that authenticates the caller
(``auth``), reads its session and quota from ``userdb`` and its profile through
``profile-cache`` (falling back to ``userdb`` on a miss), has the request preprocessed
(``preprocessor``: tokenizing, audio decoding, fetching the uploaded images from an object
store), encodes the images, audio and text (``vision-encoder`` with its own CPU-side image
decode/resize/normalize and ViT layers, ``audio-encoder``, ``text-encoder``, in parallel),
fuses them (``fusion``), generates the answer (the self-hosted ``llm``; a share of the
text-only requests goes to a hosted Gemini model instead), records usage (``billing``,
concurrently with the model call) and publishes a usage event that ``metering`` consumes
from a queue, in a trace of its own linked to the request's.

The spans look like what off-the-shelf instrumentation emits, not a modalscope dialect:

* model calls are OTel GenAI CLIENT spans (``chat mm-llm-7b``, ``generate_content
  gemini-2.0-flash``) with ``gen_ai.operation.name``, ``gen_ai.provider.name`` (and the
  older ``gen_ai.system``), request/response model, token usage in total and per modality
  (``gen_ai.usage.{text,image,audio}.input_tokens``, the names opentelemetry-util-genai
  sets for opentelemetry-instrumentation-google-genai) and the captured input messages
  (``gen_ai.input.messages``, media as ``uri`` parts with a ``modality``). The self-hosted
  LLM is instrumented too (its SERVER span sits under the client span); the Gemini call
  has only the SDK's HTTP request under it, so its callee is the provider;
* gRPC services carry ``rpc.system``/``rpc.service``/``rpc.method``; the gateway and the
  Gemini transport use the stable HTTP conventions (``http.request.method``, ``url.full``,
  ``server.address``/``server.port``, ``http.response.status_code``), the llm server and
  the preprocessor's object-store client the older ones (``http.method``, ``http.url``,
  ``net.peer.name``/``net.peer.port``, ``http.status_code``);
* uninstrumented dependencies appear only as client spans: ``userdb`` (``peer.service``),
  the object store (by URL) and metering's usage database (``server.address:server.port``);
* the usage event is a PRODUCER span in the gateway and a CONSUMER span in ``metering``,
  a queue delay later, in its own trace with a span link to the producer;
* the input type comes from the model calls' usage per modality and message parts;
  ``mm.image_count`` / ``mm.audio_count`` / ``mm.prompt_chars`` stay as optional extras on
  the preprocessor's spans (they say the same), and no span sets ``mm.input_type``.

Everything is emitted as serialized OTLP ``ExportTraceServiceRequest`` messages and goes
through :func:`~modalscope.ingest.otlp.decode_protobuf`, the stage rules and the writer:
the path the receivers use, with no side door into the tables.

How the numbers are made
------------------------
Per input type, a trace's end-to-end latency (its root span's duration) is drawn from a
lognormal fitted to the source document's P50 and P95 (``sigma = ln(P95/P50) / 1.645``;
see :data:`PROFILES`); the request's side calls (auth, userdb, cache) get their own
latency distributions, and what remains is split into the pipeline's stages by the
type's shares (:data:`CORE_SHARES`, with per-trace jitter), so the percentiles of the
whole stay those of the table. Stage time is self time, so the spans are laid out
sequentially inside the root (only the encoders run in parallel, and billing runs beside
the model call); :data:`STAGE_SHARES` is the share of self time per stage this produces.
The usage event's consumer traces are not requests: they have no input type (``unknown``)
and are not counted by :func:`expected_traces`.

Traffic follows a daily curve (peak 15:00 UTC), errors are ~1% of traces, and instances
(``service.instance.id`` = ``pod-N``) churn: rolling restarts and one scale-up.

Injected patterns
-----------------
Unless ``clean``, every kind of DESIGN.md's anomaly catalog is injected at a known time
and subject; :func:`injected_patterns` returns the plan as data. The windows are laid out
for the default 3 hours (a clean 30-minute baseline before the P99 band break; patterns
with one cause share a window: the cache penetration feeds the userdb hot spot, the
CPU-bound image decode makes the multi-image regression) and scaled to other lengths, to
whole minutes. Patterns that cost user-visible latency also lift the end-to-end
percentiles of their window (the hot spot those of every input type, the LB truncation
the multi-image P99): detectors may rightly report that too.

Determinism: everything is drawn from generators seeded with ``config.seed`` (one per
minute of traffic), never the global ``random`` or the wall clock; ``config.now_ns`` is
the only anchor in time. Same config, byte-identical requests.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from .records import KIND_CLIENT, KIND_CONSUMER, KIND_INTERNAL, KIND_PRODUCER, KIND_SERVER, STATUS_ERROR

log = logging.getLogger(__name__)

__all__ = [
    "BOTTLENECK_STAGE",
    "BOTTLENECK_STAGES",
    "CORE_SHARES",
    "DEFAULT_HOURS",
    "DEFAULT_RATE",
    "DEFAULT_SEED",
    "DemoConfig",
    "FillResult",
    "GEMINI_SHARE",
    "InjectedPattern",
    "LIVE_RATE",
    "LiveTraffic",
    "PATTERN_KINDS",
    "PROFILES",
    "SERVICES",
    "STAGE_SHARES",
    "expected_traces",
    "export_requests",
    "fill",
    "injected_patterns",
    "iter_requests",
]

NS = 1_000_000_000
MIN_NS = 60 * NS
HOUR_NS = 3600 * NS

DEFAULT_SEED = 42
DEFAULT_HOURS = 3.0
#: Requests per second, averaged over the generated window. Sized so the default run
#: (3 hours) fills a SQLite store in well under a minute on two cores.
DEFAULT_RATE = 2.0
#: Requests per second the live thread sends while the demo runs.
LIVE_RATE = 2.0
#: Spans per generated request (whole traces; a request ends after the trace crossing it).
SPANS_PER_REQUEST = 4000

LB_TIMEOUT_S = 30.0  # the load balancer's default timeout (the seed: 30 s / 60 s)
LB_GIANT_PER_MINUTE = 0.4  # 6-8 image requests a minute in the truncation window (at any rate)
HOT_SPOT_QUERY_S = 1.5  # median of the slow, uncached profile query in the hot-spot window
SCOPE_NAME = "modalscope.demo"
NAMESPACE = "mm-inference"

#: Instrumented services (their spans carry ``service.name``).
SERVICES = (
    "gateway", "auth", "billing", "preprocessor", "vision-encoder", "text-encoder",
    "audio-encoder", "fusion", "llm", "metering",
)
# Instrumented services and their initial instance counts. The other callees are not
# instrumented: userdb and profile-cache (named by peer.service), the object store (by
# URL), metering's usage database (server.address:server.port) and Gemini (a provider).
POOLS = (
    ("gateway", 3), ("vision-encoder", 4), ("auth", 2), ("billing", 2), ("preprocessor", 3),
    ("text-encoder", 2), ("audio-encoder", 2), ("fusion", 2), ("llm", 3), ("metering", 2),
)


# --------------------------------------------------------------------------------------
# The source document's numbers
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputProfile:
    """End-to-end latency of one input type: the seed's P50 and P95, in seconds."""

    input_type: str
    p50_s: float
    p95_s: float
    traffic_share: float

    @property
    def sigma(self) -> float:
        return math.log(self.p95_s / self.p50_s) / 1.6448536269514722

    @property
    def mu(self) -> float:
        return math.log(self.p50_s)


#: The seed's table (text, one image, two images) plus audio, which the seed does not
#: measure: ~10 s of speech and a short prompt, plausibly ~0.95 s / 1.6 s.
PROFILES: dict[str, InputProfile] = {
    "text": InputProfile("text", 0.320, 0.410, 0.45),
    "image": InputProfile("image", 1.3, 2.1, 0.30),
    "multi_image": InputProfile("multi_image", 3.7, 6.4, 0.12),
    "audio": InputProfile("audio", 0.95, 1.6, 0.13),
}

#: The stage the seed's "main bottleneck" column points at, per input type (the stage
#: with the most self time): text encoding + LLM inference -> inference; image decode +
#: vision encoding -> preprocessing; cross-modal attention scheduling + memory copies
#: -> fusion. Audio (not in the seed): the audio encoder.
BOTTLENECK_STAGE = {"text": "inference", "image": "preprocessing", "multi_image": "fusion",
                    "audio": "encoder"}
#: The stages the seed's bottleneck column names, together the bulk of the self time.
BOTTLENECK_STAGES = {"text": ("encoder", "inference"), "image": ("preprocessing", "encoder"),
                     "multi_image": ("fusion",), "audio": ("encoder",)}

#: How the pipeline's part of a request (end-to-end minus the side calls) splits, per input
#: type: fractions of that time, per segment. ``pre`` is the preprocessor call, ``decode``
#: / ``resize`` / ``normalize`` the vision encoder's CPU-side image work, ``vit`` its ViT,
#: ``tenc`` / ``aenc`` the text / audio encoder call, ``fusion`` the fusion work after the
#: last encoder returned, ``llm`` the LLM call. ``tenc_par`` is the text encoder running in
#: parallel with the vision / audio encoder (extra self time, off the critical path).
CORE_SHARES: dict[str, dict[str, float]] = {
    "text": {"pre": 0.05, "tenc": 0.30, "llm": 0.65},
    "image": {"pre": 0.03, "decode": 0.22, "resize": 0.07, "normalize": 0.06, "vit": 0.30,
              "fusion": 0.08, "llm": 0.24, "tenc_par": 0.03},
    "multi_image": {"pre": 0.02, "decode": 0.12, "resize": 0.045, "normalize": 0.035, "vit": 0.18,
                    "fusion": 0.40, "llm": 0.20, "tenc_par": 0.02},
    "audio": {"pre": 0.20, "aenc": 0.38, "fusion": 0.12, "llm": 0.30, "tenc_par": 0.03},
}

#: Share of self time per stage and input type that the generator produces in a clean run
#: (what ``/api/v1/stages`` reports as ``share``); the tests hold the stored data to it.
STAGE_SHARES: dict[str, dict[str, float]] = {
    "text": {"preprocessing": 0.04, "encoder": 0.19, "fusion": 0.0, "inference": 0.56,
             "network": 0.11, "other": 0.10},
    "image": {"preprocessing": 0.34, "encoder": 0.30, "fusion": 0.08, "inference": 0.22,
              "network": 0.03, "other": 0.03},
    "multi_image": {"preprocessing": 0.21, "encoder": 0.20, "fusion": 0.39, "inference": 0.19,
                    "network": 0.01, "other": 0.01},
    "audio": {"preprocessing": 0.19, "encoder": 0.37, "fusion": 0.12, "inference": 0.25,
              "network": 0.03, "other": 0.04},
}

# ViT layer profile (the seed's TensorRT-LLM table): patch embedding 3.1%, attention
# 18.2%, MLP 35.5%; the rest (norms, residuals) is the forward span's own time.
VIT_LAYERS = (("patch_embed", 0.031), ("attention", 0.182), ("mlp", 0.355))
# Encoder finishing spread before fusion (the seed: ~12 ms for 2 modalities, ~29 for 3).
SYNC_SPREAD_S = {2: 0.0124, 3: 0.0289}
# Baseline rates.
BASELINE_FALLBACK_RATE = 0.002  # gpu.cuda_graph=fallback on a GPU span, clean traffic
CACHE_HIT = {"gold": 0.88, "silver": 0.86, "bronze": 0.85}
TIER_MIX = (("gold", 0.40), ("silver", 0.35), ("bronze", 0.25))
ERROR_RATES = {"llm": 0.006, "billing": 0.005, "vision": 0.003, "gemini": 0.006}
#: Share of text-only requests the gateway sends to the hosted Gemini model instead of the
#: self-hosted pipeline (text encoder + llm): the same latency budget, one model call.
GEMINI_SHARE = 0.2
#: The usage event's time in the queue (publish end to consume start): lognormal median and
#: sigma, in seconds (a Kafka consumer polling in batches).
QUEUE_DELAY_S = (0.045, 0.6)

PATTERN_KINDS = (
    "hot_spot", "p99_band_break", "cache_penetration", "fusion_sync_wait", "preprocessing_bound",
    "batching_failure", "cuda_graph_fallback", "lb_timeout_truncation", "cold_start",
    "baseline_regression",
)

# Windows of the default 3-hour run, in minutes from its start (scaled for other lengths).
_WINDOWS_3H = {
    "cuda_graph_fallback": (15, 40),
    "batching_failure": (20, 45),
    "cache_penetration": (50, 80),
    "hot_spot": (50, 80),
    "fusion_sync_wait": (55, 75),
    "cold_start": (90, 96),
    "p99_band_break": (110, 130),
    "lb_timeout_truncation": (132, 152),
    "preprocessing_bound": (155, 175),
    "baseline_regression": (155, 175),
}


# --------------------------------------------------------------------------------------
# Configuration and the injection plan
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoConfig:
    """What to generate. ``now_ns`` anchors the window ``[now - hours, now)``: pass it
    (the CLI passes the wall clock); nothing inside generation reads the clock."""

    now_ns: int
    seed: int = DEFAULT_SEED
    hours: float = DEFAULT_HOURS
    rate: float = DEFAULT_RATE
    clean: bool = False
    #: Traffic share per input type (default: each profile's ``traffic_share``).
    mix: tuple[tuple[str, float], ...] | None = None
    spans_per_request: int = SPANS_PER_REQUEST

    def __post_init__(self) -> None:
        if not (self.hours > 0 and math.isfinite(self.hours)):
            raise ValueError("hours must be a positive number")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError("rate must be a positive number")

    @property
    def start_ns(self) -> int:
        """The window's start: ``now - hours``, down to a whole minute."""
        return (self.now_ns - int(self.hours * HOUR_NS)) // MIN_NS * MIN_NS

    @property
    def end_ns(self) -> int:
        return self.now_ns

    def type_mix(self) -> tuple[tuple[str, float], ...]:
        mix = self.mix or tuple((p.input_type, p.traffic_share) for p in PROFILES.values())
        total = sum(w for _, w in mix)
        return tuple((t, w / total) for t, w in mix)


@dataclass(frozen=True)
class InjectedPattern:
    """One injected pattern: the catalog ``kind``, its ``subject`` (keys as in
    ``/api/v1/anomalies``), its window ``[start_ns, end_ns)`` and what was done."""

    kind: str
    subject: dict[str, Any]
    start_ns: int
    end_ns: int
    description: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Instance:
    service: str
    name: str
    born_min: int  # minutes from the window start (may be negative: there from the start)
    died_min: int  # exclusive; a large number when it lives on


class _Plan:
    """Everything decided once per config: windows, instances, the injected patterns."""

    def __init__(self, config: DemoConfig) -> None:
        self.config = config
        self.t0 = config.start_ns
        self.total_min = max(1, -(-(config.end_ns - self.t0) // MIN_NS))
        rng = random.Random(f"modalscope-demo:{config.seed}:plan")
        scale = (config.end_ns - self.t0) / (180 * MIN_NS)

        # Windows, whole minutes from t0 (every kind planned, also when clean, so a clean
        # run is the same traffic minus the injections).
        self.window_min: dict[str, tuple[int, int]] = {}
        for kind, (a, b) in _WINDOWS_3H.items():
            s = int(round(a * scale))
            e = max(s + 1, int(round(b * scale)))
            self.window_min[kind] = (s, e)

        # Instances: pod-N, numbered in order of creation.
        counter = 0

        def new_name() -> str:
            nonlocal counter
            counter += 1
            return f"pod-{counter}"

        live: dict[str, list[list]] = {}  # service -> [[name, born, died]]
        for service, n in POOLS:
            live[service] = [[new_name(), -10_000, 10**9] for _ in range(n)]
        # The instances the patterns are about: the slow vision pod of the preprocessing
        # window (the last initial vision pod, pod-7), the LLM pod whose CUDA graph capture
        # fails, and the LLM pod added by a scale-up (cold start). They are never restarted.
        self.slow_vision_pod = live["vision-encoder"][-1][0]
        self.fallback_llm_pod = live["llm"][0][0]
        protected = {self.slow_vision_pod, self.fallback_llm_pod}
        events: list[tuple[int, str, str]] = []  # (minute, service, what)
        hours = max(1, math.ceil(self.total_min / 60))
        for service, _ in POOLS:
            for h in range(hours):
                if rng.random() < 0.35:
                    events.append((h * 60 + rng.randrange(60), service, "restart"))
        cold_at = self.window_min["cold_start"][0]
        events.append((cold_at, "llm", "scale_up"))
        events.sort()
        self.cold_pod = ""
        for minute, service, what in events:
            if minute >= self.total_min:
                continue
            pool = [i for i in live[service] if i[2] > minute]
            if what == "scale_up":
                inst = [new_name(), minute, 10**9]
                live[service].append(inst)
                self.cold_pod = inst[0]
                protected.add(inst[0])
                continue
            candidates = [i for i in pool if i[0] not in protected]
            if not candidates:
                continue
            old = candidates[rng.randrange(len(candidates))]
            old[2] = minute
            live[service].append([new_name(), minute, 10**9])
        self.instances = [_Instance(s, n, b, d) for s, insts in live.items() for n, b, d in insts]
        # Alive instances per service and minute (the last minute's set continues after).
        self.alive: dict[str, list[tuple[str, ...]]] = {}
        for service, insts in live.items():
            per_min = []
            for m in range(self.total_min + 1):
                per_min.append(tuple(n for n, b, d in insts if b <= m < d))
            self.alive[service] = per_min
        self.born_ns = {n: self.t0 + b * MIN_NS for s, insts in live.items() for n, b, d in insts}

        # Active windows (ns) of injected patterns: none when clean.
        self.windows: dict[str, tuple[int, int]] = {}
        if not config.clean:
            for kind, (a, b) in self.window_min.items():
                self.windows[kind] = (self.t0 + a * MIN_NS, self.t0 + b * MIN_NS)

    def window_ns(self, kind: str) -> tuple[int, int]:
        a, b = self.window_min[kind]
        return self.t0 + a * MIN_NS, self.t0 + b * MIN_NS

    def patterns(self) -> list[InjectedPattern]:
        if self.config.clean:
            return []
        w = self.window_ns
        out = [
            InjectedPattern(
                "hot_spot", {"caller": "gateway", "callee": "userdb"}, *w("hot_spot"),
                "gateway->userdb: profile-cache misses fall through to an uncached, slow profile "
                "query (lock contention): the busiest pair gets a P99 in the seconds",
                {"slow_query_p50_ms": HOT_SPOT_QUERY_S * 1000},
            ),
            InjectedPattern(
                "cache_penetration",
                {"cache": "profile", "attribute": {"key": "user_tier", "value": "bronze"}},
                *w("cache_penetration"),
                "profile-cache key ignores user_tier: gold traffic (now ~62% of requests) evicts "
                "bronze entries; bronze hit rate falls from ~85% to ~8% while gold's holds",
                {"baseline_hit_rate": CACHE_HIT["bronze"], "hit_rate": 0.08, "dominant": "gold"},
            ),
            InjectedPattern(
                "fusion_sync_wait", {"service": "fusion", "stage": "fusion"}, *w("fusion_sync_wait"),
                "text/audio encoders launched with the vision encoder instead of just in time: "
                "they finish 120-450 ms before it and fusion blocks in fusion.sync_wait "
                "(baseline spread ~12 ms for 2 modalities, ~29 ms for 3)",
                {"baseline_spread_ms": 12.4, "spread_ms": [120, 450]},
            ),
            InjectedPattern(
                "batching_failure", {"service": "vision-encoder", "attribute": {"key": "batch.size", "value": 1}},
                *w("batching_failure"),
                "mixed image sizes defeat dynamic batching on vision-encoder: batch.size stuck at 1 "
                "during a 1.5x traffic surge, ViT time +35%",
                {"load_factor": 1.5},
            ),
            InjectedPattern(
                "cuda_graph_fallback",
                {"service": "llm", "attribute": {"key": "gpu.cuda_graph", "value": "fallback"}},
                *w("cuda_graph_fallback"),
                f"CUDA Graph capture fails on llm {self.fallback_llm_pod}: llm.generate falls back "
                "to per-kernel launches (~5.7 us vs ~0.8 us a launch), +60% generate time",
                {"instance": self.fallback_llm_pod, "extra_latency_factor": 1.6},
            ),
            InjectedPattern(
                "cold_start", {"service": "llm", "attribute": {"key": "service.instance.id", "value": self.cold_pod}},
                *w("cold_start"),
                f"llm scales up: new instance {self.cold_pod} loads weights and captures graphs "
                "while serving; its first requests take seconds longer",
                {"instance": self.cold_pod, "extra_s_first": 7.0, "decay_s": 80},
            ),
            InjectedPattern(
                "p99_band_break", {"caller": "gateway", "callee": "vision-encoder"}, *w("p99_band_break"),
                "vision-encoder stalls (GC / resource contention) on ~3% of calls for 7-14 s: the "
                "pair's P99 jumps several-fold while its P50 holds",
                {"stall_fraction": 0.03, "stall_s": [7, 14]},
            ),
            InjectedPattern(
                "lb_timeout_truncation", {"service": "gateway", "input_type": "multi_image"},
                *w("lb_timeout_truncation"),
                f"a client starts sending multi-image requests with 6-8 images (~{LB_GIANT_PER_MINUTE:g} a "
                "minute) that need 34-50 s; the load balancer's 30 s timeout cuts them: root spans "
                "end just under 30 s, with errors (504)",
                {"ceiling_s": LB_TIMEOUT_S, "per_minute": LB_GIANT_PER_MINUTE},
            ),
            InjectedPattern(
                "preprocessing_bound", {"input_type": "multi_image", "stage": "preprocessing"},
                *w("preprocessing_bound"),
                f"image.decode on vision-encoder turns CPU-bound (noisy neighbour): 3x slower on "
                f"every pod, 6x on {self.slow_vision_pod}; preprocessing's share of multi-image "
                "latency roughly doubles",
                {"instance": self.slow_vision_pod, "decode_factor": 3.0, "slow_pod_factor": 6.0},
            ),
            InjectedPattern(
                "baseline_regression", {"input_type": "multi_image"}, *w("baseline_regression"),
                "multi-image P95 over its SLO (the seed's 6.4 s) by more than 10%, from the "
                "CPU-bound image decode of the same window",
                {"slo_p95_ms": PROFILES["multi_image"].p95_s * 1000, "margin": 0.10},
            ),
        ]
        order = {k: i for i, k in enumerate(PATTERN_KINDS)}
        out.sort(key=lambda p: order[p.kind])
        return out


def injected_patterns(config: DemoConfig) -> list[InjectedPattern]:
    """The patterns a run with ``config`` injects (empty when ``config.clean``)."""
    return _Plan(config).patterns()


# --------------------------------------------------------------------------------------
# Protobuf building
# --------------------------------------------------------------------------------------

_KV_CACHE: dict[tuple[str, Any], KeyValue] = {}


def _any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def _kv(key: str, value: Any) -> KeyValue:
    """A KeyValue, shared for recurring (key, value) pairs (appending copies it)."""
    ck = (key, type(value), value)
    kv = _KV_CACHE.get(ck)
    if kv is None:
        kv = KeyValue(key=key, value=_any(value))
        if len(_KV_CACHE) < 50_000:
            _KV_CACHE[ck] = kv
    return kv


class _Request:
    """One ExportTraceServiceRequest being built; spans grouped by (service, instance)."""

    __slots__ = ("msg", "_containers", "n_spans", "n_traces", "n_requests", "last_end_ns")

    def __init__(self) -> None:
        self.msg = ExportTraceServiceRequest()
        self._containers: dict[tuple[str, str], Any] = {}
        self.n_spans = 0
        self.n_traces = 0  # every trace, the usage consumers' included
        self.n_requests = 0  # the users' requests (one trace each)
        self.last_end_ns = 0

    def container(self, service: str, instance: str):
        key = (service, instance)
        c = self._containers.get(key)
        if c is None:
            rs = self.msg.resource_spans.add()
            rs.resource.attributes.extend((
                _kv("service.name", service), _kv("service.instance.id", instance),
                _kv("service.namespace", NAMESPACE), _kv("deployment.environment.name", "demo"),
            ))
            ss = rs.scope_spans.add()
            ss.scope.name = SCOPE_NAME
            c = self._containers[key] = ss.spans
        return c

    def serialize(self) -> bytes:
        return self.msg.SerializeToString()


# One span of a trace under construction, times in seconds from the trace's start:
# [service, span_id, parent_id, name, kind, start, end, attrs(list of KeyValue), status, message]
_SVC, _SID, _PARENT, _NAME, _KIND, _START, _END, _ATTRS, _STATUS, _MSG = range(10)


# --------------------------------------------------------------------------------------
# Traces
# --------------------------------------------------------------------------------------


def _lognorm(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def _daily_curve(t_ns: int) -> float:
    """Relative traffic by time of day (UTC): 0.5x at 03:00, 1.5x at 15:00."""
    hour = (t_ns / HOUR_NS) % 24.0
    return 1.0 + 0.5 * math.sin(2 * math.pi * (hour - 9.0) / 24.0)


_ROUTE = "/v1/chat/completions"
_ROOT_NAME = f"POST {_ROUTE}"
_API_HOST = "api.mm-inference.example"
# gRPC methods (span names "package.Service/Method", as OTel's gRPC instrumentation names them).
_M_AUTH = "auth.v1.Auth/Verify"
_M_PRE = "preprocess.v1.Preprocessor/Preprocess"
_M_VISION = "vision.v1.VisionEncoder/Encode"
_M_TEXT = "text.v1.TextEncoder/Encode"
_M_AUDIO = "audio.v1.AudioEncoder/Encode"
_M_FUSION = "fusion.v1.Fusion/Fuse"
_M_BILLING = "billing.v1.Billing/RecordUsage"
_RPC_PORT = {"auth": 50051, "preprocessor": 50052, "vision-encoder": 50053, "text-encoder": 50054,
             "audio-encoder": 50055, "fusion": 50056, "billing": 50058}

# The self-hosted model: an OpenAI-compatible server (service llm) called by the gateway's
# GenAI-instrumented client. "vllm" is a custom provider value, as the GenAI conventions
# allow when no well-known one applies.
_MODEL = "mm-llm-7b"
_LLM_PROVIDER = "vllm"
_LLM_HOST, _LLM_PORT = "llm", 8000
# The hosted model, as opentelemetry-instrumentation-google-genai names and describes it.
_GEMINI_MODEL = "gemini-2.0-flash"
_GEMINI_HOST = "generativelanguage.googleapis.com"
_GEMINI_URL = f"https://{_GEMINI_HOST}/v1beta/models/{_GEMINI_MODEL}:generateContent"
# Uninstrumented dependencies (client-side attributes only).
_OBJSTORE = "objstore.internal:9000"
_OBJSTORE_URL = f"http://{_OBJSTORE}/mm-uploads/"
_USAGEDB_HOST, _USAGEDB_PORT = "usagedb.internal", 5432
# The usage events' queue.
_TOPIC = "usage-events"
_KAFKA_HOST, _KAFKA_PORT = "kafka", 9092
_PRODUCE_NAME = f"send {_TOPIC}"
_CONSUME_NAME = f"process {_TOPIC}"
_INSERT_NAME = "INSERT usage_events"


def _rpc_attrs(method: str, service: str, client: bool) -> list[KeyValue]:
    pkg_service, _, name = method.partition("/")
    attrs = [_kv("rpc.system", "grpc"), _kv("rpc.service", pkg_service), _kv("rpc.method", name)]
    if client:
        attrs += [_kv("server.address", service), _kv("server.port", _RPC_PORT[service])]
    attrs.append(_kv("rpc.grpc.status_code", 0))
    return attrs


_RPC_CACHE: dict[tuple[str, str, bool], list[KeyValue]] = {}


def _rpc(method: str, service: str, client: bool) -> list[KeyValue]:
    key = (method, service, client)
    attrs = _RPC_CACHE.get(key)
    if attrs is None:
        attrs = _RPC_CACHE[key] = _rpc_attrs(method, service, client)
    return attrs


def _int_kv(key: str, value: int) -> KeyValue:
    """A KeyValue for a value too varied to share (token counts, sizes)."""
    return KeyValue(key=key, value=AnyValue(int_value=value))


def _str_kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


_ROOT_BASE = [_kv("http.request.method", "POST"), _kv("http.route", _ROUTE), _kv("url.scheme", "https"),
              _kv("url.path", _ROUTE), _kv("server.address", _API_HOST), _kv("server.port", 443)]
_OK_200 = _kv("http.response.status_code", 200)
# The model calls' attributes known when they start (GenAI conventions; gen_ai.system is
# the older name of gen_ai.provider.name: the google-genai instrumentation no longer sets
# it, others such as OpenLLMetry's still do, so the demo carries both).
_CHAT_BASE = [_kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", _LLM_PROVIDER),
              _kv("gen_ai.system", _LLM_PROVIDER), _kv("gen_ai.request.model", _MODEL),
              _kv("server.address", _LLM_HOST), _kv("server.port", _LLM_PORT)]
_CHAT_DONE = [_kv("gen_ai.response.model", _MODEL)]
_GEMINI_BASE = [_kv("gen_ai.operation.name", "generate_content"), _kv("gen_ai.provider.name", "gemini"),
                _kv("gen_ai.system", "gemini"), _kv("gen_ai.request.model", _GEMINI_MODEL),
                _kv("server.address", _GEMINI_HOST)]
_GEMINI_DONE = [_kv("gen_ai.response.model", f"{_GEMINI_MODEL}-001")]
# The google-genai SDK's own HTTP request (httpx instrumentation, stable HTTP conventions).
_GEMINI_HTTP = [_kv("http.request.method", "POST"), _kv("url.full", _GEMINI_URL),
                _kv("server.address", _GEMINI_HOST), _kv("server.port", 443)]
# The llm's server span (an older FastAPI instrumentation: the pre-1.21 HTTP conventions).
_LLM_SERVER = [_kv("http.method", "POST"), _kv("http.target", _ROUTE), _kv("http.route", _ROUTE),
               _kv("http.scheme", "http"), _kv("net.host.name", _LLM_HOST), _kv("net.host.port", _LLM_PORT),
               _kv("http.flavor", "1.1")]
# The preprocessor's object-store client (an older requests instrumentation).
_OBJ_GET = [_kv("http.method", "GET"), _kv("net.peer.name", _OBJSTORE.partition(":")[0]),
            _kv("net.peer.port", int(_OBJSTORE.partition(":")[2])), _kv("http.status_code", 200)]
# Messaging conventions: the gateway's producer and metering's consumer of the usage events.
_PRODUCE = [_kv("messaging.system", "kafka"), _kv("messaging.destination.name", _TOPIC),
            _kv("messaging.operation.type", "send"), _kv("messaging.operation.name", "send"),
            _kv("server.address", _KAFKA_HOST), _kv("server.port", _KAFKA_PORT)]
_CONSUME = [_kv("messaging.system", "kafka"), _kv("messaging.destination.name", _TOPIC),
            _kv("messaging.operation.type", "process"), _kv("messaging.operation.name", "process"),
            _kv("messaging.consumer.group.name", "metering")]
_PARTITIONS = [_kv("messaging.destination.partition.id", str(i)) for i in range(6)]
# Metering's usage database: no peer.service, so the pair names it by address and port.
_INSERT = [_kv("db.system", "postgresql"), _kv("db.operation.name", "INSERT"),
           _kv("db.collection.name", "usage_events"), _kv("server.address", _USAGEDB_HOST),
           _kv("server.port", _USAGEDB_PORT)]
# Prompt text for the captured messages (cut to each request's prompt length).
_PROMPT = ("Describe what you see and answer the question about it in a few sentences. " * 40)


def _input_messages(prompt_chars: int, uris: list[str], audio_uri: str | None) -> str:
    """``gen_ai.input.messages`` as opentelemetry-util-genai serializes it: one user message,
    the uploaded media as ``uri`` parts with their ``modality``, then the prompt text."""
    parts = [f'{{"mime_type":"image/jpeg","modality":"image","uri":"{u}","type":"uri"}}' for u in uris]
    if audio_uri is not None:
        parts.append(f'{{"mime_type":"audio/wav","modality":"audio","uri":"{audio_uri}","type":"uri"}}')
    parts.append(f'{{"content":"{_PROMPT[:prompt_chars]}","type":"text"}}')
    return '[{"role":"user","parts":[' + ",".join(parts) + "]}]"


def _usage(in_text: int, images: int, audio: int, out_tokens: int) -> list[KeyValue]:
    """Token usage in total and per input modality. The per-modality keys are the ones
    opentelemetry-util-genai sets from the provider's usage details (google-genai's
    ``prompt_tokens_details``), left out where a modality has no tokens."""
    in_image = images * 258  # Gemini-style: a fixed token count an image
    in_audio = audio * 320  # ~10 s of speech at 32 tokens a second
    attrs = [_int_kv("gen_ai.usage.input_tokens", in_text + in_image + in_audio),
             _int_kv("gen_ai.usage.output_tokens", out_tokens), _int_kv("gen_ai.usage.text.input_tokens", in_text)]
    if in_image:
        attrs.append(_int_kv("gen_ai.usage.image.input_tokens", in_image))
    if in_audio:
        attrs.append(_int_kv("gen_ai.usage.audio.input_tokens", in_audio))
    return attrs


class _Factory:
    """Builds traces for one config (and its plan) into requests."""

    def __init__(self, config: DemoConfig, plan: _Plan | None = None) -> None:
        self.config = config
        self.plan = plan or _Plan(config)
        self.windows = self.plan.windows
        types, weights = zip(*config.type_mix())
        self.types = types
        self.cum_weights = []
        acc = 0.0
        for w in weights:
            acc += w
            self.cum_weights.append(acc)

    # -- helpers ----------------------------------------------------------------------
    def _on(self, kind: str, t_ns: int) -> bool:
        w = self.windows.get(kind)
        return w is not None and w[0] <= t_ns < w[1]

    def _instance(self, service: str, t_ns: int, rng: random.Random) -> str:
        per_min = self.plan.alive[service]
        m = (t_ns - self.plan.t0) // MIN_NS
        m = 0 if m < 0 else (len(per_min) - 1 if m >= len(per_min) else m)
        pool = per_min[m]
        return pool[int(rng.random() * len(pool))]

    def pick_type(self, rng: random.Random) -> str:
        i = bisect.bisect_right(self.cum_weights, rng.random() * self.cum_weights[-1])
        return self.types[min(i, len(self.types) - 1)]

    # -- one trace --------------------------------------------------------------------
    def trace(self, rng: random.Random, t_ns: int, itype: str, req: _Request, load: float = 1.0,
              giant: bool = False) -> None:
        """Add one request's trace starting at ``t_ns`` to ``req``, and the trace of its usage
        event's consumer when it was published (``giant``: a 6-8 image request longer than
        the load balancer's timeout)."""
        on = self._on
        spans: list[list] = []
        ids = rng.getrandbits

        def span(service, parent, name, kind, start, end, attrs, status=0, message=""):
            sid = ids(64) or 1
            spans.append([service, sid, parent, name, kind, start, end, attrs, status, message])
            return sid

        def call(caller, callee, method, parent, start, dur, client_extra=(), server_extra=()):
            """A gRPC call: CLIENT span in caller, SERVER span in callee (wire time on
            both sides); returns (client id, server id, server start, server end)."""
            w1 = rng.uniform(0.0002, 0.0008)
            w2 = rng.uniform(0.0002, 0.0008)
            if dur < 4 * (w1 + w2):
                w1 = w2 = dur * 0.05
            cid = span(caller, parent, method, KIND_CLIENT, start, start + dur,
                       _rpc(method, callee, True) + list(client_extra))
            s0, s1 = start + w1, start + dur - w2
            sid = span(callee, cid, method, KIND_SERVER, s0, s1, _rpc(method, callee, False) + list(server_extra))
            return cid, sid, s0, s1

        def sequence(parent, service, start, end, parts, self_frac):
            """Lay ``parts`` [(name, weight, attrs)] out one after another inside
            [start, end], leaving ``self_frac`` of it as the parent's own time (gaps);
            returns [(span id, start, end)]."""
            total_w = sum(p[1] for p in parts)
            dur = end - start
            gap = dur * self_frac / (len(parts) + 1)
            work = dur * (1 - self_frac)
            t = start + gap
            out = []
            for name, weight, attrs in parts:
                d = work * weight / total_w
                out.append((span(service, parent, name, KIND_INTERNAL, t, t + d, attrs), t, t + d))
                t += d + gap
            return out

        profile = PROFILES[itype]
        shares = CORE_SHARES[itype]

        # Who is asking.
        if on("cache_penetration", t_ns):
            r = rng.random()
            tier = "gold" if r < 0.62 else ("silver" if r < 0.85 else "bronze")
        else:
            r = rng.random()
            tier = "gold" if r < 0.40 else ("silver" if r < 0.75 else "bronze")

        truncate_at = None
        images = 0
        audio = 0
        if itype == "image":
            images = 1
        elif itype == "multi_image":
            r = rng.random()
            images = 2 if r < 0.80 else (3 if r < 0.95 else 4)
        elif itype == "audio":
            audio = 1
            images = 1 if rng.random() < 0.2 else 0

        # End-to-end latency, from the seed's distribution.
        T = math.exp(profile.mu + profile.sigma * rng.gauss(0.0, 1.0))
        if giant:
            images = rng.choice((6, 7, 8))
            T = rng.uniform(34.0, 50.0)
            truncate_at = LB_TIMEOUT_S - rng.uniform(0.005, 0.1)
        # Text only: the hosted model answers a share of the requests.
        hosted = itype == "text" and rng.random() < GEMINI_SHARE

        # Prompt length: ~200 tokens of text; <100 characters with one image; >300 with two.
        if itype == "text":
            prompt_chars = int(_lognorm(rng, 800, 0.3))
        elif itype == "image":
            prompt_chars = rng.randrange(12, 100)
        elif itype == "multi_image":
            prompt_chars = rng.randrange(301, 1200)
        else:
            prompt_chars = rng.randrange(0, 200)

        # Side calls (their own latency distributions).
        g0 = rng.uniform(0.0004, 0.0015)
        g1 = rng.uniform(0.0005, 0.002)
        gaps = [rng.uniform(0.00005, 0.0003) for _ in range(9)]
        auth_d = _lognorm(rng, 0.0025, 0.35) + 0.0012
        session_d = _lognorm(rng, 0.0075, 1.1)
        quota_d = _lognorm(rng, 0.0075, 1.1)
        cache_d = _lognorm(rng, 0.0009, 0.4)
        produce_d = _lognorm(rng, 0.0006, 0.3)
        hit = rng.random() < (0.08 if tier == "bronze" and on("cache_penetration", t_ns) else CACHE_HIT[tier])
        profile_d = 0.0 if hit else _lognorm(rng, 0.045, 0.5)
        side = (g0 + g1 + auth_d + session_d + quota_d + cache_d + produce_d + gaps[0] + gaps[1] + gaps[2]
                + gaps[4] + gaps[5] + gaps[8] + (gaps[6] if itype == "text" else gaps[7])
                + (0.0 if hit else profile_d + gaps[3]))
        if not hit and on("hot_spot", t_ns):
            profile_d = _lognorm(rng, HOT_SPOT_QUERY_S, 0.5)  # added on top: users wait for it
        R = max(T - side, 0.35 * T)

        # The pipeline's part, split by the type's shares with jitter (R is kept exactly).
        raw = {k: v * math.exp(0.12 * rng.gauss(0.0, 1.0)) for k, v in shares.items() if k != "tenc_par"}
        norm = R / sum(raw.values())
        seg = {k: v * norm for k, v in raw.items()}
        tenc_par = shares.get("tenc_par", 0.0) * R * math.exp(0.2 * rng.gauss(0.0, 1.0))

        # The uploaded media, as the object store names them.
        uris = [f"{_OBJSTORE_URL}{ids(48):012x}.jpg" for _ in range(images)]
        audio_uri = f"{_OBJSTORE_URL}{ids(48):012x}.wav" if audio else None

        # -- layout -------------------------------------------------------------------
        root = span("gateway", None, _ROOT_NAME, KIND_SERVER, 0.0, 0.0, _ROOT_BASE + [_kv("user_tier", tier)])
        root_span = spans[-1]
        t = g0

        call("gateway", "auth", _M_AUTH, root, t, auth_d)
        t += auth_d + gaps[0]
        span("gateway", root, "SELECT sessions", KIND_CLIENT, t, t + session_d, _DB_SESSION)
        t += session_d + gaps[1]
        span("gateway", root, "GET profile", KIND_CLIENT, t, t + cache_d, _cache_attrs(tier, hit))
        t += cache_d + gaps[2]
        if not hit:
            span("gateway", root, "SELECT user_profile", KIND_CLIENT, t, t + profile_d, _DB_PROFILE)
            t += profile_d + gaps[3]
        span("gateway", root, "SELECT quota", KIND_CLIENT, t, t + quota_d, _DB_QUOTA)
        t += quota_d + gaps[4]

        # Preprocessor: tokenizing (and audio decoding, fetching the images from the object
        # store). mm.* counts here are optional extras: the model call says the same.
        pre_d = seg["pre"]
        _, psid, p0, p1 = call("gateway", "preprocessor", _M_PRE, root, t, pre_d)
        parts = []
        if audio:
            parts += [("audio.decode", 0.50, _A_AUDIO), ("audio.resample", 0.30, _A_AUDIO)]
        if images:
            parts.append(("image.fetch", 0.4 * images, [_kv("mm.image_count", images)]))
        parts.append(("text.tokenize", 0.2 if (audio or images) else 1.0, [_int_kv("mm.prompt_chars", prompt_chars)]))
        laid = sequence(psid, "preprocessor", p0, p1, parts, 0.04)
        if images:
            # One GET a picture, one after another: most of the fetch is waiting on the store.
            fid, f0, f1 = laid[2 if audio else 0]
            gap = (f1 - f0) * 0.08 / (images + 1)
            d = (f1 - f0) * 0.92 / images
            g = f0 + gap
            for uri in uris:
                span("preprocessor", fid, "HTTP GET", KIND_CLIENT, g, g + d, _OBJ_GET + [_str_kv("http.url", uri)])
                g += d + gap
        t += pre_d + gaps[5]

        batch_fail = on("batching_failure", t_ns)
        sync_fail = on("fusion_sync_wait", t_ns)
        vis_pod = None
        # (cut time, failing service, message, failing span id or None: the service's SERVER span)
        errors: list[tuple[float, str, str, int | None]] = []

        # -- encoders -------------------------------------------------------------------
        if itype == "text":
            if hosted:
                model_d = seg["tenc"] + gaps[6] + seg["llm"]  # no local encoder: one hosted call
            else:
                tenc_d = seg["tenc"]
                _, tsid, s0, s1 = call("gateway", "text-encoder", _M_TEXT, root, t, tenc_d)
                sequence(tsid, "text-encoder", s0, s1, [("text_encoder.forward", 1.0, self._tenc_attrs(rng, load))],
                         0.05)
                t += tenc_d + gaps[6]
        else:
            # The encoder on the critical path (vision, or audio) and its duration.
            stall = 0.0
            if itype == "audio":
                long_d = seg["aenc"]
            else:
                vis_parts, vis_d, vis_pod, stall = self._vision_parts(rng, seg, images, load, batch_fail, t_ns)
                long_d = vis_d + stall
            if sync_fail:
                long_d *= 1.12  # encoders running at once contend for PCIe / L2 (the seed: 82% / 79%)
            last_end = t + long_d
            modalities = 1 + (1 if images else 0) + (1 if audio else 0)  # + text
            spread = max(0.002, rng.gauss(SYNC_SPREAD_S[min(modalities, 3)], 0.004))
            # The text encoder is launched just in time to finish ~spread before the last
            # encoder; with the sync problem it starts with the others and finishes early.
            tenc_d = tenc_par
            if sync_fail:
                tenc_start = t
                spread = max(long_d - tenc_d, 0.12 + rng.random() * 0.33)
                tenc_d = max(0.004, long_d - spread)
            else:
                tenc_start = max(t, last_end - spread - tenc_d)
            _, tsid, s0, s1 = call("gateway", "text-encoder", _M_TEXT, root, tenc_start, tenc_d)
            sequence(tsid, "text-encoder", s0, s1, [("text_encoder.forward", 1.0, self._tenc_attrs(rng, load))], 0.05)
            first_end = tenc_start + tenc_d

            if itype == "audio":
                _, asid, s0, s1 = call("gateway", "audio-encoder", _M_AUDIO, root, t, long_d)
                sequence(asid, "audio-encoder", s0, s1,
                         [("audio_encoder.forward", 1.0, self._gpu_attrs(rng, "audio", load))], 0.06)
                if images:  # a picture with the recording: vision in parallel, shorter
                    v_d = long_d * rng.uniform(0.5, 0.8)
                    v_end = last_end - spread * rng.uniform(0.2, 0.8)
                    v_parts = self._vision_layout(rng, images, load, batch_fail)
                    _, vsid, s0, s1 = call("gateway", "vision-encoder", _M_VISION, root, v_end - v_d, v_d)
                    self._emit_vision(span, vsid, s0, s1, v_parts, 0.0)
            else:
                _, vsid, s0, s1 = call("gateway", "vision-encoder", _M_VISION, root, t, long_d)
                self._emit_vision(span, vsid, s0, s1, vis_parts, stall)
                if rng.random() < ERROR_RATES["vision"]:
                    errors.append((t + rng.uniform(0.02, 0.3) * long_d, "vision-encoder",
                                   "UNAVAILABLE: GPU worker restarting", None))

            # Fusion: starts when the first encoder returns, waits for the rest, then aligns.
            f_start = first_end + gaps[6]
            f_end = last_end + seg["fusion"]
            _, fsid, s0, s1 = call("gateway", "fusion", _M_FUSION, root, f_start, f_end - f_start)
            sync_end = max(s0, min(last_end + rng.uniform(0.0003, 0.0012), s1))
            span("fusion", fsid, "fusion.sync_wait", KIND_INTERNAL, s0, sync_end, [_kv("mm.modalities", modalities)])
            sequence(fsid, "fusion", sync_end, s1, _FUSION_PARTS, 0.08)
            t = f_end + gaps[7]

        # -- the model call, with billing beside it --------------------------------------
        in_text = max(1, prompt_chars // 4)
        messages = _str_kv("gen_ai.input.messages", _input_messages(prompt_chars, uris, audio_uri))
        llm_pod = None
        if hosted:
            # Gemini: a GenAI client span with the SDK's HTTP request under it (no callee span).
            failed = rng.random() < ERROR_RATES["gemini"]
            out_tokens = max(1, int(model_d * 0.7 / 0.005))
            attrs = _GEMINI_BASE + [messages]
            if not failed:
                attrs += _GEMINI_DONE + _usage(in_text, 0, 0, out_tokens)
            gid = span("gateway", root, f"generate_content {_GEMINI_MODEL}", KIND_CLIENT, t, t + model_d, attrs)
            h0 = t + rng.uniform(0.0006, 0.0015)
            h1 = max(h0, t + model_d - rng.uniform(0.0002, 0.0008))
            status = _kv("http.response.status_code", 429 if failed else 200)
            hid = span("gateway", gid, "POST", KIND_CLIENT, h0, h1, _GEMINI_HTTP + [status])
            if failed:
                errors.append((h0 + (h1 - h0) * rng.uniform(0.3, 0.95), "gateway",
                               "RESOURCE_EXHAUSTED: 429 quota exceeded for the hosted model", hid))
        else:
            model_d = seg["llm"]
            llm_pod = self._instance("llm", t_ns, rng)
            fallback = (self._on("cuda_graph_fallback", t_ns) and llm_pod == self.plan.fallback_llm_pod) or (
                rng.random() < BASELINE_FALLBACK_RATE)
            cold_extra = 0.0
            if llm_pod == self.plan.cold_pod and self._on("cold_start", t_ns):
                age = (t_ns - self.plan.born_ns[llm_pod]) / NS
                cold_extra = 7.0 * math.exp(-age / 80.0) * rng.uniform(0.8, 1.2)
            gen_w, prefill_w = 0.74, 0.22
            # ~8 ms an output token with CUDA graphs; a fallback to per-kernel launches costs +60%.
            out_tokens = max(1, int(model_d * gen_w / 0.008))
            if fallback:
                gen_w *= 1.6
                model_d *= 1 + 0.6 * 0.74
            model_d += cold_extra
            failed = rng.random() < ERROR_RATES["llm"]
            attrs = _CHAT_BASE + [messages]
            if not failed:  # usage and the response model come with a response
                attrs += _CHAT_DONE + _usage(in_text, images, audio, out_tokens)
            ccid = span("gateway", root, f"chat {_MODEL}", KIND_CLIENT, t, t + model_d, attrs)
            w1, w2 = rng.uniform(0.0002, 0.0008), rng.uniform(0.0002, 0.0008)
            s0, s1 = t + w1, t + model_d - w2
            lsid = span("llm", ccid, _ROOT_NAME, KIND_SERVER, s0, s1,
                        _LLM_SERVER + [_kv("http.status_code", 500 if failed else 200)])
            # Cold start: the instance is still loading and warming up; requests queue.
            l0 = s0 + cold_extra
            pre_d = (s1 - l0) * prefill_w / (prefill_w + gen_w + 0.04)
            gen_d = (s1 - l0) * gen_w / (prefill_w + gen_w + 0.04)
            g = (s1 - l0 - pre_d - gen_d) / 3
            span("llm", lsid, "llm.prefill", KIND_INTERNAL, l0 + g, l0 + g + pre_d,
                 [_kv("batch.size", self._llm_batch(rng, load))])
            span("llm", lsid, "llm.generate", KIND_INTERNAL, l0 + 2 * g + pre_d, l0 + 2 * g + pre_d + gen_d,
                 [_kv("batch.size", self._llm_batch(rng, load)),
                  _kv("gpu.cuda_graph", "fallback" if fallback else "captured")])
            if failed:
                errors.append((t + model_d * rng.uniform(0.3, 0.95), "llm", "RESOURCE_EXHAUSTED: CUDA out of memory",
                               None))
        b_start = t + rng.uniform(0.0002, 0.001)
        b_d = min(_lognorm(rng, 0.012, 1.546), max(0.0005, model_d - 0.002))
        bcid, _, _, _ = call("gateway", "billing", _M_BILLING, root, b_start, b_d)
        billing_error = rng.random() < ERROR_RATES["billing"]
        t += model_d + gaps[8]
        # The usage event, published before the response goes out.
        prod_id = span("gateway", root, _PRODUCE_NAME, KIND_PRODUCER, t, t + produce_d, _PRODUCE)
        prod_span = spans[-1]
        t += produce_d + g1
        root_span[_END] = t

        # -- instances, errors, truncation ----------------------------------------------
        instances = {"gateway": self._instance("gateway", t_ns, rng)}
        if llm_pod is not None:
            instances["llm"] = llm_pod
        if itype != "audio" and images:
            instances["vision-encoder"] = vis_pod
        if billing_error:
            for s in spans:
                if s[_SID] == bcid:
                    s[_STATUS], s[_MSG] = STATUS_ERROR, "DEADLINE_EXCEEDED: billing did not answer in time"
        if truncate_at is not None:
            self._cut(spans, truncate_at, "gateway", "upstream request timeout (load balancer, 30 s)",
                      504, mark_all=True)
        elif errors:
            cut, service, message, failing = min(errors)
            self._cut(spans, cut, service, message, 503, mark_all=False, failing_sid=failing)
        if root_span[_STATUS] != STATUS_ERROR:
            root_span[_ATTRS].append(_OK_200)

        tid = self._emit(req, rng, t_ns, spans, instances)
        req.n_requests += 1
        if spans[-1] is prod_span and prod_span[_STATUS] != STATUS_ERROR:
            # Published: metering consumes it after its time in the queue, in a trace of its own.
            self._consume(rng, t_ns, req, tid, prod_id, prod_span[_END])

    def _consume(self, rng: random.Random, t_ns: int, req: _Request, producer_tid: bytes, producer_sid: int,
                 published: float) -> None:
        """Metering's trace of one usage event: a CONSUMER span linked to the producer and
        the insert into the usage database (times in seconds from ``t_ns``, as the producer's)."""
        c0 = published + _lognorm(rng, *QUEUE_DELAY_S)
        i0 = c0 + rng.uniform(0.0003, 0.001)
        i1 = i0 + _lognorm(rng, 0.0025, 0.5)
        c1 = i1 + rng.uniform(0.0002, 0.0008)
        cid = rng.getrandbits(64) or 1
        spans = [
            ["metering", cid, None, _CONSUME_NAME, KIND_CONSUMER, c0, c1,
             _CONSUME + [_PARTITIONS[int(rng.random() * len(_PARTITIONS))]], 0, ""],
            ["metering", rng.getrandbits(64) or 1, cid, _INSERT_NAME, KIND_CLIENT, i0, i1, _INSERT, 0, ""],
        ]
        self._emit(req, rng, t_ns, spans, {"metering": self._instance("metering", t_ns, rng)},
                   link=(producer_tid, producer_sid))

    # -- vision encoder -------------------------------------------------------------
    def _vision_parts(self, rng, seg, images, load, batch_fail, t_ns):
        """The vision call's children; returns (parts, duration, pod, stall)."""
        pod = self._instance("vision-encoder", t_ns, rng)
        decode_scale = 1.0
        if self._on("preprocessing_bound", t_ns):
            decode_scale = 6.0 if pod == self.plan.slow_vision_pod else 3.0
        parts = self._vision_layout(rng, images, load, batch_fail, seg, decode_scale,
                                    vit_scale=1.35 if batch_fail else 1.0)
        stall = 0.0
        if self._on("p99_band_break", t_ns) and rng.random() < 0.03:
            stall = rng.uniform(7.0, 14.0)
        return parts, sum(p[1] for p in parts), pod, stall

    def _vision_layout(self, rng, images, load, batch_fail, seg=None, decode_scale=1.0, vit_scale=1.0):
        """[(name, duration, attrs, layers)] of the vision encoder's work: per image
        decode, resize, normalize (CPU, one after another), then one batched ViT forward."""
        if seg is None:  # relative weights only (the caller scales them)
            seg = _VISION_WEIGHTS
        parts = []
        split = [math.exp(0.15 * rng.gauss(0.0, 1.0)) for _ in range(images)]
        total = sum(split)
        for i in range(images):
            f = split[i] / total
            attrs = _IMAGE_ATTRS[min(i, len(_IMAGE_ATTRS) - 1)]
            parts.append(("image.decode", seg["decode"] * f * decode_scale, attrs, None))
            parts.append(("image.resize", seg["resize"] * f, attrs, None))
            parts.append(("image.normalize", seg["normalize"] * f, attrs, None))
        batch = 1 if batch_fail else self._vision_batch(rng, load)
        fallback = rng.random() < BASELINE_FALLBACK_RATE
        vit_attrs = [_kv("mm.modality", "vision"), _kv("batch.size", batch),
                     _kv("gpu.cuda_graph", "fallback" if fallback else "captured")]
        parts.append(("vit.forward", seg["vit"] * vit_scale, vit_attrs, VIT_LAYERS))
        return parts

    @staticmethod
    def _emit_vision(span, sid, s0, s1, parts, stall):
        """Lay the vision encoder's children out in [s0, s1] (after a stall, if any)."""
        total = sum(p[1] for p in parts)
        avail = s1 - s0 - stall
        scale = avail * 0.985 / total if total > 0 else 0.0
        gap = avail * 0.015 / (len(parts) + 1)
        t = s0 + stall + gap
        for name, d, attrs, layers in parts:
            d *= scale
            cid = span("vision-encoder", sid, name, KIND_INTERNAL, t, t + d, attrs)
            if layers:
                lt = t + d * 0.02
                for layer, frac in layers:
                    ld = d * frac
                    span("vision-encoder", cid, f"vit.{layer}", KIND_INTERNAL, lt, lt + ld,
                         _LAYER_ATTRS[layer])
                    lt += ld + d * 0.14
            t += d + gap

    # -- attributes -----------------------------------------------------------------
    @staticmethod
    def _vision_batch(rng, load):
        return max(2, min(16, int(round(rng.gauss(2.0 + 3.0 * load, 1.2)))))

    @staticmethod
    def _llm_batch(rng, load):
        return max(1, min(64, int(round(rng.gauss(10.0 * load, 3.0)))))

    @staticmethod
    def _tenc_attrs(rng, load):
        return [_kv("mm.modality", "text"), _kv("batch.size", max(1, min(32, int(round(rng.gauss(4.0 * load, 1.5))))))]

    @staticmethod
    def _gpu_attrs(rng, modality, load):
        fb = rng.random() < BASELINE_FALLBACK_RATE
        return [_kv("mm.modality", modality), _kv("batch.size", max(1, min(16, int(round(rng.gauss(2.0 + 2.0 * load, 1.0)))))),
                _kv("gpu.cuda_graph", "fallback" if fb else "captured")]

    # -- errors ---------------------------------------------------------------------
    @staticmethod
    def _cut(spans, cut, service, message, http_status, mark_all, failing_sid=None):
        """End the trace at ``cut``: later spans never happened, running ones end there
        (in error where they are the failing call's chain, or every one for a timeout).
        The failing span is ``failing_sid``, else ``service``'s SERVER span at the cut."""
        by_id = {s[_SID]: s for s in spans}
        failing = by_id.get(failing_sid) if failing_sid is not None else None
        if not mark_all and failing is None:
            # The failing service's outermost span running at the cut, and its chain up.
            for s in spans:
                if s[_SVC] == service and s[_KIND] == KIND_SERVER and s[_START] <= cut < s[_END]:
                    failing = s
                    break
        chain = set()
        if failing is not None:
            p = failing
            while p is not None:
                chain.add(p[_SID])
                p = by_id.get(p[_PARENT])
        kept = []
        for s in spans:
            if s[_START] >= cut and s[_PARENT] is not None:
                continue
            if s[_END] > cut or s[_PARENT] is None:
                if s[_END] > cut:
                    s[_END] = cut
                if mark_all or s[_SID] in chain:
                    s[_STATUS] = STATUS_ERROR
                    s[_MSG] = message if (s[_PARENT] is None or not mark_all) else "CANCELLED: " + message
                    if s[_PARENT] is None:
                        s[_ATTRS] = [a for a in s[_ATTRS] if a.key != "http.response.status_code"] + [
                            _kv("http.response.status_code", http_status), _kv("error.type", str(http_status))]
            kept.append(s)
        spans[:] = kept

    # -- emit -----------------------------------------------------------------------
    def _emit(self, req: _Request, rng, t_ns: int, spans: list[list], instances: dict[str, str],
              link: tuple[bytes, int] | None = None) -> bytes:
        """Add one trace's spans to ``req`` (``link``: the root's span link, trace id and
        span id); returns its trace id."""
        # Time-ordered trace ids (X-Ray style: unix seconds in the first 4 bytes, then random
        # bits): stores index them append-mostly, which keeps a large fill fast.
        first = t_ns + int(spans[0][_START] * NS)
        tid = ((first // NS & 0xFFFFFFFF) << 96 | rng.getrandbits(96) | 1).to_bytes(16, "big")
        last = 0
        for s in spans:
            service = s[_SVC]
            inst = instances.get(service)
            if inst is None:
                inst = instances[service] = self._instance(service, t_ns, rng)
            start = t_ns + int(s[_START] * NS)
            end = t_ns + int(s[_END] * NS)
            if end < start:
                end = start
            if end > last:
                last = end
            pb = req.container(service, inst).add(
                trace_id=tid, span_id=s[_SID].to_bytes(8, "big"), name=s[_NAME], kind=s[_KIND],
                start_time_unix_nano=start, end_time_unix_nano=end, attributes=s[_ATTRS],
            )
            if s[_PARENT] is not None:
                pb.parent_span_id = s[_PARENT].to_bytes(8, "big")
            elif link is not None:
                pb.links.add(trace_id=link[0], span_id=link[1].to_bytes(8, "big"))
            if s[_STATUS]:
                pb.status.code = s[_STATUS]
                pb.status.message = s[_MSG]
                ev = pb.events.add(time_unix_nano=end, name="exception")
                ev.attributes.extend((_kv("exception.type", "RpcError"), _kv("exception.message", s[_MSG])))
        req.n_spans += len(spans)
        req.n_traces += 1
        if last > req.last_end_ns:
            req.last_end_ns = last
        return tid


def _cache_attrs(tier: str, hit: bool) -> list[KeyValue]:
    return [_kv("db.system", "redis"), _kv("db.operation.name", "GET"), _kv("cache.name", "profile"),
            _kv("cache.hit", hit), _kv("user_tier", tier), _kv("peer.service", "profile-cache"),
            _kv("server.address", "profile-cache")]


def _db(op: str, table: str) -> list[KeyValue]:
    return [_kv("db.system", "postgresql"), _kv("db.operation.name", op), _kv("db.collection.name", table),
            _kv("peer.service", "userdb"), _kv("server.address", "userdb"), _kv("server.port", 5432)]


_DB_SESSION = _db("SELECT", "sessions")
_DB_PROFILE = _db("SELECT", "user_profile")
_DB_QUOTA = _db("SELECT", "quota")
_A_AUDIO = [_kv("mm.audio_count", 1)]
_FUSION_PARTS = (("fusion.align", 0.25, []), ("fusion.cross_attn", 0.45, []), ("fusion.memcpy", 0.22, []))
_VISION_WEIGHTS = {"decode": 0.22, "resize": 0.07, "normalize": 0.06, "vit": 0.30}
_IMAGE_ATTRS = [[_kv("mm.image.index", i), _kv("image.format", "jpeg")] for i in range(8)]
_LAYER_ATTRS = {layer: [_kv("mm.layer", layer), _kv("mm.modality", "vision")] for layer, _ in VIT_LAYERS}


# --------------------------------------------------------------------------------------
# Traffic over time
# --------------------------------------------------------------------------------------


def _minute_rng(seed: int, stream: str, minute: int) -> random.Random:
    return random.Random(f"modalscope-demo:{seed}:{stream}:{minute}")


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 50:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    # Knuth, for small means.
    limit = math.exp(-lam)
    k, p = 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


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


def _block_requests(config: DemoConfig, factory: "_Factory", schedule: _Schedule, counts: list[tuple[int, int]],
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
    import itertools
    import multiprocessing
    import queue as queues

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
    from .otlp import decode_protobuf
    from .stages import default_rules
    from .writer import write_spans

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


# --------------------------------------------------------------------------------------
# Live traffic
# --------------------------------------------------------------------------------------


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
        from .otlp import decode_protobuf
        from .writer import WriterClosed, WriterFull

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
