"""What every detector reads and writes: its thresholds (``Thresholds``, each one a
setting), its input (``Frames`` and their columns) and its output (``finding``), with the
constants and small helpers all detectors share. The frames' columns are listed in the
package's docstring (``app/detectors/__init__.py``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Mapping

import numpy as np
import pandas as pd

from ...core.findings import Finding, Subject
from ...durations import MINUTE_NS as NS_MIN
from ...models import sketch
from ...settings import DetectorThresholds, SettingsError, declared, read_settings
# The reference latency table (P50, P95 in ms per input type) lives with the overview's queries.
from ..queries import SEED_BASELINE, parse_baseline

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
MAX_EXEMPLARS = 5
KIND_SERVER_CODES = (2, 5)  # SERVER, CONSUMER
STATUS_ERROR_CODE = 2


# -- thresholds: every one a documented setting ------------------------------------------
@dataclass(frozen=True)
class Thresholds(DetectorThresholds):
    """Detector thresholds: each field is one setting, declared (variable, default, meaning)
    in ``modalscope/settings.py``."""

    @classmethod
    def kept_in(cls, store: dict) -> "Thresholds":
        """The thresholds from the environment, read once and kept in ``store`` (an app's
        ``extensions["modalscope"]``: the API, the pages and the embeds share them)."""
        if "thresholds" not in store:
            store["thresholds"] = cls.from_env()
        return store["thresholds"]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Thresholds":
        th = read_settings(cls, env)
        try:
            th.baseline_table()
        except ValueError as exc:
            raise SettingsError(f"MODALSCOPE_DETECT_BASELINE: {exc}") from None
        return th

    def baseline_table(self) -> dict[str, tuple[float, float]]:
        return parse_baseline(self.baseline) if self.baseline else dict(SEED_BASELINE)


#: The environment variable of each threshold.
SETTINGS = {name: d.env for name, d in declared(Thresholds)}


# -- frames --------------------------------------------------------------------------------
PAIR_COLUMNS = ("caller", "callee", "minute", "count", "errors", "keys", "counts")
TRACE_COLUMNS = ("input_type", "minute", "count", "errors", "sum_ns", "keys", "counts")
TSTAGE_COLUMNS = ("input_type", "stage", "minute", "count", "sum_ns")
SPAN_COLUMNS = ("trace_id", "service", "name", "kind", "stage", "start_ns", "duration_ns", "status", "instance",
                "attrs")
LONG_TRACE_COLUMNS = ("trace_id", "root_service", "input_type", "start_ns", "duration_ns", "error")


def empty_frame(columns) -> pd.DataFrame:
    """A frame of no rows with these (object) columns: a copy of one built once (building
    one costs far more than copying it, and each exemplar look-up's ``Frames`` starts with five)."""
    return _empty_frame(tuple(columns)).copy()


@functools.lru_cache(maxsize=64)
def _empty_frame(columns: tuple) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


@dataclass
class Frames:
    """What the detectors read. ``start_ns``/``end_ns``: the window findings are reported
    for; ``data_start_ns``: where the data begins (a trailing look-back before ``start_ns``
    serves as baseline only). ``sampled``: raw spans cover only part of the window."""

    start_ns: int
    end_ns: int
    data_start_ns: int
    pairs: pd.DataFrame = field(default_factory=lambda: empty_frame(PAIR_COLUMNS))
    traces: pd.DataFrame = field(default_factory=lambda: empty_frame(TRACE_COLUMNS))
    tstage: pd.DataFrame = field(default_factory=lambda: empty_frame(TSTAGE_COLUMNS))
    spans: pd.DataFrame = field(default_factory=lambda: empty_frame(SPAN_COLUMNS))
    long_traces: pd.DataFrame = field(default_factory=lambda: empty_frame(LONG_TRACE_COLUMNS))
    sampled: bool = False
    spans_start_ns: int | None = None  # where raw spans begin (default: data_start_ns)
    # Convention rollups (``cache``/``batch``/``cuda``/``sync`` series, see CACHE_COLUMNS
    # etc.); None: computed from ``spans`` (hand-made frames carry raw spans only).
    cache: pd.DataFrame | None = None
    batch: pd.DataFrame | None = None
    cuda: pd.DataFrame | None = None
    sync: pd.DataFrame | None = None
    # (service, instance) pairs the ``inst`` rollups show as new; None: every instance
    # first seen after the raw spans begin. With it, ``spans`` may hold only the spans
    # around those births.
    new_instances: set | None = None
    # ``cold_start`` findings an earlier evaluation made from the same, unchanged raw spans
    # around births it checked (``findings._new_instances``): reported as found, when they
    # fall in this window, instead of reading those spans again.
    cold_starts_known: list | None = None
    # ``(lengths, keys, counts)`` of ``pairs``' sketches, every row's entries in row order,
    # as the reader decoded them (``findings._columns_frame``); None: concatenated from the
    # frame's ``keys``/``counts`` when needed. With it, ``pairs`` may leave out its ``keys``
    # and ``counts`` columns (a view a row: ~100,000 of them a day, built for a few findings);
    # its rows are then found by position (a default index).
    pair_sketches: tuple | None = None
    # What several detectors derive from one of the frames above (pair groups, attribute
    # spans, ...), built once: name -> (the frame it came from, the result).
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def derived(self, name: str, source, build):
        """``build()``, once per ``source`` object: a detector that replaces the frame it
        derives from gets a fresh result."""
        hit = self._derived.get(name)
        if hit is not None and hit[0] is source:
            return hit[1]
        value = build()
        self._derived[name] = (source, value)
        return value

    @property
    def first_minute(self) -> int:
        return -(-self.data_start_ns // NS_MIN)

    @property
    def end_minute(self) -> int:  # exclusive
        return -(-self.end_ns // NS_MIN)

    @property
    def report_minute(self) -> int:
        return -(-self.start_ns // NS_MIN)


# -- small helpers -------------------------------------------------------------------------
def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def finding(kind: str, severity: str, subject: Subject, start_ns: int, end_ns: int, evidence: dict,
            hint: str, exemplars=()) -> Finding:
    """A finding (``core.findings.Finding``): its window in whole seconds, floats in the
    evidence rounded to 4 places, numpy numbers as Python's, and at most ``MAX_EXEMPLARS``
    distinct exemplars in lowercase (``exemplar_ids``). Each ``evidence`` key names its value's unit, as
    ``units.evidence_unit`` reads it (``*_ms``, ``*_s``, ``*_minutes``, ``*_share``/``*_rate`` a
    fraction, ``*_ratio`` a multiple, ``*_count`` a count, or a key it lists): the pages and the
    CLI show it in that unit, and a test fails on a key it cannot place."""
    ev = {k: (round(float(v), 4) if isinstance(v, (float, np.floating)) else int(v) if isinstance(v, (np.integer,)) else v)
          for k, v in evidence.items()}
    return Finding(kind, severity, subject, rfc3339(start_ns), rfc3339(end_ns), ev, exemplar_ids(exemplars), hint)


def exemplar_ids(exemplars) -> tuple[str, ...]:
    """The first ``MAX_EXEMPLARS`` distinct trace ids of ``exemplars``, lowercase."""
    ids: list[str] = []
    for t in exemplars:
        t = str(t).lower()
        if t not in ids:
            ids.append(t)
        if len(ids) >= MAX_EXEMPLARS:
            break
    return tuple(ids)


def histogram_of(keys_list, counts_list) -> sketch.Histogram:
    """Merge sparse sketches (a frame's ``keys``/``counts`` columns) into one histogram."""
    h = sketch.Histogram()
    ks = [np.asarray(k) for k in keys_list if len(k)]
    if ks:
        np.add.at(h.counts, np.concatenate(ks), np.concatenate([np.asarray(c) for c, k in zip(counts_list, keys_list)
                                                                if len(k)]).astype(np.int64))
    return h


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


# -- the window a finding is reported in ---------------------------------------------------
def _reportable(frames: Frames, start_minute: int, end_minute: int) -> bool:
    return end_minute > frames.report_minute and start_minute < frames.end_minute


def _clip_window(frames: Frames, start_ns: int, end_ns: int) -> tuple[int, int]:
    return max(start_ns, frames.data_start_ns), min(end_ns, max(frames.end_ns, start_ns + NS_MIN))
