"""The kinds of latency series the settler rolls up (the ``series.kind`` column).

A ``StrEnum``, so a kind is stored and compared as its plain text ("op", "pair", ...).
"""

from __future__ import annotations

from enum import StrEnum


class SeriesKind(StrEnum):
    OP = "op"  # a span name of a service
    LAYER = "layer"  # a model layer inside an encoder span (callee = the layer)
    PAIR = "pair"  # a caller -> callee call (name = the model a call requested)
    TRACE = "trace"  # end-to-end time of traces by root service and input type
    TRACE_STAGE = "tstage"  # a trace's self time in one stage
    TOKENS = "tokens"  # model calls' token counts
    SYNC = "sync"  # how long fusion waited for its encoders
    INSTANCE = "inst"  # spans of a service instance (a new one: a cold start)
    CACHE = "cache"  # cache lookups (hits and misses) by key attribute
    BATCH = "batch"  # batch sizes of batched calls
    CUDA = "cuda"  # CUDA graph replays and fallbacks
