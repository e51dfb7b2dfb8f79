"""The read side of the store, behind one small interface (Jaeger's SpanReader idea).

Readers take typed query objects and return plain rows; all statistics are computed from
those rows by pure functions in ``modalscope.app.queries``. Percentiles never come from
raw spans here: ``rollups`` returns merged histograms.

``StoreReader`` is composed of one class a concern, each in its module:

* ``base``: the engine reads go through, ``Filters`` and the series filter;
* ``tiers``: which minute and hourly rows answer a window (``TierPlan``,
  ``tier_plan``, ``plan_tiers``), their ``UNION ALL`` reads and the merge into
  ``RollupGroup``s;
* ``rollups``: rollup reads (``RollupQuery``, ``rollups``, ``rollup_steps``, ``tier_rows``,
  ``rollup_rows``, ``rollup_columns``, series ids and values, ``first_minutes``);
* ``walks``: what the span and call reads share (walking a duration index, narrowing by
  callee or model, column lists);
* ``spans``: raw spans and trace rows (``SpanQuery``, ``slow_spans``, ``spans_by_id``,
  ``callee_children``, ``long_traces``);
* ``attributes``: spans read for their attributes (``attribute_ops``, ``cache_spans``,
  ``subject_spans``, ``attribute_spans``);
* ``calls``: a pair's calls (``slow_calls``, ``pending_calls``) and ``slow_traces``.

Every name other code uses is re-exported here. These are copies: a test that patches a
constant must patch it in the module that reads it (e.g. ``reader.calls``).
"""

from __future__ import annotations

from .. import Series
from .attributes import (ATTRIBUTE_SCAN_SLACK, ATTRIBUTE_SERVICE_SHARE, ATTRIBUTE_WALK_COUNTED, ROOTS_PER_STATEMENT,
                         STAGE_WALK_SERVICES, SUBJECT_CLUSTERS, AttributeReads)
from .base import NS_PER_MINUTE, PAIR_STAGE_BEFORE, Filters, ReaderBase, _raw_rows
from .calls import (PENDING_CHUNK, PENDING_STRAGGLER_SHARE, PENDING_WALK_AFTER, PENDING_WALK_ENTRIES_PER_TRACE,
                    TRACE_WALK_SHARE, CallReads)
from .rollups import RollupQuery, RollupReads
from .spans import CALLEE_LATE_NS, CALLEE_SKEW_NS, SPAN_WALK_SHARE, SpanQuery, SpanReads
from .tiers import TIERS_PER_STATEMENT, RollupGroup, TierPlan, TierReads, minute_range, plan_tiers, tier_plan
from .walks import CALLEE_KIND_CODES, KIND_CLIENT_CODE, SpanWalks


class StoreReader(RollupReads, SpanReads, AttributeReads, CallReads):
    """Every read of the store, over one engine (the app shares one reader between requests
    and threads)."""


__all__ = [
    "ATTRIBUTE_SCAN_SLACK", "ATTRIBUTE_SERVICE_SHARE", "ATTRIBUTE_WALK_COUNTED", "CALLEE_KIND_CODES", "CALLEE_LATE_NS",
    "CALLEE_SKEW_NS", "KIND_CLIENT_CODE", "NS_PER_MINUTE", "PAIR_STAGE_BEFORE", "PENDING_CHUNK",
    "PENDING_STRAGGLER_SHARE", "PENDING_WALK_AFTER", "PENDING_WALK_ENTRIES_PER_TRACE",
    "ROOTS_PER_STATEMENT", "SPAN_WALK_SHARE", "STAGE_WALK_SERVICES", "SUBJECT_CLUSTERS", "TIERS_PER_STATEMENT",
    "TRACE_WALK_SHARE", "AttributeReads", "CallReads", "Filters", "ReaderBase", "RollupGroup", "RollupQuery",
    "RollupReads", "Series", "SpanQuery", "SpanReads", "SpanWalks", "StoreReader", "TierPlan", "TierReads",
    "_raw_rows", "minute_range", "plan_tiers", "tier_plan",
]
