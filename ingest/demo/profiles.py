"""The demo's reference figures: the reference latency table's per-type latency, the
stage shares the traces are built from, baseline rates and the services that emit spans."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...durations import HOUR_NS, NS  # noqa: F401 - HOUR_NS: the demo modules take it from here
from ...durations import MINUTE_NS as MIN_NS

DEFAULT_SEED = 42
DEFAULT_HOURS = 3.0
#: Requests per second, averaged over the generated window. Sized so the default run
#: (3 hours) fills a SQLite store in well under a minute on two cores.
DEFAULT_RATE = 2.0
#: Requests per second the live thread sends while the demo runs.
LIVE_RATE = 2.0
#: Spans per generated request (whole traces; a request ends after the trace crossing it).
SPANS_PER_REQUEST = 4000

LB_TIMEOUT_S = 30.0  # the load balancer's default timeout (the source document: 30 s / 60 s)
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


@dataclass(frozen=True)
class InputProfile:
    """End-to-end latency of one input type: the reference latency table's P50
    and P95, in seconds."""

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


#: The reference latency table (text, one image, two images) plus audio, which the source
#: document does not measure: ~10 s of speech and a short prompt, plausibly ~0.95 s / 1.6 s.
PROFILES: dict[str, InputProfile] = {
    "text": InputProfile("text", 0.320, 0.410, 0.45),
    "image": InputProfile("image", 1.3, 2.1, 0.30),
    "multi_image": InputProfile("multi_image", 3.7, 6.4, 0.12),
    "audio": InputProfile("audio", 0.95, 1.6, 0.13),
}

#: The stage the reference latency table's "main bottleneck" column points at, per input
#: type (the stage with the most self time): text encoding + LLM inference -> inference;
#: image decode + vision encoding -> preprocessing; cross-modal attention scheduling +
#: memory copies -> fusion. Audio (not in the table): the audio encoder.
BOTTLENECK_STAGE = {"text": "inference", "image": "preprocessing", "multi_image": "fusion",
                    "audio": "encoder"}
#: The stages the table's bottleneck column names, together the bulk of the self time.
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

# ViT layer profile (the source document's TensorRT-LLM table): patch embedding 3.1%,
# attention 18.2%, MLP 35.5%; the rest (norms, residuals) is the forward span's own time.
VIT_LAYERS = (("patch_embed", 0.031), ("attention", 0.182), ("mlp", 0.355))
# Encoder finishing spread before fusion (the source document: ~12 ms for 2 modalities,
# ~29 ms for 3).
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
