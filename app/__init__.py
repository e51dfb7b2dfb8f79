"""The web app: ``create_app(settings=None)`` builds the Flask server with ``/api/v1`` and
the Dash dashboard (Dash Pages, one module per page under ``app/pages/``).

Nothing heavy happens at import time (Dash is imported inside the factory); tests build
the app through the factory with a temporary database. The factory returns the Flask
server, so ``gunicorn 'modalscope.app:create_app()'`` serves everything.
"""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from ..settings import Settings

PACKAGE_DIR = Path(__file__).resolve().parent


def assets_folder() -> Path:
    """``assets/`` beside the package folders: the source tree's top level (editable
    installs, the Docker image) or ``modalscope/assets`` when installed as a package."""
    return PACKAGE_DIR.parent / "assets"


def create_app(settings: Settings | None = None) -> Flask:
    from ..models.engine import make_engine
    from ..models.reader import StoreReader
    from . import api, auth, embed, render

    settings = settings or Settings.from_env()
    server = Flask(__name__)
    server.config["JSON_SORT_KEYS"] = False
    server.json.sort_keys = False
    server.json.ensure_ascii = True  # \u-escape everything outside ASCII: inert in any client
    engine = make_engine(settings.database_url)
    server.extensions["modalscope"] = {"settings": settings, "engine": engine, "reader": StoreReader(engine),
                                       "render_gate": render.RenderGate(settings.render_queue)}
    render.configure(settings.render_timeout_s)
    server.register_blueprint(api.bp)
    server.register_blueprint(embed.bp)  # /embed/<panel>, /render/<panel>.png|svg

    # The access gate and /login first: its before_request must run before Dash's.
    auth.init_app(server, settings, inline_scripts=lambda: _dash_inline_scripts(server))

    dash_app = _add_dashboard(server, settings)
    server.extensions["modalscope"]["dash"] = dash_app

    return server


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
