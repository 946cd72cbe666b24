"""Where the global tier's residency decisions go: the hash-chained audit trail.

Every residency decision of a request — the verdict, the region chosen (or none, for a
refusal), each retry's region — is one :func:`policies.decision_record` line. Records
hold ids, codes and country codes only: never prompt text (policies.audit).
"""

from __future__ import annotations

import threading
from typing import Protocol

from policies import AuditRecord, AuditWriter


class AuditSink(Protocol):
    def append(self, record: AuditRecord, /) -> object: ...


class MemoryAudit:
    """Keeps records in a list (tests, ``gtm route``): a verified fake of the writer."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []
        self._lock = threading.Lock()

    def append(self, record: AuditRecord, /) -> object:
        with self._lock:
            self.records.append(record)
        return record


__all__ = ["AuditSink", "AuditWriter", "MemoryAudit"]
