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

The pure decisions (open paths, safe redirects, bearer and proxy checks, the session key)
are in :mod:`.auth_rules`; the headers every response gets, :mod:`.security_headers`
(installed by :func:`init_app`). Both are re-exported here.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable
from urllib.parse import quote

from flask import (Flask, Request, Response, current_app, g, has_request_context, jsonify, redirect,
                   render_template_string, request, session)
from flask.sessions import SecureCookieSessionInterface
from sqlalchemy import delete, insert, select
from sqlalchemy.exc import SQLAlchemyError

from ..models import RevokedSession
from ..settings import Settings
from .auth_rules import (  # noqa: F401 - re-exported: this module is the gate's public face
    API_PREFIXES, DASH_XHR_PREFIXES, LOGIN_PATH, LOGOUT_PATH, MAX_NEXT_LEN, PUBLIC_PATHS, PUBLIC_PREFIXES,
    bearer_matches, is_signed_panel_request, panel_of_path, printable, request_is_https, route_kind, safe_next,
    same_origin_post, session_key, token_fingerprint)
from .security_headers import (  # noqa: F401 - re-exported, as above
    _make_private, apply_security_headers, content_security_policy, embed_headers, frame_ancestors, script_hashes,
    with_frame_ancestors)

log = logging.getLogger(__name__)

SESSION_LIFETIME = timedelta(hours=12)
SESSION_COOKIE = "modalscope_session"
_SID = re.compile(r"^[0-9a-f]{32}$")
# The sign-in form is a token and a path: nothing bigger is read (a 413 before reading).
MAX_LOGIN_BYTES = 16 * 1024


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
    return current_app.extensions["modalscope"]["engine"]


def session_revoked(sid: str) -> bool:
    """Whether the session ``sid`` was signed out. A store that cannot answer counts as
    revoked (one warning): a signed-out cookie must not come back during an outage."""
    try:
        with _engine().connect() as conn:
            return conn.execute(select(RevokedSession.sid).where(RevokedSession.sid == sid)).first() is not None
    except SQLAlchemyError as exc:
        log.warning("session check failed, refusing the session: %s", printable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
        return True


def revoke_session(sid: str, expires_s: float) -> None:
    """Store ``sid`` as signed out until ``expires_s`` (unix seconds), and forget the
    sessions whose cookies have expired anyway."""
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
