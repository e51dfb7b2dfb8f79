"""The trace factory: one user request's trace through the gateway, its side calls, the
preprocessor, the encoders, fusion and the model call (with billing beside it), the
injected patterns where they are active, and the usage event consumer's trace."""

from __future__ import annotations

import math
import random

from ...core.spans import KIND_CLIENT, KIND_CONSUMER, KIND_INTERNAL, KIND_PRODUCER, KIND_SERVER, STATUS_ERROR
from .conventions import (_A_AUDIO, _CHAT_BASE, _CHAT_DONE, _CONSUME, _CONSUME_NAME, _DB_PROFILE, _DB_QUOTA,
                          _DB_SESSION, _FUSION_PARTS, _GEMINI_BASE, _GEMINI_DONE, _GEMINI_HTTP, _GEMINI_MODEL,
                          _INSERT, _INSERT_NAME, _LLM_SERVER, _M_AUDIO, _M_AUTH, _M_BILLING, _M_FUSION, _M_PRE,
                          _M_TEXT, _M_VISION, _MODEL, _OBJ_GET, _OBJSTORE_URL, _OK_200, _PARTITIONS, _PRODUCE,
                          _PRODUCE_NAME, _ROOT_BASE, _ROOT_NAME, _cache_attrs, _input_messages, _rpc, _usage)
from .draws import _lognorm
from .profiles import (BASELINE_FALLBACK_RATE, CACHE_HIT, CORE_SHARES, ERROR_RATES, GEMINI_SHARE,
                       HOT_SPOT_QUERY_S, LB_TIMEOUT_S, NS, PROFILES, QUEUE_DELAY_S, SYNC_SPREAD_S)
from .protobuf import _ATTRS, _END, _MSG, _SID, _STATUS, _Request, _int_kv, _kv, _str_kv
from .trace_parts import _TraceParts


class _Factory(_TraceParts):
    """Builds traces for one config (and its plan) into requests."""

    def trace(self, rng: random.Random, t_ns: int, itype: str, req: _Request, load: float = 1.0,
              giant: bool = False) -> None:
        """Add one request's trace starting at ``t_ns`` to ``req``, and the trace of its usage
        event's consumer when it was published (``giant``: a 6-8 image request longer than
        the load balancer's timeout)."""
        on = self._on
        spans: list[list] = []
        ids = rng.getrandbits

        def span(service, parent, name, kind, start, end, attrs, status=0, message=""):
            sid = ids(64) or 1
            spans.append([service, sid, parent, name, kind, start, end, attrs, status, message])
            return sid

        def call(caller, callee, method, parent, start, dur, client_extra=(), server_extra=()):
            """A gRPC call: CLIENT span in caller, SERVER span in callee (wire time on
            both sides); returns (client id, server id, server start, server end)."""
            w1 = rng.uniform(0.0002, 0.0008)
            w2 = rng.uniform(0.0002, 0.0008)
            if dur < 4 * (w1 + w2):
                w1 = w2 = dur * 0.05
            cid = span(caller, parent, method, KIND_CLIENT, start, start + dur,
                       _rpc(method, callee, True) + list(client_extra))
            s0, s1 = start + w1, start + dur - w2
            sid = span(callee, cid, method, KIND_SERVER, s0, s1, _rpc(method, callee, False) + list(server_extra))
            return cid, sid, s0, s1

        def sequence(parent, service, start, end, parts, self_frac):
            """Lay ``parts`` [(name, weight, attrs)] out one after another inside
            [start, end], leaving ``self_frac`` of it as the parent's own time (gaps);
            returns [(span id, start, end)]."""
            total_w = sum(p[1] for p in parts)
            dur = end - start
            gap = dur * self_frac / (len(parts) + 1)
            work = dur * (1 - self_frac)
            t = start + gap
            out = []
            for name, weight, attrs in parts:
                d = work * weight / total_w
                out.append((span(service, parent, name, KIND_INTERNAL, t, t + d, attrs), t, t + d))
                t += d + gap
            return out

        profile = PROFILES[itype]
        shares = CORE_SHARES[itype]

        # Who is asking.
        if on("cache_penetration", t_ns):
            r = rng.random()
            tier = "gold" if r < 0.62 else ("silver" if r < 0.85 else "bronze")
        else:
            r = rng.random()
            tier = "gold" if r < 0.40 else ("silver" if r < 0.75 else "bronze")

        truncate_at = None
        images = 0
        audio = 0
        if itype == "image":
            images = 1
        elif itype == "multi_image":
            r = rng.random()
            images = 2 if r < 0.80 else (3 if r < 0.95 else 4)
        elif itype == "audio":
            audio = 1
            images = 1 if rng.random() < 0.2 else 0

        # End-to-end latency, from the reference latency table's distribution.
        T = math.exp(profile.mu + profile.sigma * rng.gauss(0.0, 1.0))
        if giant:
            images = rng.choice((6, 7, 8))
            T = rng.uniform(34.0, 50.0)
            truncate_at = LB_TIMEOUT_S - rng.uniform(0.005, 0.1)
        # Text only: the hosted model answers a share of the requests.
        hosted = itype == "text" and rng.random() < GEMINI_SHARE

        # Prompt length: ~200 tokens of text; <100 characters with one image; >300 with two.
        if itype == "text":
            prompt_chars = int(_lognorm(rng, 800, 0.3))
        elif itype == "image":
            prompt_chars = rng.randrange(12, 100)
        elif itype == "multi_image":
            prompt_chars = rng.randrange(301, 1200)
        else:
            prompt_chars = rng.randrange(0, 200)

        # Side calls (their own latency distributions).
        g0 = rng.uniform(0.0004, 0.0015)
        g1 = rng.uniform(0.0005, 0.002)
        gaps = [rng.uniform(0.00005, 0.0003) for _ in range(9)]
        auth_d = _lognorm(rng, 0.0025, 0.35) + 0.0012
        session_d = _lognorm(rng, 0.0075, 1.1)
        quota_d = _lognorm(rng, 0.0075, 1.1)
        cache_d = _lognorm(rng, 0.0009, 0.4)
        produce_d = _lognorm(rng, 0.0006, 0.3)
        hit = rng.random() < (0.08 if tier == "bronze" and on("cache_penetration", t_ns) else CACHE_HIT[tier])
        profile_d = 0.0 if hit else _lognorm(rng, 0.045, 0.5)
        side = (g0 + g1 + auth_d + session_d + quota_d + cache_d + produce_d + gaps[0] + gaps[1] + gaps[2]
                + gaps[4] + gaps[5] + gaps[8] + (gaps[6] if itype == "text" else gaps[7])
                + (0.0 if hit else profile_d + gaps[3]))
        if not hit and on("hot_spot", t_ns):
            profile_d = _lognorm(rng, HOT_SPOT_QUERY_S, 0.5)  # added on top: users wait for it
        R = max(T - side, 0.35 * T)

        # The pipeline's part, split by the type's shares with jitter (R is kept exactly).
        raw = {k: v * math.exp(0.12 * rng.gauss(0.0, 1.0)) for k, v in shares.items() if k != "tenc_par"}
        norm = R / sum(raw.values())
        seg = {k: v * norm for k, v in raw.items()}
        tenc_par = shares.get("tenc_par", 0.0) * R * math.exp(0.2 * rng.gauss(0.0, 1.0))

        # The uploaded media, as the object store names them.
        uris = [f"{_OBJSTORE_URL}{ids(48):012x}.jpg" for _ in range(images)]
        audio_uri = f"{_OBJSTORE_URL}{ids(48):012x}.wav" if audio else None

        # -- layout -------------------------------------------------------------------
        root = span("gateway", None, _ROOT_NAME, KIND_SERVER, 0.0, 0.0, _ROOT_BASE + [_kv("user_tier", tier)])
        root_span = spans[-1]
        t = g0

        call("gateway", "auth", _M_AUTH, root, t, auth_d)
        t += auth_d + gaps[0]
        span("gateway", root, "SELECT sessions", KIND_CLIENT, t, t + session_d, _DB_SESSION)
        t += session_d + gaps[1]
        span("gateway", root, "GET profile", KIND_CLIENT, t, t + cache_d, _cache_attrs(tier, hit))
        t += cache_d + gaps[2]
        if not hit:
            span("gateway", root, "SELECT user_profile", KIND_CLIENT, t, t + profile_d, _DB_PROFILE)
            t += profile_d + gaps[3]
        span("gateway", root, "SELECT quota", KIND_CLIENT, t, t + quota_d, _DB_QUOTA)
        t += quota_d + gaps[4]

        # Preprocessor: tokenizing (and audio decoding, fetching the images from the object
        # store). mm.* counts here are optional extras: the model call says the same.
        pre_d = seg["pre"]
        _, psid, p0, p1 = call("gateway", "preprocessor", _M_PRE, root, t, pre_d)
        parts = []
        if audio:
            parts += [("audio.decode", 0.50, _A_AUDIO), ("audio.resample", 0.30, _A_AUDIO)]
        if images:
            parts.append(("image.fetch", 0.4 * images, [_kv("mm.image_count", images)]))
        parts.append(("text.tokenize", 0.2 if (audio or images) else 1.0, [_int_kv("mm.prompt_chars", prompt_chars)]))
        laid = sequence(psid, "preprocessor", p0, p1, parts, 0.04)
        if images:
            # One GET a picture, one after another: most of the fetch is waiting on the store.
            fid, f0, f1 = laid[2 if audio else 0]
            gap = (f1 - f0) * 0.08 / (images + 1)
            d = (f1 - f0) * 0.92 / images
            g = f0 + gap
            for uri in uris:
                span("preprocessor", fid, "HTTP GET", KIND_CLIENT, g, g + d, _OBJ_GET + [_str_kv("http.url", uri)])
                g += d + gap
        t += pre_d + gaps[5]

        batch_fail = on("batching_failure", t_ns)
        sync_fail = on("fusion_sync_wait", t_ns)
        vis_pod = None
        # (cut time, failing service, message, failing span id or None: the service's SERVER span)
        errors: list[tuple[float, str, str, int | None]] = []

        # -- encoders -------------------------------------------------------------------
        if itype == "text":
            if hosted:
                model_d = seg["tenc"] + gaps[6] + seg["llm"]  # no local encoder: one hosted call
            else:
                tenc_d = seg["tenc"]
                _, tsid, s0, s1 = call("gateway", "text-encoder", _M_TEXT, root, t, tenc_d)
                sequence(tsid, "text-encoder", s0, s1, [("text_encoder.forward", 1.0, self._tenc_attrs(rng, load))],
                         0.05)
                t += tenc_d + gaps[6]
        else:
            # The encoder on the critical path (vision, or audio) and its duration.
            stall = 0.0
            if itype == "audio":
                long_d = seg["aenc"]
            else:
                vis_parts, vis_d, vis_pod, stall = self._vision_parts(rng, seg, images, load, batch_fail, t_ns)
                long_d = vis_d + stall
            if sync_fail:
                long_d *= 1.12  # encoders running at once contend for PCIe / L2 (the source document: 82% / 79%)
            last_end = t + long_d
            modalities = 1 + (1 if images else 0) + (1 if audio else 0)  # + text
            spread = max(0.002, rng.gauss(SYNC_SPREAD_S[min(modalities, 3)], 0.004))
            # The text encoder is launched just in time to finish ~spread before the last
            # encoder; with the sync problem it starts with the others and finishes early.
            tenc_d = tenc_par
            if sync_fail:
                tenc_start = t
                spread = max(long_d - tenc_d, 0.12 + rng.random() * 0.33)
                tenc_d = max(0.004, long_d - spread)
            else:
                tenc_start = max(t, last_end - spread - tenc_d)
            _, tsid, s0, s1 = call("gateway", "text-encoder", _M_TEXT, root, tenc_start, tenc_d)
            sequence(tsid, "text-encoder", s0, s1, [("text_encoder.forward", 1.0, self._tenc_attrs(rng, load))], 0.05)
            first_end = tenc_start + tenc_d

            if itype == "audio":
                _, asid, s0, s1 = call("gateway", "audio-encoder", _M_AUDIO, root, t, long_d)
                sequence(asid, "audio-encoder", s0, s1,
                         [("audio_encoder.forward", 1.0, self._gpu_attrs(rng, "audio", load))], 0.06)
                if images:  # a picture with the recording: vision in parallel, shorter
                    v_d = long_d * rng.uniform(0.5, 0.8)
                    v_end = last_end - spread * rng.uniform(0.2, 0.8)
                    v_parts = self._vision_layout(rng, images, load, batch_fail)
                    _, vsid, s0, s1 = call("gateway", "vision-encoder", _M_VISION, root, v_end - v_d, v_d)
                    self._emit_vision(span, vsid, s0, s1, v_parts, 0.0)
            else:
                _, vsid, s0, s1 = call("gateway", "vision-encoder", _M_VISION, root, t, long_d)
                self._emit_vision(span, vsid, s0, s1, vis_parts, stall)
                if rng.random() < ERROR_RATES["vision"]:
                    errors.append((t + rng.uniform(0.02, 0.3) * long_d, "vision-encoder",
                                   "UNAVAILABLE: GPU worker restarting", None))

            # Fusion: starts when the first encoder returns, waits for the rest, then aligns.
            f_start = first_end + gaps[6]
            f_end = last_end + seg["fusion"]
            _, fsid, s0, s1 = call("gateway", "fusion", _M_FUSION, root, f_start, f_end - f_start)
            sync_end = max(s0, min(last_end + rng.uniform(0.0003, 0.0012), s1))
            span("fusion", fsid, "fusion.sync_wait", KIND_INTERNAL, s0, sync_end, [_kv("mm.modalities", modalities)])
            sequence(fsid, "fusion", sync_end, s1, _FUSION_PARTS, 0.08)
            t = f_end + gaps[7]

        # -- the model call, with billing beside it --------------------------------------
        in_text = max(1, prompt_chars // 4)
        messages = _str_kv("gen_ai.input.messages", _input_messages(prompt_chars, uris, audio_uri))
        llm_pod = None
        if hosted:
            # Gemini: a GenAI client span with the SDK's HTTP request under it (no callee span).
            failed = rng.random() < ERROR_RATES["gemini"]
            out_tokens = max(1, int(model_d * 0.7 / 0.005))
            attrs = _GEMINI_BASE + [messages]
            if not failed:
                attrs += _GEMINI_DONE + _usage(in_text, 0, 0, out_tokens)
            gid = span("gateway", root, f"generate_content {_GEMINI_MODEL}", KIND_CLIENT, t, t + model_d, attrs)
            h0 = t + rng.uniform(0.0006, 0.0015)
            h1 = max(h0, t + model_d - rng.uniform(0.0002, 0.0008))
            status = _kv("http.response.status_code", 429 if failed else 200)
            hid = span("gateway", gid, "POST", KIND_CLIENT, h0, h1, _GEMINI_HTTP + [status])
            if failed:
                errors.append((h0 + (h1 - h0) * rng.uniform(0.3, 0.95), "gateway",
                               "RESOURCE_EXHAUSTED: 429 quota exceeded for the hosted model", hid))
        else:
            model_d = seg["llm"]
            llm_pod = self._instance("llm", t_ns, rng)
            fallback = (self._on("cuda_graph_fallback", t_ns) and llm_pod == self.plan.fallback_llm_pod) or (
                rng.random() < BASELINE_FALLBACK_RATE)
            cold_extra = 0.0
            if llm_pod == self.plan.cold_pod and self._on("cold_start", t_ns):
                age = (t_ns - self.plan.born_ns[llm_pod]) / NS
                cold_extra = 7.0 * math.exp(-age / 80.0) * rng.uniform(0.8, 1.2)
            gen_w, prefill_w = 0.74, 0.22
            # ~8 ms an output token with CUDA graphs; a fallback to per-kernel launches costs +60%.
            out_tokens = max(1, int(model_d * gen_w / 0.008))
            if fallback:
                gen_w *= 1.6
                model_d *= 1 + 0.6 * 0.74
            model_d += cold_extra
            failed = rng.random() < ERROR_RATES["llm"]
            attrs = _CHAT_BASE + [messages]
            if not failed:  # usage and the response model come with a response
                attrs += _CHAT_DONE + _usage(in_text, images, audio, out_tokens)
            ccid = span("gateway", root, f"chat {_MODEL}", KIND_CLIENT, t, t + model_d, attrs)
            w1, w2 = rng.uniform(0.0002, 0.0008), rng.uniform(0.0002, 0.0008)
            s0, s1 = t + w1, t + model_d - w2
            lsid = span("llm", ccid, _ROOT_NAME, KIND_SERVER, s0, s1,
                        _LLM_SERVER + [_kv("http.status_code", 500 if failed else 200)])
            # Cold start: the instance is still loading and warming up; requests queue.
            l0 = s0 + cold_extra
            pre_d = (s1 - l0) * prefill_w / (prefill_w + gen_w + 0.04)
            gen_d = (s1 - l0) * gen_w / (prefill_w + gen_w + 0.04)
            g = (s1 - l0 - pre_d - gen_d) / 3
            span("llm", lsid, "llm.prefill", KIND_INTERNAL, l0 + g, l0 + g + pre_d,
                 [_kv("batch.size", self._llm_batch(rng, load))])
            span("llm", lsid, "llm.generate", KIND_INTERNAL, l0 + 2 * g + pre_d, l0 + 2 * g + pre_d + gen_d,
                 [_kv("batch.size", self._llm_batch(rng, load)),
                  _kv("gpu.cuda_graph", "fallback" if fallback else "captured")])
            if failed:
                errors.append((t + model_d * rng.uniform(0.3, 0.95), "llm", "RESOURCE_EXHAUSTED: CUDA out of memory",
                               None))
        b_start = t + rng.uniform(0.0002, 0.001)
        b_d = min(_lognorm(rng, 0.012, 1.546), max(0.0005, model_d - 0.002))
        bcid, _, _, _ = call("gateway", "billing", _M_BILLING, root, b_start, b_d)
        billing_error = rng.random() < ERROR_RATES["billing"]
        t += model_d + gaps[8]
        # The usage event, published before the response goes out.
        prod_id = span("gateway", root, _PRODUCE_NAME, KIND_PRODUCER, t, t + produce_d, _PRODUCE)
        prod_span = spans[-1]
        t += produce_d + g1
        root_span[_END] = t

        # -- instances, errors, truncation ----------------------------------------------
        instances = {"gateway": self._instance("gateway", t_ns, rng)}
        if llm_pod is not None:
            instances["llm"] = llm_pod
        if itype != "audio" and images:
            instances["vision-encoder"] = vis_pod
        if billing_error:
            for s in spans:
                if s[_SID] == bcid:
                    s[_STATUS], s[_MSG] = STATUS_ERROR, "DEADLINE_EXCEEDED: billing did not answer in time"
        if truncate_at is not None:
            self._cut(spans, truncate_at, "gateway", "upstream request timeout (load balancer, 30 s)",
                      504, mark_all=True)
        elif errors:
            cut, service, message, failing = min(errors)
            self._cut(spans, cut, service, message, 503, mark_all=False, failing_sid=failing)
        if root_span[_STATUS] != STATUS_ERROR:
            root_span[_ATTRS].append(_OK_200)

        tid = self._emit(req, rng, t_ns, spans, instances)
        req.n_requests += 1
        if spans[-1] is prod_span and prod_span[_STATUS] != STATUS_ERROR:
            # Published: metering consumes it after its time in the queue, in a trace of its own.
            self._consume(rng, t_ns, req, tid, prod_id, prod_span[_END])

    def _consume(self, rng: random.Random, t_ns: int, req: _Request, producer_tid: bytes, producer_sid: int,
                 published: float) -> None:
        """Metering's trace of one usage event: a CONSUMER span linked to the producer and
        the insert into the usage database (times in seconds from ``t_ns``, as the producer's)."""
        c0 = published + _lognorm(rng, *QUEUE_DELAY_S)
        i0 = c0 + rng.uniform(0.0003, 0.001)
        i1 = i0 + _lognorm(rng, 0.0025, 0.5)
        c1 = i1 + rng.uniform(0.0002, 0.0008)
        cid = rng.getrandbits(64) or 1
        spans = [
            ["metering", cid, None, _CONSUME_NAME, KIND_CONSUMER, c0, c1,
             _CONSUME + [_PARTITIONS[int(rng.random() * len(_PARTITIONS))]], 0, ""],
            ["metering", rng.getrandbits(64) or 1, cid, _INSERT_NAME, KIND_CLIENT, i0, i1, _INSERT, 0, ""],
        ]
        self._emit(req, rng, t_ns, spans, {"metering": self._instance("metering", t_ns, rng)},
                   link=(producer_tid, producer_sid))

