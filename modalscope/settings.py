"""Every setting modalscope reads, each declared once: its environment variable, its default
as written in the environment, its parser and its one-line meaning, on the field of
:class:`Settings` it fills.

Settings come from the environment (``MODALSCOPE_*``). ``Settings.from_env()`` reads them
once; the app factory and commands accept a ``Settings`` so tests can pass their own.
README.md's settings table is checked against :data:`DOCUMENTED` (``tests/test_docs.py``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from .durations import window_seconds


class SettingsError(ValueError):
    """A setting has a value we cannot use; the message names the variable."""


Parser = Callable[[str, str], Any]  # (variable name, raw text) -> value


@dataclass(frozen=True)
class Declared:
    """One setting: the variable, its default as text, how it is parsed, what it means."""

    env: str
    default: str
    parse: Parser
    doc: str

    def read(self, env: Mapping[str, str]) -> Any:
        return self.parse(self.env, env.get(self.env) or self.default)


def setting(env: str, default: str, parse: Parser, doc: str) -> Any:
    """A dataclass field filled from ``env`` (``default`` when unset or empty)."""
    return field(default=parse(env, default), metadata={"setting": Declared(env, default, parse, doc)})


def declared(cls) -> list[tuple[str, Declared]]:
    """``(field name, declaration)`` of each setting field of a dataclass, in order."""
    return [(f.name, f.metadata["setting"]) for f in fields(cls) if "setting" in f.metadata]


def read_settings(cls, env: Mapping[str, str] | None = None, **fixed):
    """An instance of the dataclass ``cls`` with every declared setting read from ``env``."""
    env = os.environ if env is None else env
    return cls(**{name: d.read(env) for name, d in declared(cls) if name not in fixed}, **fixed)


# -- parsers ---------------------------------------------------------------------------------


def text(strip: bool = False, trailing_slash: bool = True) -> Parser:
    def parse(name: str, raw: str) -> str:
        value = raw.strip() if strip else raw
        return value if trailing_slash else value.rstrip("/")
    return parse


def integer(minimum: int = 0) -> Parser:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not an integer") from None
        if value < minimum:
            raise SettingsError(f"{name}={value} must be at least {minimum}")
        return value
    return parse


def number(minimum: float = 0.0) -> Parser:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not a number") from None
        if not math.isfinite(value) or value < minimum:
            raise SettingsError(f"{name}={raw!r} must be a finite number, at least {minimum:g}")
        return value
    return parse


def flag() -> Parser:
    return lambda name, raw: raw.strip().lower() in ("1", "true", "yes", "on")


def words() -> Parser:
    """Comma- or space-separated words."""
    return lambda name, raw: tuple(raw.replace(",", " ").split())


def durations() -> Parser:
    """Comma-separated durations (``1h,24h``) as whole seconds, each between 1 minute and 7 days."""
    def parse(name: str, raw: str) -> tuple[int, ...]:
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
    return parse


# -- the settings ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    database_url: str = setting(
        "MODALSCOPE_DATABASE_URL", "sqlite:///modalscope.db", text(),
        "SQLAlchemy URL of the store: `sqlite:///path.db` (embedded, WAL) or `postgresql+psycopg://user@host/db`.")
    rules_path: str = setting(
        "MODALSCOPE_RULES", "", text(),
        "Path of a TOML stage-rules file replacing the built-in rules (`ingest/default_rules.toml` is the template).")
    otlp_http_port: int = setting(
        "MODALSCOPE_OTLP_HTTP_PORT", "4318", integer(),
        "Port of the OTLP/HTTP receiver (`POST /v1/traces`).")
    otlp_grpc_port: int = setting(
        "MODALSCOPE_OTLP_GRPC_PORT", "4317", integer(),
        "Port of the OTLP/gRPC receiver (`TraceService/Export`).")
    port: int = setting(
        "MODALSCOPE_PORT", "8050", integer(),
        "Port of the dashboard and `/api/v1`.")
    bind: str = setting(
        "MODALSCOPE_BIND", "127.0.0.1", text(),
        "Address the receivers and dashboard listen on; `0.0.0.0` to accept traffic from other hosts (the Docker image sets it).")
    cloud_trace_endpoint: str = setting(
        "MODALSCOPE_CLOUD_TRACE_ENDPOINT", "", text(),
        "`host:port` of a Cloud Trace API stand-in, reached in plaintext with anonymous credentials (emulators, tests).")
    cloud_monitoring_endpoint: str = setting(
        "MODALSCOPE_CLOUD_MONITORING_ENDPOINT", "", text(),
        "`host:port` of a Cloud Monitoring API stand-in, plaintext, anonymous.")
    google_cloud_project: str = setting(
        "GOOGLE_CLOUD_PROJECT", "", text(),
        "Default Google Cloud project for `ingest cloud-trace` and `export-metrics`.")
    auth_token: str = setting(
        "MODALSCOPE_AUTH_TOKEN", "", text(),
        "When set, the dashboard and `/api/v1` (except `/api/v1/health`) require `Authorization: Bearer <token>` or a login session.")
    ingest_token: str = setting(
        "MODALSCOPE_INGEST_TOKEN", "", text(),
        "When set, OTLP ingest requires `Authorization: Bearer <token>` (gRPC metadata `authorization`).")
    secret_key: str = setting(
        "MODALSCOPE_SECRET_KEY", "", text(),
        "Key that signs session cookies and shared embed/image links.")
    trusted_proxy_header: str = setting(
        "MODALSCOPE_TRUSTED_PROXY_HEADER", "", text(strip=True),
        "Request header set by an authenticating proxy (e.g. `X-Goog-Authenticated-User-Email` behind Identity-Aware Proxy): a non-empty value counts as signed in, as that identity. Only behind a proxy that sets or strips the header on every request.")
    embed_origins: tuple[str, ...] = setting(
        "MODALSCOPE_EMBED_ORIGINS", "", words(),
        "Origins allowed to frame `/embed/*` (comma- or space-separated); unset: same origin only.")
    retention_days: float = setting(
        "MODALSCOPE_RETENTION_DAYS", "7", number(),
        "Raw spans (and trace rows) older than this many days are deleted, in small batches by the settler every 10 minutes or by `modalscope db prune`; `0` keeps them forever.")
    minute_rollup_days: float = setting(
        "MODALSCOPE_MINUTE_ROLLUP_DAYS", "2", number(),
        "Minute rollups older than this many days are deleted; older windows are answered from hourly rollups, rounded to whole hours (`0`: keep).")
    rollup_retention_days: float = setting(
        "MODALSCOPE_ROLLUP_RETENTION_DAYS", "90", number(),
        "Hourly rollups (the percentiles and counts of long ranges) older than this many days are deleted (`0`: keep).")
    findings_every_s: float = setting(
        "MODALSCOPE_FINDINGS_EVERY_S", "60", number(),
        "The worker's settler evaluates the anomaly catalog over each of `MODALSCOPE_FINDINGS_RANGES` this often and stores the findings, so the Anomalies page and the overview answer \\\"the last 24 h\\\" without running the detectors, and keeps the 24 h windows of the days before evaluated, as far back as minute rollups and raw spans are both kept (`0`: off; requests then run them).")
    findings_ranges_s: tuple[int, ...] = setting(
        "MODALSCOPE_FINDINGS_RANGES", "1h,24h", durations(),
        "Relative ranges evaluated ahead (comma-separated durations); a request for one of them is answered from an evaluation at most 90 s old.")
    settle_seconds: float = setting(
        "MODALSCOPE_SETTLE_SECONDS", "5", number(),
        "A trace idle this long is settled: input type, self times, pairs and rollups computed (corrected if a late span arrives).")
    max_request_bytes: int = setting(
        "MODALSCOPE_MAX_REQUEST_BYTES", "20971520", integer(minimum=1024),
        "Largest OTLP request accepted, in bytes, checked before and after decompression (default 20 MiB).")
    max_queue_spans: int = setting(
        "MODALSCOPE_MAX_QUEUE_SPANS", "50000", integer(minimum=1),
        "Spans the writer holds before receivers answer 429/UNAVAILABLE with a retry delay (bounds the receiver's memory while the store is slow or down).")
    max_queue_bytes: int = setting(
        "MODALSCOPE_MAX_QUEUE_BYTES", "67108864", integer(minimum=1024),
        "Bytes of requests (decompressed, as received) the writer holds before receivers answer 429/UNAVAILABLE with a retry delay: spans carrying large values fill memory long before the span count does (default 64 MiB).")
    max_value_bytes: int = setting(
        "MODALSCOPE_MAX_VALUE_BYTES", "65536", integer(minimum=16384),
        "String attribute values and status messages are cut to this many UTF-8 bytes (inline base64 media elided first; at least 16384); the span's `modalscope.truncated` attribute lists the keys cut.")
    max_value_items: int = setting(
        "MODALSCOPE_MAX_VALUE_ITEMS", "4096", integer(minimum=1),
        "Array and key-value-list attribute values keep this many elements, nested ones counted; the rest are dropped as the request is decoded, before they take memory, and the key is listed in `modalscope.truncated`.")
    max_series_per_kind: int = setting(
        "MODALSCOPE_MAX_SERIES_PER_KIND", "2000", integer(minimum=1),
        "Latency series the settler keeps per kind (operations, service pairs, traces, caches, ...); spans naming a new series past it count in the kind's `(other)` series, so a client sending thousands of service or span names cannot grow the store and the filter pickers without bound.")
    max_settle_lag_s: float = setting(
        "MODALSCOPE_MAX_SETTLE_LAG_S", "10", number(),
        "When the settler has fallen this many seconds behind (a trace idle `MODALSCOPE_SETTLE_SECONDS` plus this long is still not settled), receivers answer 429/UNAVAILABLE with a retry delay until it catches up: bounds how far rollups, pairs and exemplar searches lag behind a sustained flood, while a burst passes (`0`: no limit).")
    threads: int = setting(
        "MODALSCOPE_THREADS", "4", integer(minimum=1),
        "Threads per gunicorn worker of the dashboard (`modalscope.gunicorn_conf`; workers: `WEB_CONCURRENCY`, default 2).")
    public_url: str = setting(
        "MODALSCOPE_PUBLIC_URL", "", text(strip=True, trailing_slash=False),
        "The dashboard's public address (`https://scope.example.com`): share links and incident links are built from it; unset: from the request's `Host`.")
    head_timeout_s: float = setting(
        "MODALSCOPE_HEAD_TIMEOUT_S", "10", number(minimum=0.5),
        "A dashboard connection whose request head (request line and headers) is not complete within this many seconds is closed; a request body that pauses this long, or takes three times it in all, is a 408 (`modalscope.gunicorn_conf`'s worker).")
    max_body_bytes: int = setting(
        "MODALSCOPE_MAX_BODY_BYTES", "4194304", integer(minimum=16384),
        "Largest request body the dashboard reads (Dash callbacks); larger is a 413 before reading it. `/login` takes at most 16 KiB.")
    render_max_px: int = setting(
        "MODALSCOPE_RENDER_MAX_PX", "2000", integer(minimum=200),
        "Largest width or height, in CSS pixels, of a `/render/<panel>.png|svg` image.")
    render_max_scale: int = setting(
        "MODALSCOPE_RENDER_MAX_SCALE", "2", integer(minimum=1),
        "Largest `scale` (device pixels per CSS pixel) of a PNG image.")
    render_queue: int = setting(
        "MODALSCOPE_RENDER_QUEUE", "2", integer(minimum=1),
        "Images a dashboard worker draws or holds waiting at once (keep it below `MODALSCOPE_THREADS`, so other requests find a thread); past that `/render` answers 503 with `Retry-After`.")
    render_timeout_s: float = setting(
        "MODALSCOPE_RENDER_TIMEOUT_S", "20", number(minimum=1),
        "An image not drawn within this many seconds is a 504; the browser is restarted for the next one.")
    new_windows_per_hour: float = setting(
        "MODALSCOPE_NEW_WINDOWS_PER_HOUR", "60", number(),
        "First evaluations of absolute anomaly windows (`start`/`end`, not yet stored) a client (session, else address) may start per hour and dashboard worker, in bursts of up to 10; past that a 429 with `Retry-After` (`0`: no limit).")
    debug: bool = setting(
        "MODALSCOPE_DEBUG", "0", flag(),
        "`1` turns on Dash's debug mode (debugger, dev tools); never in production.")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        return read_settings(cls, env)

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)



@dataclass(frozen=True)
class DetectorThresholds:
    """The anomaly detectors' thresholds, each a setting (``app.detectors.Thresholds`` adds
    what the detectors do with them)."""

    min_samples: int = setting(
        "MODALSCOPE_DETECT_MIN_SAMPLES", "20", integer(),
        "Fewest samples (calls, traces, spans) a block or series needs before any detector looks at it.")
    block_minutes: int = setting(
        "MODALSCOPE_DETECT_BLOCK_MINUTES", "5", integer(minimum=1),
        "Detectors judge time in blocks of this many minutes; consecutive firing blocks make one finding.")
    baseline_minutes: int = setting(
        "MODALSCOPE_DETECT_BASELINE_MINUTES", "60", integer(minimum=30),
        "Trailing baseline of `p99_band_break` (at least 30), and how far before the window detectors read for baselines.")
    band_ratio: float = setting(
        "MODALSCOPE_DETECT_BAND_RATIO", "2.0", number(),
        "`p99_band_break`: a block's P99 at least this times the trailing baseline's P99.")
    band_p50_tolerance: float = setting(
        "MODALSCOPE_DETECT_BAND_MEDIAN_TOLERANCE", "0.25", number(),
        "`p99_band_break`: P50 \\\"holds\\\" when within this fraction of the baseline P50.")
    band_min_outliers: int = setting(
        "MODALSCOPE_DETECT_BAND_MIN_OUTLIERS", "3", integer(),
        "`p99_band_break`: calls past the threshold a block needs (one outlier is not a band break).")
    cache_drop: float = setting(
        "MODALSCOPE_DETECT_CACHE_DROP", "0.5", number(),
        "`cache_penetration`: a tag value's hit rate below (1 - this) times the dominant value's.")
    cache_dominant_share: float = setting(
        "MODALSCOPE_DETECT_CACHE_DOMINANT_SHARE", "0.5", number(),
        "`cache_penetration`: the dominant tag value's least share of the lookups.")
    sync_spread_ms: float = setting(
        "MODALSCOPE_DETECT_SYNC_SPREAD_MS", "50", number(),
        "`fusion_sync_wait`: median spread between first and last encoder end, in ms (the reference latency study measured ~12 ms for 2 modalities, ~29 ms for 3).")
    preprocess_ratio: float = setting(
        "MODALSCOPE_DETECT_PREPROCESS_RATIO", "1.4", number(),
        "`preprocessing_bound`: preprocessing share at least this times its median share.")
    preprocess_min_share: float = setting(
        "MODALSCOPE_DETECT_PREPROCESS_MIN_SHARE", "0.25", number(),
        "`preprocessing_bound`: and at least this share of end-to-end latency.")
    batch_stuck_share: float = setting(
        "MODALSCOPE_DETECT_BATCH_STUCK_SHARE", "0.8", number(),
        "`batching_failure`: share of a service's batched spans with `batch.size` 1.")
    batch_load_ratio: float = setting(
        "MODALSCOPE_DETECT_BATCH_LOAD_RATIO", "1.0", number(),
        "`batching_failure`: only while requests per block are at least this times the median block's.")
    fallback_share: float = setting(
        "MODALSCOPE_DETECT_FALLBACK_SHARE", "0.05", number(),
        "`cuda_graph_fallback`: share of `gpu.cuda_graph` spans saying `fallback`.")
    min_events: int = setting(
        "MODALSCOPE_DETECT_MIN_EVENTS", "5", integer(),
        "Fewest events (fallbacks, truncated traces, first requests) a finding needs.")
    lb_band: float = setting(
        "MODALSCOPE_DETECT_LB_BAND", "0.02", number(),
        "`lb_timeout_truncation`: traces within this fraction below the longest count as piled up at the ceiling.")
    lb_min_ceiling_s: float = setting(
        "MODALSCOPE_DETECT_LB_MIN_CEILING_S", "10", number(),
        "`lb_timeout_truncation`: the shortest ceiling considered, in seconds.")
    cold_factor: float = setting(
        "MODALSCOPE_DETECT_COLD_FACTOR", "3.0", number(),
        "`cold_start`: a new instance's first requests at least this times slower (median) than steady state.")
    cold_warmup_s: float = setting(
        "MODALSCOPE_DETECT_COLD_WARMUP_S", "120", number(),
        "`cold_start`: how long after an instance's first span its requests count as \\\"first\\\".")
    baseline_margin: float = setting(
        "MODALSCOPE_DETECT_BASELINE_MARGIN", "0.10", number(),
        "`baseline_regression`: P95 over its baseline by more than this fraction.")
    baseline: str = setting(
        "MODALSCOPE_DETECT_BASELINE", "", text(),
        "`baseline_regression` baseline, `input_type:p50_ms:p95_ms,...`; unset: the reference latency table (text 320/410, image 1300/2100, multi_image 3700/6400).")
    max_spans: int = setting(
        "MODALSCOPE_DETECT_MAX_SPANS", "400000", integer(),
        "Raw spans the cold-start detector reads at most around one new instance (every other detector reads rollups).")


#: Every variable: (default as text, meaning). README's settings table is checked against it.
DOCUMENTED: dict[str, tuple[str, str]] = {
    **{d.env: (d.default, d.doc) for _, d in declared(Settings)},
    **{d.env: (d.default, d.doc) for _, d in declared(DetectorThresholds)},
}


def setting_from_env(name: str, env: Mapping[str, str] | None = None) -> Any:
    """One field of :class:`Settings`, read from ``env`` (default: this process's environment)."""
    for field_name, d in declared(Settings):
        if field_name == name:
            return d.read(os.environ if env is None else env)
    raise KeyError(name)


__all__ = ["DOCUMENTED", "Declared", "DetectorThresholds", "Settings", "SettingsError", "declared", "fields",
           "read_settings", "setting", "setting_from_env"]
