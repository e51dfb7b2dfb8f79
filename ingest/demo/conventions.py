"""The span attributes the demo's services carry, as off-the-shelf instrumentation sets
them: GenAI model calls, HTTP (stable and pre-1.21 conventions), gRPC, messaging and
database clients, and the names of the routes, methods and hosts they refer to."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from .profiles import VIT_LAYERS
from .protobuf import _int_kv, _kv

_ROUTE = "/v1/chat/completions"
_ROOT_NAME = f"POST {_ROUTE}"
_API_HOST = "api.mm-inference.example"
# gRPC methods (span names "package.Service/Method", as OTel's gRPC instrumentation names them).
_M_AUTH = "auth.v1.Auth/Verify"
_M_PRE = "preprocess.v1.Preprocessor/Preprocess"
_M_VISION = "vision.v1.VisionEncoder/Encode"
_M_TEXT = "text.v1.TextEncoder/Encode"
_M_AUDIO = "audio.v1.AudioEncoder/Encode"
_M_FUSION = "fusion.v1.Fusion/Fuse"
_M_BILLING = "billing.v1.Billing/RecordUsage"
_RPC_PORT = {"auth": 50051, "preprocessor": 50052, "vision-encoder": 50053, "text-encoder": 50054,
             "audio-encoder": 50055, "fusion": 50056, "billing": 50058}

# The self-hosted model: an OpenAI-compatible server (service llm) called by the gateway's
# GenAI-instrumented client. "vllm" is a custom provider value, as the GenAI conventions
# allow when no well-known one applies.
_MODEL = "mm-llm-7b"
_LLM_PROVIDER = "vllm"
_LLM_HOST, _LLM_PORT = "llm", 8000
# The hosted model, as opentelemetry-instrumentation-google-genai names and describes it.
_GEMINI_MODEL = "gemini-2.0-flash"
_GEMINI_HOST = "generativelanguage.googleapis.com"
_GEMINI_URL = f"https://{_GEMINI_HOST}/v1beta/models/{_GEMINI_MODEL}:generateContent"
# Uninstrumented dependencies (client-side attributes only).
_OBJSTORE = "objstore.internal:9000"
_OBJSTORE_URL = f"http://{_OBJSTORE}/mm-uploads/"
_USAGEDB_HOST, _USAGEDB_PORT = "usagedb.internal", 5432
# The usage events' queue.
_TOPIC = "usage-events"
_KAFKA_HOST, _KAFKA_PORT = "kafka", 9092
_PRODUCE_NAME = f"send {_TOPIC}"
_CONSUME_NAME = f"process {_TOPIC}"
_INSERT_NAME = "INSERT usage_events"


def _rpc_attrs(method: str, service: str, client: bool) -> list[KeyValue]:
    pkg_service, _, name = method.partition("/")
    attrs = [_kv("rpc.system", "grpc"), _kv("rpc.service", pkg_service), _kv("rpc.method", name)]
    if client:
        attrs += [_kv("server.address", service), _kv("server.port", _RPC_PORT[service])]
    attrs.append(_kv("rpc.grpc.status_code", 0))
    return attrs


_RPC_CACHE: dict[tuple[str, str, bool], list[KeyValue]] = {}


def _rpc(method: str, service: str, client: bool) -> list[KeyValue]:
    key = (method, service, client)
    attrs = _RPC_CACHE.get(key)
    if attrs is None:
        attrs = _RPC_CACHE[key] = _rpc_attrs(method, service, client)
    return attrs


_ROOT_BASE = [_kv("http.request.method", "POST"), _kv("http.route", _ROUTE), _kv("url.scheme", "https"),
              _kv("url.path", _ROUTE), _kv("server.address", _API_HOST), _kv("server.port", 443)]
_OK_200 = _kv("http.response.status_code", 200)
# The model calls' attributes known when they start (GenAI conventions; gen_ai.system is
# the older name of gen_ai.provider.name: the google-genai instrumentation no longer sets
# it, others such as OpenLLMetry's still do, so the demo carries both).
_CHAT_BASE = [_kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", _LLM_PROVIDER),
              _kv("gen_ai.system", _LLM_PROVIDER), _kv("gen_ai.request.model", _MODEL),
              _kv("server.address", _LLM_HOST), _kv("server.port", _LLM_PORT)]
_CHAT_DONE = [_kv("gen_ai.response.model", _MODEL)]
_GEMINI_BASE = [_kv("gen_ai.operation.name", "generate_content"), _kv("gen_ai.provider.name", "gemini"),
                _kv("gen_ai.system", "gemini"), _kv("gen_ai.request.model", _GEMINI_MODEL),
                _kv("server.address", _GEMINI_HOST)]
_GEMINI_DONE = [_kv("gen_ai.response.model", f"{_GEMINI_MODEL}-001")]
# The google-genai SDK's own HTTP request (httpx instrumentation, stable HTTP conventions).
_GEMINI_HTTP = [_kv("http.request.method", "POST"), _kv("url.full", _GEMINI_URL),
                _kv("server.address", _GEMINI_HOST), _kv("server.port", 443)]
# The llm's server span (an older FastAPI instrumentation: the pre-1.21 HTTP conventions).
_LLM_SERVER = [_kv("http.method", "POST"), _kv("http.target", _ROUTE), _kv("http.route", _ROUTE),
               _kv("http.scheme", "http"), _kv("net.host.name", _LLM_HOST), _kv("net.host.port", _LLM_PORT),
               _kv("http.flavor", "1.1")]
# The preprocessor's object-store client (an older requests instrumentation).
_OBJ_GET = [_kv("http.method", "GET"), _kv("net.peer.name", _OBJSTORE.partition(":")[0]),
            _kv("net.peer.port", int(_OBJSTORE.partition(":")[2])), _kv("http.status_code", 200)]
# Messaging conventions: the gateway's producer and metering's consumer of the usage events.
_PRODUCE = [_kv("messaging.system", "kafka"), _kv("messaging.destination.name", _TOPIC),
            _kv("messaging.operation.type", "send"), _kv("messaging.operation.name", "send"),
            _kv("server.address", _KAFKA_HOST), _kv("server.port", _KAFKA_PORT)]
_CONSUME = [_kv("messaging.system", "kafka"), _kv("messaging.destination.name", _TOPIC),
            _kv("messaging.operation.type", "process"), _kv("messaging.operation.name", "process"),
            _kv("messaging.consumer.group.name", "metering")]
_PARTITIONS = [_kv("messaging.destination.partition.id", str(i)) for i in range(6)]
# Metering's usage database: no peer.service, so the pair names it by address and port.
_INSERT = [_kv("db.system", "postgresql"), _kv("db.operation.name", "INSERT"),
           _kv("db.collection.name", "usage_events"), _kv("server.address", _USAGEDB_HOST),
           _kv("server.port", _USAGEDB_PORT)]
# Prompt text for the captured messages (cut to each request's prompt length).
_PROMPT = ("Describe what you see and answer the question about it in a few sentences. " * 40)


def _input_messages(prompt_chars: int, uris: list[str], audio_uri: str | None) -> str:
    """``gen_ai.input.messages`` as opentelemetry-util-genai serializes it: one user message,
    the uploaded media as ``uri`` parts with their ``modality``, then the prompt text."""
    parts = [f'{{"mime_type":"image/jpeg","modality":"image","uri":"{u}","type":"uri"}}' for u in uris]
    if audio_uri is not None:
        parts.append(f'{{"mime_type":"audio/wav","modality":"audio","uri":"{audio_uri}","type":"uri"}}')
    parts.append(f'{{"content":"{_PROMPT[:prompt_chars]}","type":"text"}}')
    return '[{"role":"user","parts":[' + ",".join(parts) + "]}]"


def _usage(in_text: int, images: int, audio: int, out_tokens: int) -> list[KeyValue]:
    """Token usage in total and per input modality. The per-modality keys are the ones
    opentelemetry-util-genai sets from the provider's usage details (google-genai's
    ``prompt_tokens_details``), left out where a modality has no tokens."""
    in_image = images * 258  # Gemini-style: a fixed token count an image
    in_audio = audio * 320  # ~10 s of speech at 32 tokens a second
    attrs = [_int_kv("gen_ai.usage.input_tokens", in_text + in_image + in_audio),
             _int_kv("gen_ai.usage.output_tokens", out_tokens), _int_kv("gen_ai.usage.text.input_tokens", in_text)]
    if in_image:
        attrs.append(_int_kv("gen_ai.usage.image.input_tokens", in_image))
    if in_audio:
        attrs.append(_int_kv("gen_ai.usage.audio.input_tokens", in_audio))
    return attrs


def _cache_attrs(tier: str, hit: bool) -> list[KeyValue]:
    return [_kv("db.system", "redis"), _kv("db.operation.name", "GET"), _kv("cache.name", "profile"),
            _kv("cache.hit", hit), _kv("user_tier", tier), _kv("peer.service", "profile-cache"),
            _kv("server.address", "profile-cache")]


def _db(op: str, table: str) -> list[KeyValue]:
    return [_kv("db.system", "postgresql"), _kv("db.operation.name", op), _kv("db.collection.name", table),
            _kv("peer.service", "userdb"), _kv("server.address", "userdb"), _kv("server.port", 5432)]


_DB_SESSION = _db("SELECT", "sessions")
_DB_PROFILE = _db("SELECT", "user_profile")
_DB_QUOTA = _db("SELECT", "quota")
_A_AUDIO = [_kv("mm.audio_count", 1)]
_FUSION_PARTS = (("fusion.align", 0.25, []), ("fusion.cross_attn", 0.45, []), ("fusion.memcpy", 0.22, []))
_VISION_WEIGHTS = {"decode": 0.22, "resize": 0.07, "normalize": 0.06, "vit": 0.30}
_IMAGE_ATTRS = [[_kv("mm.image.index", i), _kv("image.format", "jpeg")] for i in range(8)]
_LAYER_ATTRS = {layer: [_kv("mm.layer", layer), _kv("mm.modality", "vision")] for layer, _ in VIT_LAYERS}
