"""Pure figure builders: rows from ``app.queries`` in, a ``plotly.graph_objects.Figure`` out.

No database, no Dash: every builder is tested on its own. Untrusted text (service and
span names, attribute values) reaches Plotly only through :func:`plot_text`, which
escapes ``<``, ``>`` and ``&``: Plotly renders a small HTML subset (``<a href>``,
``<b>``, ...) in labels and hover text, and entities come back out as literal text.

One module per kind of chart:

* ``theme``: the palette, ``plot_text``, ``base_layout``, ``dict_figure``, ``empty_figure``;
* ``latency``: the pair heatmap, latency histogram, percentiles and traffic over time,
  tokens against duration;
* ``stages``: stage time per input type and over time, ViT layers, Compare's stages;
* ``trace``: one trace's waterfall and flame graph;
* ``cache``: hit rates and lookup shares;
* ``evidence``: a finding's evidence over time.

Every name other code uses is re-exported here. These are copies: a test that patches a
constant or helper must patch it in the module that reads it (e.g. ``figures.trace``), with
one exception, ``VALIDATE`` below, which the builders read from this package.
"""

from __future__ import annotations

from .cache import GROUP_COLORS, cache_hit_rate_figure, cache_share_figure, group_label
from .evidence import EVIDENCE_LINE_COLORS, EVIDENCE_UNITS, evidence_figure
from .latency import (BAND_FILL, TOKEN_COLORS, latency_histogram, pair_heatmap, pair_label,
                      percentile_timeseries, tokens_latency_scatter, traffic_figure)
from .stages import compare_stage_figure, stage_stack, stage_timeseries, vit_layers_figure
from .theme import (ACCENT, CRITICAL, DANGER, FONT, GRID, HEAT_SCALE, INK, INPUT_TYPE_COLORS, MUTED,
                    PCT_STYLE, STAGE_COLORS, UNSAFE_CHARS, base_layout, dict_figure, empty_figure,
                    input_type_color, log_ticks, plot_text, stage_color)
from .trace import (BAR_WIDTH, LABEL_PX, ROW_PX, SECONDS_FROM_MS, SELECTED_BAND, WATERFALL_ROWS,
                    hidden_summary, icicle, waterfall, waterfall_rows)

# Figures built from plain dicts skip plotly's per-property validation (most of the cost of
# a chart of many traces). Only for builders whose every property is tested to
# validate: tests/app/test_figures.py builds them once with VALIDATE = True and compares.
# (``theme.dict_figure`` reads it here at each build, so setting it on the package works.)
VALIDATE = False

__all__ = [
    "ACCENT", "BAND_FILL", "BAR_WIDTH", "CRITICAL", "DANGER", "EVIDENCE_LINE_COLORS", "EVIDENCE_UNITS", "FONT",
    "GRID", "GROUP_COLORS", "HEAT_SCALE", "INK", "INPUT_TYPE_COLORS", "LABEL_PX", "MUTED", "PCT_STYLE", "ROW_PX",
    "SECONDS_FROM_MS", "SELECTED_BAND", "STAGE_COLORS", "TOKEN_COLORS", "UNSAFE_CHARS", "VALIDATE",
    "WATERFALL_ROWS",
    "base_layout", "cache_hit_rate_figure", "cache_share_figure", "compare_stage_figure", "dict_figure",
    "empty_figure", "evidence_figure", "group_label", "hidden_summary", "icicle", "input_type_color",
    "latency_histogram", "log_ticks", "pair_heatmap", "pair_label", "percentile_timeseries", "plot_text",
    "stage_color", "stage_stack", "stage_timeseries", "tokens_latency_scatter", "traffic_figure",
    "vit_layers_figure", "waterfall", "waterfall_rows",
]
