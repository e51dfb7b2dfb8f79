"""Reading stage rules: a TOML rules file (``default_rules.toml`` next to this module is the
built-in set; ``MODALSCOPE_RULES`` names a replacement) into :class:`~.stages.StageRules`,
with one-line errors that name the file and line. Files in the older layout (``[[name]]``,
``[[attribute]]``, ``[[service]]`` sections) still load: see :func:`parse_rules`."""

from __future__ import annotations

import os
import re
import tomllib
from importlib import resources
from typing import Any

from ..core.spans import STAGES
from .stages import (_KINDS_BY_NAME, _STAGE_SET, STAGE_FROM_PARENT, STAGE_FROM_VALUE, Rule, StageRules, _value_text,
                     tokens)

__all__ = ["DEFAULT_RULES_FILE", "RulesError", "default_rules", "load_rules", "parse_rules"]

DEFAULT_RULES_FILE = "default_rules.toml"


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
