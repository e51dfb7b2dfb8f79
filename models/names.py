"""Bounded series names: what a hostile or buggy client can make the store remember.

A service, operation, cache or attribute value becomes a series dimension (and a filter
option) as sent. Longer than its limit, it keeps a prefix, a visible ``…`` and a short hash
of the whole, so two long names that share a prefix stay two series, and every name the
dashboard lists is a few hundred characters at most. Capping is idempotent: a capped name
is exactly ``limit`` characters long and caps to itself.
"""

from __future__ import annotations

import hashlib

SERVICE_CHARS = 128  # services (a span's service.name; a pair's caller and callee)
NAME_CHARS = 256  # operations (span names), caches, models, attribute values
MARK = "…"
_HASH_CHARS = 8
# The name a kind's series past MODALSCOPE_MAX_SERIES_PER_KIND share (each unbounded dimension)
OVERFLOW = "(other)"


def cap_text(value: str, limit: int) -> str:
    """``value`` if at most ``limit`` characters, else its prefix, ``…`` and 8 hex digits of
    its hash: ``limit`` characters in all."""
    if len(value) <= limit:
        return value
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=_HASH_CHARS // 2).hexdigest()
    return value[: limit - _HASH_CHARS - len(MARK)] + MARK + digest


def cap_service(value: str) -> str:
    return cap_text(value, SERVICE_CHARS)


def cap_name(value: str) -> str:
    return cap_text(value, NAME_CHARS)


__all__ = ["MARK", "NAME_CHARS", "OVERFLOW", "SERVICE_CHARS", "cap_name", "cap_service", "cap_text"]
