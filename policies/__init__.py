"""Compliance policy files: schemas, loader, residency engine, tenants and audit trail.

This package is a leaf: it imports nothing else of gtm's, so compliance teams can
validate their files with it alone (``python -m policies policy check DIR``).

Typical use by a tier::

    policy_set = load_paths(["/etc/gtm/policies"])      # or from the store: gtm.policy_store
    engine = compile(policy_set)
    verdict = engine.allowed_regions(ResidencyQuery(tenant, model, data_class, country))
    if verdict.refused: ...                              # fail closed, verdict.reason says why
"""

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
