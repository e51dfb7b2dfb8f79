"""Signed read-only links for shared panels (``/embed/<panel>``, ``/render/<panel>.png|svg``).

A signature is an HMAC-SHA256, keyed from ``MODALSCOPE_SECRET_KEY``, over the panel name,
the expiry (``exp``, unix seconds) and every other parameter of the query (time range,
filters, selection, ``trace_id`` and an image's ``width``, ``height`` and ``scale``), in a
canonical order. Only ``theme`` stays free. An image's size is signed because it is what
its cost grows with: a link signed for the default size draws that size and no other, so
a public link cannot be turned into a stream of 4000-pixel pictures. A signature for one
panel, one query or one size opens nothing else.

Pure functions: no Flask here, so the rules are tested alone and shared by the embed
routes, ``/api/v1/share`` and the access gate.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Iterable, Mapping
from urllib.parse import quote

# Parameters that change how a panel looks at no cost: not signed. (An image's width,
# height and scale are signed: they set what drawing it costs.)
PRESENTATION_PARAMS = frozenset({"theme"})
SIZE_PARAMS = frozenset({"width", "height", "scale"})
# The signature's own parameters.
SIGNATURE_PARAMS = frozenset({"sig", "exp"})
# Longest lifetime a signed link may ask for (a year): links are read-only, not forever.
MAX_TTL_SECONDS = 366 * 24 * 3600

_PURPOSE = b"modalscope/share/v1"


def _key(secret: str) -> bytes:
    # Derive a key for this one purpose, so a share signature can never double as a
    # session cookie signature made with the same MODALSCOPE_SECRET_KEY.
    return hmac.new(secret.encode(), _PURPOSE, hashlib.sha256).digest()


def _pairs(params: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(key, value) pairs of ``params``; a werkzeug MultiDict keeps repeated keys."""
    if hasattr(params, "items"):
        try:
            items = list(params.items(multi=True))  # type: ignore[call-arg]
        except TypeError:
            items = list(params.items())
    else:
        items = list(params)
    return [(str(k), str(v)) for k, v in items]


def data_params(params: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The signed part of a query: every parameter but ``theme`` and the signature's own,
    empty values dropped (``?stage=`` means no filter), sorted."""
    return sorted((k, v) for k, v in _pairs(params)
                  if k not in PRESENTATION_PARAMS and k not in SIGNATURE_PARAMS and v != "")


def signature(secret: str, panel: str, params: Mapping[str, str] | Iterable[tuple[str, str]], exp: int) -> str:
    """Hex HMAC-SHA256 over panel, exp and the data (and size) parameters."""
    canonical = "\n".join([panel, str(int(exp))] + [f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in data_params(params)])
    return hmac.new(_key(secret), canonical.encode(), hashlib.sha256).hexdigest()


def sign(secret: str, panel: str, params: Mapping[str, str] | Iterable[tuple[str, str]], ttl_seconds: int,
         now: float | None = None) -> list[tuple[str, str]]:
    """The query of a signed link: the data, size and presentation parameters, then ``exp`` and ``sig``."""
    if not secret:
        raise ValueError("signing needs MODALSCOPE_SECRET_KEY")
    ttl = max(1, min(int(ttl_seconds), MAX_TTL_SECONDS))
    exp = int(time.time() if now is None else now) + ttl
    kept = [(k, v) for k, v in _pairs(params) if k not in SIGNATURE_PARAMS and v != ""]
    return kept + [("exp", str(exp)), ("sig", signature(secret, panel, kept, exp))]


def verify(secret: str, panel: str, params: Mapping[str, str] | Iterable[tuple[str, str]],
           now: float | None = None) -> bool:
    """True when ``params`` carry a valid, unexpired signature for exactly this panel and
    data query. False for no secret, no/malformed ``sig``/``exp``, a past ``exp``, or any
    changed data parameter."""
    if not secret:
        return False
    pairs = _pairs(params)
    sigs = [v for k, v in pairs if k == "sig"]
    exps = [v for k, v in pairs if k == "exp"]
    if len(sigs) != 1 or len(exps) != 1:
        return False
    try:
        exp = int(exps[0])
    except ValueError:
        return False
    if exp < (time.time() if now is None else now):
        return False
    expected = signature(secret, panel, pairs, exp)
    return hmac.compare_digest(expected.encode(), sigs[0].encode("utf-8", "replace"))


__all__ = ["MAX_TTL_SECONDS", "PRESENTATION_PARAMS", "SIGNATURE_PARAMS", "SIZE_PARAMS", "data_params", "sign", "signature", "verify"]
