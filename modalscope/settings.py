"""Every setting modalscope reads, as one documented constant each (the opentelemetry-python way).

Settings come from the environment (``MODALSCOPE_*``). ``Settings.from_env()`` reads them
once; the app factory and commands accept a ``Settings`` so tests can pass their own.
README.md documents every variable listed here; ``tests/test_settings.py`` checks that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from .durations import window_seconds

# name: (default, one-line description) — README's settings table is generated from, and
# checked against, this mapping.
DOCUMENTED: dict[str, tuple[str, str]] = {
    "MODALSCOPE_DATABASE_URL": ("sqlite:///modalscope.db", "SQLAlchemy URL of the store: `sqlite:///path.db` (embedded, WAL) or `postgresql+psycopg://user@host/db`."),
    "MODALSCOPE_RULES": ("", "Path of a TOML stage-rules file replacing the built-in rules (`ingest/default_rules.toml` is the template)."),
    "MODALSCOPE_OTLP_HTTP_PORT": ("4318", "Port of the OTLP/HTTP receiver (`POST /v1/traces`)."),
    "MODALSCOPE_OTLP_GRPC_PORT": ("4317", "Port of the OTLP/gRPC receiver (`TraceService/Export`)."),
    "MODALSCOPE_PORT": ("8050", "Port of the dashboard and `/api/v1`."),
    "MODALSCOPE_BIND": ("127.0.0.1", "Address the receivers and dashboard listen on; `0.0.0.0` to accept traffic from other hosts (the Docker image sets it)."),
    "MODALSCOPE_CLOUD_TRACE_ENDPOINT": ("", "`host:port` of a Cloud Trace API stand-in, reached in plaintext with anonymous credentials (emulators, tests)."),
    "MODALSCOPE_CLOUD_MONITORING_ENDPOINT": ("", "`host:port` of a Cloud Monitoring API stand-in, plaintext, anonymous."),
    "GOOGLE_CLOUD_PROJECT": ("", "Default Google Cloud project for `ingest cloud-trace` and `export-metrics`."),
    "MODALSCOPE_AUTH_TOKEN": ("", "When set, the dashboard and `/api/v1` (except `/api/v1/health`) require `Authorization: Bearer <token>` or a login session."),
    "MODALSCOPE_INGEST_TOKEN": ("", "When set, OTLP ingest requires `Authorization: Bearer <token>` (gRPC metadata `authorization`)."),
    "MODALSCOPE_SECRET_KEY": ("", "Key that signs session cookies and shared embed/image links."),
    "MODALSCOPE_TRUSTED_PROXY_HEADER": ("", "Request header set by an authenticating proxy (e.g. `X-Goog-Authenticated-User-Email` behind Identity-Aware Proxy): a non-empty value counts as signed in, as that identity. Only behind a proxy that sets or strips the header on every request."),
    "MODALSCOPE_EMBED_ORIGINS": ("", "Origins allowed to frame `/embed/*` (comma- or space-separated); unset: same origin only."),
    "MODALSCOPE_RETENTION_DAYS": ("7", "Raw spans (and trace rows) older than this many days are deleted, in small batches by the settler every 10 minutes or by `modalscope db prune`; `0` keeps them forever."),
    "MODALSCOPE_MINUTE_ROLLUP_DAYS": ("2", "Minute rollups older than this many days are deleted; older windows are answered from hourly rollups, rounded to whole hours (`0`: keep)."),
    "MODALSCOPE_ROLLUP_RETENTION_DAYS": ("90", "Hourly rollups (the percentiles and counts of long ranges) older than this many days are deleted (`0`: keep)."),
    "MODALSCOPE_FINDINGS_EVERY_S": ("60", "The worker's settler evaluates the anomaly catalog over each of `MODALSCOPE_FINDINGS_RANGES` this often and stores the findings, so the Anomalies page and the overview answer \"the last 24 h\" without running the detectors, and keeps the 24 h windows of the days before evaluated, as far back as minute rollups and raw spans are both kept (`0`: off; requests then run them)."),
    "MODALSCOPE_FINDINGS_RANGES": ("1h,24h", "Relative ranges evaluated ahead (comma-separated durations); a request for one of them is answered from an evaluation at most 90 s old."),
    "MODALSCOPE_SETTLE_SECONDS": ("5", "A trace idle this long is settled: input type, self times, pairs and rollups computed (corrected if a late span arrives)."),
    "MODALSCOPE_MAX_REQUEST_BYTES": ("20971520", "Largest OTLP request accepted, in bytes, checked before and after decompression (default 20 MiB)."),
    "MODALSCOPE_MAX_QUEUE_SPANS": ("50000", "Spans the writer holds before receivers answer 429/UNAVAILABLE with a retry delay (bounds the receiver's memory while the store is slow or down)."),
    "MODALSCOPE_MAX_QUEUE_BYTES": ("67108864", "Bytes of requests (decompressed, as received) the writer holds before receivers answer 429/UNAVAILABLE with a retry delay: spans carrying large values fill memory long before the span count does (default 64 MiB)."),
    "MODALSCOPE_MAX_VALUE_BYTES": ("65536", "String attribute values and status messages are cut to this many UTF-8 bytes (inline base64 media elided first; at least 16384); the span's `modalscope.truncated` attribute lists the keys cut."),
    "MODALSCOPE_MAX_VALUE_ITEMS": ("4096", "Array and key-value-list attribute values keep this many elements, nested ones counted; the rest are dropped as the request is decoded, before they take memory, and the key is listed in `modalscope.truncated`."),
    "MODALSCOPE_MAX_SERIES_PER_KIND": ("2000", "Latency series the settler keeps per kind (operations, service pairs, traces, caches, ...); spans naming a new series past it count in the kind's `(other)` series, so a client sending thousands of service or span names cannot grow the store and the filter pickers without bound."),
    "MODALSCOPE_MAX_SETTLE_LAG_S": ("10", "When the settler has fallen this many seconds behind (a trace idle `MODALSCOPE_SETTLE_SECONDS` plus this long is still not settled), receivers answer 429/UNAVAILABLE with a retry delay until it catches up: bounds how far rollups, pairs and exemplar searches lag behind a sustained flood, while a burst passes (`0`: no limit)."),
    "MODALSCOPE_THREADS": ("4", "Threads per gunicorn worker of the dashboard (`modalscope.gunicorn_conf`; workers: `WEB_CONCURRENCY`, default 2)."),
    "MODALSCOPE_PUBLIC_URL": ("", "The dashboard's public address (`https://scope.example.com`): share links and incident links are built from it; unset: from the request's `Host`."),
    "MODALSCOPE_HEAD_TIMEOUT_S": ("10", "A dashboard connection whose request head (request line and headers) is not complete within this many seconds is closed; a request body that pauses this long, or takes three times it in all, is a 408 (`modalscope.gunicorn_conf`'s worker)."),
    "MODALSCOPE_MAX_BODY_BYTES": ("4194304", "Largest request body the dashboard reads (Dash callbacks); larger is a 413 before reading it. `/login` takes at most 16 KiB."),
    "MODALSCOPE_RENDER_MAX_PX": ("2000", "Largest width or height, in CSS pixels, of a `/render/<panel>.png|svg` image."),
    "MODALSCOPE_RENDER_MAX_SCALE": ("2", "Largest `scale` (device pixels per CSS pixel) of a PNG image."),
    "MODALSCOPE_RENDER_QUEUE": ("2", "Images a dashboard worker draws or holds waiting at once (keep it below `MODALSCOPE_THREADS`, so other requests find a thread); past that `/render` answers 503 with `Retry-After`."),
    "MODALSCOPE_RENDER_TIMEOUT_S": ("20", "An image not drawn within this many seconds is a 504; the browser is restarted for the next one."),
    "MODALSCOPE_NEW_WINDOWS_PER_HOUR": ("60", "First evaluations of absolute anomaly windows (`start`/`end`, not yet stored) a client (session, else address) may start per hour and dashboard worker, in bursts of up to 10; past that a 429 with `Retry-After` (`0`: no limit)."),
    "MODALSCOPE_DEBUG": ("0", "`1` turns on Dash's debug mode (debugger, dev tools); never in production."),
    # Detector thresholds (app/detectors.py, `Thresholds`): one setting a field.
    "MODALSCOPE_DETECT_MIN_SAMPLES": ("20", "Fewest samples (calls, traces, spans) a block or series needs before any detector looks at it."),
    "MODALSCOPE_DETECT_BLOCK_MINUTES": ("5", "Detectors judge time in blocks of this many minutes; consecutive firing blocks make one finding."),
    "MODALSCOPE_DETECT_BASELINE_MINUTES": ("60", "Trailing baseline of `p99_band_break` (at least 30), and how far before the window detectors read for baselines."),
    "MODALSCOPE_DETECT_BAND_RATIO": ("2.0", "`p99_band_break`: a block's P99 at least this times the trailing baseline's P99."),
    "MODALSCOPE_DETECT_BAND_MEDIAN_TOLERANCE": ("0.25", "`p99_band_break`: P50 \"holds\" when within this fraction of the baseline P50."),
    "MODALSCOPE_DETECT_BAND_MIN_OUTLIERS": ("3", "`p99_band_break`: calls past the threshold a block needs (one outlier is not a band break)."),
    "MODALSCOPE_DETECT_CACHE_DROP": ("0.5", "`cache_penetration`: a tag value's hit rate below (1 - this) times the dominant value's."),
    "MODALSCOPE_DETECT_CACHE_DOMINANT_SHARE": ("0.5", "`cache_penetration`: the dominant tag value's least share of the lookups."),
    "MODALSCOPE_DETECT_SYNC_SPREAD_MS": ("50", "`fusion_sync_wait`: median spread between first and last encoder end, in ms (the reference latency study measured ~12 ms for 2 modalities, ~29 ms for 3)."),
    "MODALSCOPE_DETECT_PREPROCESS_RATIO": ("1.4", "`preprocessing_bound`: preprocessing share at least this times its median share."),
    "MODALSCOPE_DETECT_PREPROCESS_MIN_SHARE": ("0.25", "`preprocessing_bound`: and at least this share of end-to-end latency."),
    "MODALSCOPE_DETECT_BATCH_STUCK_SHARE": ("0.8", "`batching_failure`: share of a service's batched spans with `batch.size` 1."),
    "MODALSCOPE_DETECT_BATCH_LOAD_RATIO": ("1.0", "`batching_failure`: only while requests per block are at least this times the median block's."),
    "MODALSCOPE_DETECT_FALLBACK_SHARE": ("0.05", "`cuda_graph_fallback`: share of `gpu.cuda_graph` spans saying `fallback`."),
    "MODALSCOPE_DETECT_MIN_EVENTS": ("5", "Fewest events (fallbacks, truncated traces, first requests) a finding needs."),
    "MODALSCOPE_DETECT_LB_BAND": ("0.02", "`lb_timeout_truncation`: traces within this fraction below the longest count as piled up at the ceiling."),
    "MODALSCOPE_DETECT_LB_MIN_CEILING_S": ("10", "`lb_timeout_truncation`: the shortest ceiling considered, in seconds."),
    "MODALSCOPE_DETECT_COLD_FACTOR": ("3.0", "`cold_start`: a new instance's first requests at least this times slower (median) than steady state."),
    "MODALSCOPE_DETECT_COLD_WARMUP_S": ("120", "`cold_start`: how long after an instance's first span its requests count as \"first\"."),
    "MODALSCOPE_DETECT_BASELINE_MARGIN": ("0.10", "`baseline_regression`: P95 over its baseline by more than this fraction."),
    "MODALSCOPE_DETECT_BASELINE": ("", "`baseline_regression` baseline, `input_type:p50_ms:p95_ms,...`; unset: the reference latency table (text 320/410, image 1300/2100, multi_image 3700/6400)."),
    "MODALSCOPE_DETECT_MAX_SPANS": ("400000", "Raw spans the cold-start detector reads at most around one new instance (every other detector reads rollups)."),
}


class SettingsError(ValueError):
    """A setting has a value we cannot use; the message names the variable."""


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    raw = env.get(name) or DOCUMENTED[name][0]
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, minimum: float = 0.0) -> float:
    raw = env.get(name) or DOCUMENTED[name][0]
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def _str(env: Mapping[str, str], name: str) -> str:
    return env.get(name) or DOCUMENTED[name][0]


def _ranges(env: Mapping[str, str], name: str) -> tuple[int, ...]:
    """Comma-separated durations (``1h,24h``) as whole seconds, each at most 7 days."""
    raw = env.get(name) or DOCUMENTED[name][0]
    out = []
    for part in raw.replace(" ", ",").split(","):
        if not part.strip():
            continue
        try:
            seconds = int(window_seconds(part.strip(), name))
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r}: {exc}") from None
        if not 60 <= seconds <= 7 * 86400:
            raise SettingsError(f"{name}={raw!r}: each range must be between 1m and 7d")
        out.append(seconds)
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Settings:
    database_url: str = DOCUMENTED["MODALSCOPE_DATABASE_URL"][0]
    rules_path: str = ""
    otlp_http_port: int = 4318
    otlp_grpc_port: int = 4317
    port: int = 8050
    bind: str = "127.0.0.1"
    cloud_trace_endpoint: str = ""
    cloud_monitoring_endpoint: str = ""
    google_cloud_project: str = ""
    auth_token: str = ""
    ingest_token: str = ""
    secret_key: str = ""
    trusted_proxy_header: str = ""
    embed_origins: tuple[str, ...] = field(default_factory=tuple)
    retention_days: float = 7.0
    minute_rollup_days: float = 2.0
    rollup_retention_days: float = 90.0
    findings_every_s: float = 60.0
    findings_ranges_s: tuple[int, ...] = (3600, 86400)
    settle_seconds: float = 5.0
    max_request_bytes: int = 20 * 1024 * 1024
    max_queue_spans: int = 50_000
    max_queue_bytes: int = 64 * 1024 * 1024
    max_value_bytes: int = 64 * 1024
    max_value_items: int = 4096
    max_series_per_kind: int = 2000
    max_settle_lag_s: float = 10.0
    public_url: str = ""
    head_timeout_s: float = 10.0
    max_body_bytes: int = 4 * 1024 * 1024
    render_max_px: int = 2000
    render_max_scale: int = 2
    render_queue: int = 2
    render_timeout_s: float = 20.0
    new_windows_per_hour: float = 60.0
    debug: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        origins = _str(env, "MODALSCOPE_EMBED_ORIGINS").replace(",", " ").split()
        return cls(
            database_url=_str(env, "MODALSCOPE_DATABASE_URL"),
            rules_path=_str(env, "MODALSCOPE_RULES"),
            otlp_http_port=_int(env, "MODALSCOPE_OTLP_HTTP_PORT"),
            otlp_grpc_port=_int(env, "MODALSCOPE_OTLP_GRPC_PORT"),
            port=_int(env, "MODALSCOPE_PORT"),
            bind=_str(env, "MODALSCOPE_BIND"),
            cloud_trace_endpoint=_str(env, "MODALSCOPE_CLOUD_TRACE_ENDPOINT"),
            cloud_monitoring_endpoint=_str(env, "MODALSCOPE_CLOUD_MONITORING_ENDPOINT"),
            google_cloud_project=_str(env, "GOOGLE_CLOUD_PROJECT"),
            auth_token=_str(env, "MODALSCOPE_AUTH_TOKEN"),
            ingest_token=_str(env, "MODALSCOPE_INGEST_TOKEN"),
            secret_key=_str(env, "MODALSCOPE_SECRET_KEY"),
            trusted_proxy_header=_str(env, "MODALSCOPE_TRUSTED_PROXY_HEADER").strip(),
            embed_origins=tuple(origins),
            retention_days=_float(env, "MODALSCOPE_RETENTION_DAYS"),
            minute_rollup_days=_float(env, "MODALSCOPE_MINUTE_ROLLUP_DAYS"),
            rollup_retention_days=_float(env, "MODALSCOPE_ROLLUP_RETENTION_DAYS"),
            findings_every_s=_float(env, "MODALSCOPE_FINDINGS_EVERY_S"),
            findings_ranges_s=_ranges(env, "MODALSCOPE_FINDINGS_RANGES"),
            settle_seconds=_float(env, "MODALSCOPE_SETTLE_SECONDS"),
            max_request_bytes=_int(env, "MODALSCOPE_MAX_REQUEST_BYTES", minimum=1024),
            max_queue_spans=_int(env, "MODALSCOPE_MAX_QUEUE_SPANS", minimum=1),
            max_queue_bytes=_int(env, "MODALSCOPE_MAX_QUEUE_BYTES", minimum=1024),
            max_value_bytes=_int(env, "MODALSCOPE_MAX_VALUE_BYTES", minimum=16384),
            max_value_items=_int(env, "MODALSCOPE_MAX_VALUE_ITEMS", minimum=1),
            max_series_per_kind=_int(env, "MODALSCOPE_MAX_SERIES_PER_KIND", minimum=1),
            max_settle_lag_s=_float(env, "MODALSCOPE_MAX_SETTLE_LAG_S"),
            public_url=_str(env, "MODALSCOPE_PUBLIC_URL").strip().rstrip("/"),
            head_timeout_s=_float(env, "MODALSCOPE_HEAD_TIMEOUT_S", minimum=0.5),
            max_body_bytes=_int(env, "MODALSCOPE_MAX_BODY_BYTES", minimum=16384),
            render_max_px=_int(env, "MODALSCOPE_RENDER_MAX_PX", minimum=200),
            render_max_scale=_int(env, "MODALSCOPE_RENDER_MAX_SCALE", minimum=1),
            render_queue=_int(env, "MODALSCOPE_RENDER_QUEUE", minimum=1),
            render_timeout_s=_float(env, "MODALSCOPE_RENDER_TIMEOUT_S", minimum=1),
            new_windows_per_hour=_float(env, "MODALSCOPE_NEW_WINDOWS_PER_HOUR"),
            debug=_str(env, "MODALSCOPE_DEBUG").lower() in ("1", "true", "yes", "on"),
        )

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)


__all__ = ["DOCUMENTED", "Settings", "SettingsError", "fields"]
