"""Stage tagging: which pipeline stage a span belongs to.

Rules live in a TOML file (``default_rules.toml`` next to this module is the built-in set;
``MODALSCOPE_RULES`` names a replacement). The file documents the format: an ordered list
of ``[[rule]]`` tables, the first that matches a span decides its stage. Every built-in
behaviour (explicit ``mm.stage``, model-call conventions, name/attribute/service patterns,
transport spans under a model call, CLIENT/PRODUCER -> network, the ``other`` fallback) is
an ordinary entry of that file. Files in the older layout (``[[name]]``, ``[[attribute]]``,
``[[service]]`` sections) still load: see :func:`parse_rules`.

Public entry points:

* :func:`load_rules` / :func:`default_rules` / :func:`parse_rules` build a :class:`StageRules`;
* :meth:`StageRules.tag` sets ``stage`` and ``signals`` on a batch of spans (the ingest path);
* :meth:`StageRules.stage_of` gives one span's stage as the rules decide it alone;
* :func:`apply_parent_stages` gives transport spans under a model call their parent's stage,
  from the ``"call"`` and ``"inh"`` markers in ``signals`` (the settler reuses it per trace).

Tagging is on the ingest hot path: :class:`StageRules` compiles, per (span name, service,
kind), the short list of attribute checks that can still decide the span, in bounded dicts,
so a span like one seen before costs a dict lookup and a few ``key in attributes`` tests.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Iterable, Protocol, Sequence

from ..models.names import SERVICE_CHARS, cap_service
from .records import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_PRODUCER,
    KIND_SERVER,
    KIND_UNSPECIFIED,
    STAGES,
    SpanRecord,
)
from .signals import span_signals

__all__ = [
    "CALL",
    "DEFAULT_RULES_FILE",
    "INHERIT",
    "Rule",
    "RulesError",
    "StageRules",
    "apply_parent_stages",
    "default_rules",
    "load_rules",
    "parse_rules",
    "tokens",
]

DEFAULT_RULES_FILE = "default_rules.toml"
"""Name of the built-in rules file, shipped as package data of ``modalscope.ingest``."""

CALL = 1
"""Decision flag: the deciding rule has ``model_call = true`` (signals get ``"call": 1``)."""
INHERIT = 2
"""Decision flag: a ``stage_from = "parent_call"`` rule matched (signals get ``"inh"``)."""

_STAGE_SET = frozenset(STAGES)
_CACHE_LIMIT = 100_000  # entries per cache; a full cache is cleared, not evicted piecemeal
_KINDS_BY_NAME = {
    "INTERNAL": (KIND_UNSPECIFIED, KIND_INTERNAL),  # OTel treats unspecified as internal
    "SERVER": (KIND_SERVER,),
    "CLIENT": (KIND_CLIENT,),
    "PRODUCER": (KIND_PRODUCER,),
    "CONSUMER": (KIND_CONSUMER,),
}
_CALLEE_KINDS = frozenset((KIND_SERVER, KIND_CONSUMER))

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
# Errors
# --------------------------------------------------------------------------------------


class RulesError(ValueError):
    """A rules file that cannot be used; ``str()`` is one line: ``FILE:LINE: reason``."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {reason}")


_TOML_POSITION = re.compile(r"\s*\((?:at line (\d+), column (\d+)|at end of document)\)\s*$")


def _toml_error(path: str, text: str, exc: tomllib.TOMLDecodeError) -> RulesError:
    # Python 3.11-3.13 put the position only in the message: "... (at line 3, column 5)".
    message = str(exc)
    line = getattr(exc, "lineno", None)
    col = getattr(exc, "colno", None)
    m = _TOML_POSITION.search(message)
    if m:
        message = message[: m.start()]
        if m.group(1) and line is None:
            line, col = int(m.group(1)), int(m.group(2))
    if line is None:  # "at end of document"
        line = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
    detail = f" (column {col})" if col else ""
    return RulesError(path, line, f"invalid TOML: {message}{detail}")


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


class _TokenMatcher:
    """Whole-token patterns of a run of rules, longest first; matches give a payload."""

    __slots__ = ("_by_first",)

    def __init__(self, entries: Iterable[tuple[Sequence[str], Any]]) -> None:
        ranked: list[tuple[tuple[int, int, int], tuple[str, ...], Any]] = []
        order = 0
        for patterns, payload in entries:
            for pattern in patterns:
                toks = tokens(pattern)
                # priority: more tokens, then more characters, then file order
                ranked.append(((-len(toks), -sum(map(len, toks)), order), toks, payload))
                order += 1
        ranked.sort(key=lambda e: e[0])
        by_first: dict[str, list[tuple[tuple[int, int, int], tuple[str, ...], Any]]] = {}
        for entry in ranked:
            by_first.setdefault(entry[1][0], []).append(entry)
        self._by_first = by_first

    def match(self, toks: tuple[str, ...]) -> Any:
        best = None
        by_first = self._by_first
        n = len(toks)
        for i, tok in enumerate(toks):
            candidates = by_first.get(tok)
            if not candidates:
                continue
            for entry in candidates:  # sorted best first: the first fit is the best here
                if best is not None and entry[0] >= best[0]:
                    break
                pat = entry[1]
                if len(pat) == 1 or (i + len(pat) <= n and toks[i : i + len(pat)] == pat):
                    best = entry
                    break
        return None if best is None else best[2]


# Compiled steps: (code, keys, values, outcome). An outcome is (stage, flags), or None for
# the marker of a stage_from = "parent_call" rule.
_CONST = 0  # matches whatever the attributes
_HAS = 1  # any of the exact keys present
_EQ = 2  # any of the exact keys present with one of the values
_VALUE = 3  # stage from the first key whose value names a stage; outcome: {stage: outcome}
_GENERIC = 4  # anything else (prefix keys): values holds the Rule

_OTHER = ("other", 0)
_Step = tuple[int, tuple[str, ...], Any, Any]


class _Run:
    """Consecutive rules that match only on the name (or only on the service): the longest
    pattern across them wins, whatever their order."""

    __slots__ = ("field", "rules", "_matcher", "_cache")

    def __init__(self, field_: str, rules: list[Rule], outcomes: list[tuple[str, int] | None]) -> None:
        self.field = field_
        self.rules = tuple(rules)
        self._matcher = _TokenMatcher(
            (r.names if field_ == "name" else r.services, o) for r, o in zip(rules, outcomes)
        )
        self._cache: dict[str, Any] = {}

    def lookup(self, text: str) -> tuple[str, int] | None:
        hit: Any = self._cache.get(text)
        if hit is None:
            hit = self._matcher.match(tokens(text)) or False
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[text] = hit
        return hit if hit else None


class _Single:
    """One rule on its own: its name/service/kind part is decided once per program."""

    __slots__ = ("rule", "step", "_names", "_services")

    def __init__(self, rule: Rule, outcome: tuple[str, int] | None, value_outcomes: dict[str, tuple[str, int]]) -> None:
        self.rule = rule
        self._names = _TokenMatcher([(rule.names, True)]) if rule.names else None
        self._services = _TokenMatcher([(rule.services, True)]) if rule.services else None
        keys = rule.keys
        self.step: _Step
        if not keys:
            self.step = (_CONST, (), None, outcome)
        elif rule.stage_from == STAGE_FROM_VALUE:
            self.step = (_VALUE, keys, None, value_outcomes)
        elif any(k.endswith("*") for k in keys):
            self.step = (_GENERIC, keys, rule, outcome)
        elif rule.values is None:
            self.step = (_HAS, keys, None, outcome)
        else:
            self.step = (_EQ, keys, rule.values, outcome)

    def static_match(self, name_tokens: tuple[str, ...], service_tokens: tuple[str, ...], kind: int) -> bool:
        rule = self.rule
        if rule.kinds is not None and kind not in rule.kinds:
            return False
        if self._names is not None and self._names.match(name_tokens) is None:
            return False
        if self._services is not None and self._services.match(service_tokens) is None:
            return False
        return True


def _run_steps(steps: tuple, attributes: dict[str, Any]) -> tuple[str, int]:
    """The outcome of a compiled program for these attributes (the last step always fits)."""
    inherit = False
    for code, keys, values, outcome in steps:
        if code == _HAS:
            for key in keys:
                if key in attributes:
                    break
            else:
                continue
        elif code == _EQ:
            for key in keys:
                value = attributes.get(key)
                if value is None:
                    continue
                if (value.strip().lower() if value.__class__ is str else _value_text(value)) in values:
                    break
            else:
                continue
        elif code == _VALUE:
            for key in keys:
                value = attributes.get(key)
                if value is not None:
                    stage = _stage_value(value)
                    if stage is not None:
                        outcome = outcome[stage]
                        break
            else:
                continue
        elif code == _GENERIC:
            if not values.attributes_match(attributes):
                continue
        if outcome is None:  # a stage_from = "parent_call" rule: its fallback comes next
            inherit = True
            continue
        if inherit:
            return (outcome[0], outcome[1] | INHERIT)
        return outcome
    return (_OTHER[0], INHERIT) if inherit else _OTHER


class _Program:
    """The compiled steps for spans of one (name, service, kind)."""

    __slots__ = ("steps", "empty", "keys", "value_keys", "by_present")

    def __init__(self, steps: tuple) -> None:
        self.steps = steps
        self.empty = _run_steps(steps, {})  # the outcome for a span with none of the keys
        # The keys any step reads (None: a prefix key, no cheap test), and those whose value
        # matters; with none of the latter present, outcomes are cached by the keys present.
        self.keys: frozenset[str] | None = frozenset(k for step in steps for k in step[1])
        if any(step[0] == _GENERIC for step in steps):
            self.keys = None
        self.value_keys = frozenset(k for step in steps if step[0] in (_EQ, _VALUE) for k in step[1])
        self.by_present: dict[frozenset[str], tuple[str, int]] = {}


class StageRules:
    """Compiled stage rules, in order. Use :func:`load_rules` to build one from a file."""

    def __init__(self, rules: Iterable[Rule] = (), source: str = "<rules>") -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.source = source
        units: list[_Run | _Single] = []
        pending: list[Rule] = []
        pending_field = ""

        def flush() -> None:
            if pending:
                units.append(_Run(pending_field, list(pending), [_outcome(r) for r in pending]))
                pending.clear()

        for rule in self.rules:
            run_field = _run_field(rule)
            if run_field is None or run_field != pending_field:
                flush()
            if run_field is not None:
                pending_field = run_field
                pending.append(rule)
                continue
            pending_field = ""
            units.append(_Single(rule, _outcome(rule), _value_outcomes(rule)))
        flush()
        self._units = tuple(units)
        self._programs: dict[tuple[str, str, int], _Program] = {}
        self._tokens: dict[str, tuple[str, ...]] = {}

    def __repr__(self) -> str:
        return f"StageRules(source={self.source!r}, rules={len(self.rules)})"

    # -- compiling -----------------------------------------------------------------------

    def _tokens_of(self, text: str) -> tuple[str, ...]:
        toks = self._tokens.get(text)
        if toks is None:
            toks = tokens(text)
            if len(self._tokens) >= _CACHE_LIMIT:
                self._tokens.clear()
            self._tokens[text] = toks
        return toks

    def _compile(self, key: tuple[str, str, int]) -> _Program:
        """The steps left for spans of this (name, service, kind): the attribute checks of
        the rules whose other matchers pass, up to the first rule that needs no attribute."""
        name, service, kind = key
        name_toks = service_toks = None
        steps: list[tuple] = []
        for unit in self._units:
            if isinstance(unit, _Run):
                outcome = unit.lookup(name if unit.field == "name" else service)
                if outcome is not None:
                    steps.append((_CONST, (), None, outcome))
                    break
                continue
            rule = unit.rule
            if rule.names and name_toks is None:
                name_toks = self._tokens_of(name)
            if rule.services and service_toks is None:
                service_toks = self._tokens_of(service)
            if not unit.static_match(name_toks or (), service_toks or (), kind):
                continue
            steps.append(unit.step)
            if unit.step[0] == _CONST and unit.step[3] is not None:
                break
        else:
            steps.append((_CONST, (), None, _OTHER))
        program = _Program(tuple(steps))
        if len(self._programs) >= _CACHE_LIMIT:
            self._programs.clear()
        self._programs[key] = program
        return program

    # -- the decision --------------------------------------------------------------------

    def decide(self, span: SpanRecord) -> tuple[str, int]:
        """``(stage, flags)`` for one span on its own: flags has :data:`CALL` when the
        deciding rule marks a model call and :data:`INHERIT` when a ``parent_call`` rule
        matched (then ``stage`` is its fallback, what the rules after it give)."""
        key = (span.name, span.service, span.kind)
        program = self._programs.get(key)
        if program is None:
            program = self._compile(key)
        attributes = span.attributes
        if not attributes:
            return program.empty
        keys = program.keys
        if keys is None:
            return _run_steps(program.steps, attributes)
        if keys.isdisjoint(attributes):  # most spans: none of the keys the rules read
            return program.empty
        present = keys.intersection(attributes)
        if program.value_keys.isdisjoint(present):
            # Only presence matters here: the outcome is a function of which keys are present.
            outcome = program.by_present.get(present)
            if outcome is None:
                outcome = _run_steps(program.steps, attributes)
                if len(program.by_present) >= 64:
                    program.by_present.clear()
                program.by_present[present] = outcome
            return outcome
        return _run_steps(program.steps, attributes)

    def stage_of(self, span: SpanRecord) -> str:
        """The stage the rules give one span, before any parent is considered."""
        return self.decide(span)[0]

    def tag(self, spans: Iterable[SpanRecord]) -> None:
        """Set ``.stage`` and ``.signals`` (ingest/signals.py) on every span, and cap its
        service name (``models/names.py``) as the store keeps it.

        A span decided by a ``model_call`` rule gets ``"call": 1`` in its signals; one that
        matched a ``parent_call`` rule gets ``"inh": <its own stage>``, and takes its parent's
        stage here when the parent is in the same batch (:func:`apply_parent_stages`).
        """
        if not isinstance(spans, list):
            spans = list(spans)
        decide = self.decide
        heirs: list[SpanRecord] = []
        for span in spans:
            if len(span.service) > SERVICE_CHARS:  # every source passes here: stored capped
                span.service = cap_service(span.service)
            stage, flags = decide(span)
            span.stage = stage
            signals = span_signals(span)
            if flags:
                if signals is None:
                    signals = {}
                if flags & CALL:
                    signals["call"] = 1
                if flags & INHERIT:
                    signals["inh"] = stage
                    heirs.append(span)
            span.signals = signals
        if heirs:  # rare: only batches with transport spans under a model call pay for this
            calls = {(s.trace_id, s.span_id): s for s in spans if s.signals and s.signals.get("call")}
            if calls:
                _inherit(spans, calls, heirs)

    def clear_cache(self) -> None:
        self._programs.clear()
        self._tokens.clear()
        for unit in self._units:
            if isinstance(unit, _Run):
                unit._cache.clear()


def _outcome(rule: Rule) -> tuple[str, int] | None:
    if rule.stage_from == STAGE_FROM_PARENT:
        return None
    if rule.stage is None:  # stage_from = "value": per stage, see _value_outcomes
        return None
    return (rule.stage, CALL if rule.model_call else 0)


def _value_outcomes(rule: Rule) -> dict[str, tuple[str, int]]:
    flags = CALL if rule.model_call else 0
    return {stage: (stage, flags) for stage in STAGES}


def _run_field(rule: Rule) -> str | None:
    """"name" or "service" when the rule can join a longest-pattern run."""
    if rule.stage is None or rule.keys or rule.kinds is not None:
        return None
    if rule.names and not rule.services:
        return "name"
    if rule.services and not rule.names:
        return "service"
    return None


# --------------------------------------------------------------------------------------
# Transport spans under a model call
# --------------------------------------------------------------------------------------


class _SpanLike(Protocol):
    trace_id: str
    span_id: str
    parent_span_id: str | None
    service: str
    kind: int
    stage: str | None
    signals: dict[str, Any] | None


def apply_parent_stages(spans: Iterable[_SpanLike]) -> int:
    """Give each span marked ``"inh"`` in its signals the stage it should have within ``spans``.

    Such a span (a transport CLIENT span matched by a ``stage_from = "parent_call"`` rule)
    takes its parent's stage when the parent is among ``spans``, in the same service, is a
    model call (``"call"`` in its signals: a ``model_call`` rule, or ingest/signals.py, put it
    there), and no SERVER or CONSUMER span among ``spans``
    is its child (an instrumented callee: its own stages tell the story). Otherwise it gets
    back the stage the rules gave it alone (the ``"inh"`` value), so calling this again on a
    grown set (a settling trace) is always right. Pure but for setting ``.stage``; returns
    how many stages changed.
    """
    spans = spans if isinstance(spans, (list, tuple)) else list(spans)
    calls: dict[tuple[str, str], _SpanLike] = {}
    heirs: list[_SpanLike] = []
    for span in spans:
        signals = span.signals
        if signals:
            if signals.get("call"):
                calls[(span.trace_id, span.span_id)] = span
            if signals.get("inh"):
                heirs.append(span)
    return _inherit(spans, calls, heirs)


def _inherit(spans: Sequence[_SpanLike], calls: dict[tuple[str, str], Any], heirs: list[Any]) -> int:
    called = {(s.trace_id, s.parent_span_id) for s in spans if s.kind in _CALLEE_KINDS and s.parent_span_id}
    changed = 0
    for span in heirs:
        stage = span.signals["inh"]  # type: ignore[index]
        pid = span.parent_span_id
        parent = calls.get((span.trace_id, pid)) if pid and pid != span.span_id else None
        if (
            parent is not None
            and parent.service == span.service
            and (span.trace_id, span.span_id) not in called
        ):
            # One level only: a parent that is itself marked counts with its own fallback,
            # so the answer does not depend on the order spans are visited in.
            stage = parent.signals.get("inh") or parent.stage or stage
        if span.stage != stage:
            span.stage = stage
            changed += 1
    return changed


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------

_LEGACY_SECTIONS = ("name", "attribute", "service")
_SECTIONS = ("rule",) + _LEGACY_SECTIONS
_SECTION_KEYS = {
    "rule": ("stage", "stage_from", "names", "services", "keys", "values", "kinds", "model_call"),
    "name": ("stage", "patterns"),
    "service": ("stage", "patterns"),
    "attribute": ("stage", "keys", "values"),
}

# A file in the older layout keeps its [[name]], [[attribute]] and [[service]] rules, in
# that order, between these built-in entries (the same as in default_rules.toml), so a
# GenAI CLIENT span is a model call there too.
_LEGACY_HEAD = """
[[rule]]
stage_from = "value"
keys = ["mm.stage"]

[[rule]]
stage = "encoder"
keys = ["gen_ai.operation.name"]
values = ["embeddings"]
model_call = true

[[rule]]
stage = "inference"
keys = ["gen_ai.operation.name"]
values = ["chat", "generate_content", "text_completion"]
model_call = true

[[rule]]
stage = "inference"
keys = ["openinference.span.kind"]
values = ["llm", "reranker"]
model_call = true

[[rule]]
stage = "encoder"
keys = ["openinference.span.kind"]
values = ["embedding"]
model_call = true
"""
_LEGACY_TAIL = """
[[rule]]
stage_from = "parent_call"
kinds = ["CLIENT"]
keys = ["http.request.method", "http.method", "url.full", "http.url", "rpc.system", "rpc.service"]

[[rule]]
stage = "network"
kinds = ["CLIENT", "PRODUCER"]

[[rule]]
stage = "other"
"""


def parse_rules(text: str, path: str = "<rules>") -> StageRules:
    """Build :class:`StageRules` from TOML text; errors name ``path`` and a line.

    A file with ``[[rule]]`` tables is the whole, ordered list. A file without any (the
    older layout, or an empty file) gets the built-in entries around its sections: explicit
    ``mm.stage``, the model-call conventions, then its ``[[name]]`` rules (one longest-pattern
    run), ``[[attribute]]`` rules in order, ``[[service]]`` rules (one run), then transport
    spans under a model call, CLIENT/PRODUCER -> network and ``other``.
    """
    return StageRules(_parse(text, path), source=path)


def _parse(text: str, path: str) -> list[Rule]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(path, text, exc) from None
    where = _Locator(text)

    for top, value in data.items():
        if top not in _SECTIONS:
            raise RulesError(
                path,
                where.table(top) or where.key("", 0, top),
                f"unknown section {top!r} (expected [[rule]]; or, in the older layout, "
                "[[name]], [[attribute]] or [[service]])",
            )
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            raise RulesError(
                path, where.table(top) or where.key("", 0, top),
                f"{top!r} must be an array of tables: write [[{top}]]",
            )
    legacy = [s for s in _LEGACY_SECTIONS if s in data]
    if "rule" in data and legacy:
        raise RulesError(
            path, where.table(legacy[0]),
            f"[[{legacy[0]}]] cannot be mixed with [[rule]]: write it as a [[rule]] "
            "(patterns -> names/services) where it belongs in the order",
        )

    def fail(section: str, index: int, key: str | None, reason: str, needle: str | None = None):
        line = where.key(section, index, key, needle) if key else where.table(section, index)
        return RulesError(path, line, f"[[{section}]] #{index + 1}: {reason}")

    def check_keys(section: str, index: int, table: dict[str, Any]) -> None:
        for key in table:
            if key not in _SECTION_KEYS[section]:
                allowed = ", ".join(_SECTION_KEYS[section])
                raise fail(section, index, key, f"unknown key {key!r} (expected {allowed})")

    def stage_of_table(section: str, index: int, table: dict[str, Any]) -> str:
        stage = table["stage"]
        if not isinstance(stage, str) or stage not in _STAGE_SET:
            raise fail(
                section, index, "stage",
                f"unknown stage {stage!r} (expected one of {', '.join(STAGES)})",
            )
        return stage

    def strings(section: str, index: int, table: dict[str, Any], key: str, what: str) -> tuple[str, ...]:
        value = table[key]
        if not isinstance(value, list):
            raise fail(section, index, key, f"'{key}' must be a list of strings")
        out = []
        for item in value:
            if not isinstance(item, str):
                raise fail(section, index, key, f"{what} {item!r} is not a string", repr(item))
            if what == "pattern" and not tokens(item):
                raise fail(section, index, key, f"pattern {item!r} has no letters or digits", repr(item)[1:-1])
            if what == "key" and (not item or "*" in item[:-1] or item == "*"):
                raise fail(
                    section, index, key,
                    f"key {item!r}: use an exact key or a prefix ending in '*' (e.g. 'gen_ai.*')",
                    repr(item)[1:-1],
                )
            if what == "kind" and item.upper() not in _KINDS_BY_NAME:
                raise fail(
                    section, index, key,
                    f"unknown span kind {item!r} (expected {', '.join(_KINDS_BY_NAME)})", repr(item)[1:-1],
                )
            out.append(item)
        if not out:
            raise fail(section, index, key, f"'{key}' is empty")
        return tuple(out)

    def values_of(section: str, index: int, table: dict[str, Any]) -> frozenset[str]:
        raw = table["values"]
        if not isinstance(raw, list) or not raw or not all(isinstance(v, (str, int, float, bool)) for v in raw):
            raise fail(section, index, "values", "'values' must be a non-empty list of strings, numbers or booleans")
        return frozenset(_value_text(v) for v in raw)

    def new_rule(index: int, table: dict[str, Any]) -> Rule:
        s = "rule"
        check_keys(s, index, table)
        line = where.table(s, index)
        stage = stage_from = None
        if "stage" in table and "stage_from" in table:
            raise fail(s, index, "stage_from", "give either 'stage' or 'stage_from', not both")
        if "stage" in table:
            stage = stage_of_table(s, index, table)
        elif "stage_from" in table:
            stage_from = table["stage_from"]
            if stage_from not in (STAGE_FROM_VALUE, STAGE_FROM_PARENT):
                raise fail(
                    s, index, "stage_from",
                    f"unknown stage_from {stage_from!r} (expected 'value' or 'parent_call')",
                )
        else:
            raise fail(s, index, None, "missing 'stage' (or 'stage_from')")
        names = strings(s, index, table, "names", "pattern") if "names" in table else ()
        services = strings(s, index, table, "services", "pattern") if "services" in table else ()
        keys = strings(s, index, table, "keys", "key") if "keys" in table else ()
        values = values_of(s, index, table) if "values" in table else None
        kinds = None
        if "kinds" in table:
            kinds = frozenset(k for name in strings(s, index, table, "kinds", "kind") for k in _KINDS_BY_NAME[name.upper()])
        model_call = table.get("model_call", False)
        if not isinstance(model_call, bool):
            raise fail(s, index, "model_call", "'model_call' must be true or false")
        if values is not None and not keys:
            raise fail(s, index, "values", "'values' needs 'keys'")
        if stage_from == STAGE_FROM_VALUE:
            if not keys or any(k.endswith("*") for k in keys):
                raise fail(s, index, "stage_from", "stage_from = 'value' needs exact 'keys' to read the stage from")
            if values is not None:
                raise fail(s, index, "values", "'values' cannot be used with stage_from = 'value'")
        if stage_from == STAGE_FROM_PARENT and model_call:
            raise fail(s, index, "model_call", "a stage_from = 'parent_call' rule cannot be a model call")
        return Rule(stage, stage_from, names, services, keys, values, kinds, model_call, line)

    if "rule" in data:
        return [new_rule(i, t) for i, t in enumerate(data["rule"])]

    middle: list[Rule] = []
    for section in _LEGACY_SECTIONS:
        for index, table in enumerate(data.get(section, [])):
            check_keys(section, index, table)
            if "stage" not in table:
                raise fail(section, index, None, "missing 'stage'")
            stage = stage_of_table(section, index, table)
            line = where.table(section, index)
            if section == "attribute":
                if "keys" not in table:
                    raise fail(section, index, None, "missing 'keys'")
                keys = strings(section, index, table, "keys", "key")
                values = values_of(section, index, table) if "values" in table else None
                middle.append(Rule(stage, keys=keys, values=values, line=line))
                continue
            if "patterns" not in table:
                raise fail(section, index, None, "missing 'patterns'")
            patterns = strings(section, index, table, "patterns", "pattern")
            if section == "name":
                middle.append(Rule(stage, names=patterns, line=line))
            else:
                middle.append(Rule(stage, services=patterns, line=line))
    head, tail = _legacy_frame()
    return [*head, *middle, *tail]


_FRAME: tuple[list[Rule], list[Rule]] | None = None


def _legacy_frame() -> tuple[list[Rule], list[Rule]]:
    global _FRAME
    if _FRAME is None:
        _FRAME = (_parse(_LEGACY_HEAD, "<built-in>"), _parse(_LEGACY_TAIL, "<built-in>"))
    return _FRAME


class _Locator:
    """Finds the source line of the i-th ``[[section]]`` table, or of a key inside it.

    tomllib gives no positions for values, so shape errors are located by scanning the
    text: good enough to point a user at the right table and key.
    """

    _HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\"'-]+)\s*\]\]?")

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.headers: dict[str, list[int]] = {}
        for number, line in enumerate(self.lines, start=1):
            m = self._HEADER.match(line)
            if m:
                self.headers.setdefault(m.group(1).strip("\"'"), []).append(number)

    def table(self, section: str, index: int | None = None) -> int | None:
        found = self.headers.get(section, [])
        if index is None:
            return found[0] if found else None
        return found[index] if index < len(found) else None

    def key(self, section: str, index: int, key: str, needle: str | None = None) -> int | None:
        start = self.table(section, index)
        if start is None:
            return self._search(key, needle, 1, len(self.lines))
        end = len(self.lines)
        for number in (n for ns in self.headers.values() for n in ns):
            if start < number <= end:
                end = number - 1
        return self._search(key, needle, start, end) or start

    def _search(self, key: str, needle: str | None, first: int, last: int) -> int | None:
        key_re = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
        key_line = None
        for number in range(first, last + 1):
            line = self.lines[number - 1]
            if key_line is None and key_re.match(line):
                key_line = number
                if needle is None:
                    return number
            if key_line is not None and needle is not None and needle in line:
                return number
        return key_line


def load_rules(path: str | os.PathLike[str] | None = None) -> StageRules:
    """Load stage rules from ``path``; ``None`` loads the built-in defaults.

    Raises :class:`RulesError` (one line, ``FILE:LINE: reason``) for a file that cannot be
    read, is not valid TOML or UTF-8, or has the wrong shape.
    """
    if path is None:
        resource = resources.files(__package__).joinpath(DEFAULT_RULES_FILE)
        display = str(resource)
        try:
            raw = resource.read_bytes()
        except OSError as exc:  # a broken install: package data missing
            raise RulesError(display, None, f"cannot read built-in rules: {exc.strerror or exc}") from None
    else:
        display = os.fspath(path)
        try:
            with open(display, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise RulesError(display, None, f"cannot read rules file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RulesError(display, line, "not valid UTF-8") from None
    return parse_rules(text, display)


_DEFAULT: StageRules | None = None


def default_rules() -> StageRules:
    """The built-in rules, loaded once per process."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_rules(None)
    return _DEFAULT
