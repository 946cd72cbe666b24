"""The policy mutants: the shipped example policies, edited as an operator could.

``gtm up`` without ``--policies`` serves the examples (``policies/examples``) plus the
load-test tenant (``gtm/data/load-tenant.yaml``). A policy mutant writes that same set
to a folder with one file edited and launches the deployment with ``--policies`` on
it. The edits work on the parsed YAML by rule, tenant and profile name, so they follow
the examples as those change, and one that no longer finds what it edits fails
(:class:`PolicyEditError`) instead of silently editing nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gtm.errors import ConfigError
from policies.loader import examples_path

#: The load-test tenant ``gtm up`` adds to the examples (gtmctl.up.fleet).
LOAD_TENANT = "load-tenant.yaml"


class PolicyEditError(ConfigError):
    """A policy mutant's edit did not find what it edits in the example policies."""


Document = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PolicyEdit:
    """Edit the documents of one example file (its name in ``policies/examples``)."""

    file: str
    edit: Callable[[Document], Document]


def _spec(document: Document) -> dict[str, Any]:
    spec = document.get("spec")
    if not isinstance(spec, dict):
        raise PolicyEditError(f"{document.get('kind')}: no spec mapping")
    return spec


def residency_off(document: Document) -> Document:
    """Keep only the rules that allow every region: no tenant, jurisdiction or data
    class restricts where a request is served."""
    spec = _spec(document)
    rules = [r for r in spec.get("rules", []) if r.get("all_regions") is True]
    if not rules or len(rules) == len(spec.get("rules", [])):
        raise PolicyEditError("residency-off: expected restricting rules and an allow-all")
    spec["rules"] = rules
    return document


def no_spill(document: Document) -> Document:
    """A saturated region rejects: ``on_saturation: reject`` everywhere."""
    spec = _spec(document)
    if "on_saturation" not in spec:
        raise PolicyEditError("no-spill: the residency document sets no on_saturation")
    spec["on_saturation"] = "reject"
    for rule in spec.get("rules", []):
        if "on_saturation" in rule:
            rule["on_saturation"] = "reject"
    return document


def no_quota(document: Document) -> Document:
    """Every tenant without quotas (an omitted limit is unlimited)."""
    tenants = _spec(document).get("tenants", [])
    if not any("quotas" in t for t in tenants):
        raise PolicyEditError("no-quota: no tenant has quotas")
    for tenant in tenants:
        tenant.pop("quotas", None)
    return document


#: The regional profile of the examples and the picker that replaces its scorers.
REGIONAL_PROFILE = "regional-default"
RANDOM_PICKER = {"type": "random-picker", "name": "mutant-random"}


def regional_random_zone(document: Document) -> Document:
    """The regional profile without scorers and with a random picker: zones are
    picked blind to their queues and predicted TTFT."""
    spec = _spec(document)
    profiles = [p for p in spec.get("profiles", []) if p.get("name") == REGIONAL_PROFILE]
    if not profiles:
        raise PolicyEditError(f"regional-random-zone: no profile {REGIONAL_PROFILE}")
    spec.setdefault("plugins", []).append(dict(RANDOM_PICKER))
    for profile in profiles:
        profile["scorers"] = []
        profile["picker"] = RANDOM_PICKER["name"]
    return document


#: Policy edit name → the file it edits and how.
POLICY_EDITS: Mapping[str, PolicyEdit] = MappingProxyType(
    {
        "residency-off": PolicyEdit("residency.yaml", residency_off),
        "no-spill": PolicyEdit("residency.yaml", no_spill),
        "no-quota": PolicyEdit("tenants.yaml", no_quota),
        "regional-random-zone": PolicyEdit("routing-profiles.yaml", regional_random_zone),
    }
)


def write_policies(name: str, folder: Path) -> Path:
    """The examples plus the load-test tenant in ``folder``, with ``name``'s edit
    applied; returns ``folder`` (for ``gtm up --policies``)."""
    edit = POLICY_EDITS[name]
    folder.mkdir(parents=True, exist_ok=True)
    source = examples_path()
    for path in sorted(source.glob("*.yaml")):
        shutil.copyfile(path, folder / path.name)
    with resources.as_file(resources.files("gtm.data") / LOAD_TENANT) as extra:
        shutil.copyfile(extra, folder / LOAD_TENANT)
    target = folder / edit.file
    if not target.is_file():
        raise PolicyEditError(f"{name}: the example policies have no {edit.file}")
    documents = list(yaml.safe_load_all(target.read_text("utf-8")))
    edited = [edit.edit(d) for d in documents if isinstance(d, dict)]
    target.write_text(
        f"# {edit.file} edited by chaos mutant {name} (chaos/mutants/policy.py)\n"
        + yaml.safe_dump_all(edited, sort_keys=False),
        "utf-8",
    )
    return folder
