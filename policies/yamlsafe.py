"""Safe, line-tracking YAML and JSON reading for policy files.

Why not ``yaml.safe_load``: it gives no line numbers, and it reads YAML 1.1, where
``NO`` (Norway's country code), ``yes``, ``on`` and ``off`` are booleans and duplicate
keys silently keep the last value. Policy files are compliance rules, so this module:

* composes the node tree with PyYAML's pure-Python scanner/parser/composer (no
  constructor ever runs, so ``!!python/...`` can never execute anything) and builds
  plain data itself, recording the line of every field path;
* resolves plain scalars with the YAML 1.2 core schema (``true``/``false`` only are
  booleans; ``NO`` stays a string) and never resolves timestamps;
* accepts only the standard tags for strings, numbers, booleans, null, lists and
  mappings — any other tag (``!!python/object``, ``!custom``, ``!!binary``, merge
  keys ``<<``) is an error naming the line;
* rejects duplicate keys and non-string keys;
* caps nesting depth, alias count and the number of nodes after alias expansion, so a
  "billion laughs" document fails fast instead of exhausting memory.

JSON files are parsed by :mod:`json` (strict: no NaN, no duplicate keys) and their
lines are recovered by composing the same text as YAML (JSON is YAML 1.2 flow syntax).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from policies.errors import ReadError as ReadError  # raised here; re-exported

#: One segment of a field path: a mapping key or a list index.
PathPart = str | int
Path = tuple[PathPart, ...]

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_MERGE = "tag:yaml.org,2002:merge"


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps on one document. The defaults are far above any real policy file (the
    shipped examples use depth 7, no aliases, a few hundred nodes)."""

    max_depth: int = 64
    max_aliases: int = 100
    max_nodes: int = 200_000


def format_path(path: Path) -> str:
    """``("spec", "rules", 2, "match")`` → ``spec.rules[2].match``; ``()`` → ``<root>``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "<root>"


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """Plain data (dicts, lists, str, int, float, bool, None) and where each path starts."""

    data: Any
    lines: Mapping[Path, int]
    start_line: int

    def line_of(self, path: Path) -> int:
        """Line of ``path``, or of its nearest ancestor that has one."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return self.start_line


class _CoreResolver(BaseResolver):
    """Implicit scalar resolution per the YAML 1.2 core schema (yaml.org/spec/1.2.2 §10.3),
    plus merge keys so that ``<<`` can be rejected by name rather than read as a field."""


_CoreResolver.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_CoreResolver.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_CoreResolver.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
_CoreResolver.add_implicit_resolver(
    _NULL, re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
_CoreResolver.add_implicit_resolver(_MERGE, re.compile(r"^<<$"), ["<"])


class _Composer(Reader, Scanner, Parser, Composer, _CoreResolver):
    """Text → node tree, with depth and alias caps. Never constructs Python objects."""

    def __init__(self, text: str, limits: Limits) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _CoreResolver.__init__(self)
        self._limits = limits
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(AliasEvent):
            self._aliases += 1
            if self._aliases > self._limits.max_aliases:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ReadError(mark.line + 1, f"more than {self._limits.max_aliases} YAML aliases")
        self._depth += 1
        try:
            if self._depth > self._limits.max_depth:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ReadError(
                    mark.line + 1, f"nested deeper than {self._limits.max_depth} levels"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Builder:
    """Node tree → plain data and a path → line map, expanding aliases under a budget."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._visited = 0
        self._active: set[int] = set()
        self.lines: dict[Path, int] = {}

    def build(self, node: Node, path: Path) -> Any:
        self._visited += 1
        if self._visited > self._limits.max_nodes:
            raise ReadError(
                node.start_mark.line + 1,
                f"more than {self._limits.max_nodes} values after expanding aliases "
                "(an alias bomb?)",
                path,
            )
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, ScalarNode):
            return _scalar(node, path)
        if id(node) in self._active:
            raise ReadError(node.start_mark.line + 1, "recursive YAML alias", path)
        self._active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                _require_tag(node, _SEQ, path)
                return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
            if isinstance(node, MappingNode):
                _require_tag(node, _MAP, path)
                return self._mapping(node, path)
        finally:
            self._active.discard(id(node))
        raise ReadError(node.start_mark.line + 1, "unsupported YAML node", path)

    def _mapping(self, node: MappingNode, path: Path) -> dict[str, Any]:
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE:
                raise ReadError(line, "YAML merge keys ('<<') are not supported", path)
            if not isinstance(key_node, ScalarNode) or key_node.tag != _STR:
                raise ReadError(line, "mapping keys must be plain strings", path)
            key = key_node.value
            if key in result:
                raise ReadError(
                    line, f"duplicate key {key!r} (first at line {first_line[key]})", path
                )
            first_line[key] = line
            self.lines[(*path, key)] = line
            result[key] = self.build(value_node, (*path, key))
        return result


def _require_tag(node: Node, tag: str, path: Path) -> None:
    if node.tag != tag:
        raise ReadError(node.start_mark.line + 1, _unsafe_tag_message(node.tag), path)


def _unsafe_tag_message(tag: str) -> str:
    shown = tag.replace("tag:yaml.org,2002:", "!!")
    return (
        f"unsafe or unsupported YAML tag {shown!r}: only plain strings, numbers, booleans, "
        "null, lists and mappings are allowed"
    )


def _scalar(node: ScalarNode, path: Path) -> Any:
    value: str = node.value
    line = node.start_mark.line + 1
    if node.tag == _STR:
        return value
    if node.tag == _NULL:
        return None
    if node.tag == _BOOL:
        return value.lower() == "true"
    try:
        if node.tag == _INT:
            return _int(value)
        if node.tag == _FLOAT:
            return _float(value)
    except ValueError:
        raise ReadError(line, f"not a valid number: {value!r}", path) from None
    raise ReadError(line, _unsafe_tag_message(node.tag), path)


def _int(value: str) -> int:
    if value.startswith("0o"):
        return int(value[2:], 8)
    if value.startswith("0x"):
        return int(value[2:], 16)
    return int(value, 10)


def _float(value: str) -> float:
    lowered = value.lower()
    if lowered.endswith(".inf"):
        return float("-inf") if lowered.startswith("-") else float("inf")
    if lowered == ".nan":
        return float("nan")
    return float(value)


def _compose_all(text: str, limits: Limits) -> Iterator[Node]:
    composer = _Composer(text, limits)
    try:
        while composer.check_node():
            node = composer.get_node()
            if node is not None:
                yield node
    finally:
        composer.dispose()


def parse_yaml(text: str, limits: Limits | None = None) -> list[ParsedDocument]:
    """Every document in ``text`` (``---``-separated), as plain data with line numbers.

    Raises:
        ReadError: malformed YAML, an unsafe tag, a duplicate key, or a cap exceeded.
    """
    limits = limits or Limits()
    documents = []
    try:
        for node in _compose_all(text, limits):
            builder = _Builder(limits)
            data = builder.build(node, ())
            documents.append(
                ParsedDocument(data, MappingProxyType(builder.lines), node.start_mark.line + 1)
            )
    except yaml.MarkedYAMLError as exc:
        raise ReadError(*_describe_yaml_error(exc)) from None
    except yaml.YAMLError as exc:
        raise ReadError(0, f"malformed YAML: {exc}") from None
    except RecursionError:
        raise ReadError(0, "YAML nested too deeply") from None
    return documents


def _describe_yaml_error(exc: yaml.MarkedYAMLError) -> tuple[int, str]:
    """Line and message. When PyYAML knows where the construct in trouble started (an
    unclosed ``[`` or quote), that line is the one to fix; the message says both."""
    parts = [p for p in (exc.context, exc.problem) if p]
    message = "malformed YAML: " + ("; ".join(parts) or "syntax error")
    problem, context = exc.problem_mark, exc.context_mark
    if problem is not None:
        message += f" (line {problem.line + 1}, column {problem.column + 1})"
    mark = context or problem
    return (mark.line + 1 if mark is not None else 0), message


def parse_json(text: str, limits: Limits | None = None) -> list[ParsedDocument]:
    """One JSON document (strict JSON), with line numbers recovered via the YAML composer."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ReadError(exc.lineno, f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise ReadError(0, "JSON nested too deeply") from None
    lines: Mapping[Path, int] = MappingProxyType({})
    try:
        located = parse_yaml(text, limits)
        if len(located) == 1:
            lines = located[0].lines
    except ReadError:
        pass  # valid JSON the YAML composer cannot follow: errors carry no line then
    _check_depth(data, (limits or Limits()).max_depth)
    return [ParsedDocument(data, lines, 1)]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ReadError(0, f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> float:
    raise ReadError(0, f"{name} is not valid JSON")


def _check_depth(data: Any, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            raise ReadError(0, f"nested deeper than {max_depth} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
