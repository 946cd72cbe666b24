"""The real-time driver, on a fake clock: tokens arrive when (scaled) passes end."""

from __future__ import annotations

import pytest

from gpusim.driver import EngineDriver, Notifier
from gpusim.engine import Engine, EngineConfig, EngineRequest, FinishReason
from gpusim.metrics import EngineMetrics, MetricsFlavor
from gpusim.perfmodel import Degradation
from gtm.clock import FakeClock
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor

SPEEDUP = 10.0
NO_WARMUP = EngineConfig(degradation=Degradation(warmup_passes=0))


async def test_tokens_are_delivered_when_each_scaled_pass_ends() -> None:
    clock = FakeClock(start=0.0)
    profile = get_profile("A100-80GB", LLAMA_8B)
    registry = new_registry()
    driver = EngineDriver("m", Engine(profile, NO_WARMUP), clock=clock, speedup=SPEEDUP)
    EngineMetrics(registry, MetricsFlavor.VLLM, lambda: [driver.snapshot()])
    async with TaskSupervisor(registry=registry, clock=clock) as supervisor:
        supervisor.spawn("driver", driver.run())
        await clock.settle()
        notifier = Notifier()
        stream = driver.submit(EngineRequest("r", 10, 3), notifier, "length")
        await clock.settle()
        first = profile.forward_time_s(new_tokens=10, context_tokens=0, attention_pairs=55)
        await clock.advance(0.99 * first / SPEEDUP)
        assert stream.produced == 0  # the pass has not ended yet
        assert registry.get_sample_value("vllm:num_requests_running", {"model_name": "m"}) == 1
        await clock.advance(0.02 * first / SPEEDUP)
        assert stream.produced == 1
        second = profile.forward_time_s(new_tokens=1, context_tokens=10, attention_pairs=11)
        await clock.advance(2.01 * second / SPEEDUP)
        assert stream.produced == 3
        assert stream.finished is not None
        assert stream.finished.reason is FinishReason.LENGTH
        assert driver.in_flight == 0
        assert driver.now() == pytest.approx((first + 2.01 * second) * 1.0, rel=0.01)
        await clock.advance(1.0)  # idle: nothing more happens
        assert driver.engine.stats().passes_total == 3


async def test_cold_start_holds_requests_until_loaded() -> None:
    clock = FakeClock(start=0.0)
    profile = get_profile("A100-80GB", LLAMA_8B)
    engine = Engine(profile, NO_WARMUP, loaded=False)
    driver = EngineDriver("m", engine, clock=clock, speedup=SPEEDUP)
    async with TaskSupervisor(registry=new_registry(), clock=clock) as supervisor:
        supervisor.spawn("driver", driver.run())
        stream = driver.submit(EngineRequest("r", 10, 1), Notifier(), "length")
        await clock.settle()
        await clock.advance(0.99 * profile.cold_start_s / SPEEDUP)
        assert stream.finished is None
        await clock.advance(0.02 * profile.cold_start_s / SPEEDUP + 0.01)
        assert stream.finished is not None
        assert stream.produced == 1
        ttft = stream.finished.ttft
        assert ttft is not None
        assert ttft > profile.cold_start_s


async def test_abort_wakes_the_handler_and_frees_the_engine() -> None:
    clock = FakeClock(start=0.0)
    driver = EngineDriver(
        "m", Engine(get_profile("H100", LLAMA_8B), NO_WARMUP), clock=clock, speedup=SPEEDUP
    )
    async with TaskSupervisor(registry=new_registry(), clock=clock) as supervisor:
        supervisor.spawn("driver", driver.run())
        notifier = Notifier()
        stream = driver.submit(EngineRequest("r", 10, 1000), notifier, "length")
        waiter = supervisor.spawn("handler", notifier.wait())
        await clock.settle()
        driver.abort_all()
        await clock.settle()
        assert waiter.done()
        assert stream.aborted
        assert "r" not in driver.engine
        driver.abort("r")  # twice is harmless


def test_speedup_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        EngineDriver("m", Engine(get_profile("H100", LLAMA_8B)), clock=FakeClock(), speedup=0.0)
