"""``/embed/<panel>`` and ``/render/<panel>.png|svg``: one panel outside the dashboard.

Design (why a Flask blueprint and not a Dash page): an embed is one chart or table inside
someone else's wiki page. A small Jinja page (autoescaped) with the figure's JSON in a
non-executing ``<script type="application/json">`` element, drawn by plotly.js and a ~80-line
script served from here, has no Dash renderer, no callbacks and no session: a signed link
(``app/signing.py``) is the only credential it needs, it loads fast in an iframe, and its
Content-Security-Policy can be the strictest one (``script-src 'self'``, no inline script,
no hashes). The figure and table come from ``app/panels/``, which calls the same query and
figure functions as the pages, so an embed shows what its page shows.

Addresses (all taking the panel's data parameters, :data:`panels.PANELS`):

* ``GET /embed/<panel>[?theme=dark]`` -> the HTML page; with ``Accept: application/json``
  the same URL answers ``{"window", "figure"|"table"}`` (the embed's refresh reads it, so a
  signed link refreshes under its own signature).
* ``GET /render/<panel>.png|svg?width=&height=[&scale=][&theme=]`` -> the image, through the
  process's warm kaleido renderer (``app/render.py``); ``ETag`` + ``If-None-Match`` -> 304.
  ``width`` and ``height`` are at most ``MODALSCOPE_RENDER_MAX_PX``, ``scale`` at most
  ``MODALSCOPE_RENDER_MAX_SCALE``; a signed link carries its size inside the signature.
  At most ``MODALSCOPE_RENDER_QUEUE`` images draw or wait per process (then 503 with
  ``Retry-After``); one not drawn within ``MODALSCOPE_RENDER_TIMEOUT_S`` is a 504.
* ``GET /embed-assets/<file>`` -> plotly.js (from the installed ``plotly``), embed.js/css;
  any other path under ``/embed-assets/`` is a 404 (never the dashboard's page).

Errors: unknown panel 404, a signature that does not verify 403 (with or without
``MODALSCOPE_AUTH_TOKEN``: the access gate in ``app/auth.py`` handles requests without a
session, this module any request that carries ``sig``/``exp``), a bad parameter 400 naming
it, an image that cannot be drawn 503, each one line (HTML for the embed, JSON for images).
Security headers (``frame-ancestors`` from ``MODALSCOPE_EMBED_ORIGINS``, no
``X-Frame-Options`` on ``/embed/``) come from ``auth.apply_security_headers``; this module
only states the embed's own script/style policy.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import plotly
from flask import Blueprint, Response, current_app, jsonify, render_template, request, send_file

from .. import __version__
from . import panels, signing
from .detectors import Thresholds
from .params import ParamError
from .render import RenderBusy, RenderError, RenderGate, RenderTimeout, renderer

log = logging.getLogger(__name__)

bp = Blueprint("embed", __name__, template_folder="templates")

STATIC_DIR = Path(__file__).resolve().parent / "embed_static"
STATIC_PREFIX = "/embed-assets"
EMBED_PRESENTATION = ("theme",)
IMAGE_PRESENTATION = ("theme", "width", "height", "scale")
MIN_SIZE = 200
# A size the server picks (a table as tall as its rows) is bounded too, not by the setting:
# it follows the data, never a caller's number.
MAX_DEFAULT_SIZE = 4000
PNG_SCALE = 2
MAX_AGE = 60
# The embed page's own policy; the security-header hook adds frame-ancestors.
EMBED_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
             "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'")
IMAGE_TYPES = {"png": "image/png", "svg": "image/svg+xml"}


def _ext() -> dict:
    return current_app.extensions["modalscope"]


def _settings():
    return _ext()["settings"]


def _thresholds():
    return Thresholds.kept_in(_ext())


def _cache_control() -> str:
    # Behind MODALSCOPE_AUTH_TOKEN a response needed credentials: never in a shared cache.
    return f"{'private' if _settings().auth_token else 'public'}, max-age={MAX_AGE}"


# -- answers ---------------------------------------------------------------------------
def _embed_error(status: int, message: str, theme: str = "light") -> Response:
    html = render_template("embed.html", theme=theme, panel="", kind="error", refresh=0, scroll=False,
                           title="modalscope", window="", open_href=None, message=message,
                           figure_json=None, table=None, static_url=static_url)
    resp = Response(html, status, mimetype="text/html")
    resp.headers["Content-Security-Policy"] = EMBED_CSP
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _json_error(status: int, message: str, parameter: str | None = None) -> Response:
    body = {"error": message}
    if parameter:
        body["parameter"] = parameter
    resp = jsonify(body)
    resp.status_code = status
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _unknown_panel(name: str) -> str:
    return f"unknown panel {name[:64]!r}; panels: {', '.join(panels.PANEL_NAMES)}"


def signature_refused(panel: str) -> str | None:
    """Why a request that carries ``sig``/``exp`` may not open ``panel`` (None: it may, or it
    carries no signature). Holds with and without ``MODALSCOPE_AUTH_TOKEN``: a link that
    was changed, expired or made for another panel never shows anything."""
    if "sig" not in request.args and "exp" not in request.args:
        return None
    secret = _settings().secret_key
    if not secret:
        return "this link is signed, but this server has no MODALSCOPE_SECRET_KEY to check it"
    if not signing.verify(secret, panel, request.args):
        return ("this shared link is not valid: it has expired, or its query or panel was changed. "
                "Ask for a new link.")
    return None


def _theme(pres: dict) -> str:
    theme = pres.get("theme", "light")
    if theme not in panels.THEMES:
        raise ParamError("theme", f"theme must be light or dark, not {theme[:40]!r}")
    return theme


def static_url(name: str) -> str:
    version = plotly.__version__ if name == "plotly.min.js" else __version__
    return f"{STATIC_PREFIX}/{name}?v={version}"


def _wants_json() -> bool:
    """``Accept: application/json`` (the embed's refresh) rather than a page (a browser)."""
    return request.accept_mimetypes.best_match(["text/html", "application/json"]) == "application/json"


# -- routes ----------------------------------------------------------------------------
@bp.get("/embed/<panel>")
def embed(panel: str):
    p = panels.get_panel(panel)
    if p is None:
        return _embed_error(404, _unknown_panel(panel))
    refused = signature_refused(panel)
    if refused:
        return _embed_error(403, refused)
    try:
        data, pres = panels.split_params(p, request.args, EMBED_PRESENTATION)
        theme = _theme(pres)
        query = panels.parse_query(p, data)
    except ParamError as exc:
        if _wants_json():
            return _json_error(400, exc.message, exc.parameter)
        return _embed_error(400, f"{exc.parameter}: {exc.message}",
                            request.args.get("theme") if request.args.get("theme") in panels.THEMES else "light")
    built = panels.build_query(query, _ext()["reader"], thresholds=_thresholds())
    status = 200 if built.found else 404
    if built.figure is not None:
        panels.apply_theme(built.figure, theme)
    if _wants_json():
        body = {"panel": p.name, "window": panels.window_text(query)}
        if built.figure is not None:
            body["figure"] = built.figure.to_plotly_json()
        else:
            body["table"] = {"columns": built.table.columns, "rows": built.table.rows,
                             "row_classes": built.table.row_classes, "empty": built.table.empty}
        resp = Response(panels.script_json(body), status, mimetype="application/json")
    else:
        html = render_template(
            "embed.html", theme=theme, panel=p.name, kind=p.kind, refresh=panels.refresh_seconds(query),
            scroll=p.name == "trace", title=p.title, window=panels.window_text(query),
            open_href=panels.open_href(query),
            message=None if built.found else f"Trace {query.trace_id} is not stored.",
            figure_json=panels.figure_json(built.figure) if built.figure is not None else None,
            table=built.table, static_url=static_url)
        resp = Response(html, status, mimetype="text/html")
        resp.headers["Content-Security-Policy"] = EMBED_CSP
    resp.headers["Cache-Control"] = _cache_control()
    resp.headers["Vary"] = "Accept"
    return resp


def _size(pres: dict, name: str, default: int) -> int:
    raw = pres.get(name)
    if raw is None:
        return max(MIN_SIZE, min(MAX_DEFAULT_SIZE, default))
    most = _settings().render_max_px
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6):
        raise ParamError(name, f"{name} must be a whole number of CSS pixels")
    value = int(raw)
    if not MIN_SIZE <= value <= most:
        raise ParamError(name, f"{name} must be between {MIN_SIZE} and {most} CSS pixels")
    return value


def _scale(pres: dict, fmt: str) -> int:
    raw = pres.get("scale")
    if raw is None:
        return min(PNG_SCALE, _settings().render_max_scale) if fmt == "png" else 1
    if fmt != "png":
        raise ParamError("scale", "scale applies to PNG images only")
    most = _settings().render_max_scale
    allowed = [str(n) for n in range(1, most + 1)]
    if raw not in allowed:
        raise ParamError("scale", f"scale must be {', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1
                         else "scale must be 1")
    return int(raw)


@bp.get("/render/<image>")
def render_image(image: str):
    panel, dot, fmt = image.rpartition(".")
    p = panels.get_panel(panel) if dot else None
    if p is None or fmt not in IMAGE_TYPES:
        if p is not None:
            return _json_error(404, f"unknown image format {fmt[:16]!r}; use .png or .svg")
        return _json_error(404, _unknown_panel(panel or image))
    refused = signature_refused(panel)
    if refused:
        return _json_error(403, refused)
    try:
        data, pres = panels.split_params(p, request.args, IMAGE_PRESENTATION)
        theme = _theme(pres)
        scale = _scale(pres, fmt)
        query = panels.parse_query(p, data)
        built = panels.build_query(query, _ext()["reader"], thresholds=_thresholds())
        width = _size(pres, "width", built.query.panel.size[0])
        height = _size(pres, "height", panels.image_size(built, width)[1])
    except ParamError as exc:
        return _json_error(400, exc.message, exc.parameter)
    if not built.found:
        return _json_error(404, f"trace {query.trace_id} is not stored", "trace_id")
    figure = (panels.apply_theme(built.figure, theme) if built.figure is not None
              else panels.table_figure(built.table, p.title, theme))
    figure.update_layout(width=width, height=height)
    spec = panels.figure_json(figure)
    etag = hashlib.sha256(f"{spec}|{width}|{height}|{scale}|{fmt}".encode()).hexdigest()[:40]
    headers = {"ETag": f'"{etag}"', "Cache-Control": _cache_control(), "Vary": "Accept-Encoding"}
    if request.if_none_match.contains_weak(etag):
        return Response(status=304, headers=headers)
    gate = _ext().get("render_gate")
    if gate is None:
        gate = _ext().setdefault("render_gate", RenderGate(_settings().render_queue))
    draw = _ext().get("render_fn") or renderer().render  # a test may put a stand-in here
    try:
        with gate:
            body = draw(figure, fmt, width, height, scale)
    except (RenderBusy, RenderTimeout) as exc:
        log.warning("render %s: %s", image[:80], exc.description)
        raise
    except RenderError as exc:
        log.error("render %s failed: %s", image, exc)
        return _json_error(503, "the image renderer is unavailable (kaleido needs Chromium: "
                                "apt-get install chromium, or set BROWSER_PATH); see the server log")
    resp = Response(body, 200, mimetype=IMAGE_TYPES[fmt], headers=headers)
    if fmt == "svg":
        # An SVG opened on its own is a document: let it run nothing and load nothing.
        resp.headers["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return resp


@bp.route(f"{STATIC_PREFIX}/", defaults={"rest": ""}, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
@bp.route(f"{STATIC_PREFIX}/<path:rest>", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
def embed_asset_unknown(rest: str):
    """Anything else under ``/embed-assets/`` (public, like every static path): a 404 of its
    own, so Dash's catch-all never answers it with the dashboard's page."""
    return _json_error(404, "not found")


@bp.get(f"{STATIC_PREFIX}/<name>")
def embed_asset(name: str):
    """plotly.js (the installed ``plotly``'s bundle, as Dash serves it) and the embed's own
    script and style. Versioned URLs (:func:`static_url`), so they may be cached for long."""
    if name == "plotly.min.js":
        path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    elif name in ("embed.js", "embed.css"):
        path = STATIC_DIR / name
    else:
        return _json_error(404, "not found")
    resp = send_file(path, mimetype="text/javascript" if name.endswith(".js") else "text/css", conditional=True,
                     max_age=86400 if request.args.get("v") else 300)
    resp.headers["Cache-Control"] = f"public, max-age={86400 if request.args.get('v') else 300}"
    return resp


__all__ = ["bp", "signature_refused", "static_url"]
