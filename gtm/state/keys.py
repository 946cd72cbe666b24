"""The key schema: the only module that builds state-store keys.

Everything gtm stores lives under ``/gtm/v1/``; a future incompatible layout moves to
``/gtm/v2/`` so that old and new binaries can run side by side during an upgrade.

==========================================  ===========================================
key                                         value (record, see gtm.models / policies)
==========================================  ===========================================
/gtm/v1/regions/{region}                    Region
/gtm/v1/zones/{region}/{zone}               Zone
/gtm/v1/gpus/{region}/{zone}/{gpu}          GpuWorker (leased by the worker/agent)
/gtm/v1/summaries/zones/{region}/{zone}     ZoneSummary (leased by the zone agent)
/gtm/v1/summaries/regions/{region}          RegionSummary (leased by the regional LB)
/gtm/v1/tenants/{tenant}                    Tenant
/gtm/v1/policies/{kind}/{name}              a policy document (policies package)
/gtm/v1/quota-leases/{tenant}/{replica}     a regional replica's capacity lease
/gtm/v1/drains/{target}/{id}                Drain
/gtm/v1/audit-anchors/{chain}               an audit chain's anchor (policies.audit.Anchor)
==========================================  ===========================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from gtm.models import DrainTarget

ROOT = "/gtm/v1/"

# \Z, not $: "$" also matches before a trailing newline, which would let "id\n" in.
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


class Kind(StrEnum):
    REGION = "regions"
    ZONE = "zones"
    GPU = "gpus"
    ZONE_SUMMARY = "summaries/zones"
    REGION_SUMMARY = "summaries/regions"
    TENANT = "tenants"
    POLICY = "policies"
    QUOTA_LEASE = "quota-leases"
    DRAIN = "drains"
    AUDIT_ANCHOR = "audit-anchors"


def _seg(value: str) -> str:
    if not _SEGMENT.match(value):
        raise ValueError(f"invalid key segment {value!r}")
    return value


def prefix(kind: Kind, *parents: str) -> str:
    """The prefix for all keys of ``kind`` (optionally under parent ids), ending in ``/``."""
    return ROOT + kind.value + "/" + "".join(_seg(p) + "/" for p in parents)


def region(region_id: str) -> str:
    return prefix(Kind.REGION) + _seg(region_id)


def zone(region_id: str, zone_id: str) -> str:
    return prefix(Kind.ZONE, region_id) + _seg(zone_id)


def gpu(region_id: str, zone_id: str, gpu_id: str) -> str:
    return prefix(Kind.GPU, region_id, zone_id) + _seg(gpu_id)


def zone_summary(region_id: str, zone_id: str) -> str:
    return prefix(Kind.ZONE_SUMMARY, region_id) + _seg(zone_id)


def region_summary(region_id: str) -> str:
    return prefix(Kind.REGION_SUMMARY) + _seg(region_id)


def tenant(tenant_id: str) -> str:
    return prefix(Kind.TENANT) + _seg(tenant_id)


def policy(kind: str, name: str) -> str:
    return prefix(Kind.POLICY, kind) + _seg(name)


def quota_lease(tenant_id: str, replica_id: str) -> str:
    return prefix(Kind.QUOTA_LEASE, tenant_id) + _seg(replica_id)


def drain(target: DrainTarget, target_id: str) -> str:
    return prefix(Kind.DRAIN, target.value) + _seg(target_id)


def audit_anchor(chain_id: str) -> str:
    return prefix(Kind.AUDIT_ANCHOR) + _seg(chain_id)


@dataclass(frozen=True, slots=True)
class ParsedKey:
    kind: Kind
    parts: tuple[str, ...]


# Longest kind first, so "summaries/zones" wins over a hypothetical "summaries".
_KINDS_BY_LENGTH = sorted(Kind, key=lambda k: len(k.value), reverse=True)
_ARITY = {
    Kind.REGION: 1,
    Kind.ZONE: 2,
    Kind.GPU: 3,
    Kind.ZONE_SUMMARY: 2,
    Kind.REGION_SUMMARY: 1,
    Kind.TENANT: 1,
    Kind.POLICY: 2,
    Kind.QUOTA_LEASE: 2,
    Kind.DRAIN: 2,
    Kind.AUDIT_ANCHOR: 1,
}


def parse(key: str) -> ParsedKey | None:
    """Split a key into its kind and id parts; ``None`` for keys outside the schema."""
    if not key.startswith(ROOT):
        return None
    rest = key[len(ROOT) :]
    for kind in _KINDS_BY_LENGTH:
        head = kind.value + "/"
        if rest.startswith(head):
            parts = tuple(rest[len(head) :].split("/"))
            if len(parts) != _ARITY[kind] or not all(_SEGMENT.match(p) for p in parts):
                return None
            return ParsedKey(kind, parts)
    return None
