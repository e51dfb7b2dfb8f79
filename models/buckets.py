"""Duration buckets: eight a doubling, so a span's bucket orders it by duration to within 12.5 %.

The spans table's exemplar index is ``(service, duration_bucket, start_ns, duration_ns)``
rather than ``(service, duration_ns)``. New spans then land at the end of a few hundred
(bucket, time) runs instead of at random places in a duration-sorted index: a commit of
5,000 spans rewrote ~5,000 index pages before, a few hundred now (faster ingest,
bench/ingest_bench.py). A slowest-first search walks the
buckets downward and sorts within each (``reader.spans.slowest``): every span of a higher
bucket is slower than every span of a lower one, so the order is exact.
"""

from __future__ import annotations

_SHIFT = 3  # 2**3 = 8 buckets a doubling: a bucket spans at most 1/8 of its floor (12.5 %)
MAX_BUCKET = 8 * 62 + 7  # durations below 2**63 ns


def duration_bucket(duration_ns: int) -> int:
    """0 for 0 (and negatives), the duration itself below 8 ns, else 8·k + the next three
    bits after the leading one, where 2**k <= duration < 2**(k+1). Never decreasing."""
    if duration_ns < 8:
        return max(0, duration_ns)
    k = duration_ns.bit_length() - 1
    return 8 * k + ((duration_ns >> (k - _SHIFT)) & 7)


def bucket_floor_ns(bucket: int) -> int:
    """The smallest duration in ``bucket`` or any bucket above it (numbers 8-23 are unused)."""
    if bucket < 8:
        return max(0, bucket)
    if bucket < 24:
        return 8
    k, frac = divmod(bucket, 8)
    return (8 + frac) << (k - _SHIFT)

