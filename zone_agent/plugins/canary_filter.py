"""``canary-filter``: version pins and canary GPUs.

GPUs labelled ``canary=true`` get a configured ``fraction`` of the traffic: a request is
allowed onto them when a hash of its id falls below the fraction (deterministic per
request, so a retry makes the same choice). The ``x-gtm-canary`` header overrides:
``always`` keeps only canary GPUs, ``never`` removes them. A request that names a version
(``x-gtm-version``) keeps only GPUs labelled ``version=<that>``; a pin fails closed.

In ``auto`` mode canary GPUs are never the reason a request is refused: if only canary
GPUs are left, they stay.
"""

from __future__ import annotations

import hashlib

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from gtm.routing.framework import Plugin, Removal
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.request import CanaryChoice, ZoneRequest
from zone_agent.view import ModelIndex

TYPE_NAME = "canary-filter"


class Params(Frozen):
    #: Share of requests allowed onto canary GPUs (0: only those that ask).
    fraction: float = Field(default=0.0, ge=0.0, le=1.0)


def _unit_hash(request_id: str) -> float:
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class CanaryFilter(Plugin):
    capabilities = frozenset({ZoneCapability.CANARY})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._fraction = (params or Params()).fraction

    @staticmethod
    def idle(request: ZoneRequest, index: ModelIndex, /) -> bool:
        """Whether it surely removes nothing: no pin, no choice, no canary GPU."""
        return (
            request.version is None and request.canary is CanaryChoice.AUTO and not index.any_canary
        )

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        request, index = batch.request, batch.index
        if self.idle(request, index):
            return None
        mask = np.zeros(len(index), dtype=np.bool_)
        if request.version is not None:
            wrong = np.array([v != request.version for v in index.versions], dtype=np.bool_)
            mask |= wrong
        canary = index.canary
        if request.canary is CanaryChoice.ALWAYS:
            mask |= ~canary
        elif request.canary is CanaryChoice.NEVER:
            mask |= canary
        elif (
            canary.any()
            and _unit_hash(request.request_id) >= self._fraction
            and (batch.alive & ~mask & ~canary).any()
        ):
            # Auto: off the canaries, unless nothing else is left.
            mask |= canary
        if not mask.any():
            return None
        versions = index.versions
        pinned = request.version

        def reason(i: int) -> str:
            if pinned is not None and versions[i] != pinned:
                return f"version {versions[i]!r} is not the pinned {pinned!r}"
            return "canary GPU" if canary[i] else "not a canary GPU"

        return Removal(mask, reason)
