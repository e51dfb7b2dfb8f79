"""Query-string parsing shared by the API and the pages: time windows and filters.

Times are RFC 3339 or unix seconds; ``range=15m|1h|24h|7d`` (any ``<n>s|m|h|d``) means
"the last n units up to ``end`` (default now)". Bad values raise ``ParamError`` naming the
parameter, which the API turns into a 400.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Mapping

from ..core.window import Window
from ..durations import window_seconds
from ..models.reader import Filters

DEFAULT_RANGE = "1h"
_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")
FILTER_NAMES = ("service", "caller", "callee", "stage", "input_type", "model")
MAX_FILTER_LEN = 1024


class ParamError(ValueError):
    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


def parse_duration(value: str, parameter: str = "range") -> float:
    try:
        return window_seconds(value, parameter)
    except ValueError as exc:
        raise ParamError(parameter, str(exc)) from None


#: The store keeps signed 64-bit nanoseconds: times from 1970 up to April 2262.
MAX_TIME_NS = (1 << 63) - 1


def parse_time(value: str, parameter: str) -> int:
    """RFC 3339 or unix seconds -> unix nanoseconds (1970 to 2262, what the store can hold)."""
    v = value.strip()
    out_of_range = ParamError(parameter, f"{parameter} is out of range (1970 to 2262): {value!r}")
    try:
        seconds = float(v)
    except ValueError:
        pass
    else:
        if not (0 <= seconds < 1e11):
            raise out_of_range
        ns = int(round(seconds * 1e9))
        if ns > MAX_TIME_NS:
            raise out_of_range
        return ns
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ParamError(parameter, f"{parameter} must be RFC 3339 (2026-11-30T14:05:00Z) or unix seconds, not {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    try:
        ns = int(dt.timestamp() * 1e9)
    except (OverflowError, ValueError, OSError):  # e.g. year 1 with a +14:00 offset
        raise out_of_range from None
    if not 0 <= ns <= MAX_TIME_NS:
        raise out_of_range
    return ns


def parse_window(args: Mapping[str, str], now_ns: int | None = None) -> Window:
    now_ns = time.time_ns() if now_ns is None else now_ns
    end = parse_time(args["end"], "end") if args.get("end") else now_ns
    if args.get("range"):
        if args.get("start"):
            raise ParamError("range", "give either range or start, not both")
        start = end - int(parse_duration(args["range"]) * 1e9)
    elif args.get("start"):
        start = parse_time(args["start"], "start")
    else:
        start = end - int(parse_duration(DEFAULT_RANGE) * 1e9)
    if start >= end:
        raise ParamError("end", "end must be after start")
    return Window(start, end)


def parse_baseline_window(args: Mapping[str, str], window: Window) -> Window | None:
    """``baseline_start``/``baseline_end`` (end defaults to the selection's length); None
    when neither is given (the caller's default: the same length just before)."""
    b_start, b_end = args.get("baseline_start"), args.get("baseline_end")
    if not b_start and not b_end:
        return None
    if not b_start:
        raise ParamError("baseline_start", "baseline_start is needed with baseline_end")
    s = parse_time(b_start, "baseline_start")
    e = parse_time(b_end, "baseline_end") if b_end else s + (window.end_ns - window.start_ns)
    if e > MAX_TIME_NS:
        raise ParamError("baseline_start", "baseline_start plus the selection's length is past 2262")
    if e <= s:
        raise ParamError("baseline_end", "baseline_end must be after baseline_start")
    return Window(s, e)


def parse_filters(args: Mapping[str, str]) -> Filters:
    values = {}
    for name in FILTER_NAMES:
        v = args.get(name)
        if v is None or v == "":
            continue
        if len(v) > MAX_FILTER_LEN:
            raise ParamError(name, f"{name} is longer than {MAX_FILTER_LEN} characters")
        values[name] = v
    return Filters(**values)


def parse_trace_id(value: str) -> str:
    if not _HEX32.match(value or "") or set(value) == {"0"}:
        raise ParamError("trace_id", "trace_id must be 32 hexadecimal digits, not all zero")
    return value.lower()


def parse_int(args: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = args.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ParamError(name, f"{name} must be an integer") from None
    if not lo <= v <= hi:
        raise ParamError(name, f"{name} must be between {lo} and {hi}")
    return v


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
