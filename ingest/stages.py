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
A rule and its tokens are in ``stage_rule.py``, the compiled form in ``stage_program.py``;
the names other modules import from here are re-exported.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, Sequence

from ..models.names import SERVICE_CHARS, cap_service
from ..core.spans import KIND_CONSUMER, KIND_SERVER, SpanRecord
from .signals import span_signals
from .stage_program import (_CACHE_LIMIT, _CONST, _OTHER, _Program, _Run, _Single, _outcome, _run_field, _run_steps,
                            _value_outcomes)
from .stage_rule import CALL, INHERIT, Rule, tokens
from .stage_rule import (  # noqa: F401 - re-exported: rules_file.py reads them from here
    _KINDS_BY_NAME, _STAGE_SET, STAGE_FROM_PARENT, STAGE_FROM_VALUE, _value_text)

__all__ = [
    "CALL",
    "INHERIT",
    "Rule",
    "StageRules",
    "apply_parent_stages",
    "tokens",
]

_CALLEE_KINDS = frozenset((KIND_SERVER, KIND_CONSUMER))


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
