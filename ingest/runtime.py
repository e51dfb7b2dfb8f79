"""Process-wide tuning of the ``modalscope`` command's processes (receivers, settler, import, demo)."""

from __future__ import annotations

import gc

#: Net container allocations between the cyclic collector's young-generation passes in an
#: ingest process (Python's default is 700). Decoding a request allocates a few containers
#: per span attribute (an OTLP/JSON request of 5,000 spans: hundreds of thousands), freed by
#: reference counting and never in a cycle, while tens of thousands of decoded spans wait in
#: the writer's queue; at the default the collector ran every few spans and walked those
#: again and again: 28 % of an OTLP/JSON import, 12 % of a protobuf one (docs/benchmarks.md).
#: Cycles are still collected, a little later.
YOUNG_COLLECTION_ALLOCATIONS = 50_000


def tune_gc() -> None:
    """Raise the young-generation threshold to ``YOUNG_COLLECTION_ALLOCATIONS`` (never lower it)."""
    young, middle, old = gc.get_threshold()
    if young and young < YOUNG_COLLECTION_ALLOCATIONS:
        gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, middle, old)
