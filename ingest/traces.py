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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from .records import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_PRODUCER,
    KIND_SERVER,
    STATUS_ERROR,
    SpanRecord,
)
from .signals import span_signals, trace_input_type
from .stages import apply_parent_stages

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

_CALLEE_KINDS = frozenset((KIND_SERVER, KIND_CONSUMER))
_URL_KEYS = ("url.full", "http.url")  # http.url: the pre-1.21 name


def unique_spans(spans: Iterable[SpanRecord]) -> list[SpanRecord]:
    """The spans with duplicate span ids removed (the first occurrence wins)."""
    if isinstance(spans, list) and len({s.span_id for s in spans}) == len(spans):
        return spans  # the common case: stored spans are unique already
    seen: set[str] = set()
    out: list[SpanRecord] = []
    for span in spans:
        if span.span_id not in seen:
            seen.add(span.span_id)
            out.append(span)
    return out


def _end(span: SpanRecord) -> int:
    """End time, never before the start."""
    return span.end_ns if span.end_ns > span.start_ns else span.start_ns


def _children_by_parent(spans: Sequence[SpanRecord]) -> dict[str, list[SpanRecord]]:
    children: dict[str, list[SpanRecord]] = {}
    for span in spans:
        parent = span.parent_span_id
        if parent and parent != span.span_id:
            children.setdefault(parent, []).append(span)
    return children


def find_root(spans: Iterable[SpanRecord]) -> SpanRecord | None:
    """The root span: no parent; with several, the earliest start. None when there is none."""
    root = None
    for span in unique_spans(spans):
        if not span.parent_span_id and (root is None or span.start_ns < root.start_ns):
            root = span
    return root


def trace_duration_ns(spans: Iterable[SpanRecord]) -> int:
    """The root span's duration; without a root, last end minus first start (0 if empty)."""
    spans = unique_spans(spans)
    root = find_root(spans)
    if root is not None:
        return root.duration_ns
    if not spans:
        return 0
    return max(0, max(_end(s) for s in spans) - min(s.start_ns for s in spans))


def trace_error(spans: Iterable[SpanRecord]) -> bool:
    """True when any span has status ERROR."""
    return any(span.status == STATUS_ERROR for span in unique_spans(spans))


# --------------------------------------------------------------------------------------
# Signals, input type, inherited stages
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Self time
# --------------------------------------------------------------------------------------


def _union_within(start: int, end: int, intervals: list[tuple[int, int]]) -> int:
    """Length of the union of ``intervals`` clipped to [start, end]."""
    clipped = []
    for s, e in intervals:
        s = max(s, start)
        e = min(e, end)
        if e > s:
            clipped.append((s, e))
    if not clipped:
        return 0
    clipped.sort()
    total = 0
    cur_s, cur_e = clipped[0]
    for s, e in clipped[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + (cur_e - cur_s)


def self_times(spans: Iterable[SpanRecord]) -> dict[str, int]:
    """span_id -> self time in ns: duration minus the union of its children's intervals.

    Children are the spans whose ``parent_span_id`` is this span's id, clipped to this
    span's interval, so overlapping (concurrent) children are counted once and children
    running past their parent take nothing outside it. O(n log n).

    Note: the self times of a trace add up to its duration when siblings run one after
    another; concurrent siblings each keep their own self time, so the sum then exceeds
    the end-to-end latency (see :func:`critical_path_segments` for an exact split).
    """
    spans = unique_spans(spans)
    children = _children_by_parent(spans)
    out: dict[str, int] = {}
    for span in spans:
        start, end = span.start_ns, _end(span)
        kids = children.get(span.span_id)
        if not kids:
            out[span.span_id] = end - start
            continue
        covered = _union_within(start, end, [(k.start_ns, _end(k)) for k in kids])
        out[span.span_id] = end - start - covered
    return out


# --------------------------------------------------------------------------------------
# Service pairs
# --------------------------------------------------------------------------------------


def _attr_text(attributes: dict[str, Any], key: str) -> str | None:
    value = attributes.get(key)
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip()
    return text or None


def _port(value: Any) -> int | None:
    """A port attribute as a number (ints, integral floats, digit strings), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            return None
        value = int(value)
    elif isinstance(value, str):
        value = value.strip()
        if not value.isdigit():
            return None
        value = int(value)
    elif not isinstance(value, int):
        return None
    return value if 0 < value < 65536 else None


def _host_port(host: str, port: int | None) -> str:
    if port is None:
        return host
    if ":" in host and not host.startswith("["):  # IPv6 literal
        host = f"[{host}]"
    return f"{host}:{port}"


def _url_host_port(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        host = parts.hostname
        if not host:
            return None
        try:
            port = parts.port
        except ValueError:  # a port that is no number: the host alone
            port = None
    except ValueError:
        return None
    return _host_port(host, _port(port))


def address_callee(attributes: dict[str, Any]) -> str | None:
    """The callee an uninstrumented call's attributes name (docs/design.md "Service pairs"), best
    first: ``peer.service``; ``server.address`` with ``:server.port`` when present; host and
    port of ``url.full``, then of ``http.url``; ``net.peer.name`` with ``:net.peer.port``.
    Two APIs on one host with different ports are two callees. None when nothing names it."""
    if not attributes:
        return None
    callee = _attr_text(attributes, "peer.service")
    if callee:
        return callee
    host = _attr_text(attributes, "server.address")
    if host:
        return _host_port(host, _port(attributes.get("server.port")))
    for key in _URL_KEYS:
        url = _attr_text(attributes, key)
        if url:
            callee = _url_host_port(url)
            if callee:
                return callee
    host = _attr_text(attributes, "net.peer.name")
    if host:
        return _host_port(host, _port(attributes.get("net.peer.port")))
    return None


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a service pair. ``model``: a model call's requested model ('' otherwise),
    the pair's facet. A hand-off starts at the producer's start and lasts until the consumer
    ends (queue time included); it is keyed by the consumer span."""

    caller: str
    callee: str
    model: str
    start_ns: int
    duration_ns: int
    error: bool
    stage: str = "other"  # the calling span's (a hand-off's: the producer's), after inheritance


def _text_value(sig: dict[str, Any], key: str) -> str:
    value = sig.get(key)
    if value is None or isinstance(value, (dict, list, bool)):
        return ""
    return str(value).strip()


TOKEN_KEYS = ("text", "image", "audio", "video", "total")
"""Input-token keys of a model call's ``tok`` signal, in the order its entries are made;
output tokens are keyed ``"output"``."""
_MAX_TOKENS = 1 << 53  # past any real usage; keeps sums inside int64


def token_entries(sig: Mapping[str, Any] | None) -> list[tuple[str, int]]:
    """(key, count) of a model call's token usage (its signals' ``tok``): one entry per input
    key it carries (``TOKEN_KEYS``) and ``"output"`` for output tokens. Only non-negative
    integers count (a count past 2**53 is clipped); anything else is left out."""
    tok = sig.get("tok") if sig else None
    if not isinstance(tok, dict):
        return []
    out: list[tuple[str, int]] = []
    tok_in = tok.get("in")
    if isinstance(tok_in, dict):
        for key in TOKEN_KEYS:
            n = tok_in.get(key)
            if type(n) is int and n >= 0:
                out.append((key, min(n, _MAX_TOKENS)))
    n = tok.get("out")
    if type(n) is int and n >= 0:
        out.append(("output", min(n, _MAX_TOKENS)))
    return out


def _outer_model_calls(spans: Sequence[SpanRecord], by_id: Mapping[str, SpanRecord],
                       callers: Sequence[SpanRecord]) -> set[str]:
    """Ids of the model calls that wrap another model call of their own service (see
    ``trace_calls``): from each model call up through its ancestors while they stay in its
    service, every model call met is an outer one."""
    if len(callers) < 2:
        return set()
    is_caller = {s.span_id for s in callers}
    outer: set[str] = set()
    for span in callers:
        seen = {span.span_id}
        pid = span.parent_span_id
        while pid and pid not in seen:
            parent = by_id.get(pid)
            if parent is None or parent.service != span.service:
                break
            if parent.span_id in is_caller:
                outer.add(parent.span_id)
            seen.add(pid)
            pid = parent.parent_span_id
    return outer


def model_call_spans(spans: Iterable[SpanRecord]) -> list[SpanRecord]:
    """The spans that make the trace's model calls, each call once (``trace_calls`` rule 1):
    model calls (signals ``call``) that are no SERVER/CONSUMER span and wrap no other model
    call of their own service. Their signals' ``tok`` is the trace's token usage."""
    spans = unique_spans(spans)
    callers = _model_callers(spans)
    outer = _outer_model_calls(spans, {s.span_id: s for s in spans}, callers)
    return [s for s in callers if s.span_id not in outer]


def _model_callers(spans: Sequence[SpanRecord]) -> list[SpanRecord]:
    out = []
    for span in spans:
        if span.kind not in _CALLEE_KINDS:
            sig = signals_of(span)
            if sig and sig.get("call"):
                out.append(span)
    return out


def trace_calls(spans: Iterable[SpanRecord],
                linked: Mapping[tuple[str, str], SpanRecord] | None = None) -> dict[str, Call]:
    """span_id -> the :class:`Call` the span makes, per docs/design.md "Service pairs"; a span
    makes at most one, first match wins:

    1. A model call (signals ``call``) of any kind but SERVER/CONSUMER (the serving side is
       the callee): a child SERVER/CONSUMER span in another service (the earliest starting:
       an instrumented model server), else its ``provider``, else ``address_callee``, else
       a child SERVER/CONSUMER span in the same service. The model is the pair's facet.
    2. A CLIENT span: the same without the provider. A transport span whose stage it took
       from a model-call parent (``resolve_stages``) makes none: its time is the model call's.
    3. A CONSUMER span: a hand-off from its PRODUCER parent, else from the PRODUCER span
       its links point at (in this trace, else in ``linked``, keyed (trace_id, span_id);
       with several, the earliest start, then the smallest ids). Caller is the producer's
       service, callee the consumer's; the call runs from the producer's start to the
       consumer's end; it fails when either span does.

    Calls other than hand-offs take the span's own start, duration, status and stage (a
    hand-off the producer's stage): the pair series' stage, so a stage filter on pairs keeps
    the calls made from that stage (a model call's is inference).
    Cloud Trace RPC_CLIENT / RPC_SERVER spans arrive as CLIENT / SERVER and pair the same way.

    One call, one pair: a model call that wraps another model call of its own service (the
    inner one is a descendant reached through spans of that service only) makes none, of
    any kind. Two instrumentations of one call nest this way (an OpenInference LLM span
    around the OTel GenAI CLIENT span of the SDK call); the innermost span is the one next
    to the wire, whose children name an instrumented callee. A model call whose inner call
    runs in another service (an agent calling a model server that calls a model) keeps its
    pair: those are two calls. ``model_call_spans`` gives the counted model calls.
    """
    spans = unique_spans(spans)
    by_id: dict[str, SpanRecord] = {s.span_id: s for s in spans}
    servers: dict[str, list[SpanRecord]] = {}
    for span in spans:
        if span.kind in _CALLEE_KINDS and span.parent_span_id and span.parent_span_id != span.span_id:
            servers.setdefault(span.parent_span_id, []).append(span)
    resolved = resolve_stages(spans)
    inherited = {k for k, (_, inh) in resolved.items() if inh}

    def stage_of(sp: SpanRecord) -> str:
        hit = resolved.get(sp.span_id)
        return (hit[0] if hit is not None else sp.stage) or "other"

    outer = _outer_model_calls(spans, by_id, _model_callers(spans))
    calls: dict[str, Call] = {}
    for span in spans:
        kind = span.kind
        if span.span_id in outer:
            continue
        sig = signals_of(span)
        # The serving side of a model call (a SERVER span with GenAI attributes) is the
        # callee, not a caller: its client's span makes the pair.
        model_call = bool(sig and sig.get("call")) and kind not in _CALLEE_KINDS
        if not model_call and kind != KIND_CLIENT and kind != KIND_CONSUMER:
            continue
        if kind == KIND_CONSUMER and not model_call:
            producer = _producer_of(span, by_id, linked)
            if producer is not None:
                calls[span.span_id] = Call(producer.service, span.service, "", producer.start_ns,
                                           max(0, _end(span) - producer.start_ns),
                                           producer.status == STATUS_ERROR or span.status == STATUS_ERROR,
                                           stage_of(producer))
            continue
        if kind == KIND_CLIENT and not model_call and span.span_id in inherited:
            continue
        callee = _callee_of(span, servers.get(span.span_id, ()), _text_value(sig, "provider") if model_call else "")
        if callee:
            calls[span.span_id] = Call(span.service, callee, _text_value(sig, "model") if model_call else "",
                                       span.start_ns, span.duration_ns, span.status == STATUS_ERROR,
                                       stage_of(span))
    return calls


def _callee_of(span: SpanRecord, kids: Iterable[SpanRecord], provider: str) -> str | None:
    kids = [k for k in kids if k.span_id != span.span_id]
    other = [k for k in kids if k.service != span.service]
    if other:
        return min(other, key=lambda k: k.start_ns).service
    callee = provider or address_callee(span.attributes)
    if not callee and kids:
        callee = span.service
    return callee


def link_targets(links: Any) -> list[tuple[str, str]]:
    """(trace_id, span_id) of each well-formed entry of a span's links."""
    out: list[tuple[str, str]] = []
    if not isinstance(links, list):
        return out
    for link in links:
        if isinstance(link, dict):
            tid, sid = link.get("trace_id"), link.get("span_id")
            if isinstance(tid, str) and isinstance(sid, str) and tid and sid:
                out.append((tid, sid))
    return out


def _producer_of(span: SpanRecord, by_id: Mapping[str, SpanRecord],
                 linked: Mapping[tuple[str, str], SpanRecord] | None) -> SpanRecord | None:
    parent = by_id.get(span.parent_span_id) if span.parent_span_id and span.parent_span_id != span.span_id else None
    if parent is not None and parent.kind == KIND_PRODUCER:
        return parent
    best = None
    for tid, sid in link_targets(span.links):
        if tid == span.trace_id and sid == span.span_id:
            continue
        target = by_id.get(sid) if tid == span.trace_id else None
        if target is None and linked is not None:
            target = linked.get((tid, sid))
        if target is not None and target.kind == KIND_PRODUCER:
            key = (target.start_ns, tid, sid)
            if best is None or key < best[0]:
                best = (key, target)
    return best[1] if best is not None else None


def service_pairs(spans: Iterable[SpanRecord],
                  linked: Mapping[tuple[str, str], SpanRecord] | None = None) -> dict[str, tuple[str, str]]:
    """span_id -> (caller, callee) of every call the trace makes (``trace_calls``)."""
    return {span_id: (c.caller, c.callee) for span_id, c in trace_calls(spans, linked).items()}


# --------------------------------------------------------------------------------------
# Critical path
# --------------------------------------------------------------------------------------

#: Clock skew between hosts that an overlap of this size or less is taken for (NTP keeps
#: hosts in one region within a few milliseconds of each other).
CRITICAL_SKEW_NS = 5_000_000


def _waited_for(s: int, e: int, barrier: int, next_start: int, next_end: int) -> bool:
    """Did the on-path sibling ``[next_start, next_end]`` (which starts at ``barrier``) wait
    for the child ``[s, e]`` that ends after that start? Yes when the child started first,
    ended no later than the sibling, and the overlap is clock skew (up to
    ``CRITICAL_SKEW_NS``) or only partial: less than half of each span's (clipped) duration."""
    if not (s < barrier < e <= next_end):
        return False
    overlap = e - barrier
    return overlap <= CRITICAL_SKEW_NS or 2 * overlap < min(e - s, next_end - next_start)


def _walk_critical_path(
    spans: list[SpanRecord],
) -> tuple[list[tuple[str, int, int]], list[tuple[int, int, str]]]:
    """Segments, and (clipped start, depth, span_id) of every span on the path."""
    root = find_root(spans)
    if root is None:
        return [], []
    children = _children_by_parent(spans)
    # Per span: its children clipped to it, sorted by end descending (then start
    # descending). The barrier only moves back in time, so one cursor per span suffices:
    # a child skipped at one barrier stays skipped at every earlier one (the overlap only
    # grows, and the siblings chosen later end no later than it).
    clipped: dict[str, list[tuple[int, int, SpanRecord]]] = {}
    cursor: dict[str, int] = {}
    segments: list[tuple[str, int, int]] = []
    on_path: list[tuple[int, int, str]] = [(root.start_ns, 0, root.span_id)]
    visited = {root.span_id}
    # Stack of (span, barrier, clipped start, depth, next): walk ``span`` back from
    # ``barrier``; ``next`` is the (start, end) of the on-path child that starts at the
    # barrier, None when the barrier is the span's own (clipped) end.
    stack: list[tuple[SpanRecord, int, int, int, tuple[int, int] | None]] = [(root, _end(root), root.start_ns, 0, None)]
    while stack:
        span, barrier, start, depth, nxt = stack.pop()
        kids = clipped.get(span.span_id)
        if kids is None:
            kids = []
            for kid in children.get(span.span_id, ()):
                s, e = max(kid.start_ns, start), min(_end(kid), barrier)
                if e > s:
                    kids.append((e, s, kid))
            kids.sort(key=lambda t: (t[0], t[1]), reverse=True)
            clipped[span.span_id] = kids
            cursor[span.span_id] = 0
        i = cursor[span.span_id]
        chosen = None
        while i < len(kids):
            e, s, kid = kids[i]
            i += 1
            if kid.span_id in visited:
                continue
            if e <= barrier or (nxt is not None and _waited_for(s, e, barrier, nxt[0], nxt[1])):
                chosen = (e, s, kid)
                break
        cursor[span.span_id] = i
        if chosen is None:
            if barrier > start:
                segments.append((span.span_id, start, barrier))
            continue
        e, s, kid = chosen
        if barrier > e:
            segments.append((span.span_id, e, barrier))
        visited.add(kid.span_id)
        on_path.append((s, depth + 1, kid.span_id))
        stack.append((span, s, start, depth, (s, e)))  # later: the parent, back from the child's start
        # First: the child, back from its own end, or from the barrier when it ends past it
        # (the overlap stays with the sibling after it, so the segments still tile).
        stack.append((kid, min(e, barrier), s, depth + 1, None))
    segments.sort(key=lambda seg: (seg[1], seg[2]))
    on_path.sort()
    return segments, on_path


def critical_path_segments(spans: Iterable[SpanRecord]) -> list[tuple[str, int, int]]:
    """The critical path as ``(span_id, start_ns, end_ns)`` segments, in time order.

    The usual algorithm (as Jaeger's), made to survive clock skew and overlapping hand-offs.
    Walk back in time from the root's end. From a span's end, take its child that finishes
    last (children clipped to the span), recurse into that child, then continue in the span
    from the child's start (the resume point), taking the child that finishes last there,
    and so on; where no child is left, the span itself is on the path back to its start.

    Jaeger takes at a resume point only a child that ends at or before it. A child that
    ends a little after it was still the one waited for when clocks are skewed (the next
    step's host runs a few ms early) or when the next step starts early and blocks on it
    (fusion starts as the first encoder returns, then waits for the slowest). Such a child
    is taken when it started before the resume point, ends no later than the next on-path
    sibling, and the overlap is either at most ``CRITICAL_SKEW_NS`` (5 ms: clock skew
    between NTP-synced hosts, whatever the spans' lengths) or less than half of each of the
    two spans (a partial overlap: each did most of its work outside the other, so the next
    step spent most of its time after the child returned). Of several, the one that ends
    last wins. Larger overlaps mean the two really ran side by side, and Jaeger's rule
    applies: the child is skipped. The chosen child is cut at the resume point (the overlap
    stays with the sibling after it), so a faster sibling started with it stays off the path.

    The segments tile the root's interval exactly, so their lengths add up to the trace
    duration even with concurrent children: summing them per stage gives a breakdown with
    nothing counted twice. No root -> [].
    """
    return _walk_critical_path(unique_spans(spans))[0]


def critical_path(spans: Iterable[SpanRecord]) -> list[str]:
    """Span ids on the critical path: the root first, then by (clipped) start time.

    A span on the path whose whole interval is covered by its on-path children is listed
    too (it has no segment of its own). No root -> [].
    """
    return [span_id for _, _, span_id in _walk_critical_path(unique_spans(spans))[1]]
