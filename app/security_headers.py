"""Every response's security headers (:func:`apply_security_headers`, installed as an
``after_request`` hook by ``auth.init_app``): ``X-Content-Type-Options``, ``Referrer-Policy``
and a Content-Security-Policy (:func:`content_security_policy`).

Paths under ``/embed/`` get ``frame-ancestors 'self' <MODALSCOPE_EMBED_ORIGINS>`` and no
``X-Frame-Options``; every other response ``X-Frame-Options: DENY`` and ``frame-ancestors
'self'``. A view may set its own ``Content-Security-Policy`` (say, with the hash of an inline
script it writes); the hook keeps its directives and only forces ``frame-ancestors``. Embed
views need not set any header. With the auth token set, every gated response is also
``Cache-Control: private`` (a view's ``public`` becomes ``private``; its ``max-age`` and
``ETag`` stay).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Iterable

from flask import Response

from ..settings import Settings
from .auth_rules import route_kind


def script_hashes(scripts: Iterable[str]) -> list[str]:
    """CSP source expressions (``'sha256-…'``) for inline scripts, as the browser hashes them."""
    return [f"'sha256-{base64.b64encode(hashlib.sha256(s.encode('utf-8')).digest()).decode()}'" for s in scripts]


def frame_ancestors(settings: Settings, embed: bool) -> str:
    return " ".join(["'self'", *settings.embed_origins]) if embed else "'self'"


def content_security_policy(settings: Settings, *, hashes: Iterable[str] = (), embed: bool = False) -> str:
    """The policy for pages: nothing loads from anywhere but this site, and no span text can
    turn into script.

    * ``script-src 'self'`` plus the hashes of Dash's inline scripts (``new DashRenderer(...)``
      and its clientside callbacks): no ``'unsafe-inline'``. No ``'unsafe-eval'`` either: the
      Dash renderer and plotly.js run without it for every trace type the app draws (the
      WebGL ones compile shaders with ``new Function``; the app draws none), which the
      headless-browser tests check by failing on any console error.
    * ``style-src 'unsafe-inline'``: plotly.js and React write ``<style>`` and style
      attributes at run time (styles cannot run script).
    * ``img-src data:``: plotly's modebar and Dash's loading spinners use data: images.
    """
    directives = [
        ("default-src", "'self'"),
        ("script-src", " ".join(["'self'", *hashes])),
        ("style-src", "'self' 'unsafe-inline'"),
        ("img-src", "'self' data:"),
        ("font-src", "'self' data:"),
        ("connect-src", "'self'"),
        ("object-src", "'none'"),
        ("base-uri", "'self'"),
        ("form-action", "'self'"),
        ("frame-ancestors", frame_ancestors(settings, embed)),
    ]
    return "; ".join(f"{name} {value}" for name, value in directives)


def with_frame_ancestors(policy: str, ancestors: str) -> str:
    """``policy`` with its ``frame-ancestors`` directive replaced (or added)."""
    kept = [d.strip() for d in policy.split(";") if d.strip() and d.split()[0].lower() != "frame-ancestors"]
    return "; ".join([*kept, f"frame-ancestors {ancestors}"])


def apply_security_headers(resp: Response, path: str, settings: Settings, hashes: Iterable[str] = (),
                           auth_on: bool = False) -> Response:
    """Every response's security headers (see the module docstring). ``/embed/*`` may be
    framed by ``MODALSCOPE_EMBED_ORIGINS``; nothing else may be framed by another site."""
    embed = path.startswith("/embed/")
    ancestors = frame_ancestors(settings, embed)
    own = resp.headers.get("Content-Security-Policy")
    resp.headers["Content-Security-Policy"] = (with_frame_ancestors(own, ancestors) if own
                                               else content_security_policy(settings, hashes=hashes, embed=embed))
    if embed:
        resp.headers.pop("X-Frame-Options", None)
    else:
        resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers.setdefault("Referrer-Policy", "same-origin")
    if auth_on and route_kind(path) != "public":
        _make_private(resp)
    return resp


def embed_headers(resp: Response, settings: Settings) -> Response:
    """The embed headers on ``resp`` (what the after_request hook already does for every
    ``/embed/*`` path; for a view outside ``/embed/`` that wants to be framable)."""
    return apply_security_headers(resp, "/embed/", settings)


def _make_private(resp: Response) -> None:
    """What needed credentials must not sit in a shared cache: ``public`` becomes
    ``private``, and ``private`` is added unless the response is ``no-store``. A view's
    ``max-age`` and ``ETag`` stay."""
    parts = [p.strip() for p in resp.headers.get("Cache-Control", "").split(",") if p.strip()]
    parts = [p for p in parts if p.lower() != "public"]
    if not any(p.lower() in ("private", "no-store") for p in parts):
        parts.insert(0, "private")
    resp.headers["Cache-Control"] = ", ".join(parts)
