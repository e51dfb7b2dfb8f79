"""What the span, attribute and call readers share, as plain functions: whether a window is
long enough to walk a duration index slowest first (``long_window``), the walk of a service's
span index (``ix_spans_duration_walk``) bucket by bucket (``walk_bucket_list``, ``walk_conds``,
``walk_entries``), the text tests that narrow spans to a callee or a model
(``named_in_attributes``, ``of_model``), and the column lists."""

from __future__ import annotations

import json as _json
import re

import orjson

from sqlalchemy import Connection, String, and_, bindparam, func, literal, or_, select

from .. import Span
from ..buckets import duration_bucket
from ..dialect import contains_text_in
from .base import ReadContext

KIND_CLIENT_CODE = 3
CALLEE_KIND_CODES = (2, 5)  # SERVER, CONSUMER

_CANDIDATE_COLUMNS = ("trace_id", "span_id", "parent_span_id", "service", "name", "kind", "stage",
                      "start_ns", "duration_ns", "status", "attributes", "signals")

_TRACE_SUMMARY_COLUMNS = ("trace_id", "root_service", "root_name", "start_ns", "duration_ns", "span_count",
                          "error", "input_type", "pending", "settled_ns")


def _stage_is(stage: str):
    """Spans of ``stage``; a span without one counts as ``other``, as settling counts it."""
    if stage == "other":
        return or_(Span.stage == stage, Span.stage.is_(None), Span.stage == "")
    return Span.stage == stage


# A callee named ``host:port`` (traces.address_callee); URL keys, whose host the settler
# lower-cases; attribute key prefixes a model call's provider is read from.
_PORT_SUFFIX = re.compile(r"^(.+):([0-9]{1,5})$")
_URL_KEYS = ("url.full", "http.url")
_PROVIDER_KEY_PREFIXES = ("gen_ai.", "llm.")


def long_window(ctx: ReadContext, model, start_ns: int, end_ns: int, share: int) -> bool:
    """Is the window long enough, against what the table holds, that walking a duration
    index slowest first beats sorting the window? Yes when it covers at least 1/``share``
    of the stored time range (``ReadContext.time_range``): the walk then visits about
    ``share`` index entries per row it keeps."""
    lo, hi = ctx.time_range(model)
    if lo is None:
        return False
    return (end_ns - start_ns) * share >= (hi - lo)


def walk_bucket_list(ctx, conn: Connection, service: str, min_ns: int | None, max_ns: int | None) -> list[int]:
    """The duration buckets a walk of ``service``'s spans between the bounds visits: from
    its fastest stored span's bucket to its slowest's (two index look-ups through ``conn``,
    once per pinned block of ``ctx``, the ``ReadContext``). Each bucket is a seek of the
    walk, and a service's spans fill a few dozen of the ~260 (below its fastest, a walk
    without ``min_ns`` sought every empty bucket down to 0)."""
    low, top = ctx.once_per_block(("duration_buckets", service),
                                  lambda c: tuple(c.execute(_BUCKET_RANGE, {"service": service}).one()), conn)
    if top is None:
        return []
    if min_ns is not None:
        low = max(low, duration_bucket(min_ns))
    high = min(top, duration_bucket(max_ns)) if max_ns is not None else top
    return list(range(low, high + 1))


_BUCKET_RANGE = select(
    select(func.min(Span.duration_bucket)).where(Span.service == bindparam("service")).scalar_subquery(),
    select(func.max(Span.duration_bucket)).where(Span.service == bindparam("service")).scalar_subquery())


def walk_conds(service: str, buckets: list[int], lo: int, end_ns: int, min_ns: int | None,
               max_ns: int | None) -> list:
    """``service``'s spans starting in [lo, end) between the bounds, as the walk index's key
    reads them (service, each bucket, the start range; the duration from the entry)."""
    conds = [Span.service == service, Span.duration_bucket.in_(buckets), Span.start_ns >= lo,
             Span.start_ns < end_ns]
    if min_ns is not None:
        conds.append(Span.duration_ns >= min_ns)
    if max_ns is not None:
        conds.append(Span.duration_ns <= max_ns)
    return conds


def walk_entries(conn: Connection, buckets: dict[str, list[int]], lo: int, end_ns: int,
                 min_ns: int | None, max_ns: int | None, budget: int) -> int:
    """How many index entries a walk of the services' spans (service -> its buckets)
    starting in [lo, end) between the bounds reads, counted in the index alone and only up
    to ``budget`` + 1."""
    total = 0
    for service, theirs in buckets.items():
        if not theirs:
            continue
        conds = walk_conds(service, theirs, lo, end_ns, min_ns, max_ns)
        inner = select(literal(1).label("one")).where(*conds).limit(budget + 1 - total).subquery()
        total += conn.execute(select(func.count()).select_from(inner)).scalar_one()
        if total > budget:
            break
    return total


def named_in_attributes(dialect: str, may_call: str):
    """Spans whose text may name ``may_call`` as settling names an uninstrumented callee
    (``traces.trace_calls``): plain substring tests on the attributes and signals JSON,
    true for a superset (the caller checks each row exactly):

    * the name itself (``peer.service``, ``server.address``, a URL's ``host:port``);
    * for ``host:port``, the host alone (the port is a separate attribute; an IPv6
      literal is bracketed only in the name);
    * a URL's host, lower-cased by the settler: case-folded, in spans with a URL key;
    * a model call's provider, as the signals store it (lower-cased), and in spans
      stored before signals were (their provider is read from the attributes).

    Always true when JSON would write a needle differently (then no narrowing by text).
    ``dialect``: the engine's dialect name."""
    hosts = [may_call]
    port = _PORT_SUFFIX.match(may_call)
    if port:
        host = port.group(1)
        hosts.append(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    conds = []
    for needle in dict.fromkeys(hosts):
        if not needle or _json.dumps(needle, ensure_ascii=False)[1:-1] != needle:
            return literal(True)
        conds.append(contains_text_in(dialect, Span.attributes, needle))
    lower = hosts[-1]
    if lower == lower.lower():
        urls = or_(*(contains_text_in(dialect, Span.attributes, f'"{k}"') for k in _URL_KEYS))
        conds.append(and_(urls, contains_text_in(dialect, func.lower(Span.attributes, type_=String()), lower)))
        conds.append(contains_text_in(dialect, Span.signals, '"provider":' + orjson.dumps(may_call).decode()))
        conds.append(and_(Span.signals.is_(None), or_(*(contains_text_in(dialect, Span.attributes, f'"{k}')
                                                        for k in _PROVIDER_KEY_PREFIXES))))
    return or_(*conds)


def of_model(dialect: str, model: str):
    """Spans that may be calls of ``model``: the signals name it (``"model":...``), or a
    span stored before signals were names it in its attributes (the caller checks
    each row exactly). ``dialect``: the engine's dialect name."""
    in_signals = contains_text_in(dialect, Span.signals, '"model":' + orjson.dumps(model).decode())
    named = _json.dumps(model, ensure_ascii=False)[1:-1]
    legacy = contains_text_in(dialect, Span.attributes, named) if named == model else literal(True)
    return or_(in_signals, and_(Span.signals.is_(None), legacy))
