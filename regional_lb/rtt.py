"""Round-trip times the regional tier prices with: to its zones, and to peer regions.

* **Zones** are in the same region: the RTT is small and nearly constant. Azure
  documents "a round-trip latency of less than approximately 2 ms between availability
  zones" (learn.microsoft.com, "What are availability zones?"); we charge that to every
  zone, and :data:`LOCAL_ZONE_RTT_MS` to the zone this replica runs in, when it is told.
* **Peer regions**: measured P50 RTTs between the example regions
  (``data/region_rtt.csv``, from Microsoft's Azure inter-region latency statistics,
  CC BY 4.0; see the file's header), else the distance model of
  :func:`gtm.routing.cost.rtt_ms_from_distance` over the regions' coordinates.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType

from gtm.models import GeoPoint
from gtm.routing.cost import rtt_ms_from_distance

#: Between two availability zones of one region (Azure's documented upper bound).
INTRA_REGION_RTT_MS = 2.0
#: Inside the zone the replica runs in (one data-centre network hop).
LOCAL_ZONE_RTT_MS = 0.5
#: A peer region whose location is unknown: about the median inter-region RTT of the
#: Azure matrix, so an unplaced region neither wins nor is ruled out by distance alone.
UNKNOWN_PEER_RTT_MS = 150.0


def load_example_rtts() -> Mapping[tuple[str, str], float]:
    """(source region, destination region) → P50 RTT ms, for the example regions."""
    text = resources.files("regional_lb").joinpath("data/region_rtt.csv").read_text("utf-8")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    table = {
        (row["src"], row["dst"]): float(row["rtt_ms"])
        for row in csv.DictReader(io.StringIO("\n".join(lines)))
    }
    return MappingProxyType(table)


class RegionRtt:
    """RTT between regions: measured when the pair is known (either direction), else
    the distance model over ``locations``, else :data:`UNKNOWN_PEER_RTT_MS`."""

    def __init__(
        self,
        measured: Mapping[tuple[str, str], float] | None = None,
        locations: Mapping[str, GeoPoint] | None = None,
    ) -> None:
        self._measured = dict(measured if measured is not None else load_example_rtts())
        self._locations = dict(locations or {})

    def between(self, source: str, destination: str) -> float:
        if source == destination:
            return 0.0
        for pair in ((source, destination), (destination, source)):
            measured = self._measured.get(pair)
            if measured is not None:
                return measured
        a, b = self._locations.get(source), self._locations.get(destination)
        if a is None or b is None:
            return UNKNOWN_PEER_RTT_MS
        return rtt_ms_from_distance(a.distance_km(b))

    def with_locations(self, locations: Mapping[str, GeoPoint]) -> RegionRtt:
        return RegionRtt(self._measured, {**self._locations, **locations})
