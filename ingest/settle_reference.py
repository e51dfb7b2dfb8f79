"""The reference settle of one trace, over span records: what ``settle_fast`` computes for
many traces at once with arrays, and is tested against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..core.series import SeriesKind
from ..core.spans import KIND_CONSUMER, KIND_SERVER, STATUS_ERROR, SpanRecord
from .series import series_key
from .settle_fast import LAYER_KEY, convention_contributions
from .settle_rows import NS_PER_MINUTE
from .traces import (_text_value, effective_stages, find_root, input_type_of, model_call_spans, self_times,
                     signals_of, token_entries, trace_calls, trace_duration_ns, trace_error)


@dataclass
class SettledTrace:
    trace_id: str
    root_service: str | None
    root_name: str | None
    start_ns: int
    duration_ns: int
    span_count: int
    error: bool
    input_type: str
    contributions: list[tuple[tuple[str, ...], int, int, int]]  # (series key, minute, value_ns, err)


def summarize_trace(trace_id: str, spans: list[SpanRecord],
                    linked: Mapping[tuple[str, str], SpanRecord] | None = None) -> SettledTrace:
    """Pure: everything a settled trace stores, from its spans (``linked``: spans of other
    traces that CONSUMER spans' links point at, keyed (trace_id, span_id)).

    Stages are the spans' tagged ones corrected by ``traces.resolve_stages`` (a transport
    span under a model call counts in the model call's stage)."""
    # Duplicate span ids cannot be stored, but be safe for callers passing raw input.
    root = find_root(spans)
    input_type = input_type_of(spans)
    stage_of = effective_stages(spans)
    start_ns = min(s.start_ns for s in spans)
    duration = trace_duration_ns(spans)
    error = trace_error(spans)
    contribs: list[tuple[tuple[str, ...], int, int, int]] = []
    for s in spans:
        stage = stage_of.get(s.span_id, s.stage) or "other"
        contribs.append((
            series_key(SeriesKind.OP, s.service, s.name, stage, input_type),
            s.start_ns // NS_PER_MINUTE, s.end_ns - s.start_ns, int(s.status == STATUS_ERROR),
        ))
        layer = s.attributes.get(LAYER_KEY) if s.attributes else None
        if isinstance(layer, str):
            contribs.append((
                series_key(SeriesKind.LAYER, s.service, s.name, stage, input_type, callee=layer),
                s.start_ns // NS_PER_MINUTE, s.end_ns - s.start_ns, int(s.status == STATUS_ERROR),
            ))
    for call in trace_calls(spans, linked).values():
        contribs.append((
            series_key(SeriesKind.PAIR, name=call.model, stage=call.stage, input_type=input_type, caller=call.caller,
                       callee=call.callee),
            call.start_ns // NS_PER_MINUTE, call.duration_ns, int(call.error),
        ))
    trace_minute = (root.start_ns if root is not None else start_ns) // NS_PER_MINUTE
    root_service = root.service if root is not None else None
    contribs.append((series_key(SeriesKind.TRACE, service=root_service or "", input_type=input_type),
                     trace_minute, duration, int(error)))
    stage_time: dict[str, int] = {}
    selfs = self_times(spans)
    for s in spans:
        st = stage_of.get(s.span_id, s.stage) or "other"
        stage_time[st] = stage_time.get(st, 0) + selfs.get(s.span_id, 0)
    for st, total in sorted(stage_time.items()):
        contribs.append((series_key(SeriesKind.TRACE_STAGE, service=root_service or "", stage=st, input_type=input_type),
                         trace_minute, total, 0))
    for s in model_call_spans(spans):
        sig = signals_of(s)
        for key, n in token_entries(sig):
            contribs.append((series_key(SeriesKind.TOKENS, s.service, _text_value(sig, "model"), "", input_type,
                                        _text_value(sig, "provider"), key), s.start_ns // NS_PER_MINUTE, n, 0))
    contribs.extend(_convention_contributions(spans, stage_of))
    return SettledTrace(
        trace_id=trace_id,
        root_service=root_service,
        root_name=root.name if root is not None else None,
        start_ns=root.start_ns if root is not None else start_ns,
        duration_ns=duration,
        span_count=len(spans),
        error=error,
        input_type=input_type,
        contributions=contribs,
    )


def _convention_contributions(spans: list[SpanRecord], stage_of: Mapping[str, str | None]
                              ) -> list[tuple[tuple[str, ...], int, int, int]]:
    """The trace's ``cache``/``batch``/``cuda``/``sync``/``inst`` contributions (the series
    kinds are described in ``settle_fast``), span by span: the reference the batch path is
    tested against. ``stage_of``: span_id -> the stage settling counts."""
    out = []
    for s in spans:
        if s.attributes:
            out.extend(convention_contributions(s.service, s.name, s.start_ns, max(s.end_ns - s.start_ns, 0),
                                                s.attributes, s.resource))
    ordered = sorted(spans, key=lambda s: (s.start_ns, s.span_id))
    servers = [s for s in ordered if s.kind in (KIND_SERVER, KIND_CONSUMER)]
    fusion = [s for s in servers if stage_of.get(s.span_id, s.stage) == "fusion"]
    encoder_end: dict[str, int] = {}
    encoder_start: int | None = None
    for s in servers:
        if stage_of.get(s.span_id, s.stage) == "encoder":
            end = s.start_ns + max(s.end_ns - s.start_ns, 0)
            encoder_end[s.service] = max(encoder_end.get(s.service, end), end)
            encoder_start = s.start_ns if encoder_start is None else min(encoder_start, s.start_ns)
    if fusion and len(encoder_end) >= 2:
        out.append((series_key(SeriesKind.SYNC, fusion[0].service), encoder_start // NS_PER_MINUTE,
                    max(encoder_end.values()) - min(encoder_end.values()), 0))
    first_on: dict[tuple[str, str], SpanRecord] = {}
    for s in servers:
        inst = s.resource.get("service.instance.id")
        if inst is not None and str(inst):
            first_on.setdefault((s.service, str(inst)), s)
    for (service, inst), s in first_on.items():
        out.append((series_key(SeriesKind.INSTANCE, service, inst), s.start_ns // NS_PER_MINUTE,
                    max(s.end_ns - s.start_ns, 0), 0))
    return out
