"""The simulated zone agents: a pool of analytic GPUs behind one zone-agent decision,
with the agent's own accounting, view and scrapes, and the requests in flight on them.

gtm runs one pool per zone (a zone agent each); a baseline runs one per region (its
balancer over the region's whole pool). The view is rebuilt only when the agent's
would change: at a scrape that saw something new, or when a GPU is marked down.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from fleetsim.gpu import FastGpu, Job
from gtm.gpu_profiles import get_profile
from gtm.models import GpuWorker
from zone_agent.accounting import Accounting, SlotLoad, Ticket
from zone_agent.flow import Admission, Guard
from zone_agent.health import HealthStatus
from zone_agent.router import ZoneProfile as GpuProfileRunner
from zone_agent.scrape import Flavor, GpuMetrics, ModelMetrics
from zone_agent.view import GpuState, ViewBuilder, ZoneView

if TYPE_CHECKING:
    from collections.abc import Sequence

    from regional_lb.view import ZoneAccounting


class Pool:
    """A set of GPUs behind one zone agent decision (a zone, or a region's whole pool)."""

    def __init__(
        self,
        zone_id: str,
        region: str,
        gpus: Sequence[tuple[str, str]],
        model: str,
        profile: GpuProfileRunner,
    ) -> None:
        self.zone_id = zone_id
        self.region = region
        self.acc = Accounting(capacity=len(gpus))
        states = []
        self.gpus: dict[str, FastGpu] = {}
        for gpu_id, gpu_type in gpus:
            worker = GpuWorker(
                id=gpu_id,
                zone_id=zone_id,
                region_id=region,
                url=f"http://{gpu_id}.sim",
                gpu_type=gpu_type,
                models=(model,),
            )
            states.append(GpuState(worker=worker, slot=self.acc.slot(gpu_id)))
            self.gpus[gpu_id] = FastGpu(gpu_id, get_profile(gpu_type, model))
        self.states = states
        self.builder = ViewBuilder(zone_id, region)
        self.view: ZoneView = self.builder.build(states, self.acc, 0.0)
        #: The zone agent's decision (a profile of zone_agent.profiles).
        self.profile = profile
        #: Prompt tokens of the requests past their first token (decoding).
        self.running_tokens = 0.0
        #: The regional LB's accounting of this zone, charged at dispatch and released at
        #: the end as the regional LB does (gtm's tiers; ``None``: no regional tier).
        self.regional: ZoneAccounting | None = None
        #: What the last scrape saw: each GPU's (running, waiting, KV blocks) and the
        #: agent's own charges on it.
        self.last_scrape: list[tuple[tuple[int, int, int], SlotLoad]] = []
        #: The agent's flow control (``gtm zone --admission slo``; None: off), holding
        #: (request number, network ms) of the requests it holds.
        self.admission: Admission[tuple[int, float]] | None = None

    def scrape(self, now: float, model: str) -> None:
        """The agent's scrape round at ``now``: each GPU's running and waiting requests
        and KV use as its ``/metrics`` shows them, with the agent's own charges at that
        moment (:meth:`zone_agent.app.ZoneAgent.scrape_round`), then a fresh view —
        unless nothing changed since the last scrape, when the view would be the same."""
        seen = [(self.gpus[s.id].scrape(), self.acc.at(s.id)) for s in self.states]
        if seen == self.last_scrape:
            return
        self.last_scrape = seen
        states = []
        for state, ((running, waiting, used_blocks), own) in zip(self.states, seen, strict=True):
            gpu = self.gpus[state.id]
            load = ModelMetrics(
                running=float(running),
                waiting=float(waiting),
                kv_usage=used_blocks / gpu.capacity_blocks,
                block_size=gpu.block_size,
                kv_blocks_total=gpu.capacity_blocks,
            )
            metrics = GpuMetrics(now, Flavor.VLLM, MappingProxyType({model: load}))
            states.append(dataclasses.replace(state, metrics=metrics, own_at_scrape=own))
        self.states = states
        self.view = self.builder.build(states, self.acc, now)

    def mark_down(self, gpu_id: str, now: float, reason: str) -> None:
        """The agent's health check found ``gpu_id`` dead: rebuild the view without it."""
        self.states = [
            dataclasses.replace(s, health=HealthStatus(False, reason)) if s.id == gpu_id else s
            for s in self.states
        ]
        self.view = self.builder.build(self.states, self.acc, now)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def pending_tokens(self) -> float:
        """Prefill tokens the agent has charged and not yet seen done, over its GPUs."""
        return float(self.acc.pending.sum())

    def prefilling_requests(self) -> float:
        """Requests the agent has sent that have no first token yet, over its GPUs."""
        return float(self.acc.prefilling.sum())

    def matched_blocks(self, hashes: tuple[int, ...]) -> int:
        """Blocks of ``hashes`` cached on the pool's best GPU (the agent's prefix index)."""
        # The deepest group comes last.
        groups = self.acc.prefix.match_groups(hashes)
        return groups[-1][0] if groups else 0


@dataclass(slots=True)
class Live:
    """One request in flight."""

    index: int
    job: Job
    pool: Pool
    ticket: Ticket
    extra_ms: float
    region: int
    #: Its place in the pool's flow control's TPOT ledger (None: flow control off).
    guard: Guard | None = None
