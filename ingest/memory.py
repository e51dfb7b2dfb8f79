"""Keeping a receiver process's memory close to what it holds (glibc only; elsewhere no-ops).

Each thread that allocates gets a glibc malloc arena of its own (up to eight per core), and a
large request freed in one arena is seldom given back to the system: a burst of 16 MiB
requests across the receivers' threads left a process far above its working size. Two arenas,
a fixed mmap threshold (glibc otherwise raises it to the largest block freed, so the next
16 MiB bodies come from the heap and stay there) and a trim after large requests keep RSS
near the live data.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["limit_arenas", "trim"]

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
#: Blocks this large get pages of their own, returned to the system when freed.
MMAP_THRESHOLD_BYTES = 1024 * 1024
#: Requests at least this large are followed by a trim.
TRIM_AFTER_BYTES = 4 * 1024 * 1024


def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc has both; musl and macOS do not
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def limit_arenas(arenas: int = 2) -> bool:
    """Cap the malloc arenas of this process and fix its mmap threshold (call before the
    worker threads start)."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(_M_ARENA_MAX, int(arenas))) and bool(
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def trim(nbytes: int) -> None:
    """Give freed memory back to the system after a request of ``nbytes``, if it was large."""
    if _LIBC is not None and nbytes >= TRIM_AFTER_BYTES:
        _LIBC.malloc_trim(0)
