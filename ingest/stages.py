"""Stage tagging: which pipeline stage a span belongs to.

Rules live in a TOML file (``default_rules.toml`` next to this module is the built-in set;
``MODALSCOPE_RULES`` names a replacement). The file documents the format; in short, the
first match wins, in this order:

1. an explicit ``mm.stage`` attribute that names one of :data:`STAGES`;
2. CLIENT and PRODUCER spans -> ``network``;
3. ``[[name]]`` rules: whole-token patterns on the span name, longest pattern first;
4. ``[[attribute]]`` rules: attribute keys (optionally values), in file order;
5. ``[[service]]`` rules: whole-token patterns on the service name, longest first;
6. ``other``.

Tagging is on the ingest hot path, so :class:`StageRules` caches the outcome of steps 3-5
per span name, attribute signature and service name in bounded dicts: a span whose name
was seen before costs a couple of dict lookups.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterable

from .records import KIND_CLIENT, KIND_PRODUCER, STAGES, SpanRecord
from .signals import span_signals

__all__ = [
    "DEFAULT_RULES_FILE",
    "RulesError",
    "StageRules",
    "default_rules",
    "load_rules",
    "parse_rules",
    "tokens",
]

DEFAULT_RULES_FILE = "default_rules.toml"
"""Name of the built-in rules file, shipped as package data of ``modalscope.ingest``."""

_STAGE_SET = frozenset(STAGES)
_NETWORK_KINDS = frozenset((KIND_CLIENT, KIND_PRODUCER))
_CACHE_LIMIT = 100_000  # entries per cache; a full cache is cleared, not evicted piecemeal

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


@dataclass(frozen=True, slots=True)
class PatternRule:
    """A ``[[name]]`` or ``[[service]]`` rule."""

    stage: str
    patterns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AttributeRule:
    """An ``[[attribute]]`` rule: any of ``keys`` present (and, with ``values``, equal)."""

    stage: str
    keys: tuple[str, ...]
    values: tuple[str, ...] | None = None  # normalised with _value_text

    def matches(self, attributes: dict[str, Any]) -> bool:
        for key in self.keys:
            if key.endswith("*"):
                prefix = key[:-1]
                hits = [k for k in attributes if k.startswith(prefix)]
            else:
                hits = [key] if key in attributes else []
            for k in hits:
                if self.values is None or _value_text(attributes[k]) in self.values:
                    return True
        return False


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip().lower()


class _TokenMatcher:
    """Whole-token patterns of one section, longest first across all its rules."""

    __slots__ = ("_by_first",)

    def __init__(self, rules: Iterable[PatternRule]) -> None:
        entries: list[tuple[tuple[int, int, int], tuple[str, ...], str]] = []
        order = 0
        for rule in rules:
            for pattern in rule.patterns:
                toks = tokens(pattern)
                # priority: more tokens, then more characters, then file order
                entries.append(((-len(toks), -sum(map(len, toks)), order), toks, rule.stage))
                order += 1
        entries.sort(key=lambda e: e[0])
        by_first: dict[str, list[tuple[tuple[int, int, int], tuple[str, ...], str]]] = {}
        for entry in entries:
            by_first.setdefault(entry[1][0], []).append(entry)
        self._by_first = by_first

    def match(self, toks: tuple[str, ...]) -> str | None:
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


class StageRules:
    """Compiled stage rules. Use :func:`load_rules` to build one from a file."""

    def __init__(
        self,
        name_rules: Iterable[PatternRule] = (),
        attribute_rules: Iterable[AttributeRule] = (),
        service_rules: Iterable[PatternRule] = (),
        source: str = "<rules>",
    ) -> None:
        self.name_rules = tuple(name_rules)
        self.attribute_rules = tuple(attribute_rules)
        self.service_rules = tuple(service_rules)
        self.source = source
        self._names = _TokenMatcher(self.name_rules)
        self._services = _TokenMatcher(self.service_rules)
        # Keys whose *value* matters to some rule go into the attribute cache key.
        value_keys: list[str] = []
        self._value_prefixes = False
        for rule in self.attribute_rules:
            if rule.values is not None:
                for key in rule.keys:
                    if key.endswith("*"):
                        self._value_prefixes = True
                    elif key not in value_keys:
                        value_keys.append(key)
        self._value_keys = tuple(value_keys)
        # Caches: "" means "no rule of this section matched".
        self._name_cache: dict[str, str] = {}
        self._attr_cache: dict[Any, str] = {}
        self._service_cache: dict[str, str] = {}

    def __repr__(self) -> str:
        return (
            f"StageRules(source={self.source!r}, name_rules={len(self.name_rules)}, "
            f"attribute_rules={len(self.attribute_rules)}, service_rules={len(self.service_rules)})"
        )

    # -- the per-section lookups (cached) ----------------------------------------------

    def name_stage(self, name: str) -> str | None:
        """The stage the ``[[name]]`` rules give ``name``, or None."""
        stage = self._name_cache.get(name)
        if stage is None:
            stage = self._names.match(tokens(name)) or ""
            if len(self._name_cache) >= _CACHE_LIMIT:
                self._name_cache.clear()
            self._name_cache[name] = stage
        return stage or None

    def service_stage(self, service: str) -> str | None:
        """The stage the ``[[service]]`` rules give ``service``, or None."""
        stage = self._service_cache.get(service)
        if stage is None:
            stage = self._services.match(tokens(service)) or ""
            if len(self._service_cache) >= _CACHE_LIMIT:
                self._service_cache.clear()
            self._service_cache[service] = stage
        return stage or None

    def attribute_stage(self, attributes: dict[str, Any]) -> str | None:
        """The stage the ``[[attribute]]`` rules give these attributes, or None."""
        if not attributes or not self.attribute_rules:
            return None
        if self._value_prefixes:  # a value rule on a key prefix: no cheap signature
            return self._attribute_stage_uncached(attributes)
        # The outcome depends only on which keys are present plus the values of the keys
        # some rule compares; that is the cache key.
        signature: Any = tuple(attributes)
        for key in self._value_keys:
            if key in attributes:
                signature = (signature, key, _value_text(attributes[key]))
        stage = self._attr_cache.get(signature)
        if stage is None:
            stage = self._attribute_stage_uncached(attributes) or ""
            if len(self._attr_cache) >= _CACHE_LIMIT:
                self._attr_cache.clear()
            self._attr_cache[signature] = stage
        return stage or None

    def _attribute_stage_uncached(self, attributes: dict[str, Any]) -> str | None:
        for rule in self.attribute_rules:
            if rule.matches(attributes):
                return rule.stage
        return None

    # -- the whole decision ------------------------------------------------------------

    def stage_of(self, span: SpanRecord) -> str:
        """The stage of one span (see the module docstring for the order)."""
        attributes = span.attributes
        explicit = attributes.get("mm.stage") if attributes else None
        if explicit is not None and isinstance(explicit, str):
            if explicit in _STAGE_SET:
                return explicit
            explicit = explicit.strip().lower()
            if explicit in _STAGE_SET:
                return explicit
        if span.kind in _NETWORK_KINDS:
            return "network"
        stage = self._name_cache.get(span.name)  # inline fast path of name_stage()
        if stage is None:
            stage = self.name_stage(span.name) or ""
        if stage:
            return stage
        return (
            self.attribute_stage(attributes)
            or self.service_stage(span.service)
            or "other"
        )

    def tag(self, spans: Iterable[SpanRecord]) -> None:
        """Set ``.stage`` and ``.signals`` (ingest/signals.py) on every span."""
        stage_of = self.stage_of
        for span in spans:
            span.stage = stage_of(span)
            span.signals = span_signals(span)

    def clear_cache(self) -> None:
        self._name_cache.clear()
        self._attr_cache.clear()
        self._service_cache.clear()


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------

_SECTIONS = ("name", "attribute", "service")
_SECTION_KEYS = {
    "name": {"stage", "patterns"},
    "service": {"stage", "patterns"},
    "attribute": {"stage", "keys", "values"},
}


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


def parse_rules(text: str, path: str = "<rules>") -> StageRules:
    """Build :class:`StageRules` from TOML text; errors name ``path`` and a line."""
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
                f"unknown section {top!r} (expected [[name]], [[attribute]] or [[service]])",
            )
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            raise RulesError(
                path, where.table(top) or where.key("", 0, top),
                f"{top!r} must be an array of tables: write [[{top}]]",
            )

    def fail(section: str, index: int, key: str | None, reason: str, needle: str | None = None):
        line = where.key(section, index, key, needle) if key else where.table(section, index)
        return RulesError(path, line, f"[[{section}]] #{index + 1}: {reason}")

    def stage_of_table(section: str, index: int, table: dict[str, Any]) -> str:
        if "stage" not in table:
            raise fail(section, index, None, "missing 'stage'")
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
            out.append(item)
        return tuple(out)

    def check_keys(section: str, index: int, table: dict[str, Any]) -> None:
        for key in table:
            if key not in _SECTION_KEYS[section]:
                allowed = ", ".join(sorted(_SECTION_KEYS[section]))
                raise fail(section, index, key, f"unknown key {key!r} (expected {allowed})")

    pattern_rules: dict[str, list[PatternRule]] = {"name": [], "service": []}
    for section in ("name", "service"):
        for index, table in enumerate(data.get(section, [])):
            check_keys(section, index, table)
            stage = stage_of_table(section, index, table)
            if "patterns" not in table:
                raise fail(section, index, None, "missing 'patterns'")
            patterns = strings(section, index, table, "patterns", "pattern")
            pattern_rules[section].append(PatternRule(stage, patterns))

    attribute_rules: list[AttributeRule] = []
    for index, table in enumerate(data.get("attribute", [])):
        check_keys("attribute", index, table)
        stage = stage_of_table("attribute", index, table)
        if "keys" not in table:
            raise fail("attribute", index, None, "missing 'keys'")
        keys = strings("attribute", index, table, "keys", "key")
        for key in keys:
            if not key or "*" in key[:-1] or key == "*":
                raise fail(
                    "attribute", index, "keys",
                    f"key {key!r}: use an exact key or a prefix ending in '*' (e.g. 'gen_ai.*')",
                    repr(key)[1:-1],
                )
        values = None
        if "values" in table:
            raw = table["values"]
            if not isinstance(raw, list) or not all(
                isinstance(v, (str, int, float, bool)) for v in raw
            ):
                raise fail("attribute", index, "values", "'values' must be a list of strings, numbers or booleans")
            values = tuple(_value_text(v) for v in raw)
        attribute_rules.append(AttributeRule(stage, keys, values))

    return StageRules(pattern_rules["name"], attribute_rules, pattern_rules["service"], source=path)


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
