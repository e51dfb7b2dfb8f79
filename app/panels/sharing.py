"""The addresses of a panel (page link, embed, PNG, SVG, iframe), signed when a secret is set:
what ``/api/v1/share`` answers and the pages' Share control shows."""

from __future__ import annotations

import html
from typing import Iterable, Mapping
from urllib.parse import quote, urlencode

from .. import signing
from ..params import ParamError, rfc3339
from .presentation import open_href
from .query import PANELS, Panel, parse_query, split_params


DEFAULT_TTL_SECONDS = 30 * 86400
MIN_TTL_SECONDS = 60


def _query_string(pairs: Iterable[tuple[str, str]]) -> str:
    items = list(pairs)
    return "?" + urlencode(items, quote_via=quote, safe=":,") if items else ""


def _ordered(panel: Panel, params: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(k, params[k]) for k in panel.keys if params.get(k) not in (None, "")]


def parse_ttl(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_TTL_SECONDS
    try:
        ttl = int(raw)
    except ValueError:
        raise ParamError("ttl", "ttl must be a whole number of seconds") from None
    if not MIN_TTL_SECONDS <= ttl <= signing.MAX_TTL_SECONDS:
        raise ParamError("ttl", f"ttl must be between {MIN_TTL_SECONDS} and {signing.MAX_TTL_SECONDS} seconds")
    return ttl


def iframe_snippet(url: str, title: str, height: int = 480) -> str:
    """An ``<iframe>`` for a wiki page, every attribute value escaped."""
    return (f'<iframe src="{html.escape(url, quote=True)}" width="100%" height="{int(height)}" '
            f'style="border:0" loading="lazy" title="{html.escape(title, quote=True)}"></iframe>')


def share_urls(base_url: str, name: str, params: Mapping[str, str], *, secret: str = "",
               ttl_seconds: int | None = None, sign: bool = True, now: float | None = None) -> dict:
    """The addresses of a panel for its Share control and ``/api/v1/share``.

    ``params`` are the panel's data parameters (validated here: ``ParamError`` names a bad
    one). ``link`` is the full page (it needs a login when access is restricted); with a
    ``secret`` (and ``sign``) the embed, PNG and SVG URLs carry ``exp`` and ``sig``
    (``app/signing.py``): read-only, this panel and query only, until ``exp``."""
    panel = PANELS[name]
    data, _ = split_params(panel, params)
    q = parse_query(panel, data)
    base = base_url.rstrip("/")
    pairs = _ordered(panel, q.params)
    signed = bool(secret) and sign
    exp = None
    if signed:
        ttl = DEFAULT_TTL_SECONDS if ttl_seconds is None else ttl_seconds
        pairs = signing.sign(secret, panel.name, pairs, ttl, now=now)
        exp = int(dict(pairs)["exp"])
    search = _query_string(pairs)
    embed_url = f"{base}/embed/{panel.name}{search}"
    w, h = panel.size
    return {
        "panel": panel.name,
        "link": base + open_href(q),
        "embed_url": embed_url,
        "image_url": f"{base}/render/{panel.name}.png{search}",
        "svg_url": f"{base}/render/{panel.name}.svg{search}",
        "iframe": iframe_snippet(embed_url, f"modalscope · {panel.title}", h if h else 480),
        "signed": signed,
        "expires": rfc3339(exp * 1_000_000_000) if exp is not None else None,
    }
