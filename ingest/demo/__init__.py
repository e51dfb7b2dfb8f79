"""The demo traffic generator: a multimodal inference service, as real OTLP requests.

``modalscope demo`` fills a store with the last few hours of traffic of an imaginary
multimodal service (the source document's): a ``gateway`` that authenticates the caller
(``auth``), reads its session and quota from ``userdb`` and its profile through
``profile-cache`` (falling back to ``userdb`` on a miss), has the request preprocessed
(``preprocessor``: tokenizing, audio decoding, fetching the uploaded images from an object
store), encodes the images, audio and text (``vision-encoder`` with its own CPU-side image
decode/resize/normalize and ViT layers, ``audio-encoder``, ``text-encoder``, in parallel),
fuses them (``fusion``), generates the answer (the self-hosted ``llm``; a share of the
text-only requests goes to a hosted Gemini model instead), records usage (``billing``,
concurrently with the model call) and publishes a usage event that ``metering`` consumes
from a queue, in a trace of its own linked to the request's.

The spans look like what off-the-shelf instrumentation emits, not a modalscope dialect:

* model calls are OTel GenAI CLIENT spans (``chat mm-llm-7b``, ``generate_content
  gemini-2.0-flash``) with ``gen_ai.operation.name``, ``gen_ai.provider.name`` (and the
  older ``gen_ai.system``), request/response model, token usage in total and per modality
  (``gen_ai.usage.{text,image,audio}.input_tokens``, the names opentelemetry-util-genai
  sets for opentelemetry-instrumentation-google-genai) and the captured input messages
  (``gen_ai.input.messages``, media as ``uri`` parts with a ``modality``). The self-hosted
  LLM is instrumented too (its SERVER span sits under the client span); the Gemini call
  has only the SDK's HTTP request under it, so its callee is the provider;
* gRPC services carry ``rpc.system``/``rpc.service``/``rpc.method``; the gateway and the
  Gemini transport use the stable HTTP conventions (``http.request.method``, ``url.full``,
  ``server.address``/``server.port``, ``http.response.status_code``), the llm server and
  the preprocessor's object-store client the older ones (``http.method``, ``http.url``,
  ``net.peer.name``/``net.peer.port``, ``http.status_code``);
* uninstrumented dependencies appear only as client spans: ``userdb`` (``peer.service``),
  the object store (by URL) and metering's usage database (``server.address:server.port``);
* the usage event is a PRODUCER span in the gateway and a CONSUMER span in ``metering``,
  a queue delay later, in its own trace with a span link to the producer;
* the input type comes from the model calls' usage per modality and message parts;
  ``mm.image_count`` / ``mm.audio_count`` / ``mm.prompt_chars`` stay as optional extras on
  the preprocessor's spans (they say the same), and no span sets ``mm.input_type``.

Everything is emitted as serialized OTLP ``ExportTraceServiceRequest`` messages and goes
through :func:`~modalscope.ingest.otlp.decode_protobuf`, the stage rules and the writer:
the path the receivers use, with no side door into the tables.

How the numbers are made
------------------------
Per input type, a trace's end-to-end latency (its root span's duration) is drawn from a
lognormal fitted to the source document's P50 and P95 (``sigma = ln(P95/P50) / 1.645``;
see :data:`PROFILES`); the request's side calls (auth, userdb, cache) get their own
latency distributions, and what remains is split into the pipeline's stages by the
type's shares (:data:`CORE_SHARES`, with per-trace jitter), so the percentiles of the
whole stay those of the table. Stage time is self time, so the spans are laid out
sequentially inside the root (only the encoders run in parallel, and billing runs beside
the model call); :data:`STAGE_SHARES` is the share of self time per stage this produces.
The usage event's consumer traces are not requests: they have no input type (``unknown``)
and are not counted by :func:`expected_traces`.

Traffic follows a daily curve (peak 15:00 UTC), errors are ~1% of traces, and instances
(``service.instance.id`` = ``pod-N``) churn: rolling restarts and one scale-up.

Injected patterns
-----------------
Unless ``clean``, every kind of DESIGN.md's anomaly catalog is injected at a known time
and subject; :func:`injected_patterns` returns the plan as data. The windows are laid out
for the default 3 hours (a clean 30-minute baseline before the P99 band break; patterns
with one cause share a window: the cache penetration feeds the userdb hot spot, the
CPU-bound image decode makes the multi-image regression) and scaled to other lengths, to
whole minutes. Patterns that cost user-visible latency also lift the end-to-end
percentiles of their window (the hot spot those of every input type, the LB truncation
the multi-image P99): detectors may rightly report that too.

Determinism: everything is drawn from generators seeded with ``config.seed`` (one per
minute of traffic), never the global ``random`` or the wall clock; ``config.now_ns`` is
the only anchor in time. Same config, byte-identical requests.

Modules: :mod:`.profiles` (the reference figures), :mod:`.plan` (configuration and the
injection plan), :mod:`.protobuf` and :mod:`.conventions` (messages and span attributes),
:mod:`.trace_parts` and :mod:`.factory` (one trace), :mod:`.draws` (seeded draws),
:mod:`.history` (the history window and filling a store), :mod:`.live` (live traffic).
"""

from .history import FillResult, expected_traces, export_requests, fill, iter_requests
from .live import LiveTraffic
from .plan import DemoConfig, InjectedPattern, injected_patterns
from .profiles import (BASELINE_FALLBACK_RATE, BOTTLENECK_STAGE, BOTTLENECK_STAGES, CORE_SHARES, DEFAULT_HOURS,
                       DEFAULT_RATE, DEFAULT_SEED, GEMINI_SHARE, LIVE_RATE, PATTERN_KINDS, PROFILES, SERVICES,
                       STAGE_SHARES, InputProfile)

__all__ = [
    "BASELINE_FALLBACK_RATE",
    "BOTTLENECK_STAGE",
    "BOTTLENECK_STAGES",
    "CORE_SHARES",
    "DEFAULT_HOURS",
    "DEFAULT_RATE",
    "DEFAULT_SEED",
    "DemoConfig",
    "FillResult",
    "GEMINI_SHARE",
    "InjectedPattern",
    "InputProfile",
    "LIVE_RATE",
    "LiveTraffic",
    "PATTERN_KINDS",
    "PROFILES",
    "SERVICES",
    "STAGE_SHARES",
    "expected_traces",
    "export_requests",
    "fill",
    "injected_patterns",
    "iter_requests",
]
