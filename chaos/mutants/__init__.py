"""Mutants: named ways to break the product, under which a game day must fail.

A game day that passes whatever the product does proves nothing (issue 22: the
overload scenario passed with no spill at all). So every scenario names, in its
``mutants`` field, the breakages of the behaviour its title claims, and
``gtm chaos mutants`` (``make chaos-mutants``) runs it under each: a scenario that
*passes* against one of its own mutants has criteria that cannot see that behaviour,
which is a defect of the scenario.

The product carries no test hooks. A mutant is either

* a **policy edit** (:mod:`chaos.mutants.policy`): the deployment starts with the
  shipped example policies edited the way an operator could — residency rules
  removed, quotas removed, spill turned off, a routing profile without its TTFT
  scorer; or
* a **patch** (:mod:`chaos.mutants.patches`): one named product function replaced in
  every process of the deployment. ``gtm chaos run --mutant`` puts
  ``chaos/mutants/site`` on the ``PYTHONPATH`` of ``gtm up --processes`` and names the
  mutant in :data:`MUTANT_ENV`; the ``sitecustomize`` there applies the patch before
  the child's own code is imported. The runner's process gets it too, for faults that
  run product code in it (``policy-push`` loads and applies the pushed set itself).

Nothing is set when no mutant is asked for: an ordinary run is untouched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from pydantic import Field, model_validator

from chaos.mutants.patches import PATCHES
from chaos.mutants.policy import POLICY_EDITS
from gtm.errors import ConfigError
from gtm.models import Frozen

#: Names the mutant a deployment's processes apply (read by ``sitecustomize``).
MUTANT_ENV = "GTM_CHAOS_MUTANT"
#: The folder whose ``sitecustomize.py`` applies :data:`MUTANT_ENV` at start-up.
SITE_DIR = Path(__file__).resolve().parent / "site"


class UnknownMutant(ConfigError):
    """A scenario or ``--mutant`` names a mutant that does not exist."""


class Mutant(Frozen):
    """One way to break the product: a policy edit or a patch (exactly one)."""

    name: str = Field(pattern=r"^[a-z0-9-]+$", max_length=40)
    #: The product behaviour it removes, for the matrix and the report.
    breaks: str = Field(min_length=1)
    policy: str | None = None
    patch: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Mutant:
        if (self.policy is None) == (self.patch is None):
            raise ValueError(f"mutant {self.name}: exactly one of policy, patch")
        if self.policy is not None and self.policy not in POLICY_EDITS:
            raise ValueError(f"mutant {self.name}: no policy edit {self.policy!r}")
        if self.patch is not None and self.patch not in PATCHES:
            raise ValueError(f"mutant {self.name}: no patch {self.patch!r}")
        return self

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The variables a deployment's processes need to apply this mutant (none
        for a policy edit: the edited policies are passed to gtm up instead)."""
        if self.patch is None:
            return {}
        path = base.get("PYTHONPATH", "")
        return {
            MUTANT_ENV: self.name,
            "PYTHONPATH": str(SITE_DIR) + (os.pathsep + path if path else ""),
        }


def _catalogue(*mutants: Mutant) -> Mapping[str, Mutant]:
    return MappingProxyType({m.name: m for m in mutants})


#: Every mutant, by name.
MUTANTS: Mapping[str, Mutant] = _catalogue(
    Mutant(
        name="residency-off",
        breaks="residency: every rule that restricts where a tenant or client is served",
        policy="residency-off",
    ),
    Mutant(
        name="no-spill",
        breaks="spillover: a saturated region rejects instead of spilling",
        policy="no-spill",
    ),
    Mutant(
        name="no-quota",
        breaks="tenant quotas: every tenant unlimited",
        policy="no-quota",
    ),
    Mutant(
        name="regional-random-zone",
        breaks="the regional LB's TTFT cost: zones picked at random",
        policy="regional-random-zone",
    ),
    Mutant(
        name="health-checks-pass",
        breaks="global failover: every regional health probe reports healthy",
        patch="health-checks-pass",
    ),
    Mutant(
        name="no-fail-open",
        breaks="fail open: all regions failing their probes are all taken out",
        patch="no-fail-open",
    ),
    Mutant(
        name="no-failback",
        breaks="failback: a region once down never comes back",
        patch="no-failback",
    ),
    Mutant(
        name="impatient-health-checks",
        breaks="the global probe's patience: a 0.25 s timeout evacuates a slow region",
        patch="impatient-health-checks",
    ),
    Mutant(
        name="gpu-health-ignored",
        breaks="GPU health at the zone: no ejection, active checks always pass",
        patch="gpu-health-ignored",
    ),
    Mutant(
        name="scrape-round-waits-for-all",
        breaks="the zone's scrape rounds: one silent worker holds every round, the "
        "others' load goes stale and unseen",
        patch="scrape-round-waits-for-all",
    ),
    Mutant(
        name="no-retry-before-first-byte",
        breaks="retries before the first byte: one attempt per tier",
        patch="no-retry-before-first-byte",
    ),
    Mutant(
        name="region-needs-every-zone",
        breaks="zone-level failover: a region missing a zone reports itself unhealthy",
        patch="region-needs-every-zone",
    ),
    Mutant(
        name="snapshot-dropped",
        breaks="static stability: the fleet snapshot is dropped when the store fails",
        patch="snapshot-dropped",
    ),
    Mutant(
        name="watch-ends-on-compaction",
        breaks="re-listing: a watch behind compaction ends, its snapshot never updated",
        patch="watch-ends-on-compaction",
    ),
    Mutant(
        name="no-burst-allowance",
        breaks="quota bursts: a burst within the per-minute quota is refused past 1 s",
        patch="no-burst-allowance",
    ),
    Mutant(
        name="lenient-policy-loader",
        breaks="policy validation: unknown fields are dropped instead of rejected",
        patch="lenient-policy-loader",
    ),
)


def mutant(name: str) -> Mutant:
    """The mutant called ``name``; :class:`UnknownMutant` names the known ones."""
    try:
        return MUTANTS[name]
    except KeyError:
        known = ", ".join(sorted(MUTANTS))
        raise UnknownMutant(f"unknown mutant {name!r}; known: {known}") from None


def apply_in_process(name: str) -> None:
    """Apply a patch mutant to this process (a policy edit needs nothing here)."""
    found = mutant(name)
    if found.patch is not None:
        PATCHES[found.patch]()
