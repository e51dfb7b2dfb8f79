"""What one span says about its trace: media in the request, model calls, tokens.

Read at ingest, when the tagger sees the span with its attribute values whole (captured
message contents with inline images run far past any attribute length cap), and stored as a
small JSON object in ``spans.signals``. Settling combines the signals of a trace's spans
(:func:`trace_input_type`) without parsing attributes again.

A signals object has any of these keys (absent: the span said nothing of it):

* ``it``     an explicit ``mm.input_type`` naming one of the input types;
* ``mm``     ``{"image": n, "audio": n, "video": n}`` from ``mm.image_count`` /
  ``mm.audio_count`` / ``mm.video_count`` (only the counts the span carries);
* ``parts``  media parts counted in one model request's input messages (OTel GenAI
  ``gen_ai.input.messages`` parts with a ``modality``, as attribute or event; OpenInference
  ``llm.input_messages.*.message.contents.*``): ``{"image": n, "audio": n, "video": n}``;
* ``usage``  modalities with input tokens in the GenAI usage (``gen_ai.usage.image.input_tokens``
  and the like): media present, count unknown;
* ``text``   1: a model call or ``mm.prompt_chars``, so the request had text at least;
* ``call``   1: the span is a model call (GenAI operation or OpenInference LLM/EMBEDDING/...);
* ``provider``, ``model``: the model call's provider and requested model;
* ``tok``    ``{"in": {modality or "total": n}, "out": n}``: the call's token usage.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from .records import INPUT_TYPES, SpanRecord

__all__ = ["MEDIA", "span_signals", "trace_input_type"]

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


def span_signals(span: SpanRecord) -> dict[str, Any] | None:
    """The span's signals (see the module docstring), or None when it says nothing."""
    attributes = span.attributes
    if not attributes:
        return None
    out: dict[str, Any] = {}
    explicit = attributes.get("mm.input_type")
    if isinstance(explicit, str):
        explicit = explicit.strip().lower()
        if explicit in _INPUT_TYPE_SET and explicit != "unknown":
            out["it"] = explicit
    counts = {}
    for key, media in _MM_COUNT_KEYS:
        n = _count(attributes.get(key))
        if n is not None:
            counts[media] = n
    if counts:
        out["mm"] = counts
    if "mm.prompt_chars" in attributes:
        out["text"] = 1
    return out or None


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
