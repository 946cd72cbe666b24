"""Compliance policy files: schemas, loader, residency engine, tenants and audit trail.

This package is a leaf: it imports nothing else of gtm's, so compliance teams can
validate their files with it alone (``python -m policies policy check DIR``).

Typical use by a tier::

    policy_set = load_paths(["/etc/gtm/policies"])      # or from the store: gtm.policy_store
    engine = compile(policy_set)
    verdict = engine.allowed_regions(ResidencyQuery(tenant, model, data_class, country))
    if verdict.refused: ...                              # fail closed, verdict.reason says why
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policies.audit import (
        AuditRecord,
        AuditWriter,
        FsyncPolicy,
        Head,
        VerifyReport,
        decision_record,
        verify,
    )
    from policies.documents import API_VERSION, Kind, SaturationPolicy, json_schema
    from policies.errors import (
        ApiKeyError,
        AuditChainError,
        AuditError,
        PolicyConflictError,
        PolicyError,
        PolicyValidationError,
        Problem,
    )
    from policies.loader import LoadOptions, load_examples, load_paths
    from policies.policyset import PolicySet
    from policies.residency import ReasonCode, ResidencyEngine, ResidencyQuery, Verdict, compile
    from policies.tenants import TenantDirectory

#: Where each public name lives. The submodules are imported on first use of one of
#: their names, not with the package: ``gtm.models`` needs only :mod:`policies.types`
#: (shared field types), and a process that routes nothing (an emulated GPU worker)
#: should not build every policy document's validators. A tier that uses a name imports
#: it at its own module level, so a broken submodule still fails at start-up.
_HOMES = {
    "API_VERSION": "policies.documents",
    "ApiKeyError": "policies.errors",
    "AuditChainError": "policies.errors",
    "AuditError": "policies.errors",
    "AuditRecord": "policies.audit",
    "AuditWriter": "policies.audit",
    "compile": "policies.residency",
    "decision_record": "policies.audit",
    "FsyncPolicy": "policies.audit",
    "Head": "policies.audit",
    "json_schema": "policies.documents",
    "Kind": "policies.documents",
    "load_examples": "policies.loader",
    "load_paths": "policies.loader",
    "LoadOptions": "policies.loader",
    "PolicyConflictError": "policies.errors",
    "PolicyError": "policies.errors",
    "PolicySet": "policies.policyset",
    "PolicyValidationError": "policies.errors",
    "Problem": "policies.errors",
    "ReasonCode": "policies.residency",
    "ResidencyEngine": "policies.residency",
    "ResidencyQuery": "policies.residency",
    "SaturationPolicy": "policies.documents",
    "TenantDirectory": "policies.tenants",
    "Verdict": "policies.residency",
    "verify": "policies.audit",
    "VerifyReport": "policies.audit",
}

__all__ = [
    "API_VERSION",
    "ApiKeyError",
    "AuditChainError",
    "AuditError",
    "AuditRecord",
    "AuditWriter",
    "FsyncPolicy",
    "Head",
    "Kind",
    "LoadOptions",
    "PolicyConflictError",
    "PolicyError",
    "PolicySet",
    "PolicyValidationError",
    "Problem",
    "ReasonCode",
    "ResidencyEngine",
    "ResidencyQuery",
    "SaturationPolicy",
    "TenantDirectory",
    "Verdict",
    "VerifyReport",
    "compile",
    "decision_record",
    "json_schema",
    "load_examples",
    "load_paths",
    "verify",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'policies' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
