"""Policy files → validated documents → a :class:`~policies.policyset.PolicySet`.

Loading is all-or-nothing: every file of a directory is read and validated, every
problem is collected, and either a complete policy set comes back or
:class:`~policies.errors.PolicyValidationError` lists every problem as
``file:line: path: message``. Nothing is returned half-loaded.

Each file is size-checked *before* it is parsed (default 1 MiB), so a runaway or
hostile file costs a ``stat`` and a bounded read, never a parse.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from policies.documents import DOCUMENT_TYPES, Kind, PolicyDocument
from policies.errors import PolicyValidationError, Problem
from policies.policyset import LoadedDocument, PolicySet, build_policy_set
from policies.types import FORMAT_ERROR
from policies.yamlsafe import (
    Limits,
    ParsedDocument,
    ReadError,
    format_path,
    parse_json,
    parse_yaml,
)
from policies.yamlsafe import Path as FieldPath

#: Default per-file size limit. The largest shipped file (the default jurisdictions) is
#: about 6 KiB; 1 MiB leaves room for thousands of rules while bounding parse cost.
DEFAULT_MAX_BYTES = 1 << 20

POLICY_SUFFIXES = (".yaml", ".yml", ".json")


class Format(StrEnum):
    YAML = "yaml"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class LoadOptions:
    max_bytes: int = DEFAULT_MAX_BYTES
    limits: Limits = field(default_factory=Limits)
    #: Add the built-in jurisdictions (EU, EEA, GDPR, US, …) to what is loaded.
    include_defaults: bool = True


def builtin_jurisdictions_path() -> Path:
    return Path(str(resources.files("policies") / "data" / "jurisdictions.yaml"))


def examples_path() -> Path:
    return Path(str(resources.files("policies") / "examples"))


def load_paths(paths: Iterable[str | Path], options: LoadOptions | None = None) -> PolicySet:
    """Load files and directories (their ``*.yaml``, ``*.yml``, ``*.json``, sorted)
    into one policy set.

    Raises:
        PolicyValidationError: every problem found, in every file.
    """
    return build_policy_set(load_documents(paths, options))


def load_documents(
    paths: Iterable[str | Path], options: LoadOptions | None = None
) -> tuple[LoadedDocument, ...]:
    """Each document of the files and directories, validated on its own but not
    cross-checked (``gtm policy apply`` checks them together with the stored ones).

    Raises:
        PolicyValidationError: every problem found, in every file.
    """
    options = options or LoadOptions()
    documents: list[LoadedDocument] = []
    problems: list[Problem] = []
    files, listing_problems = _expand(paths)
    problems.extend(listing_problems)
    if options.include_defaults:
        documents.extend(load_file(builtin_jurisdictions_path()))
    for file in files:
        try:
            documents.extend(load_file(file, options))
        except PolicyValidationError as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyValidationError(tuple(problems))
    return tuple(documents)


def load_examples(options: LoadOptions | None = None) -> PolicySet:
    """The example policies shipped in ``policies/examples`` (used by ``gtm up``)."""
    return load_paths([examples_path()], options)


def _expand(paths: Iterable[str | Path]) -> tuple[list[Path], list[Problem]]:
    files: list[Path] = []
    problems: list[Problem] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p
                for p in path.iterdir()
                if p.suffix in POLICY_SUFFIXES and not p.name.startswith(".") and p.is_file()
            )
            if not found:
                problems.append(
                    Problem(str(path), 0, "<root>", "directory holds no .yaml/.yml/.json files")
                )
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            problems.append(Problem(str(path), 0, "<root>", "no such file or directory"))
    return files, problems


def load_file(path: Path, options: LoadOptions | None = None) -> tuple[LoadedDocument, ...]:
    """Read, size-check, parse and validate one file (without cross-file checks)."""
    options = options or LoadOptions()
    source = str(path)
    try:
        with path.open("rb") as stream:
            size = path.stat().st_size
            if size > options.max_bytes:
                raise _too_large(source, size, options.max_bytes)
            raw = stream.read(options.max_bytes + 1)  # the file may grow after the stat
    except OSError as exc:
        raise PolicyValidationError(
            (Problem(source, 0, "<root>", f"cannot read: {exc.strerror}"),)
        ) from None
    if len(raw) > options.max_bytes:
        raise _too_large(source, len(raw), options.max_bytes)
    fmt = Format.JSON if path.suffix == ".json" else Format.YAML
    return load_bytes(raw, source, fmt, options)


def _too_large(source: str, size: int, limit: int) -> PolicyValidationError:
    return PolicyValidationError(
        (
            Problem(
                source,
                0,
                "<root>",
                f"file is {size} bytes, more than the {limit}-byte limit for one policy file "
                "(split it, or raise the limit with --max-bytes)",
            ),
        )
    )


def load_bytes(
    raw: bytes, source: str, fmt: Format, options: LoadOptions | None = None
) -> tuple[LoadedDocument, ...]:
    """Parse and validate the documents in ``raw`` (a file's or a store value's bytes)."""
    options = options or LoadOptions()
    if len(raw) > options.max_bytes:
        raise _too_large(source, len(raw), options.max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PolicyValidationError(
            (Problem(source, line, "<root>", "not valid UTF-8 text"),)
        ) from None
    try:
        parse = parse_json if fmt is Format.JSON else parse_yaml
        parsed = parse(text, options.limits)
    except ReadError as exc:
        raise PolicyValidationError(
            (Problem(source, exc.line, format_path(exc.path), exc.message),)
        ) from None
    if not parsed:
        raise PolicyValidationError((Problem(source, 1, "<root>", "file holds no document"),))
    documents: list[LoadedDocument] = []
    problems: list[Problem] = []
    for doc in parsed:
        try:
            documents.append(validate_document(doc, source))
        except PolicyValidationError as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyValidationError(tuple(problems))
    return tuple(documents)


def validate_document(parsed: ParsedDocument, source: str) -> LoadedDocument:
    """One parsed document → its typed model, or every problem with file, line and path."""
    data = parsed.data

    def problem(path: FieldPath, message: str) -> PolicyValidationError:
        return PolicyValidationError(
            (Problem(source, parsed.line_of(path), format_path(path), message),)
        )

    if not isinstance(data, dict):
        raise problem((), f"expected a mapping with {_ENVELOPE}, got {_describe(data)}")
    kind_value = data.get("kind")
    if kind_value is None:
        raise problem((), f"missing 'kind' (expected one of {_KINDS})")
    try:
        kind = Kind(kind_value)
    except ValueError:
        raise problem(("kind",), f"expected one of {_KINDS}, got {kind_value!r}") from None
    model = DOCUMENT_TYPES[kind]
    try:
        document: PolicyDocument = model.model_validate(data)
    except ValidationError as exc:
        errors = _without_echoes(exc.errors())
        raise PolicyValidationError(
            tuple(_problem_from(error, model, parsed, source) for error in errors)
        ) from None
    return LoadedDocument(source=source, document=document, parsed=parsed)


_ENVELOPE = "'apiVersion', 'kind', 'metadata' and 'spec'"
_KINDS = ", ".join(k.value for k in Kind)


# ---------------------------------------------------------------------------- pydantic errors


def _without_echoes(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """Drop "too short after validation" errors on a list whose items failed: pydantic
    reports both, but only the item's problem is news to the author."""
    inner = {tuple(e["loc"][:i]) for e in errors for i in range(len(e["loc"]))}
    return [e for e in errors if not (e["type"] == "too_short" and tuple(e["loc"]) in inner)]


def _problem_from(
    error: ErrorDetails, model: type[BaseModel], parsed: ParsedDocument, source: str
) -> Problem:
    loc: FieldPath = tuple(error["loc"])
    message = _message(error, model, loc)
    return Problem(source, parsed.line_of(loc), format_path(loc), message)


def _message(error: ErrorDetails, model: type[BaseModel], loc: FieldPath) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        hint = f" (expected one of: {', '.join(allowed)})" if allowed else ""
        return f"unknown field {loc[-1]!r}{hint}"
    if kind == FORMAT_ERROR:
        return f"{error['msg']}, got {error.get('input')!r}"
    if kind == "value_error":
        # Our validators phrase the message; pydantic prefixes "Value error, ".
        return str(error["msg"]).removeprefix("Value error, ")
    msg = str(error["msg"]).replace("Input should be", "expected", 1)
    if msg.startswith("expected"):
        return f"{msg}, got {_describe(error.get('input'))}"
    return msg


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _fields_at(model: type[BaseModel], loc: FieldPath) -> list[str]:
    """Field names (by alias) of the model found by following ``loc`` from ``model``."""
    current: Any = model
    for part in loc:
        current = _step(current, part)
        if current is None:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or name for name, f in current.model_fields.items()]
    return []


def _step(annotation: Any, part: str | int) -> Any:
    annotation = _unwrap(annotation)
    if isinstance(part, int):
        args = typing.get_args(annotation)
        return args[0] if args else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, info in annotation.model_fields.items():
            if part in (name, info.alias):
                return _unwrap(info.annotation)
    return None


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` down to the interesting type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation
