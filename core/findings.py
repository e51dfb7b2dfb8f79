"""What the anomaly catalog reports: a ``Finding`` (one detector's verdict on one subject over
one window) and an ``Incident`` (findings grouped under their likely cause).

Both are immutable values the analysis code passes around; ``to_json`` gives the exact
object ``/api/v1/anomalies`` and ``/api/v1/incidents`` answer (keys in that order), and
``from_json`` reads one back (stored evaluations keep findings as JSON). Nothing here
computes a finding: the detectors do (``app/detectors``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Union

__all__ = ["SUBJECT_FILTERS", "Attribute", "Subject", "Finding", "StageSuspect", "AttributeSuspect", "Suspect",
           "IncidentLinks", "Incident", "parse_rfc3339_ns"]

#: A subject's dimensions a request filter names (``Filters`` fields of the same names).
SUBJECT_FILTERS = ("caller", "callee", "service", "stage", "input_type")

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_US = timedelta(microseconds=1)


def parse_rfc3339_ns(text: str) -> int:
    """An RFC 3339 time (as findings write theirs: ``2026-11-30T14:05:00Z``) as unix nanoseconds."""
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - _EPOCH) // _ONE_US * 1000


def _as_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Attribute:
    """A span attribute a finding is about: ``key`` and the ``value`` it has (a string, or a
    number such as ``batch.size`` 1)."""

    key: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Attribute":
        if not isinstance(data, Mapping) or set(data) != {"key", "value"}:
            raise ValueError(f"an attribute is {{key, value}}, not {data!r}")
        return cls(_as_str(data["key"], "attribute key"), data["value"])


@dataclass(frozen=True, slots=True)
class Subject:
    """What a finding is about: a caller -> callee pair, a service, a cache, an input type, a
    stage, and the attribute value singled out; the dimensions it does not name are None.

    ``to_json`` lists the named ones in the field order below, the order the detectors have
    always written them in (``{"caller", "callee"}``, ``{"service", "attribute"}``,
    ``{"cache", "attribute"}``, ``{"input_type", "stage"}``, ...)."""

    caller: str | None = None
    callee: str | None = None
    service: str | None = None
    cache: str | None = None
    input_type: str | None = None
    stage: str | None = None
    attribute: Attribute | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value.to_json() if isinstance(value, Attribute) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Subject":
        if not isinstance(data, Mapping):
            raise ValueError(f"a subject is an object, not {data!r}")
        unknown = set(data) - _SUBJECT_KEYS
        if unknown:
            raise ValueError(f"a subject has no dimension {sorted(unknown)!r}")
        kw: dict[str, Any] = {k: _as_str(v, f"subject {k}") for k, v in data.items()
                              if k != "attribute" and v is not None}
        if data.get("attribute") is not None:
            kw["attribute"] = Attribute.from_json(data["attribute"])
        return cls(**kw)

    def filters(self) -> dict[str, str]:
        """The request filters naming this subject (``SUBJECT_FILTERS``, non-empty values)."""
        return {k: v for k in SUBJECT_FILTERS if (v := getattr(self, k))}

    def services(self) -> tuple[str, ...]:
        """The services it names: its service, caller and callee (non-empty ones)."""
        return tuple(v for v in (self.service, self.caller, self.callee) if v)

    def text(self) -> str:
        """``service=llm, service.instance.id=llm-7`` (an attribute as ``key=value``)."""
        return ", ".join(f"{v['key']}={v['value']}" if isinstance(v, dict) else f"{k}={v}"
                         for k, v in self.to_json().items())


_SUBJECT_KEYS = frozenset(f.name for f in fields(Subject))


class _Timed:
    """``start_ns``/``end_ns``: the ``start``/``end`` (RFC 3339) of a finding or an incident."""

    __slots__ = ()
    start: str
    end: str

    @property
    def start_ns(self) -> int:
        return parse_rfc3339_ns(self.start)

    @property
    def end_ns(self) -> int:
        return parse_rfc3339_ns(self.end)


@dataclass(frozen=True, slots=True)
class Finding(_Timed):
    """One finding of the anomaly catalog.

    ``start``/``end``: its window, RFC 3339 in whole seconds (``start_ns``/``end_ns`` as unix
    nanoseconds); ``evidence``: the numbers that fired it, each key naming its unit
    (``app/units.py``), in the order the detector gave them; ``exemplar_trace_ids``: up to
    five traces showing it (lowercase hex); ``hint``: what to do about it."""

    kind: str
    severity: str
    subject: Subject
    start: str
    end: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    exemplar_trace_ids: tuple[str, ...] = ()
    hint: str = ""

    def replace(self, **changes: Any) -> "Finding":
        """A copy with ``changes`` (e.g. its exemplars and hint once looked up)."""
        if "exemplar_trace_ids" in changes:
            changes["exemplar_trace_ids"] = tuple(changes["exemplar_trace_ids"] or ())
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The finding as the API answers it: ``{"kind", "severity", "subject", "start",
        "end", "evidence", "exemplar_trace_ids", "hint"}``."""
        return {"kind": self.kind, "severity": self.severity, "subject": self.subject.to_json(),
                "start": self.start, "end": self.end, "evidence": dict(self.evidence),
                "exemplar_trace_ids": list(self.exemplar_trace_ids), "hint": self.hint}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Finding":
        """A finding from its JSON object (``to_json``'s shape; what a stored evaluation holds)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a finding is an object, not {data!r}")
        evidence = data.get("evidence") or {}
        if not isinstance(evidence, Mapping):
            raise ValueError(f"a finding's evidence is an object, not {evidence!r}")
        return cls(kind=_as_str(data["kind"], "kind"), severity=_as_str(data["severity"], "severity"),
                   subject=Subject.from_json(data.get("subject") or {}), start=_as_str(data["start"], "start"),
                   end=_as_str(data["end"], "end"), evidence=dict(evidence),
                   exemplar_trace_ids=tuple(str(t) for t in data.get("exemplar_trace_ids") or ()),
                   hint=str(data.get("hint") or ""))


# -- incidents ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageSuspect:
    """A stage that took a share (``added_share``, a fraction) of the time the incident added."""

    stage: str
    added_share: float

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "added_share": self.added_share}


@dataclass(frozen=True, slots=True)
class AttributeSuspect:
    """An attribute value over-represented among the incident's slow spans (``lift`` times)."""

    key: str
    value: Any
    lift: float

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "lift": self.lift}


Suspect = Union[StageSuspect, AttributeSuspect]


def _suspect_from_json(data: Mapping[str, Any]) -> Suspect:
    if "stage" in data:
        return StageSuspect(data["stage"], data["added_share"])
    return AttributeSuspect(data["key"], data["value"], data["lift"])


@dataclass(frozen=True, slots=True)
class IncidentLinks:
    """Compare and the drilldown over the incident's span for its headline's subject, and
    the trace pages of its exemplars."""

    compare: str
    drilldown: str
    traces: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"compare": self.compare, "drilldown": self.drilldown, "traces": list(self.traces)}


@dataclass(frozen=True, slots=True)
class Incident(_Timed):
    """Findings grouped under their likely cause (``app/incidents.py``): ``findings`` headline
    first; ``cause_known`` when the headline names a mechanism, else ``suspects`` are what
    Compare found; ``start``/``end`` (RFC 3339, whole seconds) span every finding."""

    id: str
    severity: str
    start: str
    end: str
    cause_known: bool
    findings: tuple[Finding, ...]
    suspects: tuple[Suspect, ...] = ()
    links: IncidentLinks = IncidentLinks("", "")

    def __post_init__(self) -> None:
        if not self.findings:
            raise ValueError("an incident holds at least one finding, its headline")

    @property
    def headline(self) -> Finding:
        return self.findings[0]

    def to_json(self) -> dict[str, Any]:
        """The incident as ``/api/v1/incidents`` answers it: ``{"id", "severity", "start",
        "end", "headline", "cause_known", "findings", "suspects", "links"}``."""
        found = [f.to_json() for f in self.findings]
        return {"id": self.id, "severity": self.severity, "start": self.start, "end": self.end,
                "headline": found[0], "cause_known": self.cause_known, "findings": found,
                "suspects": [s.to_json() for s in self.suspects], "links": self.links.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Incident":
        found = tuple(Finding.from_json(f) for f in data["findings"])
        if found and "headline" in data and Finding.from_json(data["headline"]) != found[0]:
            raise ValueError("an incident's headline is its first finding")
        links = data.get("links") or {}
        return cls(id=str(data["id"]), severity=str(data["severity"]), start=str(data["start"]),
                   end=str(data["end"]), cause_known=bool(data["cause_known"]), findings=found,
                   suspects=tuple(_suspect_from_json(s) for s in data.get("suspects") or ()),
                   links=IncidentLinks(str(links.get("compare", "")), str(links.get("drilldown", "")),
                                       tuple(str(t) for t in links.get("traces") or ())))
