"""Whole-trace facts, computed when a trace settles: pure functions, no database.

Every function takes one trace's spans as a list of :class:`SpanRecord` (stages already
tagged where it matters) and copes with what real traces look like:

- no root yet (the root span arrives last, or never): see each function;
- orphans, whose parent is not among the spans: they are simply nobody's child;
- duplicate span ids: the first occurrence in the list wins, later ones are ignored;
- zero-duration spans and spans with ``end < start`` (treated as zero-length);
- children that start before or end after their parent: clipped to the parent.

A *root* is a span whose ``parent_span_id`` is None (or empty); with several, the one that
starts first (then the first in the list).

The functions live in one module per concern, and are imported from here: ``trace_spans``
(root, duration, error, self times), ``trace_signals`` (signals, input type, inherited
stages), ``trace_pairs`` (calls, service pairs, token usage) and ``trace_critical_path``.
"""

from __future__ import annotations

# _text_value too: the settler reads model and provider from signals as the calls do.
from .trace_critical_path import CRITICAL_SKEW_NS, critical_path, critical_path_segments
from .trace_pairs import (TOKEN_KEYS, Call, _text_value, address_callee, link_targets, model_call_spans,
                          service_pairs, token_entries, trace_calls)
from .trace_signals import (LEGACY_SIGNAL_KEYS, LEGACY_SIGNAL_NEEDLES, effective_stages, input_type_of,
                            legacy_signals, resolve_stages, signals_of)
from .trace_spans import find_root, self_times, trace_duration_ns, trace_error, unique_spans

__all__ = [
    "Call",
    "address_callee",
    "critical_path",
    "critical_path_segments",
    "find_root",
    "effective_stages",
    "input_type_of",
    "link_targets",
    "model_call_spans",
    "resolve_stages",
    "self_times",
    "service_pairs",
    "signals_of",
    "token_entries",
    "trace_duration_ns",
    "trace_calls",
    "trace_error",
    "unique_spans",
]
