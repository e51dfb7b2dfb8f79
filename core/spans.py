"""The one record shape every source decodes into.

Nothing downstream of decoding knows where a span came from except ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KIND_UNSPECIFIED", "KIND_INTERNAL", "KIND_SERVER", "KIND_CLIENT", "KIND_PRODUCER", "KIND_CONSUMER",
    "KIND_NAMES", "KIND_BY_NAME", "STATUS_UNSET", "STATUS_OK", "STATUS_ERROR", "STATUS_NAMES",
    "SOURCES", "STAGES", "INPUT_TYPES", "SpanRecord",
]

# Span kinds use OTLP's numbering so protobuf enums map straight across.
KIND_UNSPECIFIED = 0
KIND_INTERNAL = 1
KIND_SERVER = 2
KIND_CLIENT = 3
KIND_PRODUCER = 4
KIND_CONSUMER = 5

KIND_NAMES = {
    KIND_UNSPECIFIED: "INTERNAL",  # unspecified is shown as INTERNAL, as OTel treats it
    KIND_INTERNAL: "INTERNAL",
    KIND_SERVER: "SERVER",
    KIND_CLIENT: "CLIENT",
    KIND_PRODUCER: "PRODUCER",
    KIND_CONSUMER: "CONSUMER",
}
KIND_BY_NAME = {
    "INTERNAL": KIND_INTERNAL,
    "SERVER": KIND_SERVER,
    "CLIENT": KIND_CLIENT,
    "PRODUCER": KIND_PRODUCER,
    "CONSUMER": KIND_CONSUMER,
}

# Status codes, OTLP numbering.
STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2
STATUS_NAMES = {STATUS_UNSET: "UNSET", STATUS_OK: "OK", STATUS_ERROR: "ERROR"}

SOURCES = ("otlp", "cloud-trace", "import")

STAGES = ("preprocessing", "encoder", "fusion", "inference", "network", "other")
INPUT_TYPES = ("text", "image", "multi_image", "audio", "video", "unknown")


@dataclass(slots=True)
class SpanRecord:
    """One span, whatever its source.

    Ids are lowercase hex (32 digits a trace, 16 a span); times are unix nanoseconds.
    ``attributes`` holds the span's own attributes, ``resource`` the resource's
    (``service.name``, ``service.instance.id``, ...), values as sent: str, int, float,
    bool, list or dict. ``stage`` and ``signals`` are filled by the tagger, not by decoders.
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    service: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status: int = STATUS_UNSET
    status_message: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    source: str = "otlp"
    scope: str = ""
    stage: str | None = None
    # [{"trace_id", "span_id", "attributes"}]: OTLP span links (ids lowercase hex)
    links: list[dict[str, Any]] = field(default_factory=list)
    # What the span says about its trace, read from the full attribute values before any
    # cap cuts them (ingest/signals.py): media counts, model call, tokens. None: nothing.
    signals: dict[str, Any] | None = None

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def instance(self) -> str | None:
        value = self.resource.get("service.instance.id")
        return None if value is None else str(value)
