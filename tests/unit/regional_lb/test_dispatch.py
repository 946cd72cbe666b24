"""The fair queue's waiting room: refusals, TTLs, a client going away, shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gtm.clock import FakeClock
from gtm.models import Priority, RouteRequest
from policies import ResidencyQuery
from regional_lb.admission import Admitted
from regional_lb.dispatch import Dispatcher, Waiter
from regional_lb.errors import Overloaded
from regional_lb.fairqueue import BandSettings, FairQueue, QueueSettings
from regional_lb.metrics import RegionalMetrics
from regional_lb.quota import Cost
from regional_lb.request import HopInfo
from regional_lb.router import Inputs, RegionalDecision
from regional_lb.view import RegionalView, ZoneAccounting
from tests.unit.regional_lb.policy_fixtures import policy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _admitted(tmp_path: Path) -> Admitted:
    active = policy(tmp_path)
    query = ResidencyQuery("alpha", MODEL, "default", "US")
    verdict = active.engine.allowed_regions(query)
    request = RouteRequest(model=MODEL, input_tokens=100, max_output_tokens=10, tenant="alpha")
    inputs = Inputs(allowed=verdict.allowed, on_saturation=verdict.on_saturation)
    tenant = active.policy_set.tenants["alpha"]
    return Admitted(
        tenant,
        request,
        inputs,
        verdict,
        query,
        Cost(100, 10),
        Priority.INTERACTIVE,
        HopInfo(),
        stream=False,
        body=b"{}",
    )


def _dispatcher(clock: FakeClock, depth: int = 4, ttl_s: float = 2.0) -> Dispatcher:
    bands = {band: BandSettings(ttl_s=ttl_s, max_depth=depth) for band in Priority}
    queue: FairQueue[Waiter] = FairQueue(QueueSettings(bands=bands))

    def no_view() -> RegionalView:
        raise AssertionError("without a router nothing is dispatched, so no view is read")

    return Dispatcher(
        queue,
        router=lambda: None,  # no zone ever has room: requests stay queued
        view=no_view,
        accounting=ZoneAccounting(),
        metrics=RegionalMetrics(CollectorRegistry(), queue.depth),
        clock=clock,
    )


async def _queued(dispatcher: Dispatcher, admitted: Admitted) -> asyncio.Future[RegionalDecision]:
    waiting = asyncio.ensure_future(dispatcher.wait(admitted))  # noqa: TID251
    await asyncio.sleep(0)  # the request is offered, then waits for a zone
    assert len(dispatcher.queue) == 1
    return waiting


async def test_a_full_band_refuses_at_once_with_retry_after(tmp_path: Path) -> None:
    dispatcher = _dispatcher(FakeClock(), depth=0, ttl_s=20.0)
    with pytest.raises(Overloaded) as refused:
        await dispatcher.wait(_admitted(tmp_path))
    assert refused.value.status == 503
    assert refused.value.reason == "queue_full"
    assert refused.value.retry_after_s == 2.0


async def test_a_request_past_its_ttl_is_refused_by_the_tick(tmp_path: Path) -> None:
    clock = FakeClock()
    dispatcher = _dispatcher(clock, ttl_s=2.0)
    waiting = await _queued(dispatcher, _admitted(tmp_path))
    clock.advance_nowait(2.5)
    await dispatcher.tick()
    with pytest.raises(Overloaded) as expired:
        await waiting
    assert expired.value.reason == "queue_timeout"
    assert len(dispatcher.queue) == 0


async def test_a_client_that_goes_away_leaves_the_queue(tmp_path: Path) -> None:
    dispatcher = _dispatcher(FakeClock())
    waiting = await _queued(dispatcher, _admitted(tmp_path))
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(dispatcher.queue) == 0


async def test_shutdown_answers_every_waiting_request(tmp_path: Path) -> None:
    dispatcher = _dispatcher(FakeClock())
    waiting = await _queued(dispatcher, _admitted(tmp_path))
    dispatcher.refuse_waiting()
    with pytest.raises(Overloaded) as refused:
        await waiting
    assert refused.value.reason == "shutdown"
    assert len(dispatcher.queue) == 0
