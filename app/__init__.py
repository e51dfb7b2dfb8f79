"""The web app: ``create_app(settings=None)`` builds the Flask server with ``/api/v1``.

Nothing heavy happens at import time; tests build the app through the factory with a
temporary database.
"""

from __future__ import annotations

from flask import Flask, jsonify

from ..settings import Settings


def create_app(settings: Settings | None = None) -> Flask:
    from ..models.engine import make_engine
    from ..models.reader import StoreReader
    from . import api

    settings = settings or Settings.from_env()
    server = Flask(__name__)
    server.config["JSON_SORT_KEYS"] = False
    server.json.sort_keys = False
    server.json.ensure_ascii = True  # \u-escape everything outside ASCII: inert in any client
    engine = make_engine(settings.database_url)
    server.extensions["modalscope"] = {"settings": settings, "engine": engine, "reader": StoreReader(engine)}
    server.register_blueprint(api.bp)

    @server.get("/")
    def index():
        return jsonify({
            "name": "modalscope",
            "api": ["/api/v1/health", "/api/v1/pairs", "/api/v1/input-types", "/api/v1/stages",
                    "/api/v1/traces/<trace_id>"],
        })

    if settings.auth_token:
        _require_bearer_token(server, settings.auth_token)

    @server.after_request
    def _headers(resp):
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        resp.headers.setdefault("X-Frame-Options", "DENY")
        resp.headers.setdefault("Content-Security-Policy", "frame-ancestors 'self'")
        return resp

    return server


def _require_bearer_token(server: Flask, token: str) -> None:
    """MODALSCOPE_AUTH_TOKEN: everything but /api/v1/health needs ``Authorization: Bearer``."""
    import hmac

    from flask import request

    expected = f"Bearer {token}".encode()

    @server.before_request
    def _check_token():
        if request.path == "/api/v1/health":
            return None
        given = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, expected):
            return None
        resp = jsonify({"error": "authentication required: send Authorization: Bearer <MODALSCOPE_AUTH_TOKEN>"})
        resp.status_code = 401
        resp.headers["WWW-Authenticate"] = 'Bearer realm="modalscope"'
        return resp
