"""The web app: ``create_app(settings=None)`` builds the Flask server with ``/api/v1`` and
the Dash dashboard (Dash Pages, one module per page under ``app/pages/``).

Nothing heavy happens at import time (Dash is imported inside the factory); tests build
the app through the factory with a temporary database. The factory returns the Flask
server, so ``gunicorn 'modalscope.app:create_app()'`` serves everything.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from flask import Flask, Request, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from ..settings import Settings, SettingsError

PACKAGE_DIR = Path(__file__).resolve().parent
log = logging.getLogger(__name__)


def assets_folder() -> Path:
    """``assets/`` beside the package folders: the source tree's top level (editable
    installs, the Docker image) or ``modalscope/assets`` when installed as a package."""
    return PACKAGE_DIR.parent / "assets"


def create_app(settings: Settings | None = None) -> Flask:
    from ..models.engine import make_engine
    from ..models.reader import StoreReader
    from . import api, auth, embed, evaluations, render, window_budget

    settings = settings or Settings.from_env()
    public_url = _public_url(settings)
    server = Flask(__name__)
    if public_url:
        server.request_class = _public_request_class(public_url)
    server.config["JSON_SORT_KEYS"] = False
    server.json.sort_keys = False
    server.json.ensure_ascii = True  # \u-escape everything outside ASCII: inert in any client
    engine = make_engine(settings.database_url)
    server.extensions["modalscope"] = {"settings": settings, "engine": engine, "reader": StoreReader(engine),
                                       "render_gate": render.RenderGate(settings.render_queue),
                                       "window_budget": (window_budget.WindowBudget(settings.new_windows_per_hour)
                                                         if settings.new_windows_per_hour > 0 else None)}
    render.configure(settings.render_timeout_s)
    if window_budget.admit not in evaluations.FIRST_EVALUATION_GATES:  # (a no-op outside a request)
        evaluations.FIRST_EVALUATION_GATES.append(window_budget.admit)
    server.register_blueprint(api.bp)
    server.register_blueprint(embed.bp)  # /embed/<panel>, /render/<panel>.png|svg

    # Body limits before anything reads a body (the access gate included).
    _limit_bodies(server, settings)
    # The access gate and /login first: its before_request must run before Dash's.
    auth.init_app(server, settings, inline_scripts=lambda: _dash_inline_scripts(server))

    dash_app = _add_dashboard(server, settings)
    server.extensions["modalscope"]["dash"] = dash_app
    _guard_dash_routes(server, dash_app)
    # Dash finishes its set-up in the first request; two first requests at once race it
    # (one iterates the callback map while the other is still filling it). Done here, once.
    with server.test_request_context("/"):
        dash_app._setup_server()  # noqa: SLF001

    return server


def _public_url(settings: Settings) -> str:
    """``MODALSCOPE_PUBLIC_URL`` without its trailing slash, checked: ``http(s)://host[:port][/path]``."""
    url = settings.public_url.strip().rstrip("/")
    if url and not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~!$&'()*+,;=:@%/\-]*)?", url):
        raise SettingsError(f"MODALSCOPE_PUBLIC_URL={settings.public_url!r} must be http(s)://host[:port][/path]")
    return url


def _public_request_class(public_url: str):
    """Requests whose ``url_root`` and ``host_url`` are ``MODALSCOPE_PUBLIC_URL``: the share
    control, ``/api/v1/share`` and incident links build absolute URLs from them, and the
    request's ``Host`` header is the client's to choose. The origin checks of the sign-in
    form still read the request's own ``Host``."""

    class PublicURLRequest(Request):
        @property
        def url_root(self) -> str:
            return public_url + "/"

        @property
        def host_url(self) -> str:
            return public_url + "/"

    return PublicURLRequest


def _limit_bodies(server: Flask, settings: Settings) -> None:
    """Every request body is bounded: ``MODALSCOPE_MAX_BODY_BYTES`` (``/login``: 16 KiB). A
    declared ``Content-Length`` over the limit is a 413 before a byte of the body is read
    (and the connection closes, so the server does not drain it); a chunked body is cut off
    at the limit as it is read (werkzeug's limited stream, the same 413)."""
    from .auth import LOGIN_PATH, MAX_LOGIN_BYTES

    server.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes

    @server.before_request
    def _body_limit():
        limit = MAX_LOGIN_BYTES if request.path == LOGIN_PATH else settings.max_body_bytes
        request.max_content_length = limit
        length = request.content_length
        if length is not None and length > limit:
            log.info("refused a %d-byte body on %s %s from %s (limit %d)", length, request.method,
                     request.path[:200], request.remote_addr, limit)
            return _too_large(f"request body too large: {length} bytes, at most {limit}")
        if length is None and "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            # No length given: read it now, at most the limit (werkzeug's stream stops there
            # quietly), and refuse it if more was coming rather than hand a view a cut body.
            request.get_data(cache=True)
            try:
                request.stream.read(1)
            except RequestEntityTooLarge:
                log.info("refused a chunked body over %d bytes on %s %s from %s", limit, request.method,
                         request.path[:200], request.remote_addr)
                return _too_large(f"request body too large: more than {limit} bytes")
        return None


def _too_large(message: str):
    resp = _json_response({"error": message}, 413)
    resp.headers["Connection"] = "close"  # gunicorn closes after draining at most 64 KiB of the rest anyway
    return resp


def _json_response(body: dict, status: int):
    resp = jsonify(body)
    resp.status_code = status
    resp.headers["Cache-Control"] = "no-store"
    return resp


def callback_request_problem(body, callback_map) -> str | None:
    """Why a ``/_dash-update-component`` body is not a callback request Dash can run (None:
    it is one). Checks the envelope only: the values inside are the callbacks' business."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    output = body.get("output")
    if not isinstance(output, str) or output not in callback_map:
        return "output names no callback of this app"
    if not isinstance(body.get("outputs"), (dict, list)):
        return "outputs must be an object or a list"

    def ok_item(item) -> bool:
        return (isinstance(item, dict) and isinstance(item.get("id"), (str, dict))
                and isinstance(item.get("property"), str))

    for key in ("inputs", "state"):
        items = body.get(key, [])
        if not isinstance(items, list):
            return f"{key} must be a list"
        for item in items:
            # a pattern-matching (ALL) dependency is a list of items
            if not (ok_item(item) or (isinstance(item, list) and all(ok_item(i) for i in item))):
                return f"each of {key} must be {{id, property, value}}"
    outputs = body["outputs"]
    for item in outputs if isinstance(outputs, list) else [outputs]:
        if not (ok_item(item) or (isinstance(item, list) and all(ok_item(i) for i in item))):
            return "each output must be {id, property}"
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        return "changedPropIds must be a list of strings"
    return None


def _guard_dash_routes(server: Flask, dash_app) -> None:
    """Dash's own routes answer bad requests with a 4xx and one log line, never a 500 with a
    traceback: an unknown ``/_dash-component-suites/`` file is a 404, a malformed
    ``/_dash-update-component`` body a 400, and so is a callback that fails on values no
    page of this app sends (a number where a dropdown sends a string). A failing store is
    still a 500: that is the server's trouble, not the request's."""
    from dash.exceptions import DependencyException, InvalidResourceError, PreventUpdate
    from sqlalchemy.exc import SQLAlchemyError

    prefix = dash_app.config.routes_pathname_prefix
    suites = f"{prefix}_dash-component-suites/<string:package_name>/<path:fingerprinted_path>"
    update = f"{prefix}_dash-update-component"
    for rule in list(server.url_map.iter_rules()):
        view = server.view_functions.get(rule.endpoint)
        if view is None:
            continue
        if rule.rule == suites:
            server.view_functions[rule.endpoint] = _guarded_suites(view, DependencyException, InvalidResourceError)
        elif rule.rule == update:
            def guarded_update(_view=view):
                body = request.get_json(silent=True)
                problem = callback_request_problem(body, dash_app.callback_map)
                if problem:
                    log.info("refused a callback request from %s: %s", request.remote_addr, problem)
                    return _json_response({"error": f"malformed callback request: {problem}"}, 400)
                try:
                    return _view()
                except (HTTPException, PreventUpdate, SQLAlchemyError, OSError, MemoryError):
                    raise
                except Exception as exc:  # noqa: BLE001 - values a page never sends: the request's fault
                    log.warning("refused a callback request for %s: %s: %s (at %s)", body["output"][:120],
                                type(exc).__name__, _one_line(exc), _where(exc))
                    return _json_response({"error": "this callback request could not be handled: "
                                                    f"{type(exc).__name__}"}, 400)

            server.view_functions[rule.endpoint] = guarded_update

    def unknown_suite(rest: str = ""):
        return _json_response({"error": "not found"}, 404)

    # Fewer than two path segments: without this, Dash's catch-all answers with the page.
    server.add_url_rule(f"{prefix}_dash-component-suites/", "ms_unknown_suite", unknown_suite)
    server.add_url_rule(f"{prefix}_dash-component-suites/<path:rest>", "ms_unknown_suite", unknown_suite)


def _guarded_suites(view, *not_found):
    def guarded(package_name: str, fingerprinted_path: str):
        try:
            return view(package_name, fingerprinted_path)
        except not_found:
            log.info("no such component file: %s", request.path[:200])
            return _json_response({"error": "not found"}, 404)

    return guarded


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] or "no detail"


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame in this package, else the innermost of all
    (where to look if it is a bug)."""
    tb, ours, last = exc.__traceback__, None, "?"
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        last = f"{Path(name).parent.name}/{Path(name).name}:{tb.tb_lineno}"
        if str(PACKAGE_DIR) in name and name != __file__:
            ours = last
        tb = tb.tb_next
    return ours or last


def _add_dashboard(server: Flask, settings: Settings):
    """Mount the Dash app (pages, shell, callbacks) on ``server``."""
    import dash
    from dash import _callback

    from . import auth, components

    dash_app = dash.Dash(
        "modalscope.app",
        server=server,
        use_pages=True,
        pages_folder=str(PACKAGE_DIR / "pages"),
        assets_folder=str(assets_folder()),
        title="modalscope",
        update_title=None,
        serve_locally=True,
        suppress_callback_exceptions=False,
        compress=False,
        meta_tags=[{"name": "viewport", "content": "width=device-width, initial-scale=1"}],
    )
    # A function, so each page load's shell knows who is signed in (auth.account()).
    dash_app.layout = lambda: components.shell(account=auth.account())
    components.register_callbacks()
    # Dash collects ``dash.callback`` registrations in module-level lists and hands them to
    # whichever app serves its first request. Page modules are (re-)executed for every app
    # the factory builds, so claim this app's callbacks now: several apps in one process
    # (tests, a gunicorn worker re-creating its app) each get their own complete set.
    dash_app.callback_map.update(_callback.GLOBAL_CALLBACK_MAP)
    _callback.GLOBAL_CALLBACK_MAP.clear()
    dash_app._callback_list.extend(_callback.GLOBAL_CALLBACK_LIST)  # noqa: SLF001
    _callback.GLOBAL_CALLBACK_LIST.clear()
    dash_app._inline_scripts.extend(_callback.GLOBAL_INLINE_SCRIPTS)  # noqa: SLF001
    _callback.GLOBAL_INLINE_SCRIPTS.clear()
    if settings.debug:
        # MODALSCOPE_DEBUG=1 only: the dev tools expose a debugger.
        dash_app.enable_dev_tools(debug=True, dev_tools_hot_reload=False, dev_tools_ui=True,
                                  dev_tools_props_check=True, dev_tools_serve_dev_bundles=True,
                                  dev_tools_disable_version_check=True)
    return dash_app


def _dash_inline_scripts(server: Flask) -> list[str]:
    """The inline scripts Dash writes into its pages (the renderer's start and clientside
    callbacks), for the CSP's script hashes. Dash adds some at its first request."""
    dash_app = server.extensions["modalscope"].get("dash")
    if dash_app is None:
        return []
    return [*dash_app._inline_scripts, dash_app.renderer]  # noqa: SLF001
