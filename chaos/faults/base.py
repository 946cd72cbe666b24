"""What every fault shares: the :class:`Injected` handle and target-name checks.

A fault spec (a frozen pydantic model, one per ``kind``) is pure data; ``inject`` does
the I/O against a :class:`~chaos.deployment.Deployment` and returns an
:class:`Injected` whose ``rollback`` undoes it. Rollbacks are idempotent: the runner
always calls them (after the method, and again on abort), so a second call is a no-op.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Annotated

from pydantic import AfterValidator

from chaos.deployment import DeploymentError, UnknownTarget
from gtm.models import Frozen

__all__ = [
    "DeploymentError",
    "FaultError",
    "Injected",
    "Name",
    "SpecBase",
    "TierName",
    "UnknownTarget",
]


class FaultError(DeploymentError):
    """A fault could not be injected or rolled back."""


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TIER = re.compile(r"global|chaos-proxy|(regional|zone|gpu)/[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a name (letters, digits, '.', '_', '-'; e.g. eu-west)")
    return value


def _tier(value: str) -> str:
    if not _TIER.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a tier: expected global, regional/<region>, zone/<zone> "
            "or gpu/<gpu> (e.g. regional/eu-west)"
        )
    return value


#: A region, zone, GPU or etcd member name (checked against the deployment at inject).
Name = Annotated[str, AfterValidator(_name)]
#: A supervised process of gtm up: ``global``, ``regional/<id>``, ``zone/<id>``, ``gpu/<id>``.
TierName = Annotated[str, AfterValidator(_tier)]


class SpecBase(Frozen):
    """Base of every fault spec (frozen, unknown fields rejected)."""


Undo = Callable[[], Awaitable[None]]


class Injected:
    """A fault in force. ``rollback`` runs ``undo`` once; later calls do nothing."""

    def __init__(self, description: str, undo: Undo | None = None) -> None:
        self._description = description
        self._undo = undo
        self.rolled_back = False

    @property
    def refused(self) -> bool:
        """Whether the product refused the fault (recorded in the journal; the
        ``fault_refused`` probe reads it). Most faults cannot be refused."""
        return False

    def describe(self) -> str:
        """One line for the timeline: what was done, to what."""
        return self._description

    async def rollback(self) -> None:
        if self.rolled_back:
            return
        self.rolled_back = True
        if self._undo is not None:
            await self._undo()
