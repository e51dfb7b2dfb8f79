"""The catalog: every detector by kind (``DETECTORS``), ``run_all`` over a frame, the order
findings are shown in, and the exemplars of findings found from rollups alone."""

from __future__ import annotations

from typing import Callable

import pandas as pd

from ...core.findings import Finding
from ...ingest.settle_fast import cache_hit_value
from .band_break import detect_p99_band_break
from .conventions import (_attr_spans, cuda_hint, detect_batching_failure, detect_cache_penetration,
                          detect_cuda_graph_fallback)
from .frames import SEVERITY_ORDER, Frames, Thresholds, exemplar_ids
from .hot_spot import detect_hot_spot
from .lifecycle import detect_baseline_regression, detect_cold_start, detect_lb_timeout_truncation
from .stages import _sync_blocks, detect_fusion_sync_wait, detect_preprocessing_bound


DETECTORS: dict[str, Callable[[Frames, Thresholds], list[Finding]]] = {
    "hot_spot": detect_hot_spot,
    "p99_band_break": detect_p99_band_break,
    "cache_penetration": detect_cache_penetration,
    "fusion_sync_wait": detect_fusion_sync_wait,
    "preprocessing_bound": detect_preprocessing_bound,
    "batching_failure": detect_batching_failure,
    "cuda_graph_fallback": detect_cuda_graph_fallback,
    "lb_timeout_truncation": detect_lb_timeout_truncation,
    "cold_start": detect_cold_start,
    "baseline_regression": detect_baseline_regression,
}


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then latest first, then by kind."""
    return sorted(findings, key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), -f.start_ns, f.kind))


def run_all(frames: Frames, th: Thresholds | None = None, kinds=None) -> list[Finding]:
    """Every detector (or those named in ``kinds``) over ``frames``, most severe first."""
    th = th or Thresholds()
    out: list[Finding] = []
    for kind, fn in DETECTORS.items():
        if kinds and kind not in kinds:
            continue
        out.extend(fn(frames, th))
    return sort_findings(out)


# -- exemplars for rollup-based attribute findings -----------------------------------------
ATTRIBUTE_KINDS = ("cache_penetration", "batching_failure", "cuda_graph_fallback", "fusion_sync_wait")


def describe_from_spans(f: Finding, spans: pd.DataFrame) -> Finding:
    """A finding of :data:`ATTRIBUTE_KINDS` found from rollups with its exemplar traces
    (and, for a CUDA Graph fallback, the instance in its hint) from raw spans of (part of)
    its window, as the detectors give them when they have raw spans (``f`` itself when there
    are none). ``spans`` as ``Frames.spans``."""
    if spans.empty:
        return f
    frames = Frames(0, 1, 0, spans=spans)
    s = f.subject
    ids: list = []
    hint = f.hint
    if f.kind == "cache_penetration":
        df = _attr_spans(frames, "cache.name")
        key, value = s.attribute.key, s.attribute.value
        df = df[df["_v"].astype(str) == s.cache]
        ids = [t for t, a in zip(df["trace_id"], df["attrs"]) if a.get(key) == value
               and cache_hit_value(a.get("cache.hit")) is False]
    elif f.kind == "batching_failure":
        df = _attr_spans(frames, "batch.size")
        df = df[(df["service"] == s.service) & pd.to_numeric(df["_v"], errors="coerce").notna()]
        ids = df.sort_values("duration_ns", ascending=False)["trace_id"].tolist()
    elif f.kind == "cuda_graph_fallback":
        df = _attr_spans(frames, "gpu.cuda_graph")
        fb = df[(df["service"] == s.service) & (df["_v"] == "fallback")]
        ids = fb.sort_values("duration_ns", ascending=False)["trace_id"].tolist()
        if len(fb):
            hint = cuda_hint(fb["instance"])
    elif f.kind == "fusion_sync_wait":
        got = _sync_blocks(frames, Thresholds())
        if got is not None:
            ids = got[1](lambda blk: blk == blk)[2]
    return f.replace(exemplar_trace_ids=exemplar_ids(ids), hint=hint)
