"""Stage tagging: which pipeline stage a span belongs to.

Rules live in a TOML file (``default_rules.toml`` next to this module is the built-in set;
``MODALSCOPE_RULES`` names a replacement). The file documents the format: an ordered list
of ``[[rule]]`` tables, the first that matches a span decides its stage. Every built-in
behaviour (explicit ``mm.stage``, model-call conventions, name/attribute/service patterns,
transport spans under a model call, CLIENT/PRODUCER -> network, the ``other`` fallback) is
an ordinary entry of that file. Files in the older layout (``[[name]]``, ``[[attribute]]``,
``[[service]]`` sections) still load: see :func:`parse_rules`.

Public entry points (the rules file is read by ``rules_file.py``):

* ``rules_file.load_rules`` / ``default_rules`` / ``parse_rules`` build a :class:`StageRules`;
* :meth:`StageRules.tag` sets ``stage`` and ``signals`` on a batch of spans (the ingest path);
* :meth:`StageRules.stage_of` gives one span's stage as the rules decide it alone;
* :func:`apply_parent_stages` gives transport spans under a model call their parent's stage,
  from the ``"call"`` and ``"inh"`` markers in ``signals`` (the settler reuses it per trace).

Tagging is on the ingest hot path: :class:`StageRules` compiles, per (span name, service,
kind), the short list of attribute checks that can still decide the span, in bounded dicts,
so a span like one seen before costs a dict lookup and a few ``key in attributes`` tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

from ..models.names import SERVICE_CHARS, cap_service
from ..core.spans import (
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
    "INHERIT",
    "Rule",
    "StageRules",
    "apply_parent_stages",
    "tokens",
]
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
