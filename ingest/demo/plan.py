"""What a run generates: its configuration, and the plan decided once per configuration
(pattern windows, service instances and their restarts, the injected patterns)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from .profiles import (CACHE_HIT, DEFAULT_HOURS, DEFAULT_RATE, DEFAULT_SEED, HOT_SPOT_QUERY_S, HOUR_NS,
                       LB_GIANT_PER_MINUTE, LB_TIMEOUT_S, MIN_NS, PATTERN_KINDS, POOLS, PROFILES,
                       SPANS_PER_REQUEST)

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
                "multi-image P95 over its reference (the reference latency table's 6.4 s) by more than 10%, from the "
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
