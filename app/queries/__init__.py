"""Query functions shared by the JSON API and the pages.

Each takes a ``StoreReader``, a time window and filters, and returns plain rows (lists of
dicts, JSON-ready). Percentiles come from merged rollup histograms, never from raw spans;
raw spans serve only the single-trace view, exemplar traces and the discovery of which
operations are ViT layers.

One module per page (and the ``/api/v1`` routes that share its queries):

* ``overview``: Overview page, ``/input-types`` (``input_types``, ``overview_rows``,
  ``traffic_series``, the reference latency table);
* ``service_pairs``: Pairs page, ``/pairs`` (``pairs``, ``pair_heatmap``, ``pair_table``,
  ``pair_models``);
* ``drilldown``: Drilldown page, ``/traces`` (``latency_distribution``,
  ``percentile_series``, ``exemplar_traces``);
* ``trace``: Trace page, ``/traces/<trace_id>`` (``trace_detail``, ``trace_view``);
* ``stage_time``: Stages page, ``/stages`` (``stages``, ``stage_time_at``,
  ``stage_breakdown``, ``stage_series``, ``vit_layers``);
* ``cache``: Cache page, ``/cache`` (``cache_rates``, ``cache_series``);
* ``comparison``: Compare page, ``/compare`` (``compare``);
* ``common`` and ``bins``: what those share (subjects, filter pickers, latency bins).

Every name other code uses is re-exported here. These are copies: a test that patches a
constant or helper must patch it in the module that reads it (e.g. ``queries.cache``).
"""

from __future__ import annotations

from .bins import BINS_PER_DECADE, bin_band_ms, bin_edges_ms, binned_counts
from .cache import (CACHE_MAX_SPANS, GROUP_BY_PATTERN, NO_GROUP, _rates_table, cache_buckets, cache_events,
                    cache_hit_value, cache_rates, cache_rates_and_series, cache_rollup_cells, cache_series, cache_table,
                    valid_group_by)
from .common import INPUT_TYPE_ORDER, filter_options, subject_label, subject_of
from .comparison import (COMPARE_MAX_SPANS, COMPARE_MAX_VALUES, COMPARE_MIN_SELECTION, COMPARE_MIN_SHARE, COMPARE_TOP,
                         KEEP_ID_KEYS, SLOW_QUANTILE, attribute_lift, compare, default_baseline, span_facets,
                         stage_deltas)
from .drilldown import EXEMPLAR_SCAN_LIMIT, _calls_of_pair, exemplar_traces, latency_distribution, percentile_series
from .overview import DEFAULT_MARGIN, SEED_BASELINE, input_types, overview_rows, parse_baseline, traffic_series
from .service_pairs import pair_heatmap, pair_models, pair_table, pairs
from .stage_time import (AT_QUANTILES, MEASURE_AT_PERCENTILE, MEASURE_SPAN_PERCENTILES, VIT_LAYERS, stage_breakdown,
                         stage_series, stage_time_at, stages, vit_layers)
from .trace import MAX_LINKED_LOOKUPS, trace_detail, trace_view

__all__ = [
    "AT_QUANTILES", "BINS_PER_DECADE", "CACHE_MAX_SPANS", "COMPARE_MAX_SPANS", "COMPARE_MAX_VALUES",
    "COMPARE_MIN_SELECTION", "COMPARE_MIN_SHARE", "COMPARE_TOP", "DEFAULT_MARGIN", "EXEMPLAR_SCAN_LIMIT",
    "GROUP_BY_PATTERN", "INPUT_TYPE_ORDER", "KEEP_ID_KEYS", "MAX_LINKED_LOOKUPS", "MEASURE_AT_PERCENTILE",
    "MEASURE_SPAN_PERCENTILES", "NO_GROUP", "SEED_BASELINE", "SLOW_QUANTILE", "VIT_LAYERS",
    "attribute_lift", "bin_band_ms", "bin_edges_ms", "binned_counts", "cache_buckets", "cache_events",
    "cache_hit_value", "cache_rates", "cache_rates_and_series", "cache_rollup_cells", "cache_series",
    "cache_table", "compare", "default_baseline", "exemplar_traces", "filter_options", "input_types",
    "latency_distribution", "overview_rows", "pair_heatmap", "pair_models", "pair_table", "pairs",
    "parse_baseline", "percentile_series", "span_facets", "stage_breakdown", "stage_deltas", "stage_series",
    "stage_time_at", "stages", "subject_label", "subject_of", "trace_detail", "trace_view", "traffic_series",
    "valid_group_by", "vit_layers",
    # private helpers the tests call directly
    "_calls_of_pair", "_rates_table",
]
