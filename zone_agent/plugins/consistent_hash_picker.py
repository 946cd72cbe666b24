"""``consistent-hash-picker`` (baseline): the same prompt prefix always goes to the same GPU.

The seeds' example: key = MD5 of the prompt's first 256 characters, on a ring of 160
virtual nodes per GPU (the vLLM router's ``consistent_hash``, as ketama); the request
goes to the first survivor clockwise from its key. Maximal cache affinity, no notion of
load — a hot prefix makes a hot GPU.

``bounded_load_epsilon`` set: consistent hashing with bounded loads (Mirrokni, Thorup,
Zadimoghaddam, SODA 2018, :func:`gtm.routing.cost.bounded_load_capacity`): a GPU whose
in-flight sequences would exceed ``⌈(1+ε)·(total + this) / n⌉`` is skipped and the walk
continues clockwise.

Old type name ``consistent-hash``, still accepted.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from zone_agent.batch import ZoneBatch
from zone_agent.plugins._arrays import OneHotPicker
from zone_agent.view import ring_lookup

TYPE_NAME = "consistent-hash-picker"

#: Ring points examined per vector step of the clockwise walk.
_CHUNK = 64


class Params(Frozen):
    bounded_load_epsilon: float | None = Field(default=None, gt=0.0)


class ConsistentHashPicker(OneHotPicker):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._epsilon = (params or Params()).bounded_load_epsilon

    def choose(self, batch: ZoneBatch, /) -> int:
        index, request = batch.index, batch.request
        ok = batch.alive
        if self._epsilon is not None:
            total = float(batch.streams[ok].sum()) + request.sequences
            cap = math.ceil((1.0 + self._epsilon) * total / int(ok.sum()))
            within = ok & (batch.streams + request.sequences <= cap)
            ok = within if within.any() else ok
        points = len(index.ring_points)
        start = ring_lookup(index, request.hash_key >> 64)
        for offset in range(0, points, _CHUNK):
            at = (start + offset + np.arange(_CHUNK)) % points
            owners = index.ring_owner[at]
            hits = np.flatnonzero(ok[owners])
            if len(hits):
                return int(owners[hits[0]])
        return int(np.flatnonzero(batch.alive)[0])


#: The class under its name before the vocabulary of issue 21.
ConsistentHash = ConsistentHashPicker
