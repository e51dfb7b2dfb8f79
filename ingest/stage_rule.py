"""One stage rule and the words it matches on: :class:`Rule`, :func:`tokens`, and how an
attribute value is read as text or as a stage.

Kept apart from the compiled matcher (``stage_program.py``) so the rules file reader
(``rules_file.py``) can build rules without the hot-path machinery.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..core.spans import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_PRODUCER,
    KIND_SERVER,
    KIND_UNSPECIFIED,
    STAGES,
)

__all__ = ["CALL", "INHERIT", "STAGE_FROM_PARENT", "STAGE_FROM_VALUE", "Rule", "tokens"]

CALL = 1
"""Decision flag: the deciding rule has ``model_call = true`` (signals get ``"call": 1``)."""
INHERIT = 2
"""Decision flag: a ``stage_from = "parent_call"`` rule matched (signals get ``"inh"``)."""

_STAGE_SET = frozenset(STAGES)
_KINDS_BY_NAME = {
    "INTERNAL": (KIND_UNSPECIFIED, KIND_INTERNAL),  # OTel treats unspecified as internal
    "SERVER": (KIND_SERVER,),
    "CLIENT": (KIND_CLIENT,),
    "PRODUCER": (KIND_PRODUCER,),
    "CONSUMER": (KIND_CONSUMER,),
}

# --------------------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------------------

# "HTTPServer" -> "HTTP_Server": an upper-case run ends before a Capitalised word.
_ACRONYM_END = re.compile(r"([A-Z])(?=[A-Z][a-z])")
# "visionEncoder" -> "vision_Encoder", "getHTTP" -> "get_HTTP"; but a lone capital at the
# end of a word stays with it ("ViT" -> "vit", "Conv2D" -> "conv2d").
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z][A-Za-z])")
_SEPARATORS = re.compile(r"[\W_]+")


def tokens(name: str) -> tuple[str, ...]:
    """Split a span or service name into lowercase whole-word tokens.

    CamelCase is split into snake_case first, then every run of characters that are not
    letters or digits separates tokens::

        "VisionEncoder/Encode" -> ("vision", "encoder", "encode")
        "image.decode"         -> ("image", "decode")
        "decoder-llm"          -> ("decoder", "llm")
        "HTTPServer"           -> ("http", "server")
        "getHTTPResponse"      -> ("get", "http", "response")

    Acronyms: an upper-case run is one token ("HTTP"), ending before a Capitalised word.
    A *lone* capital after lower-case letters or digits, at the end of a word, stays with
    that word, so the model names ViT, DeiT and Conv2D stay whole::

        "ViTLayer" -> ("vit", "layer"),  "ViT.forward" -> ("vit", "forward"),
        "CLIPViT"  -> ("clip", "vit"),   "Conv2D"      -> ("conv2d",)

    (The price: "ViTMLP" -> ("vi", "tmlp"); write "ViT_MLP" or "ViTMlp".) Digits stay
    with the letters before them ("layer2Norm" -> ("layer2", "norm")).
    """
    if not name:
        return ()
    if not name.islower():  # skip the regexes for names with no capitals at all
        name = _CAMEL.sub("_", _ACRONYM_END.sub(r"\1_", name))
    return tuple(t for t in _SEPARATORS.split(name.lower()) if t)


# --------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------

STAGE_FROM_VALUE = "value"
STAGE_FROM_PARENT = "parent_call"


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``[[rule]]`` table. Its matchers are ANDed; a rule without any matches every span.

    ``stage`` is the stage it gives, or None with ``stage_from``: ``"value"`` (the value of
    the first of ``keys`` present that names a stage; no such value: no match) or
    ``"parent_call"`` (the stage the rules after this one give, marked so that the span
    takes its parent model call's stage once the parent is known: :func:`apply_parent_stages`).
    """

    stage: str | None
    stage_from: str | None = None
    names: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    values: frozenset[str] | None = None  # normalised with _value_text
    kinds: frozenset[int] | None = None
    model_call: bool = False
    line: int | None = field(default=None, compare=False)  # where it was written, for messages

    def attributes_match(self, attributes: dict[str, Any]) -> str | bool:
        """The attribute part of the rule: False, True, or (``stage_from = "value"``) the stage."""
        if self.stage_from == STAGE_FROM_VALUE:
            for key in self.keys:
                stage = _stage_value(attributes.get(key))
                if stage is not None:
                    return stage
            return False
        values = self.values
        for key in self.keys:
            if key.endswith("*"):
                prefix = key[:-1]
                hits: Iterable[str] = [k for k in attributes if k.startswith(prefix)]
            elif key in attributes:
                hits = (key,)
            else:
                continue
            for k in hits:
                if values is None or _value_text(attributes[k]) in values:
                    return True
        return False


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return value.strip().lower()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip().lower()


def _stage_value(value: Any) -> str | None:
    if isinstance(value, str):
        if value in _STAGE_SET:
            return value
        value = value.strip().lower()
        if value in _STAGE_SET:
            return value
    return None
