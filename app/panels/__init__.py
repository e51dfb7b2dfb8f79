"""Panels: the named charts and tables that also live outside their page.

Every panel (``pair-heatmap``, ``pair-table``, ``input-types``, ``stages``,
``latency-timeline``, ``cache``, ``anomalies``, ``trace``) has three more addresses beside
its page: ``/embed/<panel>``, ``/render/<panel>.png`` and ``/render/<panel>.svg``
(``app/embed.py``). This package is what they share, with no Flask in it:

- ``query``: which query parameters a panel takes (exactly its page's: time, the filters
  its page shows, and its own selection such as the cache's ``group_by``), parsed strictly
  with ``app/params.py`` so a typo is a 400 naming the parameter, not a silently different
  view; and panel -> (query, figure or table) dispatch, calling the SAME pure query
  (``app/queries/``) and figure (``app/figures/``) functions as the Dash pages, so an
  embed shows what the page shows;
- ``tables``: tables as rows of plain text (the embed escapes them; an image draws them as
  a Plotly Table through :func:`figures.plot_text`);
- ``presentation``: the light/dark theme, table images, the figure JSON made safe for a
  ``<script>`` element, the embed's window text and links;
- ``sharing``: the URLs of :func:`share_urls` (``/api/v1/share`` and the pages' Share
  control).

Untrusted span text only ever reaches a figure through ``figures.plot_text`` and a table
cell through :func:`cell_text`; nothing from a span becomes a link.

Every name other code uses is re-exported here. These are copies: a test that patches a
constant or helper must patch it in the module that reads it (e.g. ``panels.query``).
"""

from __future__ import annotations

from .presentation import (ALERT_ROWS, DARK, TABLE_CELL_CHARS, THEMES, apply_theme, figure_json, image_size,
                           open_href, page_path, refresh_seconds, script_json, table_figure, table_height,
                           window_text)
from .query import (ALL_FILTERS, DEFAULT_CACHE_GROUP_BY, MAX_ANOMALY_WINDOW_S, PAIR_SORTABLE, PANEL_NAMES, PANELS,
                    TIME_KEYS, Built, Panel, PanelQuery, build, build_query, get_panel, panel_params, parse_query,
                    split_params)
from .sharing import DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS, iframe_snippet, parse_ttl, share_urls
from .tables import (MAX_TEXT, Table, anomalies_table, baseline_status, cell_text, input_types_table, pair_table,
                     subject_text)

__all__ = [
    "ALERT_ROWS", "ALL_FILTERS", "DARK", "DEFAULT_CACHE_GROUP_BY", "DEFAULT_TTL_SECONDS", "MAX_ANOMALY_WINDOW_S",
    "MAX_TEXT", "MIN_TTL_SECONDS", "PAIR_SORTABLE", "PANEL_NAMES", "PANELS", "TABLE_CELL_CHARS", "THEMES",
    "TIME_KEYS",
    "Built", "Panel", "PanelQuery", "Table",
    "anomalies_table", "apply_theme", "baseline_status", "build", "build_query", "cell_text", "figure_json",
    "get_panel", "iframe_snippet", "image_size", "input_types_table", "open_href", "page_path", "pair_table",
    "panel_params", "parse_query", "parse_ttl", "refresh_seconds", "script_json", "share_urls", "split_params",
    "subject_text", "table_figure", "table_height", "window_text",
]
