"""What the OTLP decoders share: the value limits, the result and error types, and bounded
strings."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

from ...core.spans import SpanRecord

#: Span names are cut to this many characters.
MAX_NAME_CHARS = 1024
_MAX_NAME = MAX_NAME_CHARS
#: String attribute values (and status messages) are cut to this many UTF-8 bytes by
#: default (``MODALSCOPE_MAX_VALUE_BYTES``). This bounds the size of a stored row: one
#: runaway attribute (a whole prompt, a base64 image) must not blow up the spans table or the
#: memory of a dashboard worker reading it.
MAX_STRING_BYTES = 64 * 1024
#: Array and key-value-list values keep this many elements by default, nested ones counted
#: (``MODALSCOPE_MAX_VALUE_ITEMS``): a legal 16 MiB request of one 4-million-element array
#: would otherwise become gigabytes of Python objects.
MAX_VALUE_ITEMS = 4096
#: The span attribute listing the keys whose values were cut by either limit.
TRUNCATED_KEY = "modalscope.truncated"


class ValueLimits:
    """The value limits this process decodes with (:func:`set_value_limits` changes them)."""

    __slots__ = ("string_bytes", "items", "safe_chars", "raw_bytes")

    def __init__(self, string_bytes: int = MAX_STRING_BYTES, items: int = MAX_VALUE_ITEMS) -> None:
        # The hand decoder of short KeyValues never cuts strings under 16 KiB.
        self.string_bytes = max(16 * 1024, int(string_bytes))
        self.items = max(1, int(items))
        # A string of at most this many characters is at most string_bytes in UTF-8 (4 bytes
        # a character at most), so the common case is bounded without encoding it.
        self.safe_chars = self.string_bytes // 4
        # Raw bytes values are cut before base64 so the encoded text stays within the bound
        # and is still valid base64 (3 bytes -> 4 characters).
        self.raw_bytes = self.string_bytes // 4 * 3


LIMITS = ValueLimits()
# KeyValues longer than this are read field by field (_wire_any) rather than by the protobuf
# parser, which would build every element of a huge array before the cap could drop it.
_WIRE_WALK_BYTES = 64 * 1024
# Values nested deeper than this are refused, as the protobuf parser does past its limit.
_MAX_DEPTH = 64


def set_value_limits(max_value_bytes: int, max_value_items: int) -> None:
    """Apply ``MODALSCOPE_MAX_VALUE_BYTES`` / ``MODALSCOPE_MAX_VALUE_ITEMS`` to this process's
    decoders (called once by the ingest pipeline; the defaults hold until then)."""
    new = ValueLimits(max_value_bytes, max_value_items)
    for name in ValueLimits.__slots__:
        setattr(LIMITS, name, getattr(new, name))
    for clear in ON_LIMITS_CHANGED:
        clear()


#: Called when the limits change (the attribute cache forgets what it cut by the old ones).
ON_LIMITS_CHANGED: list = []


class _Budget:
    """Elements an attribute value may still take, and whether anything was cut."""

    __slots__ = ("items", "cut")

    def __init__(self) -> None:
        self.items = LIMITS.items
        self.cut = False

    def take(self) -> bool:
        if self.items <= 0:
            self.cut = True
            return False
        self.items -= 1
        return True

    def bound(self, s: str) -> str:
        if len(s) <= LIMITS.safe_chars:
            return s
        out = _bound_str(s)
        if out is not s:
            self.cut = True
        return out


def _mark_cut(out: dict[str, Any], key: str) -> None:
    cut = out.get(TRUNCATED_KEY)
    if type(cut) is not list:  # (a client's own attribute of that name is replaced)
        cut = out[TRUNCATED_KEY] = []
    cut.append(key)

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
_ZERO_TRACE_HEX = "0" * 32
_ZERO_SPAN_HEX = "0" * 16

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1

_ERR_TRACE_ID = "invalid or missing trace id (must be 16 bytes, 32 hex digits, not all zeros)"
_ERR_SPAN_ID = "invalid or missing span id (must be 8 bytes, 16 hex digits, not all zeros)"
_ERR_PARENT_ID = "invalid parent span id (must be 8 bytes, 16 hex digits, or empty)"
_ERR_LINK_TRACE_ID = "invalid link trace id (must be 16 bytes, 32 hex digits, or empty)"
_ERR_LINK_SPAN_ID = "invalid link span id (must be 8 bytes, 16 hex digits, or empty)"
_ERR_LINKS = "span links must be a list of {traceId, spanId, attributes} objects"
# The store keeps times as signed 64-bit nanoseconds (up to the year 2262): a later time
# would fail the whole write, so the span is rejected here, alone.
_ERR_TIME = "span start or end time is past the year 2262 (more than 2^63-1 ns)"


class DecodeError(ValueError):
    """Whole request is unusable (malformed protobuf/JSON, wrong shape). Message is one line, user-facing."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))


class NotTracesError(DecodeError):
    """The request is an OTLP logs or metrics request, not traces."""


@dataclass
class DecodeResult:
    spans: list[SpanRecord]
    rejected: int = 0  # spans dropped individually (bad/missing trace or span id, etc.)
    errors: list[str] = field(default_factory=list)  # one short message per distinct problem

    @property
    def error_message(self) -> str:
        """The errors joined for ``partial_success.error_message`` ("" when none)."""
        return "; ".join(self.errors)


def _one_line(text: str, limit: int = 500) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# A run of base64 this long is inline media (a captured image or audio clip), not text.
_BLOB_RUN = re.compile(r"[A-Za-z0-9+/_-]{2048,}={0,2}")


def _elide_blob(m: re.Match) -> str:
    run = m.group(0)
    # Encoded bytes mix cases and digits within any 2 KiB; a run of letters alone is text.
    head = run[:4096]
    if head.isalpha() or head.isdigit() or head.islower() or head.isupper():
        return run
    return f"[{len(run)} base64 characters elided]"


def _bound_str(s: str) -> str:
    """Cut ``s`` to LIMITS.string_bytes of UTF-8 (without splitting a character).

    Inline media is elided first: captured GenAI messages with two images run far past the
    cap, and cutting them whole would lose the second image's part (and so the input type).
    """
    if len(s) <= LIMITS.safe_chars:
        return s
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) <= LIMITS.string_bytes:
        return s
    s = _BLOB_RUN.sub(_elide_blob, s)
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) <= LIMITS.string_bytes:
        return s
    return raw[:LIMITS.string_bytes].decode("utf-8", "ignore")


def _b64(data: bytes) -> str:
    if len(data) > LIMITS.raw_bytes:
        data = data[:LIMITS.raw_bytes]
    return base64.b64encode(data).decode("ascii")
