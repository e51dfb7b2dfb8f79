"""The read side of the store, behind one small interface (Jaeger's SpanReader idea).

Readers take typed query objects and return plain rows; all statistics are computed from
those rows by pure functions in ``modalscope.app.queries``. Percentiles never come from
raw spans here: ``reader.rollups.merged`` returns merged histograms.

``StoreReader(engine)`` is a container with no query methods of its own: ``engine``, the
``context`` its readers share and one reader a concern, each a plain class in its module,
composed rather than inherited from one another:

* ``reader.rollups`` (``RollupReader``, ``rollups``): rollup reads (``RollupQuery``,
  ``merged``, ``steps``, ``rows_of_plan``, ``rows_of_kinds``, ``rows``, ``columns``,
  ``rows_by_service``, ``op_histograms``, series ids and values, ``first_minutes``);
* ``reader.spans`` (``SpanReader``, ``spans``): raw spans and trace rows (``SpanQuery``,
  ``slowest``, ``by_id``, ``callee_children``, ``of_trace``, ``trace_row``, ``trace_rows``,
  ``long_traces``);
* ``reader.attributes`` (``AttributeReader``, ``attributes``): spans read for their
  attributes (``ops``, ``cache_spans``, ``subjects``, ``spans``);
* ``reader.calls`` (``CallReader``, ``calls``): a pair's calls (``slowest``, ``pending``,
  ``complete_from``) and ``slowest_traces``.

What they share is no base class but what each holds or calls:

* ``base``: ``ReadContext`` (the engine, the autocommit engine reads go through on
  PostgreSQL, the pack cache), ``Filters``, and ``series_filter``, ``services_in`` and
  ``minutes_kept_from`` over a connection;
* ``tiers``: which minute, quarter-hour and hourly rows answer a window (``TierPlan``, ``tier_plan``,
  ``plan_tiers``), their ``UNION ALL`` reads (``series_rows``, ``rows_of_series``) and the
  merge into ``RollupGroup``s;
* ``walks``: what the span, attribute and call readers share (``long_window``, walking a
  duration index, narrowing by callee or model, column lists).

Every name other code uses is re-exported here. These are copies: a test that patches a
constant or a shared function must patch it in the module that reads it (e.g.
``reader.calls`` for ``PENDING_CHUNK``, ``reader.rollups`` for ``series_rows``).
"""

from __future__ import annotations

from sqlalchemy import Engine

from .. import Series
from .attributes import (ATTRIBUTE_SCAN_SLACK, ATTRIBUTE_SERVICE_SHARE, ATTRIBUTE_WALK_COUNTED, ROOTS_PER_STATEMENT,
                         STAGE_WALK_SERVICES, SUBJECT_CLUSTERS, AttributeReader)
from .base import NS_PER_MINUTE, PAIR_STAGE_BEFORE, Filters, ReadContext, plain_rows
from .calls import (PENDING_CHUNK, PENDING_STRAGGLER_SHARE, PENDING_WALK_AFTER, PENDING_WALK_ENTRIES_PER_TRACE,
                    TRACE_WALK_SHARE, CallReader)
from .rollups import RollupQuery, RollupReader
from .spans import CALLEE_LATE_NS, CALLEE_SKEW_NS, SPAN_WALK_SHARE, SpanQuery, SpanReader
from .tiers import TIERS_PER_STATEMENT, RollupGroup, TierPlan, minute_range, plan_tiers, tier_plan
from .walks import CALLEE_KIND_CODES, KIND_CLIENT_CODE


class StoreReader:
    """Every read of the store, over one engine, one reader a concern (the app shares one
    ``StoreReader`` between requests and threads)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.context = ReadContext(engine)
        self.rollups = RollupReader(self.context)
        self.spans = SpanReader(self.context)
        self.attributes = AttributeReader(self.context)
        self.calls = CallReader(self.context)


__all__ = [
    "ATTRIBUTE_SCAN_SLACK", "ATTRIBUTE_SERVICE_SHARE", "ATTRIBUTE_WALK_COUNTED", "CALLEE_KIND_CODES", "CALLEE_LATE_NS",
    "CALLEE_SKEW_NS", "KIND_CLIENT_CODE", "NS_PER_MINUTE", "PAIR_STAGE_BEFORE", "PENDING_CHUNK",
    "PENDING_STRAGGLER_SHARE", "PENDING_WALK_AFTER", "PENDING_WALK_ENTRIES_PER_TRACE",
    "ROOTS_PER_STATEMENT", "SPAN_WALK_SHARE", "STAGE_WALK_SERVICES", "SUBJECT_CLUSTERS", "TIERS_PER_STATEMENT",
    "TRACE_WALK_SHARE", "AttributeReader", "CallReader", "Filters", "ReadContext", "RollupGroup", "RollupQuery",
    "RollupReader", "Series", "SpanQuery", "SpanReader", "StoreReader", "TierPlan",
    "plain_rows", "minute_range", "plan_tiers", "tier_plan",
]
