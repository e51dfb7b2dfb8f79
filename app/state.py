"""A page's whole state lives in its URL query; this module reads and writes it.

Pure functions: ``from_query`` normalises what ``layout(**query)`` receives (Dash passes
repeated keys as lists), ``to_href`` writes a canonical link, ``resolve`` turns the state
into the window and filters the query functions take. Relative windows (``range=``) stay
relative in links, so a wiki link always shows "the last seven days".
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import quote, urlencode

from ..models.reader import Filters
from .params import DEFAULT_RANGE, FILTER_NAMES, ParamError, Window, parse_filters, parse_window, rfc3339

PRESETS = ("15m", "1h", "6h", "24h", "7d")
DEFAULT_RANGE_LABEL = DEFAULT_RANGE
TIME_KEYS = ("range", "start", "end")
FILTER_KEYS = FILTER_NAMES
# Page-specific selection: latency band, selected span, table sort, baseline.
EXTRA_KEYS = ("min_ms", "max_ms", "span", "sort", "baseline", "margin", "group_by", "cache",
              "baseline_start", "baseline_end", "page", "kind", "severity", "incident", "counts")
KEYS = TIME_KEYS + FILTER_KEYS + EXTRA_KEYS
CARRIED = TIME_KEYS + FILTER_KEYS  # what the nav keeps when moving between pages
MAX_VALUE_LEN = 1024
STEPS_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)


def from_query(query: Mapping[str, Any] | None) -> dict[str, str]:
    """Known keys only, one string each (the last of repeated keys), blanks dropped."""
    out: dict[str, str] = {}
    for key in KEYS:
        value = (query or {}).get(key)
        if isinstance(value, (list, tuple)):
            value = value[-1] if value else None
        if value is None:
            continue
        value = str(value).strip()[:MAX_VALUE_LEN]
        if value:
            out[key] = value
    return out


def to_search(state: Mapping[str, Any]) -> str:
    """``?key=value&...`` in a canonical key order ('' when empty)."""
    items = [(k, str(state[k])) for k in KEYS if state.get(k) not in (None, "")]
    return "?" + urlencode(items, quote_via=quote, safe=":,") if items else ""


def to_href(path: str, state: Mapping[str, Any]) -> str:
    return path + to_search(state)


def carried(state: Mapping[str, Any]) -> dict[str, str]:
    return {k: state[k] for k in CARRIED if state.get(k)}


def num(value: float) -> str:
    """A number for a URL: at most three decimals (microseconds, for milliseconds)."""
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def with_(state: Mapping[str, Any], **changes: Any) -> dict[str, str]:
    """A copy with ``changes`` applied; None or '' removes a key."""
    out = dict(state)
    for k, v in changes.items():
        if v is None or v == "":
            out.pop(k, None)
        else:
            out[k] = str(v)
    return out


@dataclass(frozen=True)
class Resolved:
    window: Window
    filters: Filters
    error: str | None  # shown on the page; the defaults were used instead
    relative: bool


def resolve(state: Mapping[str, Any], now_ns: int | None = None) -> Resolved:
    """The window and filters of a state; bad values fall back to defaults with a message."""
    error = None
    try:
        window = parse_window(state, now_ns)
    except ParamError as exc:
        error = f"{exc.parameter}: {exc.message} — showing the last {DEFAULT_RANGE} instead"
        window = parse_window({}, now_ns)
    try:
        filters = parse_filters(state)
    except ParamError as exc:
        error = f"{exc.parameter}: {exc.message}"
        filters = Filters()
    return Resolved(window, filters, error, relative=not state.get("start"))


def band(state: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The selected latency band (min_ms, max_ms); unparsable bounds are ignored."""
    out = []
    for key in ("min_ms", "max_ms"):
        try:
            v = float(state.get(key)) if state.get(key) not in (None, "") else None
        except (TypeError, ValueError):
            v = None
        out.append(v if v is not None and math.isfinite(v) and v >= 0 else None)
    return out[0], out[1]


def parse_sort(value: str | None, columns: tuple[str, ...], default: str) -> tuple[str, str]:
    """``p99_ms:desc`` -> (column, "asc"|"desc"); unknown columns fall back to ``default`` desc."""
    col, _, direction = (value or "").partition(":")
    if col not in columns:
        return default, "desc"
    return col, "asc" if direction == "asc" else "desc"


def sort_rows(rows: list[dict], column: str, direction: str) -> list[dict]:
    """Rows sorted by ``column``; rows without a value last, whatever the direction."""
    present = [r for r in rows if r.get(column) is not None]
    missing = [r for r in rows if r.get(column) is None]
    return sorted(present, key=lambda r: r[column], reverse=direction == "desc") + missing


def step_minutes(window: Window, points: int = 120) -> int:
    """A round step giving at most about ``points`` time buckets."""
    minutes = max(1.0, window.seconds / 60)
    for step in STEPS_MINUTES:
        if minutes / step <= points:
            return step
    return STEPS_MINUTES[-1]


def pair_value(caller: str | None, callee: str | None) -> str | None:
    """The pair picker's value: a JSON list, so any service name round-trips."""
    if not caller and not callee:
        return None
    return json.dumps([caller or "", callee or ""])


def parse_pair_value(value: str | None) -> tuple[str | None, str | None]:
    if not value:
        return None, None
    try:
        caller, callee = json.loads(value)
    except (ValueError, TypeError):
        return None, None
    return (caller or None), (callee or None)


def window_label(state: Mapping[str, Any], window: Window) -> str:
    if state.get("range") or not state.get("start"):
        return f"last {state.get('range') or DEFAULT_RANGE}"
    return f"{rfc3339(window.start_ns)} → {rfc3339(window.end_ns)}"


def now_ns() -> int:
    return time.time_ns()
