"""The shell every page shares: navigation, the time/filter toolbar, empty states, tables.

Layout builders are plain functions; the callbacks that serve the shell (nav links that
keep the window and filters, the toolbar writing the URL, the filter pickers' options)
are registered by :func:`register_callbacks`, which ``create_app`` calls once per app.
Everything here renders untrusted text as Dash text children (React escapes them),
never as Markdown or raw HTML.

One module per piece of the shell:

* ``layout``: the page frame, nav, panels, empty states, ``reader()``;
* ``tables``: text tables and their cells, the exemplar table;
* ``filters``: the toolbar and its pickers' options;
* ``callbacks``: ``register_callbacks`` and the chart-narrowing answer;
* ``cards``: findings and incidents as cards, their measures and links;
* ``sharing``: the Share control and its signing callback.

Every name other code uses is re-exported here. These are copies: a test that patches a
constant or helper must patch it in the module that reads it (e.g. ``components.filters``).
"""

from __future__ import annotations

from .callbacks import narrow, register_callbacks, rendering
from .cards import (MEASURES, SEVERITY_ORDER, asked_suspects, evaluation_note, evidence_text, find_findings,
                    finding_links, finding_measure, finding_title, fmt_pct_safe, incident_card, incident_cause,
                    incident_headline, kind_text, span_text, subject_text, suspects_line, thresholds, top_findings)
from .filters import FILTER_OPTIONS, OPTION_LABEL_CHARS, option_label, toolbar, toolbar_options
from .layout import (EMPTY_HINT, NAV_ITEMS, account_links, banner, empty_state, graph, loading, no_data, panel,
                     reader, shell)
from .sharing import SHARE_TTLS, register_share_callback, share_control, share_values
from .tables import LONG_WORD, cell_text, exemplar_table, is_number_text, numeric_columns, text_table

__all__ = [
    "EMPTY_HINT", "FILTER_OPTIONS", "LONG_WORD", "MEASURES", "NAV_ITEMS", "OPTION_LABEL_CHARS", "SEVERITY_ORDER",
    "SHARE_TTLS",
    "account_links", "asked_suspects", "banner", "cell_text", "empty_state", "evaluation_note", "evidence_text",
    "exemplar_table",
    "find_findings", "finding_links", "finding_measure", "finding_title", "fmt_pct_safe", "graph",
    "incident_card", "incident_cause", "incident_headline", "is_number_text", "kind_text", "loading", "narrow",
    "no_data", "numeric_columns", "option_label", "panel", "reader", "register_callbacks",
    "register_share_callback", "rendering", "share_control", "share_values", "shell", "span_text",
    "subject_text", "suspects_line", "text_table", "thresholds", "toolbar", "toolbar_options", "top_findings",
]
