"""The policies exception tree. Every error this package raises on purpose is a
:class:`PolicyError`; library errors (yaml, json, pydantic) are translated at the point
where the library is called (:mod:`policies.yamlsafe`, :mod:`policies.loader`)::

    PolicyError
    ├── ReadError                   one file's YAML/JSON cannot be read safely (line, path);
    │                               the loader turns it into a PolicyValidationError
    ├── PolicyValidationError       one or more problems in policy files (file, line, path)
    │   └── PolicyConflictError     rules that contradict each other (e.g. two allows)
    ├── ApiKeyError                 an API key that is malformed or matches no tenant
    └── AuditError                  the audit trail cannot be written or read
        └── AuditChainError         an existing log ends in a damaged record; refuse to append

``policies`` is a leaf package (it imports nothing else of gtm's), so this tree is
separate from :class:`gtm.errors.GtmError`; gtm code that calls into policies catches
:class:`PolicyError` at its boundary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a policy file, located as precisely as the input allows.

    ``line`` is 1-based, or 0 when unknown (e.g. a problem with a whole directory).
    ``path`` is the field path inside the document (``spec.rules[2].match``), or
    ``<root>`` for the document itself.
    """

    file: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path}: {self.message}"


class PolicyError(Exception):
    """Root of every error the policies package raises on purpose."""


class ReadError(PolicyError):
    """A problem reading one file (:mod:`policies.yamlsafe`), with its 1-based line (0 when
    unknown) and the field path it is at. :mod:`policies.loader` turns it into a
    :class:`Problem` of a :class:`PolicyValidationError`, naming the file."""

    def __init__(self, line: int, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.line = line
        self.message = message
        self.path = path


class PolicyValidationError(PolicyError):
    """Policy input is invalid. ``problems`` lists every problem found, one per line."""

    def __init__(self, problems: tuple[Problem, ...]) -> None:
        if not problems:
            raise ValueError("PolicyValidationError needs at least one problem")
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class PolicyConflictError(PolicyValidationError):
    """Two rules contradict each other and no precedence rule decides between them."""


class ApiKeyError(PolicyError):
    """An API key is malformed, or matches no tenant (the message never contains the key)."""


class AuditError(PolicyError):
    """The audit trail cannot be written or read."""


class AuditChainError(AuditError):
    """An existing audit file ends in a damaged record, so the chain cannot be continued.

    The writer refuses to append rather than start a chain that ``verify`` would flag;
    an operator must inspect the file (``gtm audit verify``) and move it aside.
    """
