"""What to do about each kind of finding: the ``hint`` text of its findings (some with
``str.format`` fields the detector fills in)."""


HINTS = {
    "hot_spot": "High latency on a high-volume pair (the heatmap's dark upper-right block): a slow query "
                "or an uncached path. Look at the callee's slowest calls in the exemplars; add or fix the "
                "cache in front of it, or index / rewrite the query.",
    "p99_band_break": "P99 jumped against its own trailing baseline while P50 held: a minority of calls stall "
                      "— resource contention or GC pauses in the callee. Check GC logs, CPU/GPU throttling and "
                      "noisy neighbours on the instances of the exemplar traces; isolate or resize them.",
    "cache_penetration": "The hit rate of {key}={value} collapsed while {dominant} dominates the volume: the "
                         "cache key ignores {key}, so {dominant} entries evict the others. Put {key} into the "
                         "cache key, or partition the cache by it.",
    "fusion_sync_wait": "Encoders finish out of step (the multimodal inference latency study measured "
                        "~12 ms apart for 2 modalities, ~29 ms for 3), so fusion blocks on the slowest one. "
                        "Launch the faster encoders just in time (or give them less parallel hardware), or let "
                        "fusion start on partial inputs.",
    "preprocessing_bound": "Preprocessing's share of end-to-end latency grew: CPU-bound work (image decode, "
                           "resize) is not asynchronous. Move it off the request path (async workers, a decode "
                           "pool, GPU decoding) and check CPU saturation on the instances of the exemplars.",
    "batching_failure": "batch.size is stuck at 1 while load is high: mixed input sizes defeat dynamic "
                        "batching. Bucket or pad inputs to a few fixed sizes so requests can share a batch.",
    "cuda_graph_fallback": "CUDA Graph capture failed and kernels launch one by one (~5.7 µs a launch instead "
                           "of ~0.8 µs). Check the capture error on the instance (dynamic shapes, allocations "
                           "during capture), pin shapes, and restart it.",
    "lb_timeout_truncation": "Requests pile up just under {ceiling_s:g} s and end in errors: a load-balancer "
                             "timeout (defaults are 30 s / 60 s) below the request time cuts long multimodal "
                             "requests. Raise the backend timeout for this route, or stream / split long requests.",
    "cold_start": "A new instance's first requests are far slower than its steady state: pulling image layers, "
                  "loading weights or capturing graphs while serving. Warm it up before it takes traffic "
                  "(readiness after a warm-up request), pre-pull images, keep warm instances.",
    "baseline_regression": "P95 of {input_type} requests is over its baseline by more than {margin:g} %: see "
                           "the stage breakdown for this input type and the window's other findings for the "
                           "cause.",
}
