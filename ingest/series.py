"""Latency series: the key of each (kind, service, name, stage, input type, caller, callee),
its stable hash, the caps on dimension length and on the number of series per kind (overflow
goes to one ``(other)`` series a kind), and the per-engine registry of their ids."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import weakref
from typing import Iterable

from sqlalchemy import Connection, Engine, func, select

from ..models import Series
from ..models.dialect import insert_ignore
from ..models.names import NAME_CHARS, OVERFLOW, SERVICE_CHARS, cap_text
from ..settings import SettingsError, setting_from_env

log = logging.getLogger(__name__)

# Dimension order of a series key.
SERIES_FIELDS = ("kind", "service", "name", "stage", "input_type", "caller", "callee")


def series_key(kind: str, service: str = "", name: str = "", stage: str = "", input_type: str = "",
               caller: str = "", callee: str = "") -> tuple[str, ...]:
    return (kind, service, name, stage, input_type, caller, callee)


def series_hash(key: tuple[str, ...]) -> str:
    return hashlib.sha256("\x1f".join(key).encode("utf-8", "surrogatepass")).hexdigest()


# Longest value a series dimension keeps (``models/names.py``), in SERIES_FIELDS order;
# None: bounded by the tagging rules (stage, input type). A pair's caller and callee are
# services.
_DIM_CHARS = (None, SERVICE_CHARS, NAME_CHARS, None, None, SERVICE_CHARS, NAME_CHARS)
_PAIR_DIM_CHARS = (None, SERVICE_CHARS, NAME_CHARS, None, None, SERVICE_CHARS, SERVICE_CHARS)
MAX_SERIES_PER_KIND = 2000  # MODALSCOPE_MAX_SERIES_PER_KIND's default
CACHE_SECONDS = 600.0  # cached ids are looked up again this often (retention prunes series)


def cap_key(key: tuple[str, ...]) -> tuple[str, ...]:
    """``key`` with every unbounded dimension capped (``names.cap_text``); cheap when none is long."""
    limits = _PAIR_DIM_CHARS if key[0] == "pair" else _DIM_CHARS
    if all(lim is None or len(v) <= lim for v, lim in zip(key, limits)):
        return key
    return tuple(v if lim is None else cap_text(v, lim) for v, lim in zip(key, limits))


def overflow_key(key: tuple[str, ...]) -> tuple[str, ...]:
    """The series a new key of a full kind counts in: its unbounded dimensions (service, name,
    caller, callee) ``(other)`` where set, its stage and input type kept."""
    kind, service, name, stage, input_type, caller, callee = key
    return (kind, OVERFLOW if service else "", OVERFLOW if name else "", stage, input_type,
            OVERFLOW if caller else "", OVERFLOW if callee else "")


def is_overflow(key: tuple[str, ...]) -> bool:
    return OVERFLOW in (key[1], key[2], key[5], key[6]) and overflow_key(key) == key


def max_series_setting() -> int:
    """``MODALSCOPE_MAX_SERIES_PER_KIND`` of this process's environment (the settler may run
    in a process of its own, which inherits it)."""
    try:
        return setting_from_env("max_series_per_kind")
    except SettingsError:
        log.warning("ignoring a bad MODALSCOPE_MAX_SERIES_PER_KIND; using %d", MAX_SERIES_PER_KIND)
        return MAX_SERIES_PER_KIND


class SeriesRegistry:
    """Maps series keys to ids, creating rows on first use; ids are cached once committed.

    The one place names become series: every key is capped (``cap_key``), and a kind holds
    at most ``max_per_kind`` series: a new key past that counts in the kind's overflow series
    (``overflow_key``), as a cache tag's values past ``CACHE_TAG_VALUES`` do. Cached ids
    expire after ``CACHE_SECONDS``, so a series retention pruned is created again."""

    def __init__(self, max_per_kind: int | None = None) -> None:
        self._ids: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()
        self.max_per_kind = max_series_setting() if max_per_kind is None else max_per_kind
        self._expires = time.monotonic() + CACHE_SECONDS

    def resolve(self, conn: Connection, keys: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], int]:
        out: dict[tuple[str, ...], int] = {}
        missing = []
        with self._lock:
            if time.monotonic() > self._expires:
                self._ids.clear()
                self._expires = time.monotonic() + CACHE_SECONDS
            for k in keys:
                sid = self._ids.get(k)
                if sid is None:
                    missing.append(k)
                else:
                    out[k] = sid
        if not missing:
            return out
        capped = {k: cap_key(k) for k in missing}
        found = self._lookup(conn, set(capped.values()))
        new = sorted({c for c in capped.values() if c not in found})
        if new:
            target = self._admit(conn, new)
            wanted = set(target.values())
            if wanted:
                conn.execute(
                    insert_ignore(conn, Series.__table__, ["key_hash"]),
                    [dict(zip(SERIES_FIELDS, k), key_hash=series_hash(k)) for k in sorted(wanted)],
                )
                found.update(self._lookup(conn, wanted))
            for c, t in target.items():
                found[c] = found[t]
        for k, c in capped.items():
            out[k] = found[c]
        return out

    @staticmethod
    def _lookup(conn: Connection, keys: set[tuple[str, ...]]) -> dict[tuple[str, ...], int]:
        by_hash = {series_hash(k): k for k in keys}
        hashes = list(by_hash)
        found: dict[tuple[str, ...], int] = {}
        for i in range(0, len(hashes), 500):
            chunk = hashes[i : i + 500]
            for sid, h in conn.execute(select(Series.id, Series.key_hash).where(Series.key_hash.in_(chunk))):
                found[by_hash[h]] = sid
        return found

    def _admit(self, conn: Connection, new: list[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[str, ...]]:
        """Which series each new (capped, not stored) key gets: itself while its kind has
        room, else the kind's overflow series (never capped). Two settlers admitting at
        once may pass the cap by a batch each; it holds from then on."""
        kinds = sorted({k[0] for k in new})
        counts = dict(conn.execute(select(Series.kind, func.count()).where(Series.kind.in_(kinds))
                                   .group_by(Series.kind)).all())
        target: dict[tuple[str, ...], tuple[str, ...]] = {}
        for k in new:
            if is_overflow(k):
                target[k] = k
            elif counts.get(k[0], 0) < self.max_per_kind:
                counts[k[0]] = counts.get(k[0], 0) + 1
                target[k] = k
            else:
                target[k] = overflow_key(k)
        return target

    def known(self, key: tuple[str, ...]) -> bool:
        with self._lock:
            return key in self._ids

    def remember(self, resolved: dict[tuple[str, ...], int]) -> None:
        with self._lock:
            if len(self._ids) > 200_000:
                self._ids.clear()
            self._ids.update(resolved)

    def forget(self) -> None:
        with self._lock:
            self._ids.clear()


# One registry per engine: cached ids are only valid for the database they came from.
_REGISTRIES: "weakref.WeakKeyDictionary[Engine, SeriesRegistry]" = weakref.WeakKeyDictionary()
_REGISTRIES_LOCK = threading.Lock()


def registry_for(engine: Engine) -> SeriesRegistry:
    with _REGISTRIES_LOCK:
        reg = _REGISTRIES.get(engine)
        if reg is None:
            reg = _REGISTRIES[engine] = SeriesRegistry()
        return reg
