"""``policy-push``: apply a policy set through gtm's normal apply path during traffic.

The files are loaded and validated as ``gtm policy apply --prune`` does — the set
pushed is the whole policy (:func:`policies.load_paths`, then
:func:`gtm.policy_store.apply` with its lock and compare-and-swap commit). A bad set
(malformed YAML, an unknown field, a ``!!python/object`` tag, a broken reference) is
rejected before anything is written — the injected fault then records the rejection, and
serving must stay unchanged. A good set is committed; rollback re-applies the set that
was in force before, on top of the generation the push made (so a concurrent apply is
not silently overwritten).
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from chaos.deployment import Deployment
from chaos.faults.base import FaultError, Injected, SpecBase, Undo
from gtm.clock import SystemClock
from gtm.errors import StateError
from gtm.policy_store import apply, load_from_store
from policies import PolicyError, load_paths

APPLIED_BY = "gtm chaos policy-push"


class PolicyPushInjected(Injected):
    """A policy push: ``applied`` tells whether the set was committed, ``error`` why not,
    ``rejected`` whether it was refused as invalid (not a store failure)."""

    def __init__(
        self,
        description: str,
        *,
        applied: bool,
        error: str | None,
        undo: Undo | None,
        rejected: bool = False,
    ) -> None:
        super().__init__(description, undo)
        self.applied = applied
        self.error = error
        self._rejected = rejected

    @property
    def refused(self) -> bool:
        """Rejected as invalid before anything was written (not a store failure)."""
        return self._rejected


class PolicyPushFault(SpecBase):
    """Push the policy files/directories ``paths`` (good or bad)."""

    kind: Literal["policy-push"] = "policy-push"
    paths: Annotated[tuple[Path, ...], Field(min_length=1)]

    async def inject(self, deployment: Deployment) -> Injected:
        store = deployment.store()
        clock = SystemClock()
        try:
            before = await load_from_store(store)
        except StateError as exc:
            raise FaultError(f"policy-push: cannot read the policies in force: {exc}") from None
        shown = ", ".join(str(p) for p in self.paths)
        try:
            policy_set = load_paths(list(self.paths))
            result = await apply(store, policy_set, None, clock=clock, applied_by=_who())
        except (PolicyError, StateError) as exc:
            # Invalid policies are "rejected"; a store that failed the apply "not applied".
            outcome = "rejected" if isinstance(exc, PolicyError) else "not applied"
            return PolicyPushInjected(
                f"policy push {shown}: {outcome} ({_first_line(exc)})",
                applied=False,
                error=str(exc),
                undo=None,
                rejected=isinstance(exc, PolicyError),
            )
        generation = result.generation

        async def undo() -> None:
            if before is None:
                return
            try:
                await apply(store, before.policy_set, generation, clock=clock, applied_by=_who())
            except (PolicyError, StateError) as exc:
                raise FaultError(f"policy-push rollback: {exc}") from None

        return PolicyPushInjected(
            f"policy push {shown}: applied as generation {generation}",
            applied=True,
            error=None,
            undo=undo,
        )


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


def _who() -> str:
    try:
        return f"{APPLIED_BY} ({getpass.getuser()})"
    except (KeyError, OSError):
        return APPLIED_BY
