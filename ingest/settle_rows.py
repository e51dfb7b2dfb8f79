"""The span rows a settling pass reads: their layout, as the loader's SQL hands them in."""

from ..durations import MINUTE_NS as NS_PER_MINUTE  # noqa: F401  (the rows' minute)

# Row layout handed in by the loader. BATCH and GRAPH are ``batch.size`` and
# ``gpu.cuda_graph`` as the database extracts them (``settle_conventions.convention_columns``
# says what they hold), so spans that carry only those never have their attributes parsed
# in Python.
# RESOURCE is the resource JSON of cache lookups (spans mentioning ``"cache.name"``), ''
# for the others. ROW (optional) is the span's ``spans.id``, for the ``pair_calls`` rows;
# LAYER (optional) its ``mm.layer`` when that is a string (the ``layer`` series).
# SIGNALS (optional) is ``spans.signals`` (JSON text or None), LINKS (optional) the links
# JSON of CONSUMER spans (None for the others: only hand-offs read them).
TID, SID, PARENT, SERVICE, NAME, KIND, STAGE, START, DUR, STATUS, ATTRS, INSTANCE, BATCH, GRAPH, RESOURCE, ROW, \
    LAYER, SIGNALS, LINKS = range(19)
