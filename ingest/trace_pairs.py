"""A trace's calls: service pairs, hand-offs, model calls and their token usage.

Pure functions over one trace's spans (:class:`SpanRecord`), no database (see ``traces``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from .records import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, STATUS_ERROR, SpanRecord
from .trace_signals import _CALLEE_KINDS, resolve_stages, signals_of
from .trace_spans import _end, unique_spans

_URL_KEYS = ("url.full", "http.url")  # http.url: the pre-1.21 name

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
