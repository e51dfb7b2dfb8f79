"""Duration buckets never decrease with the duration, and each bucket's floor bounds it."""

import random

from modalscope.models.buckets import MAX_BUCKET, bucket_floor_ns, duration_bucket


def test_buckets_never_decrease_and_floors_bound_them():
    rng = random.Random(5)
    values = sorted({0, 1, 7, 8, 9, 15, 16, 17, 1023, 1024, 1025, 2**62, 2**63 - 1}
                    | {rng.randrange(1, 2**63) for _ in range(3000)} | {rng.randrange(1, 10**10) for _ in range(3000)})
    buckets = [duration_bucket(v) for v in values]
    assert buckets == sorted(buckets)
    assert max(buckets) == MAX_BUCKET and duration_bucket(-3) == 0
    for v, b in zip(values, buckets):
        assert bucket_floor_ns(b) <= v
        if b < MAX_BUCKET:
            assert v < bucket_floor_ns(b + 1)
        if v >= 8:  # eight buckets a doubling: no bucket wider than 1/8 of its floor
            assert (bucket_floor_ns(b + 1) if b < MAX_BUCKET else 2**63) - bucket_floor_ns(b) <= bucket_floor_ns(b) // 8
