"""Faults an operator (or a chaos scenario) injects into an emulated worker.

``/admin/faults`` takes a JSON object of the fields below: ``POST`` merges them into the
current faults, ``DELETE`` clears all, ``GET`` shows them. Only loopback peers may call
it. What each fault does, as a client sees it:

=====================  ==================================================================
``error_rate``         that fraction of inference requests fails at once with
                       ``error_status`` (500 by default; 429 and 503 also make sense)
``added_latency_ms``   every inference request waits this long (wall time) before it is
                       processed — the first byte is that much later
``hang``               requests are accepted and never answered (until cleared/shutdown);
                       ``/metrics`` and ``/health`` still answer (a wedged engine)
``black_hole``         every request but ``/admin/*`` is accepted and never answered:
                       inference, ``/metrics``, ``/health``, ``/v1/models`` and what the
                       peers poll alike (a host that accepts connections and then goes
                       silent; only the fault's own endpoint still answers, to clear it);
                       the KV-event publisher (``--kv-events-config``) publishes nothing
                       and answers no replay until it clears, then sends what waited
``crash``              the process exits at once (exit status 70, EX_SOFTWARE)
``slowdown``           forward passes take this many times longer (throttled GPU)
``thermal_throttle``   the profile's thermal throttling: −20 % throughput
``stop_stream_after``  streams are cut (connection closed, no ``[DONE]``) after this
                       many tokens
=====================  ==================================================================

Random choices (which request fails) come from a generator seeded by the worker's
``--seed``, so a fault run is reproducible.
"""

from __future__ import annotations

import random
from typing import Annotated, Literal

from pydantic import Field

from gtm.admin_auth import is_loopback_peer
from gtm.models import Frozen

#: Exit status of an injected crash (sysexits.h EX_SOFTWARE: internal software error).
CRASH_EXIT_STATUS = 70

ErrorStatus = Literal[429, 500, 502, 503, 504]


class Faults(Frozen):
    """The faults in force. All default to "no fault"."""

    error_rate: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0
    error_status: ErrorStatus = 500
    added_latency_ms: Annotated[float, Field(ge=0.0, le=600_000.0, allow_inf_nan=False)] = 0.0
    hang: bool = False
    black_hole: bool = False
    crash: bool = False
    slowdown: Annotated[float, Field(ge=1.0, le=1000.0, allow_inf_nan=False)] = 1.0
    thermal_throttle: bool = False
    stop_stream_after: Annotated[int, Field(ge=0)] | None = None

    @property
    def active(self) -> bool:
        return self != Faults()


class FaultInjector:
    """Holds the faults in force and makes the seeded random choices they need."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.faults = Faults()

    def update(self, changes: Faults, fields: set[str]) -> Faults:
        """Apply the ``fields`` of ``changes`` (a partial update); return the new faults."""
        merged = self.faults.model_dump()
        merged.update({name: getattr(changes, name) for name in fields})
        self.faults = Faults.model_validate(merged)
        return self.faults

    def clear(self) -> Faults:
        self.faults = Faults()
        return self.faults

    def should_fail(self) -> bool:
        rate = self.faults.error_rate
        return rate > 0 and self._rng.random() < rate


#: Whether an aiohttp ``request.remote`` is loopback (the admin guard's own check).
is_loopback = is_loopback_peer
