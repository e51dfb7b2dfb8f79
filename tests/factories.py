"""Hand-built multimodal traces for tests (the demo generator is a separate module)."""

from __future__ import annotations

import random

from modalscope.core.spans import (
    KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, STATUS_ERROR, STATUS_UNSET, SpanRecord,
)
from modalscope.ingest.rules_file import load_rules
from modalscope.ingest.settle import settle
from modalscope.ingest.writer import write_spans

MS = 1_000_000
_RULES = None


def rules():
    global _RULES
    if _RULES is None:
        _RULES = load_rules(None)
    return _RULES


def multimodal_trace(rng: random.Random, start_ns: int, images: int = 1, error: bool = False) -> list[SpanRecord]:
    """gateway -> vision-encoder (decode, ViT) -> fusion -> llm, ids from ``rng``."""
    tid = f"{rng.getrandbits(128):032x}"
    ids = iter(f"{rng.getrandbits(64) | 1:016x}" for _ in range(64))
    scale = 1 + rng.random()
    t = start_ns
    root = next(ids)
    spans: list[SpanRecord] = []

    def add(parent, service, name, kind, s, e, status=STATUS_UNSET, **attrs):
        sid = next(ids)
        spans.append(SpanRecord(tid, sid, parent, service, name, kind, int(s), int(e), status=status,
                                attributes=attrs, resource={"service.name": service,
                                                            "service.instance.id": f"{service}-0"}))
        return sid

    enc_ms = 400 * images * scale
    total = 100 * scale + enc_ms + 150 * scale
    add(None, "gateway", "POST /chat", KIND_SERVER, t, t + total * MS,
        status=STATUS_ERROR if error else STATUS_UNSET, **{"mm.image_count": images})
    spans[-1].span_id, root = root, root
    c = add(root, "gateway", "vision.Encode", KIND_CLIENT, t + 5 * MS, t + (10 + enc_ms) * MS,
            **{"peer.service": "vision-encoder"})
    s = add(c, "vision-encoder", "VisionEncoder/Encode", KIND_SERVER, t + 7 * MS, t + (8 + enc_ms) * MS)
    add(s, "vision-encoder", "image.decode", KIND_INTERNAL, t + 8 * MS, t + (8 + enc_ms * 0.3) * MS)
    add(s, "vision-encoder", "vit.forward", KIND_INTERNAL, t + (8 + enc_ms * 0.3) * MS, t + (7 + enc_ms) * MS,
        **{"mm.layer": "attention"})
    f0 = 12 + enc_ms
    add(root, "gateway", "fusion.align", KIND_INTERNAL, t + f0 * MS, t + (f0 + 30 * scale) * MS)
    add(root, "gateway", "llm.generate", KIND_INTERNAL, t + (f0 + 30 * scale) * MS, t + (total - 2) * MS)
    rules().tag(spans)
    return spans


def settled_copy(templates, engine, db_url: str, key: str, spans: list[SpanRecord]) -> None:
    """Make ``engine``'s empty store hold ``spans``, settled: written and settled once a
    backend and ``key`` in a module (``templates`` is a ``FilledTemplates``), copied after."""

    def build(eng) -> None:
        write_spans(eng, spans)
        settle(eng, force=True)

    templates.fill_like(engine, db_url, key, build)
