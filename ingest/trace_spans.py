"""The span set of one trace: unique spans, root, duration, error, self times.

Pure functions over one trace's spans (:class:`SpanRecord`), no database; how they cope
with missing roots, orphans, duplicate ids and odd timings is said in ``traces``.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .records import STATUS_ERROR, SpanRecord


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
