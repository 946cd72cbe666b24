"""What a ``gtm policy apply`` will change, document by document, before it changes it.

An apply writes and replaces only the documents it is given: the next generation is the
committed one with the given documents put in (a document is identified by its kind and
name, so a ``Tenants`` document named ``load-test`` replaces the stored one of that name
and nothing else). Documents the store holds and the apply was not given are *kept*;
they are deleted only with ``prune`` — then the given documents are the whole next
generation, as ``gtm up`` and a restore from a backup want.

:func:`plan_changes` is sans-io: it takes the committed documents (their stored canonical
JSON) and the given ones, and returns every document's fate with the policy set the next
generation will hold, cross-checked whole (a kept tenant must still name known regions).
:func:`field_diff` says what changed inside a changed document, one line per field, so a
dry run reads like a review.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from policies.policyset import LoadedDocument, PolicySet, build_policy_set, document_json


class Change(StrEnum):
    """A document's fate in one apply."""

    ADDED = "added"
    CHANGED = "changed"
    UNCHANGED = "unchanged"
    #: Stored, not given, no prune: stays in the next generation.
    KEPT = "kept"
    #: Stored, not given, prune: deleted after the commit.
    DELETED = "deleted"
    #: Under the policy prefix but named by no commit (written by an apply that did not
    #: commit): never in force, removed by the next apply that commits.
    DISCARDED = "discarded"


@dataclass(frozen=True, slots=True)
class DocumentChange:
    kind: str
    name: str
    change: Change
    before: bytes | None  # the stored canonical JSON
    after: bytes | None  # what the apply writes

    @property
    def ref(self) -> str:
        """``Kind/name``: how every output names a document."""
        return f"{self.kind}/{self.name}"

    def fields(self, limit: int = 12) -> list[str]:
        """The field-level diff of a changed document (:func:`field_diff`)."""
        if self.before is None or self.after is None:
            return []
        return field_diff(json.loads(self.before), json.loads(self.after), limit=limit)


@dataclass(frozen=True, slots=True)
class ApplyPlan:
    """Every document's fate and the policy set of the next generation."""

    base_generation: int  # the committed generation the plan starts from (0: none)
    base_revision: int  # the store revision it was read at
    prune: bool
    policy_set: PolicySet
    changes: tuple[DocumentChange, ...]

    def of(self, *changes: Change) -> tuple[DocumentChange, ...]:
        return tuple(c for c in self.changes if c.change in changes)

    @property
    def writes(self) -> bool:
        """Whether applying it commits a new generation."""
        return bool(self.of(Change.ADDED, Change.CHANGED, Change.DELETED))

    def counts(self) -> str:
        """``1 added, 2 changed, …``: every fate that occurs, in a fixed order."""
        parts = [f"{len(self.of(c))} {c.value}" for c in Change if self.of(c)]
        return ", ".join(parts) or "nothing"


def plan_changes(
    committed: Sequence[LoadedDocument],
    stored: Mapping[tuple[str, str], bytes],
    given: Sequence[LoadedDocument],
    *,
    prune: bool,
    base_generation: int,
    base_revision: int,
    named: Collection[tuple[str, str]] | None = None,
) -> ApplyPlan:
    """The plan of applying ``given`` over the ``committed`` generation.

    Args:
        committed: the documents the committed generation names (needed without
            ``prune``, to cross-check the merged set; may be empty with ``prune``).
        stored: (kind, name) → stored value of every document under the policy prefix,
            committed or not.
        named: the (kind, name) of every document the commit names (default: those of
            ``committed``); a stored document it does not name is a leftover.

    Raises:
        PolicyValidationError / PolicyConflictError: the next generation does not
            validate as a whole (each problem names the file or store key).
    """
    given_refs = {(d.kind.value, d.name) for d in given}
    kept = [] if prune else [d for d in committed if (d.kind.value, d.name) not in given_refs]
    policy_set = build_policy_set([*kept, *given])
    in_commit = set(named) if named is not None else {(d.kind.value, d.name) for d in committed}
    changes = [_given_change(d, stored.get((d.kind.value, d.name))) for d in given]
    for ref, before in sorted(stored.items()):
        if ref in given_refs:
            continue
        if ref not in in_commit:
            change = Change.DISCARDED
        else:
            change = Change.DELETED if prune else Change.KEPT
        changes.append(DocumentChange(*ref, change=change, before=before, after=None))
    order = {c: i for i, c in enumerate(Change)}
    changes.sort(key=lambda c: (order[c.change], c.kind, c.name))
    return ApplyPlan(base_generation, base_revision, prune, policy_set, tuple(changes))


def _given_change(doc: LoadedDocument, before: bytes | None) -> DocumentChange:
    after = document_json(doc.document)
    if before is None:
        change = Change.ADDED
    else:
        change = Change.UNCHANGED if before == after else Change.CHANGED
    return DocumentChange(doc.kind.value, doc.name, change, before, after)


# ---------------------------------------------------------------------------- field diff

#: Keys that identify an entry of a list (tenants, rules, regions, plugins, …): such
#: lists are compared entry by entry, so one edited tenant is one line, not the list.
_IDENTITY_KEYS = ("id", "name", "type")
#: Longest value shown in a diff line.
_SHOWN = 72


def field_diff(before: Any, after: Any, *, limit: int = 12) -> list[str]:
    """What changed from ``before`` to ``after`` (JSON values), one line per field:
    ``path: old → new``, ``+ path: new`` (added), ``- path: old`` (removed); at most
    ``limit`` lines, then how many more."""
    lines = list(_diff(before, after, ""))
    if len(lines) > limit:
        lines = [*lines[:limit], f"… {len(lines) - limit} more field change(s)"]
    return lines


def _diff(before: Any, after: Any, path: str) -> Iterable[str]:
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(before.keys() | after.keys()):
            yield from _member(before, after, key, f"{path}.{key}" if path else key)
        return
    if isinstance(before, list) and isinstance(after, list):
        identity = _identity(before, after)
        if identity is not None:
            old = {entry[identity]: entry for entry in before}
            new = {entry[identity]: entry for entry in after}
            for key in [*old, *(k for k in new if k not in old)]:
                yield from _member(old, new, key, f"{path}[{key}]")
            return
        if len(before) == len(after):
            for index, (a, b) in enumerate(zip(before, after, strict=True)):
                yield from _diff(a, b, f"{path}[{index}]")
            return
    yield f"{path or '<root>'}: {_show(before)} → {_show(after)}"


def _member(
    before: Mapping[Any, Any], after: Mapping[Any, Any], key: Any, path: str
) -> Iterable[str]:
    if key not in after:
        yield f"- {path}: {_show(before[key])}"
    elif key not in before:
        yield f"+ {path}: {_show(after[key])}"
    else:
        yield from _diff(before[key], after[key], path)


def _identity(before: list[Any], after: list[Any]) -> str | None:
    """The key every entry of both lists has, unique in each, if any."""
    entries = [*before, *after]
    if not entries or not all(isinstance(e, dict) for e in entries):
        return None
    for key in _IDENTITY_KEYS:
        if all(isinstance(e.get(key), str) for e in entries) and all(
            len({e[key] for e in side}) == len(side) for side in (before, after)
        ):
            return key
    return None


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"
