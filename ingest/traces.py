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
from typing import Any, Iterable, Sequence

from .records import (
    INPUT_TYPES,
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_SERVER,
    STATUS_ERROR,
    SpanRecord,
)

__all__ = [
    "critical_path",
    "critical_path_segments",
    "find_root",
    "input_type_of",
    "self_times",
    "service_pairs",
    "trace_duration_ns",
    "trace_error",
    "unique_spans",
]

_INPUT_TYPE_SET = frozenset(INPUT_TYPES)
_CALLEE_KINDS = frozenset((KIND_SERVER, KIND_CONSUMER))
# Attributes that name an uninstrumented callee, best first (net.peer.name is the
# pre-1.21 semantic-conventions name of server.address).
_PEER_KEYS = ("peer.service", "server.address", "net.peer.name")


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
# Input type
# --------------------------------------------------------------------------------------


def _count(value: Any) -> float | None:
    """A count attribute as a number; strings such as "2" are coerced, junk is None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _explicit_input_type(span: SpanRecord) -> str | None:
    value = span.attributes.get("mm.input_type")
    if isinstance(value, str):
        value = value.strip().lower()
        if value in _INPUT_TYPE_SET:
            return value
    return None


def input_type_of(spans: Iterable[SpanRecord]) -> str:
    """The trace's input type (DESIGN.md "Input types").

    1. An explicit ``mm.input_type`` naming one of :data:`INPUT_TYPES`, on any span (the
       root's first, then the earliest-starting span carrying one) wins.
    2. Otherwise the root decides: ``mm.audio_count`` > 0 -> ``audio``;
       ``mm.image_count`` 1 -> ``image``, >= 2 -> ``multi_image``, 0 -> ``text``;
       ``mm.audio_count`` 0 with no image count -> ``text``; ``mm.prompt_chars`` or any
       ``gen_ai.*`` attribute -> ``text``; none of them -> ``unknown``.
    3. No root -> ``unknown``.
    Counts may arrive as strings ("2"); values that are not numbers count as absent.
    """
    spans = unique_spans(spans)
    root = find_root(spans)
    if root is not None:
        explicit = _explicit_input_type(root)
        if explicit:
            return explicit
    explicit_spans = [s for s in spans if "mm.input_type" in s.attributes]
    explicit_spans.sort(key=lambda s: s.start_ns)  # stable: list order breaks ties
    for span in explicit_spans:
        explicit = _explicit_input_type(span)
        if explicit:
            return explicit
    if root is None:
        return "unknown"

    attributes = root.attributes
    audio = _count(attributes.get("mm.audio_count"))
    images = _count(attributes.get("mm.image_count"))
    if audio is not None and audio > 0:
        return "audio"
    if images is not None:
        if images >= 2:
            return "multi_image"
        if images >= 1:
            return "image"
        return "text"
    if audio is not None:  # audio_count 0 and no image count: no image, no audio
        return "text"
    if "mm.prompt_chars" in attributes or any(k.startswith("gen_ai.") for k in attributes):
        return "text"
    return "unknown"


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


def service_pairs(spans: Iterable[SpanRecord]) -> dict[str, tuple[str, str]]:
    """CLIENT span id -> (caller, callee), per DESIGN.md "Service pairs".

    The caller is the CLIENT span's service. The callee is, first match wins:

    1. the service of a child SERVER or CONSUMER span in *another* service (the earliest
       starting one, if several);
    2. the client span's ``peer.service`` attribute (it wins over ``server.address``);
    3. ``server.address``, then the older ``net.peer.name``;
    4. the service of a child SERVER/CONSUMER span in the *same* service;
    5. otherwise the span makes no pair and is left out.

    Cloud Trace RPC_CLIENT / RPC_SERVER spans arrive as CLIENT / SERVER and pair the same way.
    Only CLIENT spans make pairs (PRODUCER spans do not).
    """
    spans = unique_spans(spans)
    servers: dict[str, list[SpanRecord]] = {}
    for span in spans:
        if span.kind in _CALLEE_KINDS and span.parent_span_id:
            servers.setdefault(span.parent_span_id, []).append(span)
    pairs: dict[str, tuple[str, str]] = {}
    for span in spans:
        if span.kind != KIND_CLIENT:
            continue
        caller = span.service
        kids = [k for k in servers.get(span.span_id, ()) if k.span_id != span.span_id]
        other = [k for k in kids if k.service != caller]
        callee: str | None = None
        if other:
            callee = min(other, key=lambda k: k.start_ns).service
        else:
            for key in _PEER_KEYS:
                callee = _attr_text(span.attributes, key)
                if callee:
                    break
            if not callee and kids:
                callee = caller
        if callee:
            pairs[span.span_id] = (caller, callee)
    return pairs


# --------------------------------------------------------------------------------------
# Critical path
# --------------------------------------------------------------------------------------


def _walk_critical_path(
    spans: list[SpanRecord],
) -> tuple[list[tuple[str, int, int]], list[tuple[int, int, str]]]:
    """Segments, and (clipped start, depth, span_id) of every span on the path."""
    root = find_root(spans)
    if root is None:
        return [], []
    children = _children_by_parent(spans)
    # Per span: its children clipped to it, sorted by end descending (then start
    # descending). The barrier only moves back in time, so one cursor per span suffices.
    clipped: dict[str, list[tuple[int, int, SpanRecord]]] = {}
    cursor: dict[str, int] = {}
    segments: list[tuple[str, int, int]] = []
    on_path: list[tuple[int, int, str]] = [(root.start_ns, 0, root.span_id)]
    visited = {root.span_id}
    # Stack of (span, barrier, clipped start, depth): walk ``span`` back from ``barrier``.
    stack: list[tuple[SpanRecord, int, int, int]] = [(root, _end(root), root.start_ns, 0)]
    while stack:
        span, barrier, start, depth = stack.pop()
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
            if e <= barrier and kid.span_id not in visited:
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
        stack.append((span, s, start, depth))  # later: the parent, back from the child's start
        stack.append((kid, e, s, depth + 1))  # first: the child, back from its own end
    segments.sort(key=lambda seg: (seg[1], seg[2]))
    on_path.sort()
    return segments, on_path


def critical_path_segments(spans: Iterable[SpanRecord]) -> list[tuple[str, int, int]]:
    """The critical path as ``(span_id, start_ns, end_ns)`` segments, in time order.

    The usual algorithm (as Jaeger's): walk back in time from the root's end. From a
    span's end, take its child that finishes last (children clipped to the span), recurse
    into that child, then continue in the span from the child's start, taking the child
    that finishes last at or before that point, and so on; where no child is left, the
    span itself is on the path back to its start. Children that overlap the point but end
    after it are skipped, as in Jaeger.

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
