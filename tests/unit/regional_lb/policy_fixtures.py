"""Policy sets for the regional LB's tests: the example regions, residency rules and
routing profiles, with test tenants whose API keys are cheap to verify."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import yaml

from gtm.policy_store import ActivePolicy, activate
from policies.apikeys import ScryptCost, hash_key
from policies.loader import examples_path, load_paths

#: Tests only: production hashes use the default (much slower) scrypt cost.
FAST = ScryptCost(n=1024)

#: tenant id -> API key. ``acme-health`` is pinned to the US with on_saturation: reject
#: by the example residency rules; ``demo-eu`` is EU-only.
KEYS: Mapping[str, str] = {
    "alpha": "gtm-alpha-secret",
    "beta": "gtm-beta-secret",
    "demo-eu": "gtm-demoeu-secret",
    "acme-health": "gtm-acme-secret",
}

DEFAULT_QUOTAS: Mapping[str, Mapping[str, object]] = {
    "alpha": {"requests_per_minute": 6000, "max_concurrent": 64},
    "beta": {"requests_per_minute": 6000, "max_concurrent": 64},
    "demo-eu": {"requests_per_minute": 6000},
    "acme-health": {"requests_per_minute": 6000},
}


@functools.cache
def _hash(key: str) -> str:
    return hash_key(key, FAST)


def tenants_document(
    quotas: Mapping[str, Mapping[str, object]] | None = None,
    priorities: Mapping[str, str] | None = None,
) -> dict[str, object]:
    tenants = []
    for tenant_id, key in KEYS.items():
        entry: dict[str, object] = {
            "id": tenant_id,
            "priority": (priorities or {}).get(tenant_id, "interactive"),
            "api_keys": [{"id": key.split("-")[1], "hash": _hash(key)}],
            "quotas": dict((quotas or DEFAULT_QUOTAS).get(tenant_id, {})),
        }
        tenants.append(entry)
    return {
        "apiVersion": "gtm.dev/v1",
        "kind": "Tenants",
        "metadata": {"name": "test-tenants"},
        "spec": {"tenants": tenants},
    }


def policy(
    directory: Path,
    quotas: Mapping[str, Mapping[str, object]] | None = None,
    priorities: Mapping[str, str] | None = None,
    *,
    regional_scorer: str = "ttft-scorer",
) -> ActivePolicy:
    """The example policies with the test tenants (written under ``directory``);
    ``regional_scorer`` replaces the type of the regional profile's TTFT scorer."""
    directory.mkdir(parents=True, exist_ok=True)
    tenants = directory / "tenants.yaml"
    tenants.write_text(yaml.safe_dump(tenants_document(quotas, priorities)))
    examples = examples_path()
    routing = directory / "routing-profiles.yaml"
    text = (examples / "routing-profiles.yaml").read_text()
    routing.write_text(
        text.replace(
            "- {type: ttft-scorer, name: ttft}", f"- {{type: {regional_scorer}, name: ttft}}"
        )
    )
    files = [examples / name for name in ("jurisdictions.yaml", "regions.yaml", "residency.yaml")]
    return activate(1, load_paths([*files, routing, tenants]))
