"""Stage rules: tokens, the built-in defaults, rule order, custom files and their errors."""

from __future__ import annotations

import textwrap

import pytest

from modalscope.ingest.records import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_PRODUCER,
    KIND_SERVER,
    STAGES,
    SpanRecord,
)
from modalscope.ingest.stages import RulesError, StageRules, load_rules, parse_rules, tokens


def span(name: str, kind: int = KIND_INTERNAL, service: str = "gateway", **attributes) -> SpanRecord:
    return SpanRecord(
        trace_id="ab" * 16,
        span_id="cd" * 8,
        parent_span_id=None,
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


def test_client_and_producer_spans_are_network(rules):
    assert rules.stage_of(span("image.decode", KIND_CLIENT)) == "network"
    assert rules.stage_of(span("llm.generate", KIND_PRODUCER)) == "network"
    # SERVER and CONSUMER spans go through the rules as usual
    assert rules.stage_of(span("image.decode", KIND_SERVER)) == "preprocessing"
    assert rules.stage_of(span("llm.generate", KIND_CONSUMER)) == "inference"


def test_explicit_stage_beats_everything(rules):
    s = span("image.decode", KIND_CLIENT, **{"mm.stage": "fusion"})
    assert rules.stage_of(s) == "fusion"
    assert rules.stage_of(span("whatever", **{"mm.stage": "inference"})) == "inference"
    assert rules.stage_of(span("whatever", **{"mm.stage": " Encoder "})) == "encoder"


@pytest.mark.parametrize("bad", ["gpu", "", 3, ["encoder"], None])
def test_bad_explicit_stage_is_ignored(rules, bad):
    assert rules.stage_of(span("image.decode", **{"mm.stage": bad})) == "preprocessing"
    assert rules.stage_of(span("image.decode", KIND_CLIENT, **{"mm.stage": bad})) == "network"
    assert rules.stage_of(span("handler", **{"mm.stage": bad})) == "other"


def test_attribute_rules(rules):
    assert rules.stage_of(span("chat", **{"gen_ai.system": "vllm"})) == "inference"
    assert rules.stage_of(span("chat", **{"gen_ai.operation.name": "chat"})) == "inference"
    assert rules.stage_of(span("call", **{"gen_ai.operation.name": "embeddings"})) == "encoder"
    assert rules.stage_of(span("block", **{"mm.layer": "mlp"})) == "encoder"
    assert rules.stage_of(span("forward", **{"mm.modality": "vision"})) == "encoder"
    assert rules.stage_of(span("step", **{"openinference.span.kind": "LLM"})) == "inference"
    # a name rule comes before attribute rules
    assert rules.stage_of(span("image.decode", **{"gen_ai.system": "x"})) == "preprocessing"


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
    ] * 3
    rules.tag(spans)
    assert [s.stage for s in spans[:6]] == [
        "preprocessing", "network", "inference", "other", "encoder", "inference",
    ]
    assert [s.stage for s in spans] == [s.stage for s in spans[:6]] * 3
    assert all(s.stage in STAGES for s in spans)


# -- custom rules files -----------------------------------------------------------------


def write(tmp_path, text: str, name: str = "rules.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_custom_rules_replace_the_defaults(tmp_path):
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
    assert rules.stage_of(span("image.decode")) == "other"  # defaults are gone
    assert rules.stage_of(span("x", **{"img.width": 10})) == "preprocessing"
    assert rules.stage_of(span("x", **{"model.kind": "LLM"})) == "inference"
    assert rules.stage_of(span("x", **{"model.kind": 7})) == "inference"
    assert rules.stage_of(span("x", **{"model.kind": "vae"})) == "other"
    assert rules.stage_of(span("x", service="ClipService")) == "encoder"
    assert rules.stage_of(span("x", service="clip")) == "other"
    assert rules.stage_of(span("merge", KIND_CLIENT)) == "network"


def test_longest_pattern_wins_across_rules(tmp_path):
    rules = parse_rules(
        """
        [[name]]
        stage = "preprocessing"
        patterns = ["a"]
        [[name]]
        stage = "encoder"
        patterns = ["a_b"]
        [[name]]
        stage = "fusion"
        patterns = ["ccc"]
        [[name]]
        stage = "inference"
        patterns = ["dd"]
        """
    )
    assert rules.stage_of(span("x.a.b")) == "encoder"
    assert rules.stage_of(span("a.x.b")) == "preprocessing"
    assert rules.stage_of(span("dd.ccc")) == "fusion"  # same token count: more characters


def test_empty_rules_file_tags_everything_other_or_network(tmp_path):
    rules = load_rules(write(tmp_path, "# nothing\n"))
    assert rules.stage_of(span("image.decode")) == "other"
    assert rules.stage_of(span("image.decode", KIND_CLIENT)) == "network"
    assert rules.stage_of(span("image.decode", **{"mm.stage": "encoder"})) == "encoder"


def test_invalid_toml_names_file_and_line(tmp_path):
    path = write(tmp_path, '[[name]]\nstage = "encoder"\npatterns = ["vit",\n  oops]\n')
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
        [[name]]
        stage = "encoder"
        patterns = ["vit"]

        [[name]]
        stage = "gpu"
        patterns = ["cuda"]
        """,
    )
    with pytest.raises(RulesError) as info:
        load_rules(path)
    assert str(info.value).startswith(f"{path}:6: ")
    assert "unknown stage 'gpu'" in str(info.value)


@pytest.mark.parametrize(
    "text, line, fragment",
    [
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
    ],
)
def test_wrong_shape(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(RulesError) as info:
        load_rules(path)
    assert str(info.value).startswith(f"{path}:{line}: "), str(info.value)
    assert fragment in str(info.value)


def test_missing_file_and_bad_encoding(tmp_path):
    with pytest.raises(RulesError, match="cannot read rules file"):
        load_rules(tmp_path / "absent.toml")
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'# ok\n# caf\xe9\n')
    with pytest.raises(RulesError, match=r"latin1\.toml:2: not valid UTF-8"):
        load_rules(path)


def test_default_rules_are_a_valid_file():
    from importlib import resources

    text = resources.files("modalscope.ingest").joinpath("default_rules.toml").read_text("utf-8")
    rules = parse_rules(text, "default_rules.toml")
    assert {r.stage for r in rules.name_rules} == {"preprocessing", "encoder", "fusion", "inference"}
    assert rules.attribute_rules and rules.service_rules
