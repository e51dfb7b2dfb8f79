"""A trace's signals, input type and inherited stages.

Pure functions over one trace's spans (:class:`SpanRecord`), no database (see ``traces``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .records import KIND_CONSUMER, KIND_SERVER, SpanRecord
from .signals import span_signals, trace_input_type
from .stages import apply_parent_stages
from .trace_spans import find_root, unique_spans

_CALLEE_KINDS = frozenset((KIND_SERVER, KIND_CONSUMER))

# Spans stored before ``spans.signals`` existed (and spans that said nothing) have none: their
# signals are read again from the attributes when one of them starts with these (the keys
# ``span_signals`` reads). The batch path uses them as substring needles on the JSON text.
LEGACY_SIGNAL_KEYS = ("mm.input_type", "mm.image_count", "mm.audio_count", "mm.video_count",
                      "mm.prompt_chars", "gen_ai.", "openinference.", "llm.")
LEGACY_SIGNAL_NEEDLES = tuple('"' + k for k in LEGACY_SIGNAL_KEYS)


def legacy_signals(span: SpanRecord) -> dict[str, Any] | None:
    """Signals read from a span's attributes when none were stored (see LEGACY_SIGNAL_KEYS)."""
    if any(k.startswith(LEGACY_SIGNAL_KEYS) for k in span.attributes):
        return span_signals(span)
    return None


def signals_of(span: SpanRecord) -> dict[str, Any] | None:
    """The span's stored signals, else those its attributes give (``legacy_signals``)."""
    sig = span.signals
    if not sig:
        return legacy_signals(span) if span.attributes else None
    return sig if isinstance(sig, dict) else None


def input_type_of(spans: Iterable[SpanRecord]) -> str:
    """The trace's input type (docs/design.md "Input types"), from every span's signals.

    ``signals.trace_input_type`` over the spans' signals (``signals_of``), the root's first,
    then by start time (list order breaks ties): an explicit ``mm.input_type`` first, then
    ``mm.*`` counts, media parts of model requests, media in the token usage, a model call
    or a prompt (``text``); ``unknown`` when nothing says.
    """
    spans = unique_spans(spans)
    if not spans:
        return "unknown"
    root = find_root(spans)
    ordered = sorted(spans, key=lambda s: s.start_ns)  # stable: list order breaks ties
    sigs = [signals_of(root)] if root is not None else []
    sigs.extend(signals_of(s) for s in ordered if s is not root)
    return trace_input_type(sigs)


@dataclass(slots=True)
class _StageView:
    """What ``stages.apply_parent_stages`` reads and sets, so the caller's spans stay as
    they are."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    service: str
    kind: int
    stage: str | None
    signals: dict[str, Any] | None


def resolve_stages(spans: Iterable[SpanRecord]) -> dict[str, tuple[str | None, bool]]:
    """span_id -> (stage, inherited) for the spans whose signals carry ``inh`` (a transport
    span that may sit under a model call; docs/design.md "Stages").

    The rule is ``stages.apply_parent_stages`` over the whole trace: such a span takes its
    parent's stage when the parent is in the same service, is a model call (its signals
    have ``call``) and the span has no SERVER/CONSUMER child (no instrumented callee);
    otherwise it keeps the fallback stage ``inh`` names. ``inherited`` says the first case
    held. Other spans keep their tagged stage and are not in the result.
    """
    spans = unique_spans(spans)
    views = [_StageView(s.trace_id, s.span_id, s.parent_span_id, s.service, s.kind, s.stage, signals_of(s))
             for s in spans]
    heirs = [v for v in views if v.signals and v.signals.get("inh")]
    if not heirs:
        return {}
    apply_parent_stages(views)
    by_id: dict[str, _StageView] = {}
    for v in views:
        by_id.setdefault(v.span_id, v)
    with_callee = {v.parent_span_id for v in views if v.kind in _CALLEE_KINDS and v.parent_span_id}
    out: dict[str, tuple[str | None, bool]] = {}
    for v in heirs:
        pid = v.parent_span_id
        parent = by_id.get(pid) if pid and pid != v.span_id else None
        inherited = (parent is not None and parent.service == v.service and v.span_id not in with_callee
                     and bool(parent.signals and parent.signals.get("call")))
        out[v.span_id] = (v.stage, inherited)
    return out


def effective_stages(spans: Iterable[SpanRecord]) -> dict[str, str | None]:
    """span_id -> the stage settling counts the span in: its tagged stage, corrected by
    ``resolve_stages`` for transport spans under a model call."""
    spans = unique_spans(spans)
    out = {s.span_id: s.stage for s in spans}
    for span_id, (stage, _) in resolve_stages(spans).items():
        out[span_id] = stage
    return out
