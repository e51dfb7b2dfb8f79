"""Stage rules compiled for the ingest hot path.

:class:`~.stages.StageRules` groups its rules into units: a :class:`_Run` (consecutive
rules that match on the name only, or the service only, decided by the longest pattern)
or a :class:`_Single` (any other rule, its name/service/kind part decided once per
program). For each (span name, service, kind) it keeps a :class:`_Program`: the attribute
steps that can still decide such a span, run by :func:`_run_steps`.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..core.spans import STAGES
from .stage_rule import CALL, INHERIT, STAGE_FROM_PARENT, STAGE_FROM_VALUE, Rule, _stage_value, _value_text, tokens

_CACHE_LIMIT = 100_000  # entries per cache; a full cache is cleared, not evicted piecemeal


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
