"""What one span says about its trace: media in the request, model calls, tokens.

Read at ingest by the tagger and stored as a small JSON object in ``spans.signals``.
Settling combines the signals of a trace's spans (:func:`trace_input_type`) without parsing
attributes again. Captured message contents with inline images are as large as the images
and may arrive cut (the SDK's attribute length limit, the receiver's string cap), so media
parts are counted by a scan that works on truncated JSON (:func:`scan_parts`): a part is
counted when its ``modality`` / ``mime_type`` / ``type`` key survived the cut. Which library
writes which attribute: docs/instrumenting.md.

A signals object has any of these keys (absent: the span said nothing of it):

* ``it``     an explicit ``mm.input_type`` naming one of the input types;
* ``mm``     ``{"image": n, "audio": n, "video": n}`` from ``mm.image_count`` /
  ``mm.audio_count`` / ``mm.video_count`` (only the counts the span carries);
* ``parts``  media parts counted in one model request's input messages (OTel GenAI
  ``gen_ai.input.messages`` parts with a ``modality``, as attribute or ``gen_ai.*`` span
  event; OpenInference ``llm.input_messages.*.message.contents.*.message_content.type`` and
  ``input.value``; OpenLLMetry ``gen_ai.prompt.*.content``): ``{"image": n, ...}``, only the
  media found, the largest count per medium over those places;
* ``usage``  media with input tokens in the usage (``gen_ai.usage.image.input_tokens``,
  ``llm.token_count.prompt_details.audio`` and the like), a sorted list: media present,
  count unknown;
* ``text``   1: a model call or ``mm.prompt_chars``, so the request had text at least;
* ``call``   1: the span is a model call (a GenAI operation other than a tool or agent one,
  OpenInference LLM/EMBEDDING/RERANKER, OpenLLMetry ``llm.request.type``);
* ``provider`` (lower-cased), ``model``: the model call's provider and requested model
  (OpenInference: its ``llm.model_name``, which ends as the response's model version);
* ``tok``    ``{"in": {"text"|"image"|"audio"|"video"|"total": n}, "out": n}``: the call's
  token usage, only the counts the span carries.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable

from ..core.spans import INPUT_TYPES, SpanRecord

__all__ = ["MEDIA", "scan_parts", "span_signals", "trace_input_type"]

MEDIA = ("image", "audio", "video")
_INPUT_TYPE_SET = frozenset(INPUT_TYPES)
_MM_COUNT_KEYS = (("mm.image_count", "image"), ("mm.audio_count", "audio"), ("mm.video_count", "video"))


def _count(value: Any) -> float | None:
    """A count attribute as a number; strings such as "2" are coerced, junk is None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    """A token count as a non-negative int, or None."""
    n = _count(value)
    if n is None or n < 0:
        return None
    return int(n)


# Keys whose presence sends a span down the slow path. Everything else (most spans: HTTP,
# RPC, DB) leaves after one ``isdisjoint`` over its keys.
_TRIGGERS = frozenset((
    "mm.input_type", "mm.image_count", "mm.audio_count", "mm.video_count", "mm.prompt_chars",
    "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system", "gen_ai.request.model",
    "gen_ai.input.messages", "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
    "openinference.span.kind", "llm.request.type",
))

_MM_COUNTS = frozenset(key for key, _ in _MM_COUNT_KEYS)
_MM_KEYS = _MM_COUNTS | {"mm.input_type", "mm.prompt_chars"}

# gen_ai.operation.name values that are not a call to a model.
_NOT_MODEL_OPS = frozenset((
    "execute_tool", "invoke_agent", "create_agent", "invoke_workflow", "retrieval",
))
_OI_MODEL_KINDS = frozenset(("LLM", "EMBEDDING", "RERANKER"))
# OpenLLMetry (Traceloop) model spans carry llm.request.type and gen_ai.system but no
# gen_ai.operation.name.
_LLM_REQUEST_TYPES = frozenset(("completion", "chat", "embedding", "rerank"))

# A media part in serialised input messages, found without parsing, so a value cut short
# by an attribute length limit still counts the parts before the cut. Matches the OTel GenAI
# parts ({"mime_type":"image/png","modality":"image",...}), Google's inline_data/file_data
# ("mime_type"/"mimeType"), and typed parts of other SDKs ("type":"image_url",
# "input_audio", ...). Quoted text inside a part is escaped (\"type\"), so it never matches.
_PART_RE = re.compile(
    r'"(modality|mime_?type|mimeType|type)"\s*:\s*"'
    r"(image|audio|video|input_image|input_audio|input_video|image_url|video_url)\b",
    re.IGNORECASE,
)
_MEDIA_OF = {
    "image": "image", "input_image": "image", "image_url": "image",
    "audio": "audio", "input_audio": "audio",
    "video": "video", "input_video": "video", "video_url": "video",
}
_OI_INPUT_PREFIX = "llm.input_messages."
_OI_TYPE_SUFFIX = ".message_content.type"
_TL_PROMPT_PREFIX = "gen_ai.prompt."


def scan_parts(text: str) -> dict[str, int]:
    """Media parts per medium in serialised messages (whole or truncated JSON).

    Each part says its medium under one or more keys (``modality``, ``mime_type``,
    ``type``); per medium the count is the largest over those keys, so a part that names
    it twice counts once.
    """
    by_key: dict[tuple[str, str], int] = {}
    for match in _PART_RE.finditer(text):
        key = match.group(1).lower()
        if key == "mimetype":
            key = "mime_type"
        value = match.group(2).lower()
        if key == "mime_type":
            # a MIME type names its medium before the slash ("image/png")
            end = match.end(2)
            if text[end : end + 1] != "/":
                continue
        media = _MEDIA_OF[value]
        by_key[(key, media)] = by_key.get((key, media), 0) + 1
    counts: dict[str, int] = {}
    for (_, media), n in by_key.items():
        if n > counts.get(media, 0):
            counts[media] = n
    return counts


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict, tuple)):
        try:
            return json.dumps(value, default=str)
        except (TypeError, ValueError):
            return None
    return None


def _merge_max(into: dict[str, int], counts: dict[str, int]) -> None:
    for media, n in counts.items():
        if n > into.get(media, 0):
            into[media] = n


def span_signals(span: SpanRecord) -> dict[str, Any] | None:
    """The span's signals (see the module docstring), or None when it says nothing."""
    attributes = span.attributes
    events = span.events
    if attributes:
        if _TRIGGERS.isdisjoint(attributes) and not events:
            return None
    elif not events:
        return None
    else:
        attributes = {}
    out: dict[str, Any] = {}
    hits = _TRIGGERS.intersection(attributes)
    if "mm.input_type" in hits:
        explicit = attributes["mm.input_type"]
        if isinstance(explicit, str):
            explicit = explicit.strip().lower()
            if explicit in _INPUT_TYPE_SET and explicit != "unknown":
                out["it"] = explicit
    if not _MM_COUNTS.isdisjoint(hits):
        counts = {}
        for key, media in _MM_COUNT_KEYS:
            if key in hits:
                value = attributes[key]
                n = value if type(value) is int else _count(value)
                if n is not None:
                    counts[media] = n
        if counts:
            out["mm"] = counts
    if "mm.prompt_chars" in hits:
        out["text"] = 1
    if hits <= _MM_KEYS and not events:  # the multimodal extras alone: no model call here
        return out or None
    _model_call(attributes, out)
    parts = _request_parts(attributes, events, "call" in out)
    if parts:
        out["parts"] = parts
    return out or None


def _model_call(attributes: dict[str, Any], out: dict[str, Any]) -> None:
    """Fill ``call``, ``provider``, ``model``, ``usage`` and ``tok`` of a model call."""
    get = attributes.get
    operation = get("gen_ai.operation.name")
    oi_kind = get("openinference.span.kind")
    call = False
    if isinstance(operation, str) and operation:
        call = operation.strip().lower() not in _NOT_MODEL_OPS
    elif isinstance(oi_kind, str) and oi_kind:
        call = oi_kind.strip().upper() in _OI_MODEL_KINDS
    else:
        request_type = get("llm.request.type")
        call = (
            isinstance(request_type, str)
            and request_type.strip().lower() in _LLM_REQUEST_TYPES
            and ("gen_ai.system" in attributes or "gen_ai.provider.name" in attributes)
        )
    if not call:
        return
    out["call"] = 1
    out["text"] = 1
    for key in ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system"):
        value = get(key)
        if isinstance(value, str) and value.strip():
            out["provider"] = value.strip().lower()
            break
    for key in ("gen_ai.request.model", "llm.model_name", "embedding.model_name",
                "reranker.model_name", "gen_ai.response.model"):
        value = get(key)
        if isinstance(value, str) and value.strip():
            out["model"] = value.strip()
            break

    tok_in: dict[str, int] = {}
    total = _int(get("gen_ai.usage.input_tokens"))
    if total is None:
        total = _int(get("gen_ai.usage.prompt_tokens"))  # before semconv 1.27
    if total is None:
        total = _int(get("llm.token_count.prompt"))
    for modality in ("text",) + MEDIA:
        n = _int(get(f"gen_ai.usage.{modality}.input_tokens"))
        if n is None:
            n = _int(get(f"llm.token_count.prompt_details.{modality}"))
        if n is not None:
            tok_in[modality] = n
    if total is not None:
        tok_in["total"] = total
    tok_out = _int(get("gen_ai.usage.output_tokens"))
    if tok_out is None:
        tok_out = _int(get("gen_ai.usage.completion_tokens"))
    if tok_out is None:
        tok_out = _int(get("llm.token_count.completion"))
    tok: dict[str, Any] = {}
    if tok_in:
        tok["in"] = tok_in
    if tok_out is not None:
        tok["out"] = tok_out
    if tok:
        out["tok"] = tok
    usage = [m for m in MEDIA if tok_in.get(m, 0) > 0]
    if usage:
        out["usage"] = usage


def _request_parts(
    attributes: dict[str, Any], events: list[dict[str, Any]], call: bool
) -> dict[str, int] | None:
    """Media parts of the request's input messages, the largest count per medium over the
    places that describe it (attribute, events, OpenInference keys, ``input.value``)."""
    parts: dict[str, int] = {}
    text = _as_text(attributes.get("gen_ai.input.messages"))
    if text:
        _merge_max(parts, scan_parts(text))
    for event in events:
        name = event.get("name")
        ev_attrs = event.get("attributes")
        if not ev_attrs or not isinstance(name, str) or not name.startswith("gen_ai."):
            continue
        # gen_ai.client.inference.operation.details (messages), gen_ai.content.prompt
        # (gen_ai.prompt), gen_ai.user.message (content): one request, one event each.
        for key in ("gen_ai.input.messages", "gen_ai.prompt", "content"):
            text = _as_text(ev_attrs.get(key))
            if text:
                _merge_max(parts, scan_parts(text))
    if call and "openinference.span.kind" in attributes:
        oi: dict[str, int] = {}
        for key, value in attributes.items():
            if (
                key.startswith(_OI_INPUT_PREFIX)
                and key.endswith(_OI_TYPE_SUFFIX)
                and isinstance(value, str)
            ):
                media = _MEDIA_OF.get(value.strip().lower())
                if media is not None:
                    oi[media] = oi.get(media, 0) + 1
        _merge_max(parts, oi)
        # Google GenAI audio and video parts reach OpenInference only in input.value.
        text = _as_text(attributes.get("input.value"))
        if text:
            _merge_max(parts, scan_parts(text))
    elif call and "llm.request.type" in attributes:
        for key, value in attributes.items():
            if key.startswith(_TL_PROMPT_PREFIX) and key.endswith(".content"):
                text = _as_text(value)
                if text:
                    _merge_max(parts, scan_parts(text))
    return parts or None


def _classify(counts: dict[str, float]) -> str:
    if counts.get("video", 0) > 0:
        return "video"
    if counts.get("audio", 0) > 0:
        return "audio"
    images = counts.get("image", 0)
    if images >= 2:
        return "multi_image"
    if images >= 1:
        return "image"
    return "text"


def trace_input_type(signals: Iterable[dict[str, Any] | None]) -> str:
    """The input type of a trace from its spans' signals, the most explicit signal first.

    ``signals`` in the order ties should break (the root's first, then by start time):

    1. an explicit ``it`` (the first one);
    2. ``mm`` counts, the largest per medium over the spans;
    3. media ``parts`` of model requests, the largest per medium over the requests;
    4. media in the ``usage`` (a count of 1: ``image``, not ``multi_image``);
    5. ``text`` (a model call or a prompt with no media said anywhere) -> ``text``;
    6. otherwise ``unknown``.

    Media rank video, then audio, then images: a request with any video is ``video``.
    """
    mm: dict[str, float] | None = None
    parts: dict[str, float] | None = None
    usage: set[str] = set()
    text = False
    for sig in signals:
        if not sig:
            continue
        explicit = sig.get("it")
        if explicit:
            return explicit
        for level, counts in (("mm", sig.get("mm")), ("parts", sig.get("parts"))):
            if counts:
                merged = mm if level == "mm" else parts
                if merged is None:
                    merged = {}
                    if level == "mm":
                        mm = merged
                    else:
                        parts = merged
                for media, n in counts.items():
                    if n > merged.get(media, 0) or media not in merged:
                        merged[media] = max(n, merged.get(media, 0))
        if sig.get("usage"):
            usage.update(sig["usage"])
        if sig.get("text") or sig.get("call"):
            text = True
    if mm is not None:
        return _classify(mm)
    if parts is not None:
        return _classify(parts)
    if usage:
        return _classify({m: 1 for m in usage})
    return "text" if text else "unknown"
