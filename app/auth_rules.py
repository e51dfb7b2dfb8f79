"""The access gate's pure decisions (``auth.py`` wires them into requests): which paths are
open and how a refusal looks, where sign-in may send a browser, bearer and proxy checks, and
the keys that sign session cookies. No request state, so each is tested on its own."""

from __future__ import annotations

import hashlib
import hmac
import re
from urllib.parse import urlsplit

from flask import Request

from ..settings import Settings
from . import signing

LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
MAX_NEXT_LEN = 4096

# Always open: the health check (load balancers), static files (Dash's, and plotly.js and
# the script of the embeds, which a signed embed loads without a session: no data in any of
# them) and the login form itself.
PUBLIC_PATHS = frozenset({"/api/v1/health", "/_favicon.ico", LOGIN_PATH, LOGOUT_PATH})
PUBLIC_PREFIXES = ("/assets/", "/_dash-component-suites/", "/embed-assets/")
# Machine routes: a refusal is a 401 JSON error, never a redirect to a form.
API_PREFIXES = ("/api/", "/render/")
DASH_XHR_PREFIXES = ("/_dash-", "/_reload-hash")

_EMBED_PATH = re.compile(r"^/embed/([a-z0-9][a-z0-9-]{0,63})$")
_RENDER_PATH = re.compile(r"^/render/([a-z0-9][a-z0-9-]{0,63})\.(?:png|svg)$")
_SESSION_PURPOSE = b"modalscope/session/v1"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def route_kind(path: str) -> str:
    """``public``, ``api`` (JSON 401), ``dash`` (Dash XHR: JSON 401) or ``page`` (redirect to
    the login form). Only decides what a refusal looks like: every non-public path is gated."""
    if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
        return "public"
    if path.startswith(API_PREFIXES):
        return "api"
    if path.startswith(DASH_XHR_PREFIXES):
        return "dash"
    return "page"


def panel_of_path(path: str) -> str | None:
    """The panel an ``/embed/<panel>`` or ``/render/<panel>.png|svg`` path addresses."""
    m = _EMBED_PATH.match(path) or _RENDER_PATH.match(path)
    return m.group(1) if m else None


def is_signed_panel_request(req: Request, settings: Settings, now: float | None = None) -> str | None:
    """The panel this request may read through its signed link, or None.

    True only for a GET/HEAD of ``/embed/<panel>`` or ``/render/<panel>.png|svg`` whose query
    verifies (``signing.verify``) for exactly that panel with ``MODALSCOPE_SECRET_KEY``.
    The embed code can rely on it: a non-None answer names the one panel the link opens.
    """
    if req.method not in ("GET", "HEAD"):
        return None
    panel = panel_of_path(req.path)
    if panel is None or not settings.secret_key:
        return None
    return panel if signing.verify(settings.secret_key, panel, req.args, now=now) else None


def safe_next(value: str | None, default: str = "/") -> str:
    """A local path to go to after sign-in, or ``default``.

    Only ``/path?query`` on this site: no scheme or host (``https://evil``), no
    protocol-relative ``//evil``, no backslash (browsers read ``/\\evil`` as ``//evil``), no
    control characters (browsers drop tabs and newlines, so ``/\\t/evil`` would become
    ``//evil``), and never the login or logout page itself.
    """
    if not value or len(value) > MAX_NEXT_LEN:
        return default
    if not value.startswith("/") or value.startswith("//") or "\\" in value or _CONTROL.search(value):
        return default
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return default
    if parts.path in (LOGIN_PATH, LOGOUT_PATH):
        return default
    return value


def bearer_matches(header: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>`` (scheme case-insensitive), compared in constant time."""
    if not token:
        return False
    scheme, _, given = (header or "").strip().partition(" ")
    # WSGI headers are latin-1 decoded text: encode back to the bytes the client sent.
    ok = hmac.compare_digest(given.strip().encode("latin-1", "replace"), token.encode("utf-8"))
    return ok and scheme.lower() == "bearer"


def session_key(settings: Settings) -> str:
    """The key that signs session cookies: from MODALSCOPE_SECRET_KEY, else from the auth
    token (the same in every worker). Purpose-bound, unlike the share-link key."""
    base = settings.secret_key or settings.auth_token
    return hmac.new(base.encode("utf-8"), _SESSION_PURPOSE, hashlib.sha256).hexdigest()


def token_fingerprint(settings: Settings) -> str:
    """Ties a session to the auth token it was issued for: rotating the token signs
    everyone out. Keyed, so the (readable) cookie gives no offline test of a guessed token
    beyond what its signature gives."""
    return hmac.new(session_key(settings).encode(), settings.auth_token.encode("utf-8"),
                    hashlib.sha256).hexdigest()[:24]


def request_is_https(req: Request) -> bool:
    """https, directly or as a TLS-terminating proxy reports it.

    ``X-Forwarded-Proto`` is honoured only towards *https*: it can make the cookie
    ``Secure`` (stricter: a spoofed header only denies the spoofer their own cookie over
    plain http), never take ``Secure`` away.
    """
    forwarded = req.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return req.is_secure or forwarded == "https"


def same_origin_post(req: Request) -> bool:
    """Login CSRF check: an ``Origin`` (else ``Referer``) header, when the browser sends one,
    must name this site (its ``Host``, or the ``X-Forwarded-Host`` a proxy set: a cross-site
    page cannot set either on the victim's request). Neither header: allowed (SameSite=Lax
    and the form still need the token)."""
    hosts = {req.host.lower()}
    hosts |= {h.strip().lower() for h in req.headers.get("X-Forwarded-Host", "").split(",") if h.strip()}
    origin = req.headers.get("Origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc.lower() in hosts
    referer = req.headers.get("Referer")
    if referer:
        return urlsplit(referer).netloc.lower() in hosts
    return True


def printable(value: str, limit: int = 200) -> str:
    """Proxy identities are untrusted text: no control characters in logs, bounded length."""
    cleaned = _CONTROL.sub("?", value).strip()
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"
