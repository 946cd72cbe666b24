"""``allow-list-filter``: keep only candidates whose id is allowed.

Two sources, which combine (a candidate must pass both when both are set):

* ``ids`` in the parameters — a static list, e.g. the regions a profile may ever use;
* ``from_context: true`` — the per-request set the tier's batch computes, through
  :class:`AllowListSource` (``batch.allowed_ids()``); ``None`` means "no restriction".
  This is how a policy engine's answer (say, the regions a tenant's residency rule
  allows) becomes a hard filter without the filter knowing the policy.

An empty allow-list removes everything, and the profile then refuses the request with
NoEligibleCandidate naming this filter: allow-lists fail closed.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Protocol, cast, runtime_checkable

import numpy as np
from pydantic import Field, model_validator

from gtm.errors import PluginError
from gtm.models import Frozen
from gtm.routing.framework import Batch, Bools, Plugin, Removal

TYPE_NAME = "allow-list-filter"

_NOT_LISTED = "not in the allow list of filter {name!r}"
_NOT_ALLOWED = "not allowed for this request by the snapshot"


@runtime_checkable
class AllowListSource(Protocol):
    """A batch that knows which candidate ids its request may go to."""

    def allowed_ids(self) -> Set[str] | None: ...


class Params(Frozen):
    ids: frozenset[str] | None = Field(default=None, max_length=100_000)
    from_context: bool = False

    @model_validator(mode="after")
    def _has_a_source(self) -> Params:
        if self.ids is None and not self.from_context:
            raise ValueError("set ids, from_context: true, or both")
        return self


class AllowListFilter(Plugin):
    """Removes every candidate whose id is not allowed."""

    def __init__(self, name: str, params: Params) -> None:
        super().__init__(name)
        self._ids = params.ids
        self._from_context = params.from_context
        self._not_listed = _NOT_LISTED.format(name=name)
        self._source_type: type | None = None

    def removes(self, batch: Batch, /) -> Removal | None:
        static = self._ids
        dynamic = self._context_ids(batch)
        ids = batch.ids

        def why(position: int) -> str:
            return (
                self._not_listed
                if static is not None and ids[position] not in static
                else _NOT_ALLOWED
            )

        mask: Bools | None = None
        for source in (static, dynamic):
            if source is not None:
                out = np.fromiter((i not in source for i in ids), np.bool_, len(ids))
                mask = out if mask is None else mask | out
        return Removal(mask, why) if mask is not None and mask.any() else None

    def _context_ids(self, batch: Batch) -> Set[str] | None:
        if not self._from_context:
            return None
        # (a Protocol isinstance walks the protocol's members: checked once per batch type)
        if type(batch) is not self._source_type and not isinstance(batch, AllowListSource):
            raise PluginError(
                f"filter {self.name!r} has from_context: true, but the batch "
                f"{type(batch).__name__} has no allowed_ids() method"
            )
        self._source_type = type(batch)
        return cast(AllowListSource, batch).allowed_ids()
