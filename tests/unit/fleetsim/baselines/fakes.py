"""A hand-made fleet for the cross-region rules: three regions with fixed latencies and
loads, seen through :class:`fleetsim.baselines.Regions` as the simulator shows them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleetsim.workload import SimRequest
from gtm.models import GeoPoint
from policies import ReasonCode, Verdict

REGIONS = ("eu", "us", "ap")


@dataclass
class FakeLoad:
    gpus: int = 4
    pending: float = 0.0
    prefilling: float = 0.0
    running_tokens: float = 0.0
    matched: int = 0

    @property
    def gpu_count(self) -> int:
        return self.gpus

    def pending_tokens(self) -> float:
        return self.pending

    def prefilling_requests(self) -> float:
        return self.prefilling

    def matched_blocks(self, hashes: tuple[int, ...]) -> int:
        return self.matched


@dataclass
class FakeRegions:
    #: Client round trip to each region (ms); the nearest has the smallest.
    client_ms: Mapping[str, float] = field(
        default_factory=lambda: {"eu": 10.0, "us": 80.0, "ap": 200.0}
    )
    #: Round trip between regions (ms), the same both ways.
    between_ms: float = 50.0
    loads: dict[str, FakeLoad] = field(default_factory=lambda: {r: FakeLoad() for r in REGIONS})

    @property
    def region_ids(self) -> tuple[str, ...]:
        return REGIONS

    def nearest(self, req: SimRequest, among: Sequence[str]) -> str | None:
        return min(among, key=lambda r: self.client_ms[r], default=None)

    def client_rtt_ms(self, req: SimRequest, region: str) -> float:
        return self.client_ms[region]

    def rtt_ms(self, a: str, b: str) -> float:
        return self.between_ms

    def load(self, region: str) -> FakeLoad:
        return self.loads[region]


def request(input_tokens: int = 1_000, blocks: int = 0) -> SimRequest:
    return SimRequest(
        at_s=0.0,
        input_tokens=input_tokens,
        output_tokens=100,
        prefix_hashes=tuple(range(blocks)),
        block_tokens=16,
        hash_key=1,
        tenant="acme",
        country="DE",
        point=GeoPoint(lat=50.1, lon=8.7),
        place_id=0,
    )


def allowing(*regions: str) -> Verdict:
    return Verdict(
        frozenset(regions), ReasonCode.ALLOWED if regions else ReasonCode.NO_MATCHING_RULE
    )
