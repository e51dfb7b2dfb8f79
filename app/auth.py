"""Who may see what: the access gate, the login form, and the security headers.

With ``MODALSCOPE_AUTH_TOKEN`` unset everything is open (the development default) and only
the headers apply. With it set, every request but the public ones (``/api/v1/health``,
static files: ``/assets/``, ``/_dash-component-suites/``, ``/embed-assets/``; ``/login``,
``/logout``) must be authenticated by one of:

* ``Authorization: Bearer <token>`` (API clients, image fetchers; constant-time compare);
* the session cookie that ``POST /login`` sets (browsers): signed, ``HttpOnly``,
  ``SameSite=Lax``, ``Secure`` on https, valid for :data:`SESSION_LIFETIME` from sign-in
  (absolute, not sliding) and only for the auth token it was issued for. Each carries a
  random session id; signing out stores that id in ``revoked_sessions`` (the database, so
  every worker and replica sees it), and a revoked cookie opens nothing even if replayed;
* ``MODALSCOPE_TRUSTED_PROXY_HEADER`` (e.g. ``X-Goog-Authenticated-User-Email`` behind
  Identity-Aware Proxy): a non-empty value there is the caller's identity. Only set it when
  every request passes through a proxy that sets or strips that header, or anyone can
  send it and walk in;
* a signed panel link (:mod:`.signing`): a GET of ``/embed/<panel>`` or
  ``/render/<panel>.png|svg`` whose query verifies for that panel opens that one request
  and nothing else (:func:`is_signed_panel_request`; the gate records the panel in
  :func:`current_access` so a view can check it serves exactly that panel).

Refusals fit the caller: ``/api/*``, ``/render/*``, Dash's XHR routes (``/_dash-*``,
``/_reload-hash``) and any request preferring JSON (``Accept``) get a 401 JSON error with
``WWW-Authenticate: Bearer``; a browser GET of a page (``/embed/*`` included) is redirected
to ``/login?next=<path+query>``; an embed or image URL that carries a signature that does
not verify (changed query, other panel, expired) gets a 403 saying so.

Session key: derived from ``MODALSCOPE_SECRET_KEY``; without it, from the auth token (so
every gunicorn worker derives the same key), with one warning. The derivation is
purpose-bound, so a session signature is never a valid share-link signature or vice versa.

Headers (:func:`apply_security_headers`, installed as an ``after_request`` by
:func:`init_app` for every response): ``X-Content-Type-Options``, ``Referrer-Policy`` and a
Content-Security-Policy (:func:`content_security_policy`). Paths under ``/embed/`` get
``frame-ancestors 'self' <MODALSCOPE_EMBED_ORIGINS>`` and no ``X-Frame-Options``; every other
response ``X-Frame-Options: DENY`` and ``frame-ancestors 'self'``. A view may set its own
``Content-Security-Policy`` (say, with the hash of an inline script it writes); the hook keeps
its directives and only forces ``frame-ancestors``. Embed views need not set any header.
With the token set, every gated response is also ``Cache-Control: private`` (a view's
``public`` becomes ``private``; its ``max-age`` and ``ETag`` stay).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterable
from urllib.parse import quote, urlsplit

from flask import Flask, Request, Response, g, has_request_context, jsonify, redirect, render_template_string, request, session
from flask.sessions import SecureCookieSessionInterface

from ..settings import Settings
from . import signing

log = logging.getLogger(__name__)

SESSION_LIFETIME = timedelta(hours=12)
SESSION_COOKIE = "modalscope_session"
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
_SID = re.compile(r"^[0-9a-f]{32}$")
# The sign-in form is a token and a path: nothing bigger is read (a 413 before reading).
MAX_LOGIN_BYTES = 16 * 1024


# -- pure pieces -------------------------------------------------------------------------
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


# -- Content-Security-Policy --------------------------------------------------------------
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


# -- who is asking -----------------------------------------------------------------------
@dataclass(frozen=True)
class Access:
    """How the current request got in. ``method``: ``open`` (no auth configured), ``bearer``,
    ``session``, ``proxy`` or ``signed``; ``identity``: the proxy's user; ``panel``: the one
    panel a signed link opens."""
    method: str
    identity: str | None = None
    panel: str | None = None


def current_access() -> Access | None:
    """The current request's :class:`Access` (None outside a request, or before the gate)."""
    return g.get("modalscope_access") if has_request_context() else None


def account() -> dict | None:
    """For the page header: ``{"identity": str | None, "session": bool}`` when someone is
    signed in (by login or by the proxy), else None."""
    access = current_access()
    if access is None or access.method not in ("session", "proxy"):
        return None
    return {"identity": access.identity, "session": access.method == "session"}


class _SessionInterface(SecureCookieSessionInterface):
    salt = "modalscope-session"

    def get_cookie_secure(self, app: Flask) -> bool:
        return request_is_https(request)


def _session_access(settings: Settings) -> Access | None:
    data = session.get("ms_auth")
    if not isinstance(data, dict):
        return None
    issued = data.get("iat")
    if not isinstance(issued, int):
        return None
    now = time.time()
    # Absolute lifetime from sign-in (Flask checks the cookie's own timestamp as well).
    if not (now - SESSION_LIFETIME.total_seconds() <= issued <= now + 60):
        return None
    if not hmac.compare_digest(str(data.get("v", "")), token_fingerprint(settings)):
        return None
    sid = data.get("sid")
    if not isinstance(sid, str) or not _SID.match(sid) or session_revoked(sid):
        return None
    return Access("session")


# -- revoked sessions (shared by every worker through the database) -----------------------
def _engine():
    from flask import current_app

    return current_app.extensions["modalscope"]["engine"]


def session_revoked(sid: str) -> bool:
    """Whether the session ``sid`` was signed out. A store that cannot answer counts as
    revoked (one warning): a signed-out cookie must not come back during an outage."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from ..models import RevokedSession

    try:
        with _engine().connect() as conn:
            return conn.execute(select(RevokedSession.sid).where(RevokedSession.sid == sid)).first() is not None
    except SQLAlchemyError as exc:
        log.warning("session check failed, refusing the session: %s", printable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
        return True


def revoke_session(sid: str, expires_s: float) -> None:
    """Store ``sid`` as signed out until ``expires_s`` (unix seconds), and forget the
    sessions whose cookies have expired anyway."""
    from sqlalchemy import delete, insert, select

    from ..models import RevokedSession

    now_ns = time.time_ns()
    with _engine().begin() as conn:
        conn.execute(delete(RevokedSession).where(RevokedSession.expires_ns < now_ns))
        if conn.execute(select(RevokedSession.sid).where(RevokedSession.sid == sid)).first() is None:
            conn.execute(insert(RevokedSession).values(sid=sid, expires_ns=int(expires_s * 1e9)))


_seen_identities: dict[str, None] = {}


def _note_identity(identity: str) -> None:
    # One log line per identity per worker, not per request (bounded memory).
    if identity in _seen_identities:
        return
    if len(_seen_identities) >= 1024:
        _seen_identities.clear()
    _seen_identities[identity] = None
    log.info("signed in by %s: %s", "trusted proxy header", printable(identity))


def authenticate(req: Request, settings: Settings) -> Access | None:
    """Who ``req`` is, by bearer token, trusted proxy header or session; None if nobody."""
    if bearer_matches(req.headers.get("Authorization"), settings.auth_token):
        return Access("bearer")
    if settings.trusted_proxy_header:
        identity = req.headers.get(settings.trusted_proxy_header, "").strip()
        if identity:
            _note_identity(identity)
            return Access("proxy", identity=printable(identity))
    return _session_access(settings)


# -- refusals ----------------------------------------------------------------------------
def _unauthorized_json() -> Response:
    resp = jsonify({"error": "authentication required: send Authorization: Bearer <MODALSCOPE_AUTH_TOKEN> "
                             "or sign in at /login"})
    resp.status_code = 401
    resp.headers["WWW-Authenticate"] = 'Bearer realm="modalscope"'
    return resp


def _current_target(req: Request) -> str:
    query = req.query_string.decode("latin-1")
    return quote(req.path) + (f"?{query}" if query else "")


def _wants_json(req: Request) -> bool:
    """A script asking for JSON (the embed's refresh) rather than a browser navigating."""
    return req.accept_mimetypes.best_match(["text/html", "application/json"]) == "application/json"


def _bad_signature(req: Request, kind: str) -> Response:
    message = ("this shared link is not valid: it has expired, or its query or panel was changed. "
               "Ask for a new link, or sign in.")
    if kind == "api" or _wants_json(req):
        resp = jsonify({"error": message})
        resp.status_code = 403
        return resp
    login = f"{LOGIN_PATH}?next={quote(_current_target(req), safe='')}"
    return Response(render_template_string(_FORBIDDEN_PAGE, message=message, login=login), 403,
                    mimetype="text/html")


def _refuse(req: Request) -> Response:
    kind = route_kind(req.path)
    if panel_of_path(req.path) and ("sig" in req.args or "exp" in req.args):
        return _bad_signature(req, kind)
    if kind == "page" and req.method in ("GET", "HEAD") and not _wants_json(req):
        return redirect(f"{LOGIN_PATH}?next={quote(_current_target(req), safe='')}", code=302)
    return _unauthorized_json()


# -- login form --------------------------------------------------------------------------
_HEAD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} · modalscope</title>
<link rel="stylesheet" href="/assets/modalscope.css"><link rel="stylesheet" href="/assets/auth.css"></head>"""

_LOGIN_PAGE = _HEAD + """
<body class="ms-login-body"><main class="ms-login">
<form class="ms-panel ms-login-form" method="post" action="/login">
  <div class="ms-brand"><span class="ms-logo">◆</span>modalscope</div>
  <h1 class="ms-login-title">Sign in</h1>
  {% if message %}<div class="ms-banner ms-banner-{{ kind }}" role="alert" id="login-message">{{ message }}</div>{% endif %}
  <label class="ms-filter-label" for="token">Access token</label>
  <input class="ms-input" id="token" name="token" type="password" autocomplete="current-password" required autofocus>
  <input type="hidden" name="next" value="{{ next }}">
  <button class="ms-button" id="login-submit" type="submit">Sign in</button>
  <p class="ms-note">The token is the server's <code>MODALSCOPE_AUTH_TOKEN</code>. You stay signed in for
  {{ hours }} hours on this browser.</p>
</form></main></body></html>"""

_FORBIDDEN_PAGE = _HEAD.replace("{{ title }}", "Link not valid") + """
<body class="ms-login-body"><main class="ms-login"><div class="ms-panel ms-login-form">
  <div class="ms-brand"><span class="ms-logo">◆</span>modalscope</div>
  <div class="ms-banner ms-banner-error" role="alert">{{ message }}</div>
  <a href="{{ login }}" target="_blank" rel="noopener">Sign in</a>
</div></main></body></html>"""


def _login_form(next_path: str, message: str = "", kind: str = "error", status: int = 200) -> Response:
    body = render_template_string(_LOGIN_PAGE, title="Sign in", next=next_path, message=message, kind=kind,
                                  hours=int(SESSION_LIFETIME.total_seconds() // 3600))
    resp = Response(body, status, mimetype="text/html")
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _register_login(server: Flask, settings: Settings) -> None:
    @server.route(LOGIN_PATH, methods=["GET", "POST"])
    def login():
        next_path = safe_next(request.values.get("next"))
        if not settings.auth_token:
            return redirect(next_path, code=303)
        if request.method == "GET":
            if authenticate(request, settings) is not None:
                return redirect(next_path, code=302)
            return _login_form(next_path)
        if not same_origin_post(request):
            log.warning("sign-in refused: cross-site form post (Origin %r)",
                        printable(request.headers.get("Origin") or request.headers.get("Referer") or ""))
            return _login_form(next_path, "Sign-in refused: the form was sent from another site.", status=403)
        given = request.form.get("token", "")
        if not hmac.compare_digest(given.encode("utf-8"), settings.auth_token.encode("utf-8")):
            log.info("sign-in with a wrong token from %s", request.remote_addr)
            return _login_form(next_path, "That token is not right.", status=401)
        session.clear()  # a fresh session: nothing carried over from before sign-in
        session.permanent = True
        session["ms_auth"] = {"iat": int(time.time()), "v": token_fingerprint(settings), "sid": secrets.token_hex(16)}
        return redirect(next_path, code=303)

    # GET too, for the header's plain "Sign out" link: a forged sign-out costs a sign-in, nothing more.
    @server.route(LOGOUT_PATH, methods=["GET", "POST"])
    def logout():
        if not settings.auth_token:
            return redirect("/", code=303)
        data = session.get("ms_auth")
        if isinstance(data, dict) and isinstance(data.get("sid"), str) and _SID.match(data["sid"]) \
                and isinstance(data.get("iat"), int):
            # Server-side: a copy of the cookie (another tab, a stolen one) is refused too.
            revoke_session(data["sid"], data["iat"] + SESSION_LIFETIME.total_seconds() + 3600)
        session.clear()
        return _login_form("/", "You are signed out.", kind="info")


# -- wiring ------------------------------------------------------------------------------
def init_app(server: Flask, settings: Settings, inline_scripts: Callable[[], list[str]] | None = None) -> None:
    """Install the gate (when ``MODALSCOPE_AUTH_TOKEN`` is set), ``/login`` and ``/logout``,
    and the security headers on ``server``. ``inline_scripts`` returns the inline scripts
    the app's pages carry (Dash's), whose hashes the CSP allows."""
    auth_on = bool(settings.auth_token)
    if auth_on:
        if not settings.secret_key:
            log.warning("MODALSCOPE_SECRET_KEY is not set: session cookies are signed with a key derived from "
                        "MODALSCOPE_AUTH_TOKEN, and shared links cannot be signed; set MODALSCOPE_SECRET_KEY")
        server.secret_key = session_key(settings)
        server.session_interface = _SessionInterface()
        server.config.update(
            SESSION_COOKIE_NAME=SESSION_COOKIE,
            SESSION_COOKIE_HTTPONLY=True,
            SESSION_COOKIE_SAMESITE="Lax",
            PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
            SESSION_REFRESH_EACH_REQUEST=False,  # absolute lifetime from sign-in, not sliding
        )
    _register_login(server, settings)

    if auth_on:
        @server.before_request
        def _gate():
            if route_kind(request.path) == "public":
                return None
            access = authenticate(request, settings)
            if access is None:
                panel = is_signed_panel_request(request, settings)
                access = Access("signed", panel=panel) if panel else None
            if access is None:
                return _refuse(request)
            g.modalscope_access = access
            return None
    else:
        @server.before_request
        def _open():
            g.modalscope_access = Access("open")

    cache: dict[str, object] = {"scripts": None, "hashes": []}

    def _hashes() -> list[str]:
        scripts = inline_scripts() if inline_scripts else []
        if scripts != cache["scripts"]:
            cache["scripts"], cache["hashes"] = list(scripts), script_hashes(scripts)
        return cache["hashes"]  # type: ignore[return-value]

    @server.after_request
    def _security_headers(resp: Response) -> Response:
        return apply_security_headers(resp, request.path, settings, _hashes(), auth_on=auth_on)


__all__ = [
    "Access", "SESSION_LIFETIME", "account", "apply_security_headers", "authenticate", "bearer_matches",
    "content_security_policy", "current_access", "embed_headers", "init_app", "is_signed_panel_request",
    "panel_of_path", "route_kind", "safe_next", "same_origin_post", "script_hashes", "session_key",
]
