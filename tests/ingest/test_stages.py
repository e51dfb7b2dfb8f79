"""Stage rules: tokens, the built-in defaults, rule order, model calls and the transport spans
under them, custom and older-layout files and their errors."""

from __future__ import annotations

import textwrap

import pytest

from modalscope.core.spans import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_PRODUCER,
    KIND_SERVER,
    STAGES,
    SpanRecord,
)
from modalscope.ingest.stages import StageRules, apply_parent_stages, tokens
from modalscope.ingest.rules_file import RulesError, load_rules, parse_rules


def span(name: str, kind: int = KIND_INTERNAL, service: str = "gateway", *, span_id: str = "cd" * 8,
         parent: str | None = None, **attributes) -> SpanRecord:
    return SpanRecord(
        trace_id="ab" * 16,
        span_id=span_id,
        parent_span_id=parent,
        service=service,
        name=name,
        kind=kind,
        start_ns=0,
        end_ns=1_000,
        attributes=attributes,
    )


@pytest.fixture(scope="module")
def rules() -> StageRules:
    return load_rules(None)


# -- tokens ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("VisionEncoder/Encode", ("vision", "encoder", "encode")),
        ("image.decode", ("image", "decode")),
        ("decoder-llm", ("decoder", "llm")),
        ("HTTPServer", ("http", "server")),
        ("getHTTPResponse", ("get", "http", "response")),
        ("ViTLayer", ("vit", "layer")),
        ("ViT.forward", ("vit", "forward")),
        ("vit.forward", ("vit", "forward")),
        ("vit_block", ("vit", "block")),
        ("CLIPViT", ("clip", "vit")),
        ("Conv2D", ("conv2d",)),
        ("llm.decode_step", ("llm", "decode", "step")),
        ("POST /v1/chat", ("post", "v1", "chat")),
        ("", ()),
        ("--", ()),
    ],
)
def test_tokens(name, expected):
    assert tokens(name) == expected


# -- the built-in name rules ------------------------------------------------------------


@pytest.mark.parametrize(
    "name, stage",
    [
        ("VisionEncoder/Encode", "encoder"),
        ("image.decode", "preprocessing"),
        ("image.resize", "preprocessing"),
        ("Normalize", "preprocessing"),
        ("text.tokenize", "preprocessing"),
        ("Tokenizer.encode", "preprocessing"),  # tokenizer (9 chars) beats encode (6)
        ("vit.forward", "encoder"),
        ("ViT.forward", "encoder"),
        ("vit_block", "encoder"),
        ("ViTLayer", "encoder"),
        ("TextEncoder.forward", "encoder"),
        ("audio_encoder", "encoder"),
        ("patch.embed", "encoder"),
        ("text.encode", "encoder"),
        ("vision_encoder.image_decode", "encoder"),  # two-token pattern beats decode
        ("fusion.forward", "fusion"),
        ("CrossAttn", "fusion"),
        ("modality.align", "fusion"),
        ("llm.generate", "inference"),
        ("llm.decode_step", "inference"),  # decode_step beats decode
        ("decode_step", "inference"),
        ("decoder-llm", "inference"),  # llm, never decode: whole tokens
    ],
)
def test_name_rules(rules, name, stage):
    assert rules.stage_of(span(name)) == stage


def test_whole_tokens_only(rules):
    assert rules.stage_of(span("decoder-llm")) != "preprocessing"
    assert rules.stage_of(span("decoder")) == "other"  # "decode" is not in "decoder"
    assert rules.stage_of(span("encoder")) == "other"  # "encode" is not in "encoder"
    assert rules.stage_of(span("vitals")) == "other"
    assert rules.stage_of(span("embedded_sql")) == "other"


# -- the order of the rules -------------------------------------------------------------

GEMINI = {
    "gen_ai.operation.name": "generate_content",
    "gen_ai.provider.name": "gcp.gemini",
    "gen_ai.request.model": "gemini-2.0-flash",
}


def test_client_and_producer_spans_are_network_when_nothing_before_says_otherwise(rules):
    assert rules.stage_of(span("auth.v1.Auth/Verify", KIND_CLIENT)) == "network"
    assert rules.stage_of(span("SELECT sessions", KIND_CLIENT, **{"db.system": "postgresql"})) == "network"
    assert rules.stage_of(span("publish", KIND_PRODUCER)) == "network"
    # SERVER, CONSUMER and INTERNAL spans that match nothing are other
    assert rules.stage_of(span("auth.v1.Auth/Verify", KIND_SERVER)) == "other"
    assert rules.stage_of(span("publish", KIND_CONSUMER)) == "other"
    # name, attribute and service patterns come before the kind rule
    assert rules.stage_of(span("image.decode", KIND_CLIENT)) == "preprocessing"
    assert rules.stage_of(span("llm.v1.LLM/Generate", KIND_CLIENT)) == "inference"
    assert rules.stage_of(span("forward", KIND_PRODUCER, **{"mm.layer": "mlp"})) == "encoder"
    assert rules.stage_of(span("call", KIND_CLIENT, service="vision-encoder")) == "encoder"


def test_genai_client_span_is_a_model_call_not_network(rules):
    s = span("generate_content gemini-2.0-flash", KIND_CLIENT, service="agent", **GEMINI)
    rules.tag([s])
    assert s.stage == "inference"
    assert s.signals["call"] == 1
    assert rules.stage_of(span("chat gpt-4o", KIND_CLIENT, **{"gen_ai.operation.name": "chat"})) == "inference"
    # model calls come before name patterns too: "decode" in the name does not matter
    assert rules.stage_of(span("image.decode", KIND_CLIENT, **{"gen_ai.operation.name": "chat"})) == "inference"


@pytest.mark.parametrize("value", ["embeddings", "Embeddings", " EMBEDDINGS "])
def test_genai_embeddings_call_is_encoder(rules, value):
    s = span("embeddings text-embedding-004", KIND_CLIENT, **{**GEMINI, "gen_ai.operation.name": value})
    rules.tag([s])
    assert (s.stage, s.signals["call"]) == ("encoder", 1)


@pytest.mark.parametrize(
    "kind_value, kind, stage",
    [
        ("LLM", KIND_INTERNAL, "inference"),
        ("llm", KIND_CLIENT, "inference"),
        ("EMBEDDING", KIND_CLIENT, "encoder"),
        ("Embedding", KIND_INTERNAL, "encoder"),
        ("RERANKER", KIND_INTERNAL, "inference"),
    ],
)
def test_openinference_model_calls(rules, kind_value, kind, stage):
    s = span("ChatModel", kind, service="rag", **{"openinference.span.kind": kind_value})
    rules.tag([s])
    assert (s.stage, s.signals["call"]) == (stage, 1)


def test_openinference_non_model_kinds_fall_through(rules):
    s = span("RetrievalQA", KIND_INTERNAL, service="rag", **{"openinference.span.kind": "CHAIN"})
    rules.tag([s])
    assert s.stage == "other"
    assert not (s.signals or {}).get("call")
    tool = span("search_tool", KIND_CLIENT, **{"openinference.span.kind": "TOOL"})
    assert rules.stage_of(tool) == "network"


def test_spans_decided_by_other_rules_get_no_call_marker(rules):
    spans = [span("llm.generate"), span("image.decode", KIND_CLIENT), span("x", **{"mm.stage": "inference"})]
    rules.tag(spans)
    assert [s.stage for s in spans] == ["inference", "preprocessing", "inference"]
    assert not any((s.signals or {}).get("call") for s in spans)


def test_explicit_stage_beats_everything(rules):
    s = span("image.decode", KIND_CLIENT, **{"mm.stage": "fusion"})
    assert rules.stage_of(s) == "fusion"
    assert rules.stage_of(span("whatever", **{"mm.stage": "inference"})) == "inference"
    assert rules.stage_of(span("whatever", **{"mm.stage": " Encoder "})) == "encoder"
    assert rules.stage_of(span("chat", KIND_CLIENT, **{**GEMINI, "mm.stage": "network"})) == "network"


@pytest.mark.parametrize("bad", ["gpu", "", 3, ["encoder"], None, True])
def test_bad_explicit_stage_is_ignored(rules, bad):
    assert rules.stage_of(span("image.decode", **{"mm.stage": bad})) == "preprocessing"
    assert rules.stage_of(span("image.decode", KIND_CLIENT, **{"mm.stage": bad})) == "preprocessing"
    assert rules.stage_of(span("handler", KIND_CLIENT, **{"mm.stage": bad})) == "network"
    assert rules.stage_of(span("handler", **{"mm.stage": bad})) == "other"


def test_attribute_rules(rules):
    assert rules.stage_of(span("chat", **{"gen_ai.system": "vllm"})) == "inference"  # older GenAI
    assert rules.stage_of(span("POST", KIND_CLIENT, **{"gen_ai.request.model": "m"})) == "inference"
    assert rules.stage_of(span("block", **{"mm.layer": "mlp"})) == "encoder"
    assert rules.stage_of(span("forward", **{"mm.modality": "vision"})) == "encoder"
    # a name rule comes before attribute patterns (but not before the model-call conventions)
    assert rules.stage_of(span("image.decode", **{"gen_ai.system": "x"})) == "preprocessing"
    assert rules.stage_of(span("fusion.align", **{"mm.layer": "mlp"})) == "fusion"


def test_service_rules(rules):
    assert rules.stage_of(span("forward", service="vision-encoder")) == "encoder"
    assert rules.stage_of(span("handle", service="preprocessor")) == "preprocessing"
    assert rules.stage_of(span("run", service="fusion-svc")) == "fusion"
    assert rules.stage_of(span("run", service="llm-server")) == "inference"
    # attribute rules come before service rules, name rules before both
    assert rules.stage_of(span("run", service="llm", **{"mm.layer": "mlp"})) == "encoder"
    assert rules.stage_of(span("image.decode", service="llm")) == "preprocessing"


def test_else_other(rules):
    assert rules.stage_of(span("GET /health", KIND_SERVER, service="gateway")) == "other"
    assert rules.stage_of(span("", service="")) == "other"


def test_tag_sets_stage_and_cache_is_consistent(rules):
    spans = [
        span("image.decode"),
        span("image.decode", KIND_CLIENT),
        span("x", **{"gen_ai.system": "a"}),
        span("x"),
        span("x", **{"gen_ai.operation.name": "embeddings"}),
        span("x", **{"gen_ai.operation.name": "chat"}),
        span("x", KIND_CLIENT),
        span("x", KIND_CLIENT, **{"gen_ai.operation.name": "chat"}),
        span("x", KIND_CLIENT, **{"rpc.system": "grpc"}),
        span("x", KIND_CLIENT, **{"rpc.system": "grpc", "mm.modality": "text"}),
    ] * 3
    expected = [
        "preprocessing", "preprocessing", "inference", "other", "encoder", "inference",
        "network", "inference", "network", "encoder",
    ]
    for _ in range(2):  # the second pass runs from the caches
        rules.tag(spans)
        assert [s.stage for s in spans] == expected * 3
    rules.clear_cache()
    assert [rules.stage_of(s) for s in spans[:10]] == expected
    assert all(s.stage in STAGES for s in spans)


# -- transport spans under a model call -------------------------------------------------


def genai_call(service: str = "agent", **extra) -> SpanRecord:
    return span("generate_content gemini-2.0-flash", KIND_CLIENT, service, span_id="1" * 16, **{**GEMINI, **extra})


def http_post(service: str = "agent", parent: str | None = "1" * 16, span_id: str = "2" * 16) -> SpanRecord:
    return span("POST", KIND_CLIENT, service, span_id=span_id, parent=parent,
                **{"http.request.method": "POST", "url.full": "https://generativelanguage.googleapis.com/v1"})


def test_transport_span_under_a_model_call_of_its_service_takes_its_stage(rules):
    call, post = genai_call(), http_post()
    rules.tag([post, call])  # order does not matter
    assert (call.stage, post.stage) == ("inference", "inference")
    assert post.signals["inh"] == "network"  # the stage it has on its own, for the settler
    assert not post.signals.get("call")


def test_transport_span_under_an_embeddings_call_is_encoder(rules):
    call, post = genai_call(**{"gen_ai.operation.name": "embeddings"}), http_post()
    rules.tag([call, post])
    assert post.stage == "encoder"


@pytest.mark.parametrize(
    "attributes",
    [{"http.method": "POST"}, {"http.url": "http://x/y"}, {"url.full": "https://x"}, {"rpc.system": "grpc"}],
)
def test_transport_keys(rules, attributes):
    call = span("ChatModel", KIND_INTERNAL, "rag", span_id="1" * 16, **{"openinference.span.kind": "LLM"})
    child = span("call", KIND_CLIENT, "rag", span_id="2" * 16, parent="1" * 16, **attributes)
    rules.tag([call, child])
    assert child.stage == "inference"


def test_transport_span_in_another_service_stays_network(rules):
    call, post = genai_call("agent"), http_post("sidecar")
    rules.tag([call, post])
    assert post.stage == "network" and post.signals["inh"] == "network"


def test_transport_span_with_an_instrumented_callee_stays_network(rules):
    call, post = genai_call(), http_post()
    server = span("POST /v1", KIND_SERVER, "model-server", span_id="3" * 16, parent="2" * 16)
    rules.tag([call, post, server])
    assert post.stage == "network"
    consumer = span("consume", KIND_CONSUMER, "worker", span_id="4" * 16, parent="2" * 16)
    call, post = genai_call(), http_post()
    rules.tag([call, post, consumer])
    assert post.stage == "network"


def test_transport_span_without_its_parent_in_the_batch_keeps_its_own_stage(rules):
    post = http_post()
    rules.tag([post])
    assert post.stage == "network" and post.signals["inh"] == "network"
    other_parent = span("handler", KIND_SERVER, "agent", span_id="1" * 16)  # not a model call
    post = http_post()
    rules.tag([other_parent, post])
    assert post.stage == "network"


def test_non_transport_client_spans_do_not_inherit(rules):
    call = genai_call()
    db = span("SELECT x", KIND_CLIENT, "agent", span_id="2" * 16, parent="1" * 16, **{"db.system": "redis"})
    rules.tag([call, db])
    assert db.stage == "network" and "inh" not in (db.signals or {})


def test_apply_parent_stages_follows_the_set_it_is_given(rules):
    call, post = genai_call(), http_post()
    rules.tag([post])
    assert post.stage == "network"
    assert apply_parent_stages([call, post]) == 0  # call not tagged yet: no "call" marker
    rules.tag([call])
    assert apply_parent_stages([call, post]) == 1 and post.stage == "inference"
    assert apply_parent_stages([call, post]) == 0  # idempotent
    # a callee arriving later puts the span back on its own stage
    server = span("POST /v1", KIND_SERVER, "model-server", span_id="3" * 16, parent="2" * 16)
    assert apply_parent_stages([call, post, server]) == 1 and post.stage == "network"


def test_parent_rule_spans_of_other_traces_do_not_mix(rules):
    call = genai_call()
    post = http_post()
    post.trace_id = "ef" * 16
    rules.tag([call, post])
    assert post.stage == "network"


# -- custom rules files -----------------------------------------------------------------


def write(tmp_path, text: str, name: str = "rules.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def default_text() -> str:
    from importlib import resources

    return resources.files("modalscope.ingest").joinpath("default_rules.toml").read_text("utf-8")


def test_a_file_that_puts_the_kind_rule_first_gets_the_old_behaviour(tmp_path):
    # the defaults with their kind rule moved right after mm.stage
    text = default_text()
    kind_rule = '[[rule]]\nstage = "network"\nkinds = ["CLIENT", "PRODUCER"]\n'
    assert text.count(kind_rule) == 1
    text = text.replace(kind_rule, "")
    first_model_rule = text.index("# OTel GenAI semantic conventions")
    text = text[:first_model_rule] + kind_rule + "\n" + text[first_model_rule:]
    rules = load_rules(write(tmp_path, text))
    genai = span("generate_content gemini-2.0-flash", KIND_CLIENT, service="agent", **GEMINI)
    rules.tag([genai])
    assert genai.stage == "network"
    assert rules.stage_of(span("image.decode", KIND_CLIENT)) == "network"
    assert rules.stage_of(span("image.decode", KIND_SERVER)) == "preprocessing"
    assert rules.stage_of(span("x", KIND_CLIENT, **{"mm.stage": "fusion"})) == "fusion"
    assert rules.stage_of(span("x", **{"gen_ai.operation.name": "chat"})) == "inference"


def test_rule_matchers_are_anded_and_first_match_wins(tmp_path):
    rules = load_rules(write(
        tmp_path,
        """
        [[rule]]
        stage = "fusion"
        names = ["merge"]
        kinds = ["client", "PRODUCER"]

        [[rule]]
        stage = "encoder"
        services = ["clip_service"]
        keys = ["model.kind"]
        values = ["vit", 7, true]

        [[rule]]
        stage = "preprocessing"
        keys = ["img.*"]

        [[rule]]
        stage = "inference"
        model_call = true
        keys = ["model.kind"]

        [[rule]]
        stage = "network"
        kinds = ["INTERNAL"]
        """,
    ))
    assert rules.stage_of(span("Merge.run", KIND_CLIENT)) == "fusion"
    assert rules.stage_of(span("Merge.run", KIND_SERVER)) == "other"  # no rule matched
    assert rules.stage_of(span("Merge.run")) == "network"  # INTERNAL
    assert rules.stage_of(span("x", KIND_SERVER, "ClipService", **{"model.kind": "ViT"})) == "encoder"
    assert rules.stage_of(span("x", KIND_SERVER, "ClipService", **{"model.kind": 7})) == "encoder"
    assert rules.stage_of(span("x", KIND_SERVER, "ClipService", **{"model.kind": True})) == "encoder"
    assert rules.stage_of(span("x", KIND_SERVER, "clip", **{"model.kind": "vit"})) == "inference"
    assert rules.stage_of(span("x", KIND_SERVER, **{"img.width": 3})) == "preprocessing"
    assert rules.stage_of(span("x", KIND_SERVER, **{"image.width": 3})) == "other"
    s = span("x", KIND_SERVER, "clip", **{"model.kind": "vae"})
    rules.tag([s])
    assert (s.stage, s.signals) == ("inference", {"call": 1})
    # the unspecified kind counts as INTERNAL
    assert rules.stage_of(span("y", 0)) == "network"


def test_a_rule_without_matchers_matches_everything(tmp_path):
    rules = parse_rules('[[rule]]\nstage = "fusion"\n\n[[rule]]\nstage_from = "value"\nkeys = ["mm.stage"]\n')
    assert rules.stage_of(span("x", **{"mm.stage": "encoder"})) == "fusion"
    assert rules.stage_of(span("image.decode", KIND_CLIENT, **GEMINI)) == "fusion"


def test_stage_from_value_reads_the_first_key_naming_a_stage():
    rules = parse_rules(
        '[[rule]]\nstage_from = "value"\nkeys = ["team.stage", "mm.stage"]\nmodel_call = true\n'
        '[[rule]]\nstage = "network"\n'
    )
    assert rules.stage_of(span("x", **{"team.stage": "FUSION", "mm.stage": "encoder"})) == "fusion"
    assert rules.stage_of(span("x", **{"team.stage": "gpu", "mm.stage": "encoder"})) == "encoder"
    assert rules.stage_of(span("x", **{"team.stage": "gpu"})) == "network"
    s = span("x", **{"mm.stage": "inference"})
    rules.tag([s])
    assert s.signals == {"call": 1}


def test_a_parent_call_rule_falls_back_to_the_rules_after_it():
    rules = parse_rules(
        """
        [[rule]]
        stage = "inference"
        names = ["predict"]
        model_call = true
        [[rule]]
        stage_from = "parent_call"
        names = ["fetch"]
        [[rule]]
        stage = "preprocessing"
        kinds = ["CLIENT"]
        """
    )
    call = span("predict", span_id="1" * 16)
    alone = span("fetch", KIND_INTERNAL, span_id="2" * 16)
    under = span("fetch", KIND_CLIENT, span_id="3" * 16, parent="1" * 16)
    rules.tag([call, alone, under])
    assert (alone.stage, alone.signals) == ("other", {"inh": "other"})  # nothing after it matched
    assert (under.stage, under.signals["inh"]) == ("inference", "preprocessing")


def test_longest_pattern_wins_across_rules(tmp_path):
    rules = parse_rules(
        """
        [[rule]]
        stage = "preprocessing"
        names = ["a"]
        [[rule]]
        stage = "encoder"
        names = ["a_b"]
        [[rule]]
        stage = "fusion"
        names = ["ccc"]
        [[rule]]
        stage = "inference"
        names = ["dd"]
        """
    )
    assert rules.stage_of(span("x.a.b")) == "encoder"
    assert rules.stage_of(span("a.x.b")) == "preprocessing"
    assert rules.stage_of(span("dd.ccc")) == "fusion"  # same token count: more characters


def test_longest_pattern_wins_only_within_a_run_of_name_rules():
    rules = parse_rules(
        """
        [[rule]]
        stage = "preprocessing"
        names = ["decode"]
        [[rule]]
        stage = "encoder"
        keys = ["mm.layer"]
        [[rule]]
        stage = "inference"
        names = ["decode_step"]
        [[rule]]
        stage = "fusion"
        services = ["fusion"]
        [[rule]]
        stage = "encoder"
        services = ["fusion_encoder"]
        """
    )
    # another rule between them: file order decides, so the shorter pattern wins here
    assert rules.stage_of(span("llm.decode_step")) == "preprocessing"
    assert rules.stage_of(span("decode_step_x", **{"mm.layer": "mlp"})) == "preprocessing"
    # consecutive service rules are one run: the longer pattern wins
    assert rules.stage_of(span("run", service="fusion-encoder")) == "encoder"
    assert rules.stage_of(span("run", service="fusion")) == "fusion"


def test_default_rules_longest_pattern_precedence(rules):
    assert rules.stage_of(span("llm.decode_step", KIND_CLIENT)) == "inference"
    assert rules.stage_of(span("Tokenizer.encode")) == "preprocessing"
    assert rules.stage_of(span("vision_encoder.image_decode")) == "encoder"
    assert rules.stage_of(span("run", service="vision-preprocessor")) == "preprocessing"  # same length: file order


# -- files in the older layout ------------------------------------------------------------


def test_older_layout_files_still_load(tmp_path):
    path = write(
        tmp_path,
        """
        [[name]]
        stage = "fusion"
        patterns = ["merge"]

        [[attribute]]
        stage = "preprocessing"
        keys = ["img.*"]

        [[attribute]]
        stage = "inference"
        keys = ["model.kind"]
        values = ["llm", 7]

        [[service]]
        stage = "encoder"
        patterns = ["clip_service"]
        """,
    )
    rules = load_rules(path)
    assert rules.stage_of(span("Merge.run")) == "fusion"
    assert rules.stage_of(span("image.decode")) == "other"  # the file replaces the defaults
    assert rules.stage_of(span("x", **{"img.width": 10})) == "preprocessing"
    assert rules.stage_of(span("x", **{"model.kind": "LLM"})) == "inference"
    assert rules.stage_of(span("x", **{"model.kind": 7})) == "inference"
    assert rules.stage_of(span("x", **{"model.kind": "vae"})) == "other"
    assert rules.stage_of(span("x", service="ClipService")) == "encoder"
    assert rules.stage_of(span("x", service="clip")) == "other"
    # built-in entries around the sections: the kind rule after them, conventions before
    assert rules.stage_of(span("merge", KIND_CLIENT)) == "fusion"
    assert rules.stage_of(span("split", KIND_CLIENT)) == "network"
    assert rules.stage_of(span("x", KIND_CLIENT, **{"mm.stage": "encoder"})) == "encoder"
    call, post = genai_call(), http_post()
    rules.tag([call, post])
    assert (call.stage, post.stage, call.signals["call"]) == ("inference", "inference", 1)


def test_empty_rules_file_is_the_older_layout_with_no_sections(tmp_path):
    rules = load_rules(write(tmp_path, "# nothing\n"))
    assert rules.stage_of(span("image.decode")) == "other"
    assert rules.stage_of(span("image.decode", KIND_CLIENT)) == "network"
    assert rules.stage_of(span("image.decode", **{"mm.stage": "encoder"})) == "encoder"
    assert rules.stage_of(span("chat", KIND_CLIENT, **GEMINI)) == "inference"
    assert rules.stage_of(span("x", **{"openinference.span.kind": "EMBEDDING"})) == "encoder"


def test_older_layout_built_in_entries_are_those_of_the_default_file(rules):
    frame = parse_rules("").rules
    assert frame == rules.rules[:5] + rules.rules[-3:]


def test_a_legacy_file_with_the_old_default_sections_tags_like_the_defaults(rules):
    # the older default file's sections, GenAI/OpenInference attribute rules included
    legacy = parse_rules(
        """
        [[name]]
        stage = "preprocessing"
        patterns = ["decode", "resize", "normalize", "tokenize", "tokenizer", "preprocess", "image_processor"]
        [[name]]
        stage = "encoder"
        patterns = ["vit", "vision_encoder", "text_encoder", "audio_encoder", "encode", "embed", "image_encoder"]
        [[name]]
        stage = "fusion"
        patterns = ["fusion", "cross_attn", "align", "cross_attention"]
        [[name]]
        stage = "inference"
        patterns = ["generate", "llm", "decode_step", "prefill"]
        [[attribute]]
        stage = "encoder"
        keys = ["mm.layer"]
        [[attribute]]
        stage = "inference"
        keys = ["gen_ai.*"]
        [[attribute]]
        stage = "encoder"
        keys = ["mm.modality"]
        [[service]]
        stage = "preprocessing"
        patterns = ["preprocess", "preprocessor", "preprocessing", "tokenizer"]
        [[service]]
        stage = "encoder"
        patterns = ["vision", "encoder", "vit", "embedding", "embeddings", "embedder"]
        [[service]]
        stage = "fusion"
        patterns = ["fusion"]
        [[service]]
        stage = "inference"
        patterns = ["llm", "vllm", "inference", "generator", "generation"]
        """
    )
    sample = [
        span("image.decode", KIND_CLIENT), span("llm.decode_step"), span("x", **{"mm.layer": "mlp"}),
        span("chat", KIND_CLIENT, **GEMINI), span("x", KIND_CLIENT, **{"gen_ai.system": "openai"}),
        span("x", KIND_CLIENT, service="vision-encoder"), span("auth", KIND_CLIENT), span("auth", KIND_SERVER),
        span("ChatModel", **{"openinference.span.kind": "RERANKER"}), span("x", **{"mm.stage": "fusion"}),
    ]
    assert [legacy.stage_of(s) for s in sample] == [rules.stage_of(s) for s in sample]


# -- errors -------------------------------------------------------------------------------


def test_invalid_toml_names_file_and_line(tmp_path):
    path = write(tmp_path, '[[rule]]\nstage = "encoder"\nnames = ["vit",\n  oops]\n')
    with pytest.raises(RulesError) as info:
        load_rules(path)
    message = str(info.value)
    assert message.startswith(f"{path}:4: invalid TOML")
    assert "\n" not in message
    assert info.value.line == 4


def test_invalid_toml_at_end_of_document(tmp_path):
    path = write(tmp_path, '[[name]]\nstage = "encoder\n')
    with pytest.raises(RulesError, match=r"rules\.toml:\d+: invalid TOML"):
        load_rules(path)


def test_unknown_stage_names_file_and_line(tmp_path):
    path = write(
        tmp_path,
        """\
        [[rule]]
        stage = "encoder"
        names = ["vit"]

        [[rule]]
        stage = "gpu"
        names = ["cuda"]
        """,
    )
    with pytest.raises(RulesError) as info:
        load_rules(path)
    assert str(info.value).startswith(f"{path}:6: ")
    assert "[[rule]] #2: unknown stage 'gpu'" in str(info.value)


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        # the [[rule]] layout
        ('[[rule]]\nstage = "encoder"\nnames = ["vit", 3]\n', 3, "is not a string"),
        ('[[rule]]\nstage = "encoder"\nnames = "vit"\n', 3, "list of strings"),
        ('[[rule]]\nstage = "encoder"\nnames = []\n', 3, "'names' is empty"),
        ('[[rule]]\nnames = ["vit"]\n', 1, "missing 'stage' (or 'stage_from')"),
        ('[[rule]]\nstage = "encoder"\nname = ["x"]\n', 3, "unknown key 'name'"),
        ('[[rule]]\nstage = "encoder"\n\n[[rule]]\nstage = "fusion"\npattern = ["x"]\n', 6, "#2: unknown key"),
        ('[[rule]]\nstage = "encoder"\nkinds = ["CLIENT", "RPC_CLIENT"]\n', 3, "unknown span kind 'RPC_CLIENT'"),
        ('[[rule]]\nstage = "encoder"\nkinds = "CLIENT"\n', 3, "list of strings"),
        ('[[rule]]\nstage = "encoder"\nstage_from = "value"\nkeys = ["a"]\n', 3, "not both"),
        ('[[rule]]\nstage_from = "attribute"\nkeys = ["a"]\n', 2, "unknown stage_from 'attribute'"),
        ('[[rule]]\nstage_from = "value"\n', 2, "needs exact 'keys'"),
        ('[[rule]]\nstage_from = "value"\nkeys = ["a.*"]\n', 2, "needs exact 'keys'"),
        ('[[rule]]\nstage_from = "value"\nkeys = ["a"]\nvalues = ["b"]\n', 4, "cannot be used with"),
        ('[[rule]]\nstage_from = "parent_call"\nmodel_call = true\n', 3, "cannot be a model call"),
        ('[[rule]]\nstage = "encoder"\nvalues = ["x"]\n', 3, "'values' needs 'keys'"),
        ('[[rule]]\nstage = "encoder"\nmodel_call = "yes"\n', 3, "true or false"),
        ('[[rule]]\nstage = "encoder"\nkeys = ["a*b"]\n', 3, "prefix ending in '*'"),
        ('[[rule]]\nstage = "fusion"\nservices = ["--"]\n', 3, "no letters or digits"),
        ('[[rule]]\nstage = "fusion"\n\n[[name]]\nstage = "fusion"\npatterns = ["x"]\n', 4, "cannot be mixed"),
        ('[rule]\nstage = "encoder"\n', 1, "array of tables"),
        ('[[rules]]\nstage = "encoder"\n', 1, "unknown section 'rules'"),
        # the older layout
        ('[[name]]\nstage = "encoder"\npatterns = ["vit", 3]\n', 3, "is not a string"),
        ('[[name]]\nstage = "encoder"\npatterns = "vit"\n', 3, "list of strings"),
        ('[[name]]\nstage = "encoder"\n', 1, "missing 'patterns'"),
        ('[[name]]\npatterns = ["vit"]\n', 1, "missing 'stage'"),
        ('[[name]]\nstage = "encoder"\npatterns = ["vit"]\npattern = ["x"]\n', 4, "unknown key 'pattern'"),
        ('[[names]]\nstage = "encoder"\n', 1, "unknown section 'names'"),
        ('[name]\nstage = "encoder"\n', 1, "array of tables"),
        ('[[attribute]]\nstage = "encoder"\nkeys = ["a*b"]\n', 3, "prefix ending in '*'"),
        ('[[attribute]]\nstage = "encoder"\nkeys = ["a"]\nvalues = [[1]]\n', 4, "'values'"),
        ('[[service]]\nstage = "fusion"\npatterns = ["--"]\n', 3, "no letters or digits"),
        ('[[service]]\nstage = "fusion"\npatterns = ["x"]\nkinds = ["CLIENT"]\n', 4, "unknown key 'kinds'"),
    ],
)
def test_wrong_shape(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(RulesError) as info:
        load_rules(path)
    assert str(info.value).startswith(f"{path}:{line}: "), str(info.value)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_and_bad_encoding(tmp_path):
    with pytest.raises(RulesError, match="cannot read rules file"):
        load_rules(tmp_path / "absent.toml")
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'# ok\n# caf\xe9\n')
    with pytest.raises(RulesError, match=r"latin1\.toml:2: not valid UTF-8"):
        load_rules(path)


def test_default_rules_are_a_valid_file_in_the_documented_order():
    rules = parse_rules(default_text(), "default_rules.toml")
    r = rules.rules
    assert r[0].stage_from == "value" and r[0].keys == ("mm.stage",)
    assert all(x.model_call for x in r[1:5]) and not any(x.model_call for x in r[5:])
    names = [x for x in r if x.names]
    services = [x for x in r if x.services]
    assert {x.stage for x in names} == {x.stage for x in services} == {"preprocessing", "encoder", "fusion", "inference"}
    assert r.index(names[-1]) < r.index(services[0])
    assert r[-3].stage_from == "parent_call"
    assert (r[-2].stage, r[-1].stage, r[-1].keys, r[-1].kinds, r[-1].names) == ("network", "other", (), None, ())


@pytest.mark.parametrize("operation,stage", [
    ("chat", "inference"), ("generate_content", "inference"), ("text_completion", "inference"),
    ("embeddings", "encoder"), ("execute_tool", "network"), ("invoke_agent", "network"),
])
def test_only_model_operations_are_model_calls(operation, stage):
    """Tool and agent operations are no model calls: a CLIENT one falls through to network."""
    span = SpanRecord("a" * 32, "b" * 16, None, "agent-api", f"{operation} thing", KIND_CLIENT, 0, 1,
                      attributes={"gen_ai.operation.name": operation})
    load_rules().tag([span])
    assert span.stage == stage
    assert bool(span.signals and span.signals.get("call")) == (stage != "network")
