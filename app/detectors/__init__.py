"""The anomaly catalog (docs/design.md): one pure, documented function per kind.

Every detector takes :class:`Frames` (pandas frames read from the store by
``app/findings.py``, or built by hand in tests) and :class:`Thresholds`, and returns a list
of :class:`~modalscope.core.findings.Finding` (``finding`` builds one); its ``to_json()`` is
the object ``/api/v1/anomalies`` answers::

    {"kind", "severity", "subject", "start", "end", "evidence", "exemplar_trace_ids", "hint"}

Nothing here reads the database or the clock. Detectors know no service or span names:
they use stages, span kinds, the trace's input type and the conventions of docs/design.md
(``cache.name``/``cache.hit``, ``gpu.cuda_graph``, ``batch.size``,
``service.instance.id``). They are deliberately not trigger-happy:

* a block, series or group with fewer than ``min_samples`` samples fires nothing;
* a rate or share must hold over a whole block (``block_minutes``), so one outlier does
  not fire; the band break needs ``band_min_outliers`` calls past its threshold;
* nothing compares raw volume across time, so the daily curve is not an anomaly (load
  enters only as "high", relative to the median block);
* the band break compares against a trailing baseline of ``baseline_minutes`` (at least
  30) holding at least 30 minutes of the pair's own calls, frozen while the break lasts;
  it ends when the P99 stays under a lower exit threshold for two blocks.

Frames (one row each; ``minute`` is unix minutes; ``keys``/``counts`` a rollup's sparse
sketch, see ``models/sketch.py``):

* ``pairs``: caller, callee, minute, count, errors, keys, counts (``pair`` rollups)
* ``traces``: input_type, minute, count, errors, sum_ns, keys, counts (``trace`` rollups)
* ``tstage``: input_type, stage, minute, count, sum_ns (``tstage`` rollups)
* ``long_traces``: trace_id, root_service, input_type, start_ns, duration_ns, error
* ``cache``: service, cache, key, value, minute, count, misses (``cache`` rollups: lookups
  per tag value)
* ``batch``: service, minute, count, ones, sum (``batch`` rollups: spans with a numeric
  ``batch.size``, those of size 1, the sizes' sum)
* ``cuda``: service, name, fallback, minute, count, keys, counts (``cuda`` rollups)
* ``sync``: service, minute, count, keys, counts (``sync`` rollups: encoder spread a trace)
* ``spans``: trace_id, service, name, kind, stage, start_ns, duration_ns, status,
  instance, attrs (dict). Read from the store only around new instances (``cold_start``);
  hand-made frames may carry every span instead of the convention frames, which are then
  computed from them exactly as the settler does (``ingest/settle_fast.py``), and the
  detectors take exemplars and exact medians from them. From rollups alone, the
  attribute findings get their exemplars later (``describe_from_spans``, a bounded read).

One module a concern; each detector is ``detect_<kind>`` in:

* ``hot_spot``: ``hot_spot``;
* ``band_break``: ``p99_band_break``;
* ``conventions``: ``cache_penetration``, ``batching_failure``, ``cuda_graph_fallback`` (the
  span attribute conventions, computed from raw spans when there are no rollups);
* ``stages``: ``fusion_sync_wait``, ``preprocessing_bound``;
* ``lifecycle``: ``lb_timeout_truncation``, ``cold_start``, ``baseline_regression``;
* ``catalog``: ``DETECTORS`` (kind -> detector), ``run_all``, ``sort_findings``, and
  ``describe_from_spans`` (exemplars of attribute findings found from rollups);
* what they share: ``frames`` (``Thresholds``, ``Frames`` and their columns, ``finding``),
  ``hints`` (each kind's hint text), ``sketches`` (coarse latency matrices, quantiles, blocks
  and runs) and ``pairs`` (each pair's rows, sketches and matrices, for the pair detectors);
  the finding types (``Finding``, ``Subject``, ``Attribute``) are ``core.findings``'.

Every name other code uses is re-exported here. These are copies: a test that patches a
constant must patch it in the module that reads it (e.g. ``detectors.band_break``).
"""

from __future__ import annotations

from ...core.findings import Attribute, Finding, Subject
from ...models import sketch
from .band_break import (BAND_BASELINE_DATA_MINUTES, BAND_CALM_BLOCKS, BAND_CHUNK_MINUTES, BAND_ENTRY_P, BAND_HOT_P,
                         BAND_MEDIAN_Z, _binomial_tail, _excess_p, _median_moved, detect_p99_band_break)
from .catalog import ATTRIBUTE_KINDS, DETECTORS, describe_from_spans, run_all, sort_findings
from .conventions import (BATCH_COLUMNS, CACHE_COLUMNS, CUDA_COLUMNS, MAX_TAG_VALUES, SYNC_COLUMNS, _penetrated,
                          cuda_hint, detect_batching_failure, detect_cache_penetration, detect_cuda_graph_fallback)
from .frames import (KIND_SERVER_CODES, LONG_TRACE_COLUMNS, MAX_EXEMPLARS, NS_MIN, PAIR_COLUMNS, SETTINGS,
                     SEVERITY_ORDER, SPAN_COLUMNS, STATUS_ERROR_CODE, TRACE_COLUMNS, TSTAGE_COLUMNS, Frames, Thresholds,
                     empty_frame, exemplar_ids, finding, histogram_of, rfc3339)
from .hints import HINTS
from .hot_spot import HOT_CELLS_CHUNK, VOLUME_TIE, _hot_cells, detect_hot_spot
from .lifecycle import (COLD_STEADY_NS, cold_start_candidate, cold_start_histograms_candidate,
                        detect_baseline_regression, detect_cold_start, detect_lb_timeout_truncation)
from .pairs import (SHARED_MATRICES_BYTES, _pair_block_matrix, _pair_flats, _pair_groups, _pair_minute_matrices,
                    _pair_minute_matrix, _pair_rows_histogram, _pair_series)
from .sketches import (COARSE, ROW_QUANTILE_CELLS, _block_of, _blocks, _coarse_quantile, _coarse_rows, _counts_above,
                       _flat_sketches, _row_quantiles)
from .stages import SYNC_STAGES, _encoder_ends, detect_fusion_sync_wait, detect_preprocessing_bound

__all__ = [
    "ATTRIBUTE_KINDS", "Attribute", "BAND_BASELINE_DATA_MINUTES", "BAND_CALM_BLOCKS", "BAND_CHUNK_MINUTES", "BAND_ENTRY_P",
    "BAND_HOT_P", "BAND_MEDIAN_Z", "BATCH_COLUMNS", "CACHE_COLUMNS", "COARSE", "COLD_STEADY_NS", "CUDA_COLUMNS",
    "DETECTORS", "Finding", "Frames", "HINTS", "HOT_CELLS_CHUNK", "KIND_SERVER_CODES", "LONG_TRACE_COLUMNS", "MAX_EXEMPLARS",
    "MAX_TAG_VALUES", "NS_MIN", "PAIR_COLUMNS", "ROW_QUANTILE_CELLS", "SETTINGS", "SEVERITY_ORDER",
    "SHARED_MATRICES_BYTES", "SPAN_COLUMNS", "STATUS_ERROR_CODE", "Subject", "SYNC_COLUMNS", "SYNC_STAGES", "TRACE_COLUMNS",
    "TSTAGE_COLUMNS", "Thresholds", "VOLUME_TIE", "cold_start_candidate", "cold_start_histograms_candidate",
    "cuda_hint", "describe_from_spans", "detect_baseline_regression", "detect_batching_failure",
    "detect_cache_penetration", "detect_cold_start", "detect_cuda_graph_fallback", "detect_fusion_sync_wait",
    "detect_hot_spot", "detect_lb_timeout_truncation", "detect_p99_band_break", "detect_preprocessing_bound",
    "empty_frame", "exemplar_ids", "finding", "histogram_of", "rfc3339", "run_all", "sketch", "sort_findings",
    # private helpers the tests call directly
    "_binomial_tail", "_block_of", "_blocks", "_coarse_quantile", "_coarse_rows", "_counts_above", "_encoder_ends",
    "_excess_p", "_flat_sketches", "_hot_cells", "_median_moved", "_pair_block_matrix", "_pair_flats",
    "_pair_groups", "_pair_minute_matrices", "_pair_minute_matrix", "_pair_rows_histogram", "_pair_series",
    "_penetrated", "_row_quantiles",
]
