"""The Cache page and ``/api/v1/cache``: hit rate per cache and attribute value, over the
window and over time, from the ``cache`` rollups where they answer exactly, else raw spans."""

from __future__ import annotations

from typing import Any, Iterable

import orjson

from ...ingest.settle_fast import CACHE_GROUP_KEY, CACHE_UNTAGGED_KIND
from ...ingest.settle_fast import cache_hit_value as _cache_hit_value
from ...models.reader import StoreReader, TierPlan, tier_plan
from ..params import Window, rfc3339
from .common import _group_value
from ...durations import MINUTE_NS as _NS_MIN

CACHE_MAX_SPANS = 500_000  # cache spans read per window (newest first): bounded work
GROUP_BY_PATTERN = CACHE_GROUP_KEY  # whole-string match (fullmatch)
NO_GROUP = None  # the group of a span without the group_by attribute


def valid_group_by(value: str | None) -> bool:
    """An attribute key a cache breakdown can group by: 1-128 characters of
    letters, digits and ``_ . : / -`` (OpenTelemetry keys and label names)."""
    return isinstance(value, str) and bool(GROUP_BY_PATTERN.fullmatch(value))


def cache_hit_value(value: Any) -> bool | None:
    """``cache.hit`` as sent: a boolean, or a string/number from sources without booleans
    (Cloud Trace labels). None when it says neither hit nor miss. The settler's rule too
    (``settle_fast.cache_hit_value``), so rollup and raw answers agree."""
    return _cache_hit_value(value)


def cache_events(rows: Iterable[tuple], group_by: str | None) -> list[tuple[int, str, str | None, bool]]:
    """Pure: ``(start_ns, cache, group, hit)`` from ``reader.attributes.cache_spans`` rows.

    The group is the span attribute ``group_by``, else the resource attribute of that
    name, else None. Spans whose ``cache.hit`` says neither hit nor miss are dropped.
    """
    out = []
    for start_ns, attrs_json, resource_json in rows:
        try:
            attrs = orjson.loads(attrs_json) if attrs_json else {}
        except orjson.JSONDecodeError:
            continue
        if not isinstance(attrs, dict):
            continue
        cache = attrs.get("cache.name")
        hit = cache_hit_value(attrs.get("cache.hit"))
        if cache is None or isinstance(cache, (dict, list)) or hit is None:
            continue
        group = None
        if group_by:
            value = attrs.get(group_by)
            if value is None and resource_json:
                try:
                    res = orjson.loads(resource_json)
                except orjson.JSONDecodeError:
                    res = {}
                value = res.get(group_by) if isinstance(res, dict) else None
            group = _group_value(value)
        out.append((int(start_ns), str(cache), group, hit))
    return out


def _group_sort_key(r: dict) -> tuple:
    return (r["cache"], r["group"] is None, r["group"] or "")


# Lookup counts, the common form of raw events and rollup cells: (t_ns, cache, group, hits, misses).
def _counted(events: Iterable[tuple[int, str, str | None, bool]]) -> Iterable[tuple[int, str, str | None, int, int]]:
    for t, cache, group, hit in events:
        yield (t, cache, group, 1 if hit else 0, 0 if hit else 1)


def _rates_table(counted: Iterable[tuple[int, str, str | None, int, int]]) -> list[dict]:
    counts: dict[tuple[str, str | None], list[int]] = {}
    for _, cache, group, h, m in counted:
        c = counts.setdefault((cache, group), [0, 0])
        c[0] += h
        c[1] += m
    counts = {k: v for k, v in counts.items() if v[0] + v[1] > 0}
    totals: dict[str, int] = {}
    for (cache, _), (h, m) in counts.items():
        totals[cache] = totals.get(cache, 0) + h + m
    out = []
    for (cache, group), (h, m) in counts.items():
        out.append({"cache": cache, "group": group, "hits": h, "misses": m,
                    "hit_rate": round(h / (h + m), 6), "share": round((h + m) / totals[cache], 6)})
    out.sort(key=_group_sort_key)
    return out


def _rates_buckets(counted: Iterable[tuple[int, str, str | None, int, int]], start_ns: int,
                   step_minutes: int) -> list[dict]:
    step = max(1, int(step_minutes))
    step_ns = step * _NS_MIN
    # Steps of whole quarter hours lie on a grid of their own (as the percentile charts'
    # steps: ``reader.rollups.steps``), so hourly and quarter rollup rows fall in one
    # bucket each; shorter steps start at the window's first minute.
    origin = 0 if step % 15 == 0 else start_ns // _NS_MIN * _NS_MIN
    counts: dict[tuple[int, str, str | None], list[int]] = {}
    for t, cache, group, h, m in counted:
        b = origin + (t - origin) // step_ns * step_ns
        c = counts.setdefault((b, cache, group), [0, 0])
        c[0] += h
        c[1] += m
    out = []
    for (b, cache, group), (h, m) in counts.items():
        if h + m > 0:
            out.append({"t": rfc3339(b), "t_ns": b, "cache": cache, "group": group, "hits": h, "misses": m,
                        "hit_rate": round(h / (h + m), 6)})
    out.sort(key=lambda r: (r["t_ns"], *_group_sort_key(r)))
    return out


def cache_table(events: Iterable[tuple[int, str, str | None, bool]]) -> list[dict]:
    """Pure: hits, misses and hit rate per (cache, group); ``share`` is the group's part of
    its cache's lookups."""
    return _rates_table(_counted(events))


def cache_buckets(events: Iterable[tuple[int, str, str | None, bool]], start_ns: int,
                  step_minutes: int) -> list[dict]:
    """Pure: hit rate per (cache, group) and time step: ``[{"t", "cache", "group", "hits",
    "misses", "hit_rate"}]`` in time order, on ``_rates_buckets``' grid (steps of whole quarter
    hours aligned to the clock, shorter ones to ``start_ns``'s minute)."""
    return _rates_buckets(_counted(events), start_ns, step_minutes)


def _cache_events(reader: StoreReader, window: Window, group_by: str | None, cache: str | None) -> list[tuple]:
    rows = reader.attributes.cache_spans(window.start_ns, window.end_ns, limit=CACHE_MAX_SPANS)
    events = cache_events(rows, group_by)
    return [e for e in events if e[1] == cache] if cache else events


def cache_rollup_cells(rows: Iterable[tuple], untagged_rows: Iterable[tuple], group_by: str | None,
                       cache: str | None = None) -> dict[tuple[int, str, str | None], list[int]] | None:
    """Pure: lookups per (minute, cache, group) as ``[hits, misses]`` from the ``cache``
    rollup rows ``(minute, count, error_count, sum_ns, sketch, service, name, caller,
    callee)`` and the ``cache_untagged`` rows ``(minute, count, error_count, sum_ns, sketch,
    service, name, caller)`` of the same minutes (``settle_fast.cache_contributions``), or
    None when they cannot give exactly what the raw spans give (then read those):

    * ungrouped: each cache's TOTAL series (caller = callee = '');
    * ``group_by`` = key: the key's tag series (callee = the value); the rest of the TOTAL
      is the group None. Only when no lookup of the minutes has the key untagged (a
      ``cache_untagged`` row naming the key, or "*": a value that is no tag, or a resource
      attribute) and none went to the key's overflow series (more than
      ``settle.CACHE_TAG_VALUES`` values): every group is then known exactly;
    * ``cache.*`` keys are never tags: None;
    * a (service, cache, minute) with tag rows but no TOTAL (settled before TOTAL series
      existed), or with more tagged lookups than its TOTAL: None;
    * no rows at all: None (the window may hold lookups settled before TOTAL series
      existed, without tags; the raw read is cheap when there are none).
    """
    if group_by is not None and (not valid_group_by(group_by) or group_by.startswith("cache.")):
        return None
    totals: dict[tuple[int, str, str], list[int]] = {}  # (minute, service, cache) -> [count, errors]
    tagged: dict[tuple[int, str, str], list[int]] = {}
    values: dict[tuple[int, str, str | None], list[int]] = {}  # (minute, cache, value) -> [count, errors]
    seen: set[tuple[int, str, str]] = set()
    any_rows = False
    for minute, count, errors, _sum, _sketch, service, name, caller, callee in rows:
        if count <= 0 or (cache is not None and name != cache):
            continue
        any_rows = True
        cell = (minute, service, name)
        seen.add(cell)
        if caller == "" and callee == "":
            t = totals.setdefault(cell, [0, 0])
            t[0] += count
            t[1] += errors
        elif group_by is not None and caller == group_by:
            if callee == "":
                return None  # the key overflowed its value cap: values unknown
            t = tagged.setdefault(cell, [0, 0])
            t[0] += count
            t[1] += errors
            v = values.setdefault((minute, name, callee), [0, 0])
            v[0] += count
            v[1] += errors
    if not any_rows or any(cell not in totals for cell in seen):
        return None
    if group_by is not None:
        parsed: dict[str, bool] = {}
        for _minute, count, _errors, _sum, _sketch, _service, name, caller in untagged_rows:
            if count <= 0 or (cache is not None and name != cache):
                continue
            names_key = parsed.get(caller)
            if names_key is None:
                try:
                    keys = orjson.loads(caller) if caller != "*" else None
                except orjson.JSONDecodeError:
                    keys = None
                names_key = parsed[caller] = not isinstance(keys, list) or group_by in keys
            if names_key:
                return None  # some lookups have the key as no tag shows it
    out: dict[tuple[int, str, str | None], list[int]] = {}
    for (minute, service, name), (count, errors) in totals.items():
        got = tagged.get((minute, service, name), (0, 0))
        rest, rest_err = count - got[0], errors - got[1]
        if rest < 0 or rest_err < 0 or rest - rest_err < 0:
            return None
        if rest:
            o = out.setdefault((minute, name, None), [0, 0])
            o[0] += rest - rest_err
            o[1] += rest_err
    for key, (count, errors) in values.items():
        o = out.setdefault(key, [0, 0])
        o[0] += count - errors
        o[1] += errors
    return out


def _cache_plan(lo_ns: int, hi_ns: int, step_minutes: int | None, kept_from: int | None) -> TierPlan | None:
    """Which rollup rows answer the whole minutes ``[lo, hi)`` of a cache view: the coarsest
    tier whose rows fall wholly in one ``step_minutes`` bucket (``_rates_buckets``: steps of
    whole quarters lie on a quarter-aligned grid; no step, a table over the window: hours).
    A window reaching before the minute rows retention keeps (``kept_from``) is rounded out
    to whole hours there, as every rollup view is, when its step allows hours; else None
    (its raw spans answer it)."""
    step = None if step_minutes is None else max(1, int(step_minutes))  # as _rates_buckets reads it
    hours = step is None or step % 60 == 0
    if kept_from is not None and lo_ns // _NS_MIN < kept_from:
        return tier_plan(lo_ns, hi_ns, kept_from) if hours else None
    if hours or step % 15 == 0:
        return tier_plan(lo_ns, hi_ns, hours=hours)
    return TierPlan(((lo_ns // _NS_MIN, hi_ns // _NS_MIN),), (0, 0))


def _plan_bounds(plan: TierPlan) -> tuple[int, int]:
    """First and end minute a tier plan's rows cover (rounding out included)."""
    spans = [(a, b) for a, b in plan.minute_ranges] + [(a * 15, b * 15) for a, b in plan.quarter_ranges]
    if plan.hours[1] > plan.hours[0]:
        spans.append((plan.hours[0] * 60, plan.hours[1] * 60))
    return min(a for a, _ in spans), max(b for _, b in spans)


def _cache_lookups(reader: StoreReader, window: Window, group_by: str | None, cache: str | None,
                   rollups: bool, step_minutes: int | None = None) -> list[tuple[int, str, str | None, int, int]]:
    """The window's lookups as ``(t_ns, cache, group, hits, misses)``: its whole minutes from
    the rollups when ``cache_rollup_cells`` can answer them — whole hours and quarter hours
    from the coarser tiers where every row falls in one ``step_minutes`` bucket (a week is
    168 hourly rows a series, not 10,080 minute rows; ``_cache_plan``) — the ragged edges
    (and everything otherwise) from the raw spans. The checks of ``cache_rollup_cells`` hold
    per tier row as they do per minute: a tier row is the sum of its minutes' rows (except
    in the one hour a store settled before TOTAL series existed was upgraded: a minute
    without its TOTAL row can hide in an hour that has one)."""
    m0, m1 = -(-window.start_ns // _NS_MIN), window.end_ns // _NS_MIN
    plan, rows = None, {}
    if rollups and m1 > m0:
        kinds = {"cache": ("service", "name", "caller", "callee")}
        if group_by is not None:
            kinds[CACHE_UNTAGGED_KIND] = ("service", "name", "caller")
        plan, rows = reader.rollups.rows_of_kinds(
            kinds, lambda kept_from: _cache_plan(m0 * _NS_MIN, m1 * _NS_MIN, step_minutes, kept_from), sketches=False)
    if plan is not None:
        cells = cache_rollup_cells(rows["cache"], rows.get(CACHE_UNTAGGED_KIND, ()), group_by, cache)
        if cells is not None:
            out = [(m * _NS_MIN, name, group, h, mi) for (m, name, group), (h, mi) in cells.items()]
            first, end = _plan_bounds(plan)
            for a, b in ((window.start_ns, first * _NS_MIN), (end * _NS_MIN, window.end_ns)):
                if b > a:  # a ragged edge (none where the window was rounded out to an hour)
                    out.extend(_counted(_cache_events(reader, Window(a, b), group_by, cache)))
            return out
    return list(_counted(_cache_events(reader, window, group_by, cache)))


def cache_rates(reader: StoreReader, window: Window, group_by: str | None = None,
                cache: str | None = None, *, rollups: bool = True) -> list[dict]:
    """Hit rate per cache (``cache.name``) and value of the span attribute ``group_by``
    (``cache.hit``: hits, misses) over the window.

    From the ``cache`` rollups of the window's whole minutes where they give exactly the
    raw spans' answer (``cache_rollup_cells``; the partial minutes at the edges from raw
    spans), else (``rollups=False`` too) from the raw spans carrying ``cache.name`` (window
    and key filtered in SQL; only those spans' attributes are parsed; at most
    ``CACHE_MAX_SPANS``, newest first). Rollups hold settled traces, as every rollup view."""
    return _rates_table(_cache_lookups(reader, window, group_by, cache, rollups))


def cache_series(reader: StoreReader, window: Window, group_by: str | None = None, cache: str | None = None,
                 step_minutes: int = 1, *, rollups: bool = True) -> list[dict]:
    """Hit rate per cache and group over time (``step_minutes`` buckets, on the grid
    ``_rates_buckets`` gives), read as ``cache_rates``."""
    return _rates_buckets(_cache_lookups(reader, window, group_by, cache, rollups, step_minutes),
                          window.start_ns, step_minutes)


def cache_rates_and_series(reader: StoreReader, window: Window, group_by: str | None = None,
                           cache: str | None = None, step_minutes: int = 1) -> tuple[list[dict], list[dict]]:
    """``cache_rates`` and ``cache_series`` from one read of the lookups (the Cache page
    shows both; reading them twice cost it much of its time)."""
    lookups = _cache_lookups(reader, window, group_by, cache, True, step_minutes)
    return _rates_table(lookups), _rates_buckets(lookups, window.start_ns, step_minutes)
