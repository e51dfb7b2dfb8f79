"""`/api/v1`: the JSON API. Every handler parses parameters, calls a query function, returns JSON."""

from __future__ import annotations

import logging
import math
from urllib.parse import parse_qsl, urlencode

from flask import Blueprint, current_app, jsonify, request
from sqlalchemy import text
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.routing import Map

from .. import __version__
from ..ingest.cloud_monitoring import exporter_health
from ..ingest.cloud_trace import poller_health
from ..models.reader import Filters
from . import evaluations, panels, queries, signing
from . import incidents as inc
from .detectors import Thresholds
from .params import ParamError, parse_baseline_window, parse_filters, parse_int, parse_trace_id, parse_window, rfc3339

log = logging.getLogger(__name__)

bp = Blueprint("api_v1", __name__, url_prefix="/api/v1")


def _reader():
    return current_app.extensions["modalscope"]["reader"]


@bp.errorhandler(ParamError)
def _bad_param(exc: ParamError):
    return jsonify({"error": exc.message, "parameter": exc.parameter}), 400


@bp.get("/health")
def health():
    reader = _reader()
    try:
        with reader.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        store = "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised: a health check answers
        log.warning("health check: store unreachable: %s", exc)
        store = "unreachable"
    body = {"status": "ok" if store == "ok" else "degraded", "version": __version__,
            "store": store, "database": reader.engine.dialect.name}
    if store == "ok":
        # Cloud Trace pollers and the metrics exporter report through their cursor rows:
        # whether they fall behind the quota, and whether the data is latency-sampled.
        for key, fn in (("cloud_trace", poller_health), ("metrics_export", exporter_health)):
            try:
                state = fn(reader.engine)
            except Exception as exc:  # noqa: BLE001 - health answers even if a part cannot
                log.warning("health check: %s state unreadable: %s", key, exc)
                state = {"error": "unreadable"}
            if state is not None:
                body[key] = state
    return jsonify(body), (200 if store == "ok" else 503)


@bp.get("/pairs")
def pairs():
    return jsonify(queries.pairs(_reader(), parse_window(request.args), parse_filters(request.args)))


@bp.get("/input-types")
def input_types():
    return jsonify(queries.input_types(_reader(), parse_window(request.args), parse_filters(request.args)))


@bp.get("/stages")
def stages():
    """Span-duration percentiles per stage; with ``at=p99`` (p50 … p99) the mean stage self
    time of the traces at or above that end-to-end percentile. ``X-Modalscope-Measure``
    says which of the two the answer is."""
    group_by = request.args.get("group_by", "input_type") or None
    if group_by not in (None, "input_type", "none"):
        raise ParamError("group_by", "group_by must be input_type or none")
    at = request.args.get("at") or None
    if at is not None and at not in queries.AT_QUANTILES:
        raise ParamError("at", f"at must be one of {', '.join(queries.AT_QUANTILES)}")
    resp = jsonify(queries.stages(_reader(), parse_window(request.args), parse_filters(request.args),
                                  group_by=None if group_by == "none" else group_by, at=at))
    resp.headers["X-Modalscope-Measure"] = (queries.MEASURE_SPAN_PERCENTILES if at is None
                                            else queries.MEASURE_AT_PERCENTILE)
    return resp


#: Longest window /anomalies scans (the Anomalies page's longest range is 7 days).
MAX_ANOMALY_WINDOW_S = 7 * 86400

#: Longest duration a filter takes (~31 years; the store's nanoseconds end near 292 years).
MAX_DURATION_MS = 1e12


def _float_param(name: str) -> float | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ParamError(name, f"{name} must be a number of milliseconds") from None
    if not math.isfinite(value) or value < 0:
        raise ParamError(name, f"{name} must be a non-negative number of milliseconds")
    if value > MAX_DURATION_MS:  # past what the store's 64-bit nanoseconds hold
        raise ParamError(name, f"{name} must be at most {MAX_DURATION_MS:.0e} milliseconds")
    return value


@bp.get("/traces")
def traces():
    """Exemplar traces, slowest first; ``min_ms``/``max_ms`` bound what the filters measure
    (the call for caller/callee, the span for stage/service, else the trace)."""
    window = parse_window(request.args)
    filters = parse_filters(request.args)
    min_ms, max_ms = _float_param("min_ms"), _float_param("max_ms")
    if min_ms is not None and max_ms is not None and max_ms < min_ms:
        raise ParamError("max_ms", "max_ms must not be below min_ms")
    limit = parse_int(request.args, "limit", 20, 1, 1000)
    return jsonify(queries.exemplar_traces(_reader(), window, filters, min_ms, max_ms, limit))


def _thresholds():
    return Thresholds.kept_in(current_app.extensions["modalscope"])


@bp.get("/anomalies")
def anomalies():
    """Findings of the anomaly catalog in the window, most severe first (``app/findings.py``)."""
    window = parse_window(request.args)
    if window.seconds > MAX_ANOMALY_WINDOW_S:
        # The detectors work minute by minute: a window of a year or more held a worker long and
        # much of its memory; one from 1970 tried to allocate more than a machine has.
        raise ParamError("range" if request.args.get("range") else "start",
                         f"the anomaly window is at most {MAX_ANOMALY_WINDOW_S // 86400} days")
    ev = evaluations.find_for(_reader(), window, parse_filters(request.args), _thresholds(),
                              relative=evaluations.ends_now(request.args))
    resp = jsonify([f.to_json() for f in ev.findings])
    # Which window the findings cover and when they were evaluated: a "last 24 h" request
    # may be answered by the worker's evaluation of up to 90 s ago (app/evaluations.py).
    resp.headers["X-Modalscope-Window"] = f"{rfc3339(ev.start_ns)}/{rfc3339(ev.end_ns)}"
    resp.headers["X-Modalscope-Evaluated-At"] = rfc3339(ev.evaluated_ns)
    return resp


@bp.get("/incidents")
def incidents_route():
    """The window's findings grouped into incidents, most severe first (``app/incidents.py``);
    the same window, filter parameters and errors as ``/anomalies``."""
    window = parse_window(request.args)
    if window.seconds > MAX_ANOMALY_WINDOW_S:
        raise ParamError("range" if request.args.get("range") else "start",
                         f"the anomaly window is at most {MAX_ANOMALY_WINDOW_S // 86400} days")
    reader, th = _reader(), _thresholds()
    ev = evaluations.find_for(reader, window, Filters(), th, relative=evaluations.ends_now(request.args))

    def finder(w):  # an incident's own span: an absolute window, stored once evaluated
        return evaluations.find_for(reader, w, Filters(), th, relative=False).findings

    found = inc.incidents(reader, window, finder, parse_filters(request.args), found=ev.findings,
                          prefix=request.url_root.rstrip("/"))
    resp = jsonify([i.to_json() for i in found])
    resp.headers["X-Modalscope-Window"] = f"{rfc3339(ev.start_ns)}/{rfc3339(ev.end_ns)}"
    resp.headers["X-Modalscope-Evaluated-At"] = rfc3339(ev.evaluated_ns)
    return resp


@bp.get("/cache")
def cache():
    """Hit rate per cache (``cache.name``) and value of the span attribute ``group_by``
    (e.g. ``user_tier``): ``[{"cache", "group", "hits", "misses", "hit_rate"}]``; a span
    without the attribute counts in group null. ``cache=`` narrows to one cache."""
    group_by = request.args.get("group_by")
    if group_by is not None and not queries.valid_group_by(group_by):
        raise ParamError("group_by", "group_by must be an attribute key: 1-128 letters, digits or _ . : / -")
    window = parse_window(request.args)
    rows = queries.cache_rates(_reader(), window, group_by or None, request.args.get("cache") or None)
    return jsonify([{k: r[k] for k in ("cache", "group", "hits", "misses", "hit_rate")} for r in rows])


@bp.get("/compare")
def compare():
    """The selection (``start``/``end`` or ``range``) against a baseline (``baseline_start``/
    ``baseline_end``, default: the same length just before): stage deltas and attribute
    values over-represented among slow spans (``queries.compare``)."""
    window = parse_window(request.args)
    baseline = parse_baseline_window(request.args, window)
    return jsonify(queries.compare(_reader(), window, baseline, parse_filters(request.args)))


@bp.get("/share")
def share():
    """The addresses of one panel (``panels.share_urls``): ``{"link", "embed_url", "image_url",
    "svg_url", "iframe", "signed", "expires"}``, absolute from this request's host. With
    MODALSCOPE_SECRET_KEY the embed and image URLs are signed for ``ttl`` seconds (default
    30 days); ``width``, ``height`` and ``scale`` set the images' size (signed with them: a
    signed image draws only its size); every other parameter is the panel's query, checked
    like the panel checks it."""
    name = request.args.get("panel") or ""
    if name not in panels.PANELS:
        raise ParamError("panel", f"panel must be one of {', '.join(panels.PANEL_NAMES)}")
    ttl = panels.parse_ttl(request.args.get("ttl"))
    params = [(k, v) for k, v in request.args.items(multi=True) if k not in ("panel", "ttl", *IMAGE_SIZE_KEYS)]
    settings = current_app.extensions["modalscope"]["settings"]
    urls = panels.share_urls(request.url_root, name, params, secret=settings.secret_key, ttl_seconds=ttl)
    sizes = _image_sizes(settings)
    if sizes:  # the image URLs for that size, the size signed with them (app/signing.py)
        for key, fmt in (("image_url", "png"), ("svg_url", "svg")):
            base, _, query = urls[key].partition("?")
            pairs = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in ("exp", "sig")]
            pairs += [(k, v) for k, v in sizes if fmt == "png" or k != "scale"]
            if urls["signed"]:
                exp = dict(parse_qsl(query))["exp"]
                pairs += [("exp", exp), ("sig", signing.signature(settings.secret_key, name, pairs, int(exp)))]
            urls[key] = f"{base}?{urlencode(pairs)}"
    return jsonify(urls)


#: Image sizes /share may sign into the image URLs (the render route checks them the same way).
IMAGE_SIZE_KEYS = ("width", "height", "scale")


def _image_sizes(settings) -> list[tuple[str, str]]:
    out = []
    for key in IMAGE_SIZE_KEYS:
        raw = request.args.get(key)
        if not raw:
            continue
        most, least = (settings.render_max_scale, 1) if key == "scale" else (settings.render_max_px, 200)
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and least <= int(raw) <= most):
            raise ParamError(key, f"{key} must be a whole number from {least} to {most}")
        out.append((key, str(int(raw))))
    return out


@bp.get("/traces/<trace_id>")
def trace(trace_id: str):
    tid = parse_trace_id(trace_id)
    detail = queries.trace_detail(_reader(), tid)
    if detail is None:
        return jsonify({"error": f"trace {tid} not found", "parameter": "trace_id"}), 404
    return jsonify(detail)


# -- unknown paths and methods: always a JSON error, never Dash's page -------------------
# Dash serves its index for any GET path (``/<path:path>``), so an unknown ``/api/...`` GET
# would answer 200 with HTML. These catch-alls are ordinary views: the access gate (a
# before_request hook) runs first, so without credentials every API path answers 401 alike.
_ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_CATCH_ALL = "unknown_path"


def _known_methods(path: str) -> list[str]:
    """The methods an API route takes at ``path`` (empty: no API route has that path)."""
    app = current_app._get_current_object()  # noqa: SLF001 - the map is per app
    cache = app.extensions["modalscope"]
    api_map = cache.get("api_routes")
    if api_map is None:
        rules = [r.empty() for r in app.url_map.iter_rules()
                 if r.endpoint.startswith(f"{bp.name}.") and r.endpoint != f"{bp.name}.{_CATCH_ALL}"]
        api_map = cache["api_routes"] = Map(rules)
    adapter = api_map.bind("localhost")
    try:
        adapter.match(path, method="__none__")
    except MethodNotAllowed as exc:
        return sorted(exc.valid_methods or [])
    except HTTPException:  # NotFound, or a redirect for a missing slash
        return []
    return []


def _not_found_json():
    resp = jsonify({"error": f"no such API endpoint: {request.path}", "path": request.path})
    resp.status_code = 404
    return resp


def _not_allowed_json(allowed: list[str]):
    resp = jsonify({"error": f"{request.method} is not allowed on {request.path}; allowed: {', '.join(allowed)}",
                    "path": request.path, "allowed": allowed})
    resp.status_code = 405
    resp.headers["Allow"] = ", ".join(allowed)
    return resp


@bp.route("/", methods=_ANY_METHOD, endpoint=_CATCH_ALL, strict_slashes=False, provide_automatic_options=False)
@bp.route("/<path:rest>", methods=_ANY_METHOD, endpoint=_CATCH_ALL, provide_automatic_options=False)
def _unknown_path(rest: str = ""):
    allowed = _known_methods(request.path)
    # a path the real routes refused although its method is allowed (e.g. "traces//0"): no
    # such resource, not a wrong method
    return _not_allowed_json(allowed) if allowed and request.method not in allowed else _not_found_json()


@bp.record_once
def _claim_api_prefix(state) -> None:
    # ``/api`` and ``/api/<anything>`` outside ``/api/v1``: a JSON 404 too, not Dash's page.
    for rule in ("/api", "/api/<path:rest>"):
        state.app.add_url_rule(rule, f"{bp.name}_outside", _unknown_path, methods=_ANY_METHOD,
                               strict_slashes=False, provide_automatic_options=False)


@bp.app_errorhandler(404)
def _not_found(exc):
    if request.path.startswith("/api/") or request.path == "/api":
        return _not_found_json()
    return exc


@bp.app_errorhandler(405)
def _not_allowed(exc):
    if request.path.startswith("/api/"):
        return _not_allowed_json(sorted(getattr(exc, "valid_methods", None) or []))
    return exc


@bp.app_errorhandler(500)
def _server_error(exc):
    if request.path.startswith("/api/"):
        return jsonify({"error": "internal error; see the server log", "path": request.path}), 500
    return exc
