"""Readable durations and rates: 850 µs, 12.3 ms, 320 ms, 1.30 s, 4.2 min; and a finding's
evidence numbers in the unit their key names (:func:`evidence_unit`). Nothing here writes a
number in scientific notation."""

from __future__ import annotations

import math


def fmt_num(value: float | None, sig: int = 3) -> str:
    """A plain number to ``sig`` significant digits, thousands separated, never as ``1e+04``
    (trailing zeros of the fraction dropped: 2, 12.3, 0.00123, 29,968)."""
    if value is None:
        return "—"
    v = float(value)
    if not math.isfinite(v):
        return "—"
    if v == 0:
        return "0"
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(v))))
    text = f"{v:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def fmt_ms(ms: float | None, sig: int = 3) -> str:
    """A duration given in milliseconds, in the unit a person reads fastest (``sig``
    significant digits: 3 gives 2.79 s, 4 gives 2.789 s)."""
    if ms is None or (isinstance(ms, float) and not math.isfinite(ms)):
        return "—"
    if ms < 0:
        return "-" + fmt_ms(-ms, sig)
    if ms == 0:
        return "0 ms"
    if ms < 1:
        us = ms * 1000
        return f"{us:.{sig}g} µs" if us >= 1 else f"{us:.2f} µs"
    if ms < 1000:
        return f"{ms:.{sig}g} ms" if ms < 10 ** (sig - 1) else f"{ms:.0f} ms"
    s = ms / 1000
    if s < 120:
        return f"{s:.{sig}g} s" if s < 10 ** (sig - 1) else f"{s:.0f} s"
    return f"{fmt_num(s / 60, sig)} min"


def fmt_count(n: float | None) -> str:
    if n is None:
        return "—"
    n = float(n)
    if abs(n) >= 1e6:
        return f"{fmt_num(n / 1e6)} M"
    if abs(n) >= 1e4:
        return f"{n / 1e3:.3g} k"
    if n == int(n):
        return f"{int(n):,}"
    return f"{n:.3g}"


def fmt_pct(frac: float | None, digits: int = 1) -> str:
    if frac is None:
        return "—"
    return f"{frac * 100:.{digits}f} %"


def fmt_rank(rank: float | None) -> str:
    """A share at-or-below (0..1) as a percentile label: P50, P97, P99.7, P100."""
    if rank is None:
        return "—"
    pct = max(0.0, min(1.0, rank)) * 100
    if pct >= 99 and pct < 100:
        return f"P{math.floor(pct * 10) / 10:g}"
    return f"P{math.floor(pct)}"


def time_unit(max_ms: float | None) -> tuple[float, str]:
    """(divisor, unit) for an axis whose largest value is ``max_ms`` milliseconds."""
    if max_ms is not None and max_ms >= 2000:
        return 1000.0, "s"
    return 1.0, "ms"


# -- evidence ------------------------------------------------------------------------------
# A finding's evidence (app/detectors/) is an object of named numbers whose key names their
# unit: ``*_ms`` milliseconds, ``*_s`` seconds, ``*_minutes`` minutes, ``*_share``/``*_rate``
# (and ``share``) a fraction shown as %, ``*_ratio`` (and ``ratio``) a multiple of a baseline,
# ``*_count`` a count; the few other keys are named here. ``evidence_unit`` answers None for a
# key it does not know (a test runs every detector and fails on one).
EVIDENCE_UNIT_KEYS = {
    "share": "pct", "ratio": "ratio", "margin": "pct", "change": "change",
    "extra_latency_ratio": "change",  # the fallbacks' median latency over captured ones, less 1
    "calls": "count", "pairs": "count", "outliers": "count", "truncated": "count",
    "over_threshold": "count", "calls_per_min": "per_min", "mean_batch_size": "number",
}
EVIDENCE_UNIT_SUFFIXES = (("_ms", "ms"), ("_s", "s"), ("_minutes", "min"), ("_share", "pct"), ("_rate", "pct"),
                          ("_ratio", "ratio"), ("_count", "count"))
# How a key reads (its unit left to the value): the rest are their words, P50/P95/P99 named so.
EVIDENCE_LABELS = {
    "max_duration_ms": "longest request", "band_ms": "pile-up band", "ceiling_s": "timeout ceiling",
    "threshold_ms": "threshold", "exit_threshold_ms": "exit threshold", "threshold_ratio": "threshold ratio",
    "sample_count": "samples", "threshold_count": "needed at the ceiling", "truncated": "requests at the ceiling",
    "error_share": "errors among them", "median_pair_p99_ms": "median P99 of the pairs",
    "first_median_ms": "first requests' median", "steady_median_ms": "steady median",
    "warmup_s": "warm-up", "batch_one_share": "batches of one", "baseline_batch_one_share": "baseline batches of one",
    "extra_latency_ratio": "extra latency of fallbacks", "change": "P95 over baseline",
    "baseline_data_minutes": "baseline minutes with calls", "over_threshold": "traces over threshold",
    "baseline_minutes": "baseline window", "calls_per_min": "call rate", "threshold_hit_rate": "hit-rate floor",
}


def evidence_unit(key: str) -> str | None:
    """The unit of evidence ``key``: ``ms``, ``s``, ``min``, ``pct`` (a fraction), ``change``
    (a signed fraction), ``ratio`` (a multiple), ``count``, ``per_min``, ``number``; None
    when the key follows no convention."""
    if key in EVIDENCE_UNIT_KEYS:
        return EVIDENCE_UNIT_KEYS[key]
    for suffix, unit in EVIDENCE_UNIT_SUFFIXES:
        if key.endswith(suffix):
            return unit
    return None


def evidence_label(key: str) -> str:
    """Evidence ``key`` in words, without its unit: ``baseline_p99_ms`` → "baseline P99"."""
    if key in EVIDENCE_LABELS:
        return EVIDENCE_LABELS[key]
    words = str(key)
    unit = evidence_unit(words)
    for suffix, u in EVIDENCE_UNIT_SUFFIXES:
        if u == unit and u in ("ms", "s", "min") and words.endswith(suffix):
            words = words[: -len(suffix)]
    words = words.replace("_", " ").strip()
    for p in ("p50", "p90", "p95", "p99"):
        words = " ".join(p.upper() if w == p else w for w in words.split(" "))
    return words or str(key)


def fmt_evidence(key: str, value) -> str:
    """One evidence value in its key's unit: 29.97 s, 59.3 %, ×4.62, 3,801, +60.0 %."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, (int, float)):
        return str(value)
    v = float(value)
    if not math.isfinite(v):
        return "—"
    unit = evidence_unit(key)
    if unit == "ms":
        return fmt_ms(v, 4)
    if unit == "s":
        return fmt_ms(v * 1000, 4)
    if unit == "min":
        return f"{fmt_num(v)} min"
    if unit == "pct":
        return fmt_pct(v, 2 if 0 < abs(v) < 0.01 else 1)
    if unit == "change":
        return ("+" if v >= 0 else "−") + fmt_pct(abs(v), 1)
    if unit == "ratio":
        return f"×{fmt_num(v)}"
    if unit == "count":
        return fmt_num(v, 12) if v != int(v) else f"{int(v):,}"
    if unit == "per_min":
        return f"{fmt_num(v)}/min"
    return fmt_num(v)


def evidence_items(evidence, limit: int | None = None) -> list[tuple[str, str, str]]:
    """``(key, label, value text)`` of a finding's evidence, in its order (None values and
    nested objects left out)."""
    out = []
    for k, v in (evidence or {}).items():
        if isinstance(v, (dict, list)) or v is None:
            continue
        out.append((str(k), evidence_label(str(k)), fmt_evidence(str(k), v)))
        if limit is not None and len(out) >= limit:
            break
    return out


# (observed key, reference key, what the observed is, what the reference is): the first pair a
# finding's evidence holds is its headline number.
EVIDENCE_MEASURES = (
    ("p99_ms", "baseline_p99_ms", "P99", "baseline"),
    ("p95_ms", "baseline_p95_ms", "P95", "baseline"),
    ("first_median_ms", "steady_median_ms", "first requests' median", "steady"),
    ("median_spread_ms", "threshold_ms", "median encoder spread", "threshold"),
    ("max_duration_ms", "ceiling_s", "longest", "ceiling"),
    ("share", "threshold_share", "preprocessing share", "threshold"),
    ("hit_rate", "threshold_hit_rate", "hit rate", "floor"),
    ("batch_one_share", "threshold_share", "batches of one", "threshold"),
    ("fallback_share", "threshold_share", "CUDA Graph fallbacks", "threshold"),
)


def evidence_measure(evidence) -> str:
    """A finding's headline number against its reference, in units: "P99 12.89 s vs
    baseline 2.789 s", "longest 29.97 s vs ceiling 30 s" ('' when its evidence has none)."""
    ev = evidence if isinstance(evidence, dict) else {}
    for obs, ref, label, ref_label in EVIDENCE_MEASURES:
        o, r = ev.get(obs), ev.get(ref)
        if isinstance(o, (int, float)) and not isinstance(o, bool):
            vs = (f" vs {ref_label} {fmt_evidence(ref, r)}" if isinstance(r, (int, float)) and not isinstance(r, bool)
                  else "")
            return f"{label} {fmt_evidence(obs, o)}{vs}"
    return ""
