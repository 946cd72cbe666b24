"""Builders of zone views and requests, and a relay over a recording pool, for unit tests
(no sockets)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

from aiohttp import web

from gtm.gpu_profiles import LLAMA_8B
from gtm.models import GpuWorker, Tier, WorkerState
from gtm.relay import AiohttpDownstream
from gtm.routing.framework import CostModel, Filter, Picker
from gtm.routing.runner import Runner, Weighted
from zone_agent.accounting import Accounting, SlotLoad
from zone_agent.batch import ZoneBatch
from zone_agent.fastpaths import FAST_PATHS
from zone_agent.health import HealthStatus
from zone_agent.prefix import text_block_hashes
from zone_agent.proxy import DataPath, ZoneRelay
from zone_agent.request import CanaryChoice, Endpoint, ZoneRequest, zone_request
from zone_agent.router import ZoneDecision, ZoneProfile
from zone_agent.scrape import Flavor, GpuMetrics, ModelMetrics
from zone_agent.view import GpuState, ViewBuilder, ViewSettings, ZoneView

NOW = 100.0
MODEL = LLAMA_8B


@dataclass
class Gpu:
    """One GPU of a test zone, with everything a test may want to vary."""

    id: str
    gpu_type: str = "H100"
    models: tuple[str, ...] = (MODEL,)
    state: WorkerState = WorkerState.READY
    health: HealthStatus = field(default_factory=lambda: HealthStatus(True))
    drained: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    #: Scraped numbers (None: never scraped).
    running: float | None = None
    waiting: float = 0.0
    kv_usage: float = 0.0
    kv_blocks: int | None = None
    block_size: int | None = None
    scraped_age: float = 0.0
    metrics_models: tuple[str, ...] | None = None
    own_at_scrape: SlotLoad = field(default_factory=SlotLoad)
    #: Measured prompt tokens per request, by model label (zone_agent.prompt_sizes).
    prompt_tokens: tuple[tuple[str, float], ...] = ()


def state(gpu: Gpu, acc: Accounting) -> GpuState:
    worker = GpuWorker(
        id=gpu.id,
        zone_id="zone-a",
        region_id="region-1",
        url=f"http://127.0.0.1:1/{gpu.id}",
        gpu_type=gpu.gpu_type,
        models=gpu.models,
        state=gpu.state,
        labels=gpu.labels,
    )
    metrics = None
    if gpu.running is not None:
        model_metrics = ModelMetrics(
            running=gpu.running,
            waiting=gpu.waiting,
            kv_usage=gpu.kv_usage,
            block_size=gpu.block_size,
            kv_blocks_total=gpu.kv_blocks,
        )
        names = gpu.models if gpu.metrics_models is None else gpu.metrics_models
        metrics = GpuMetrics(NOW - gpu.scraped_age, Flavor.VLLM, {m: model_metrics for m in names})
    return GpuState(
        worker=worker,
        slot=acc.slot(gpu.id),
        metrics=metrics,
        own_at_scrape=gpu.own_at_scrape,
        health=gpu.health,
        drained=gpu.drained,
        prompt_tokens=dict(gpu.prompt_tokens),
    )


def make_view(gpus: Sequence[Gpu], acc: Accounting | None = None, *, now: float = NOW) -> ZoneView:
    acc = acc or Accounting()
    builder = ViewBuilder("zone-a", "region-1", ViewSettings(stale_after_s=1.0))
    return builder.build([state(g, acc) for g in gpus], acc, now)


def make_request(
    *,
    tokens: int = 1000,
    model: str = MODEL,
    text: str | None = None,
    max_output: int | None = None,
    seq: int = 0,
    request_id: str = "req-1",
    version: str | None = None,
    canary: CanaryChoice = CanaryChoice.AUTO,
    sequences: int = 1,
) -> ZoneRequest:
    data = (text or "").encode()
    return ZoneRequest(
        request_id=request_id,
        model=model,
        endpoint=Endpoint.CHAT,
        input_tokens=tokens,
        max_prompt_tokens=tokens,
        max_output_tokens=max_output,
        sequences=sequences,
        prefix_hashes=text_block_hashes(data) if data else (),
        tokens_per_block=tokens * 256 / len(data) if data else 0.0,
        hash_key=seq << 64,
        seq=seq,
        version=version,
        canary=canary,
    )


def batch(view: ZoneView, request: ZoneRequest) -> ZoneBatch:
    """A batch whose alive mask a test may write (a decision's is the index's, shared)."""
    made = ZoneBatch(request, view, view.by_model[request.model])
    made.alive = made.alive.copy()
    return made


def zone_profile(
    name: str,
    filters: Sequence[Filter],
    scorers: Sequence[Weighted],
    picker: Picker,
    *,
    cost_model: CostModel | None = None,
    fast_paths: bool = True,
    **options: Any,
) -> ZoneProfile:
    """A zone profile of these plugins with the zone's fast paths (``fast_paths=False``:
    the reference), as the zone registry builds one."""
    runner: Runner[ZoneBatch] = Runner(
        name,
        Tier.ZONE,
        filters,
        scorers,
        picker,
        cost_model=cost_model,
        fast_paths=FAST_PATHS if fast_paths else (),
        **options,
    )
    return ZoneProfile(runner)


class RecordingPool:
    """The zone's upstream pool as a fake: each POST records the headers the worker would
    get and answers 200."""

    def __init__(self) -> None:
        self.sent: list[list[tuple[str, str]]] = []

    async def post(self, url: str, path: str, headers: list[tuple[str, str]], body: bytes) -> Any:
        self.sent.append(list(headers))
        return SimpleNamespace(status=200)


def chat_relay(
    request: web.Request,
    pool: RecordingPool,
    worker_auth: Callable[[str], tuple[str, str] | None] = lambda gpu_id: None,
) -> ZoneRelay:
    """A :class:`ZoneRelay` of a chat completion ``request`` (id ``r-1``) over ``pool``;
    ``worker_auth``: GPU id → the (header, value) of its worker key, if any."""
    path = SimpleNamespace(
        settings=SimpleNamespace(max_attempts=3),
        metrics=SimpleNamespace(stream_breaks=None),
        session=lambda: pool,
        worker_auth=worker_auth,
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    facts = zone_request(body, Endpoint.CHAT, request_id="r-1")
    return ZoneRelay(request, AiohttpDownstream(request), cast(DataPath, path), b"{}", facts, 0.0)


def relay_target(gpu_id: str) -> ZoneDecision:
    """A decision for GPU ``gpu_id`` (its worker at ``http://w``), as the relay reads it."""
    worker = SimpleNamespace(url="http://w")
    return cast(ZoneDecision, SimpleNamespace(gpu_id=gpu_id, gpu=SimpleNamespace(worker=worker)))
