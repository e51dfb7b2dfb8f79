"""A trace's critical path: the chain of spans its end-to-end latency waited on.

Pure functions over one trace's spans (:class:`SpanRecord`), no database (see ``traces``).
"""

from __future__ import annotations

from typing import Iterable

from .records import SpanRecord
from .trace_spans import _children_by_parent, _end, find_root, unique_spans

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
