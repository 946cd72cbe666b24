"""What travels during a run: requests and answers between regions, and region
summaries between the processes of a partitioned run.

A message takes at least the shortest one-way latency between two regions; that is
what lets a run's regions be simulated in several processes with the same outcomes
(:mod:`fleetsim.partition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gtm.models import RegionSummary
from regional_lb.quota import Usage


@dataclass(frozen=True, slots=True)
class Hop:
    """A request a region spilled, on its way to the peer that decides again."""

    #: When it reaches the peer (simulated s): sent + half the round trip.
    at: float
    index: int
    region: str
    hops: int
    spilled_from: tuple[str, ...]
    #: Latency added to the request's TTFT and E2E so far (ms): the client's round trip
    #: and the way back of each hop.
    extra_ms: float
    #: The way back to the region that admitted it (ms): the one-way latencies of its
    #: hops. That region holds its quota ticket until the answer has come back through.
    back_ms: float

    @property
    def order(self) -> int:
        """Tie-break among messages for one request at one instant."""
        return self.hops


@dataclass(frozen=True, slots=True)
class Release:
    """The end of a spilled request reaches the region that admitted it, which closes
    the request's quota ticket (regional_lb.api relays the peer's answer and
    finishes the ticket when the relay ends)."""

    at: float
    index: int
    #: The admitting region.
    region: str
    usage: Usage | None
    refund: bool
    #: The time the ticket is finished at (the quota limiter's clock).
    when: float

    @property
    def order(self) -> int:
        return 1 << 30  # after any hop of the same request at the same instant


#: What travels between regions during a run, ordered by (time, request, order).
Message = Hop | Release


class SummaryLink(Protocol):
    """How a process of a partitioned run gets the region summaries of the others."""

    def share(self, mine: Mapping[str, RegionSummary]) -> dict[str, RegionSummary]:
        """Every region's summary (``mine`` and the others'), in the fleet's order."""
        ...
