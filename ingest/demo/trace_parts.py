"""The parts of a trace that the factory (:mod:`.factory`) assembles: where each pattern
is active, which instance serves a call, the vision encoder's work, the attributes drawn
per call, cutting a trace at an error or a timeout, and emitting it into a request."""

from __future__ import annotations

import bisect
import math
import random

from ...core.spans import KIND_INTERNAL, KIND_SERVER, STATUS_ERROR
from .conventions import _IMAGE_ATTRS, _LAYER_ATTRS, _VISION_WEIGHTS
from .plan import DemoConfig, _Plan
from .profiles import BASELINE_FALLBACK_RATE, MIN_NS, NS, VIT_LAYERS
from .protobuf import _ATTRS, _END, _KIND, _MSG, _NAME, _PARENT, _SID, _START, _STATUS, _SVC, _Request, _kv


class _TraceParts:
    """A trace factory's building blocks, for one config and its plan."""

    def __init__(self, config: DemoConfig, plan: _Plan | None = None) -> None:
        self.config = config
        self.plan = plan or _Plan(config)
        self.windows = self.plan.windows
        types, weights = zip(*config.type_mix())
        self.types = types
        self.cum_weights = []
        acc = 0.0
        for w in weights:
            acc += w
            self.cum_weights.append(acc)

    # -- patterns and instances ---------------------------------------------------
    def _on(self, kind: str, t_ns: int) -> bool:
        w = self.windows.get(kind)
        return w is not None and w[0] <= t_ns < w[1]

    def _instance(self, service: str, t_ns: int, rng: random.Random) -> str:
        per_min = self.plan.alive[service]
        m = (t_ns - self.plan.t0) // MIN_NS
        m = 0 if m < 0 else (len(per_min) - 1 if m >= len(per_min) else m)
        pool = per_min[m]
        return pool[int(rng.random() * len(pool))]

    def pick_type(self, rng: random.Random) -> str:
        i = bisect.bisect_right(self.cum_weights, rng.random() * self.cum_weights[-1])
        return self.types[min(i, len(self.types) - 1)]

    # -- vision encoder -------------------------------------------------------------
    def _vision_parts(self, rng, seg, images, load, batch_fail, t_ns):
        """The vision call's children; returns (parts, duration, pod, stall)."""
        pod = self._instance("vision-encoder", t_ns, rng)
        decode_scale = 1.0
        if self._on("preprocessing_bound", t_ns):
            decode_scale = 6.0 if pod == self.plan.slow_vision_pod else 3.0
        parts = self._vision_layout(rng, images, load, batch_fail, seg, decode_scale,
                                    vit_scale=1.35 if batch_fail else 1.0)
        stall = 0.0
        if self._on("p99_band_break", t_ns) and rng.random() < 0.03:
            stall = rng.uniform(7.0, 14.0)
        return parts, sum(p[1] for p in parts), pod, stall

    def _vision_layout(self, rng, images, load, batch_fail, seg=None, decode_scale=1.0, vit_scale=1.0):
        """[(name, duration, attrs, layers)] of the vision encoder's work: per image
        decode, resize, normalize (CPU, one after another), then one batched ViT forward."""
        if seg is None:  # relative weights only (the caller scales them)
            seg = _VISION_WEIGHTS
        parts = []
        split = [math.exp(0.15 * rng.gauss(0.0, 1.0)) for _ in range(images)]
        total = sum(split)
        for i in range(images):
            f = split[i] / total
            attrs = _IMAGE_ATTRS[min(i, len(_IMAGE_ATTRS) - 1)]
            parts.append(("image.decode", seg["decode"] * f * decode_scale, attrs, None))
            parts.append(("image.resize", seg["resize"] * f, attrs, None))
            parts.append(("image.normalize", seg["normalize"] * f, attrs, None))
        batch = 1 if batch_fail else self._vision_batch(rng, load)
        fallback = rng.random() < BASELINE_FALLBACK_RATE
        vit_attrs = [_kv("mm.modality", "vision"), _kv("batch.size", batch),
                     _kv("gpu.cuda_graph", "fallback" if fallback else "captured")]
        parts.append(("vit.forward", seg["vit"] * vit_scale, vit_attrs, VIT_LAYERS))
        return parts

    @staticmethod
    def _emit_vision(span, sid, s0, s1, parts, stall):
        """Lay the vision encoder's children out in [s0, s1] (after a stall, if any)."""
        total = sum(p[1] for p in parts)
        avail = s1 - s0 - stall
        scale = avail * 0.985 / total if total > 0 else 0.0
        gap = avail * 0.015 / (len(parts) + 1)
        t = s0 + stall + gap
        for name, d, attrs, layers in parts:
            d *= scale
            cid = span("vision-encoder", sid, name, KIND_INTERNAL, t, t + d, attrs)
            if layers:
                lt = t + d * 0.02
                for layer, frac in layers:
                    ld = d * frac
                    span("vision-encoder", cid, f"vit.{layer}", KIND_INTERNAL, lt, lt + ld,
                         _LAYER_ATTRS[layer])
                    lt += ld + d * 0.14
            t += d + gap

    # -- attributes -----------------------------------------------------------------
    @staticmethod
    def _vision_batch(rng, load):
        return max(2, min(16, int(round(rng.gauss(2.0 + 3.0 * load, 1.2)))))

    @staticmethod
    def _llm_batch(rng, load):
        return max(1, min(64, int(round(rng.gauss(10.0 * load, 3.0)))))

    @staticmethod
    def _tenc_attrs(rng, load):
        return [_kv("mm.modality", "text"), _kv("batch.size", max(1, min(32, int(round(rng.gauss(4.0 * load, 1.5))))))]

    @staticmethod
    def _gpu_attrs(rng, modality, load):
        fb = rng.random() < BASELINE_FALLBACK_RATE
        return [_kv("mm.modality", modality), _kv("batch.size", max(1, min(16, int(round(rng.gauss(2.0 + 2.0 * load, 1.0)))))),
                _kv("gpu.cuda_graph", "fallback" if fb else "captured")]

    # -- errors ---------------------------------------------------------------------
    @staticmethod
    def _cut(spans, cut, service, message, http_status, mark_all, failing_sid=None):
        """End the trace at ``cut``: later spans never happened, running ones end there
        (in error where they are the failing call's chain, or every one for a timeout).
        The failing span is ``failing_sid``, else ``service``'s SERVER span at the cut."""
        by_id = {s[_SID]: s for s in spans}
        failing = by_id.get(failing_sid) if failing_sid is not None else None
        if not mark_all and failing is None:
            # The failing service's outermost span running at the cut, and its chain up.
            for s in spans:
                if s[_SVC] == service and s[_KIND] == KIND_SERVER and s[_START] <= cut < s[_END]:
                    failing = s
                    break
        chain = set()
        if failing is not None:
            p = failing
            while p is not None:
                chain.add(p[_SID])
                p = by_id.get(p[_PARENT])
        kept = []
        for s in spans:
            if s[_START] >= cut and s[_PARENT] is not None:
                continue
            if s[_END] > cut or s[_PARENT] is None:
                if s[_END] > cut:
                    s[_END] = cut
                if mark_all or s[_SID] in chain:
                    s[_STATUS] = STATUS_ERROR
                    s[_MSG] = message if (s[_PARENT] is None or not mark_all) else "CANCELLED: " + message
                    if s[_PARENT] is None:
                        s[_ATTRS] = [a for a in s[_ATTRS] if a.key != "http.response.status_code"] + [
                            _kv("http.response.status_code", http_status), _kv("error.type", str(http_status))]
            kept.append(s)
        spans[:] = kept

    # -- emit -----------------------------------------------------------------------
    def _emit(self, req: _Request, rng, t_ns: int, spans: list[list], instances: dict[str, str],
              link: tuple[bytes, int] | None = None) -> bytes:
        """Add one trace's spans to ``req`` (``link``: the root's span link, trace id and
        span id); returns its trace id."""
        # Time-ordered trace ids (X-Ray style: unix seconds in the first 4 bytes, then random
        # bits): stores index them append-mostly, which keeps a large fill fast.
        first = t_ns + int(spans[0][_START] * NS)
        tid = ((first // NS & 0xFFFFFFFF) << 96 | rng.getrandbits(96) | 1).to_bytes(16, "big")
        last = 0
        for s in spans:
            service = s[_SVC]
            inst = instances.get(service)
            if inst is None:
                inst = instances[service] = self._instance(service, t_ns, rng)
            start = t_ns + int(s[_START] * NS)
            end = t_ns + int(s[_END] * NS)
            if end < start:
                end = start
            if end > last:
                last = end
            pb = req.container(service, inst).add(
                trace_id=tid, span_id=s[_SID].to_bytes(8, "big"), name=s[_NAME], kind=s[_KIND],
                start_time_unix_nano=start, end_time_unix_nano=end, attributes=s[_ATTRS],
            )
            if s[_PARENT] is not None:
                pb.parent_span_id = s[_PARENT].to_bytes(8, "big")
            elif link is not None:
                pb.links.add(trace_id=link[0], span_id=link[1].to_bytes(8, "big"))
            if s[_STATUS]:
                pb.status.code = s[_STATUS]
                pb.status.message = s[_MSG]
                ev = pb.events.add(time_unix_nano=end, name="exception")
                ev.attributes.extend((_kv("exception.type", "RpcError"), _kv("exception.message", s[_MSG])))
        req.n_spans += len(spans)
        req.n_traces += 1
        if last > req.last_end_ns:
            req.last_end_ns = last
        return tid

