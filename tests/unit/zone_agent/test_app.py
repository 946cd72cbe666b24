"""The zone agent's scrape rounds and view rebuilds, on its own event loop: how many
scrapes are in flight, how many answers are taken in per loop iteration, and which view
wins when a sliced rebuild meets one made at once. The workers are a fake pool (the
real one, over sockets: tests/integration/zone_agent/test_scrape_rounds.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gpusim.metrics import MetricsFlavor
from gpusim.samples import busy_exposition
from gtm.clock import FakeClock
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from gtm.models import GpuWorker
from gtm.tasks import TaskSupervisor
from zone_agent.app import SCRAPE_TURNS, SCRAPES_IN_FLIGHT, ZoneAgent
from zone_agent.config import StaticWorker, ZoneConfig
from zone_agent.health import HealthConfig, Outcome
from zone_agent.scrape import GpuMetrics
from zone_agent.view import BUILD_STEP

BODY = busy_exposition(MetricsFlavor.VLLM, requests=64, finished=48, max_num_seqs=16).encode()


class HeldPool:
    """Answers every GET with a busy vLLM's /metrics once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.asked: list[str] = []

    async def get(self, base: str, path: str, *, limit: int) -> tuple[int, bytes]:
        self.asked.append(base)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.release.wait()
        finally:
            self.in_flight -= 1
        return 200, BODY

    async def close(self) -> None:
        self.release.set()


def _agent(workers: int, clock: FakeClock, health: HealthConfig | None = None) -> ZoneAgent:
    config = ZoneConfig(
        zone="zone-a",
        region="region-1",
        health=health or HealthConfig(),
        workers=tuple(
            StaticWorker(
                url=f"http://127.0.0.1:9/w{i}",
                id=f"gpu-{i:03d}",
                gpu_type="H100",
                models=(LLAMA_8B,),
            )
            for i in range(workers)
        ),
    )
    return ZoneAgent(config, registry=new_registry(), clock=clock)


async def _count_iterations(counter: list[int], done: asyncio.Event) -> None:
    while not done.is_set():
        counter[0] += 1
        await asyncio.sleep(0)


async def test_a_round_keeps_scrapes_in_flight_bounded_and_takes_answers_a_few_at_a_time() -> None:
    clock = FakeClock(start=100.0)
    agent = _agent(SCRAPES_IN_FLIGHT * 2 + 7, clock)
    pool = HeldPool()
    agent._scrapes = pool  # type: ignore[assignment]
    iteration = [0]
    taken_at: list[int] = []
    take = agent._take_scrape

    def counted(worker: object, result: GpuMetrics) -> None:
        taken_at.append(iteration[0])
        take(worker, result)  # type: ignore[arg-type]

    agent._take_scrape = counted  # type: ignore[method-assign]
    done = asyncio.Event()
    try:
        async with TaskSupervisor(registry=new_registry()) as tasks:
            counting = tasks.spawn("iterations", _count_iterations(iteration, done))
            round_ = tasks.spawn("round", agent.scrape_round(whole=True))
            await clock.settle()
            assert pool.in_flight == SCRAPES_IN_FLIGHT  # the rest wait in the queue
            pool.release.set()  # every answer at once
            await round_
            done.set()
            await counting
    finally:
        await agent.stop()
    workers = SCRAPES_IN_FLIGHT * 2 + 7
    assert pool.most_in_flight == SCRAPES_IN_FLIGHT
    assert sorted(pool.asked) == sorted(f"http://127.0.0.1:9/w{i}" for i in range(workers))
    assert len(taken_at) == workers
    per_iteration: dict[int, int] = {}
    for at in taken_at:
        per_iteration[at] = per_iteration.get(at, 0) + 1
    # Turns: what one iteration lets through, and the next's already given.
    assert max(per_iteration.values()) <= 2 * SCRAPE_TURNS
    view = agent.view.by_model[LLAMA_8B]
    assert len(view) == workers
    assert bool(view.fresh.all())


async def test_a_sliced_rebuild_yields_to_a_view_made_at_once_meanwhile() -> None:
    clock = FakeClock(start=100.0)
    agent = _agent(BUILD_STEP * 3, clock)
    try:
        async with TaskSupervisor(registry=new_registry()) as tasks:
            sliced = tasks.spawn("sliced", agent._rebuild_sliced())
            await asyncio.sleep(0)  # its first slice
            assert not sliced.done()
            at_once = agent.rebuild()  # e.g. an ejection
            await sliced
        assert agent.view is at_once
        # Two sliced rebuilds overlapping: the one begun later reads every GPU later,
        # and its view is the one left in force, whichever finishes first.
        async with TaskSupervisor(registry=new_registry()) as tasks:
            first = tasks.spawn("first", agent._rebuild_sliced())
            await asyncio.sleep(0)
            clock.advance_nowait(1.0)
            second = tasks.spawn("second", agent._rebuild_sliced())
            await asyncio.gather(first, second)
        assert agent.view.built_at == 101.0
        # Alone, a sliced rebuild swaps its view in.
        await agent._rebuild_sliced()
        assert agent.view is not at_once
        assert len(agent.view.gpus) == BUILD_STEP * 3
        assert agent.registry.get_sample_value("gtm_zone_view_build_seconds_count") == 4
    finally:
        await agent.stop()


async def test_a_replaced_views_gpus_are_let_go_a_slice_per_loop_iteration() -> None:
    clock = FakeClock(start=100.0)
    agent = _agent(BUILD_STEP * 3 + 5, clock)
    try:
        agent.rebuild()  # replaces the empty first view: nothing to let go
        old = agent.view
        agent.rebuild()
        assert agent.view is not old
        left = [len(agent._retired)]
        while left[-1]:
            await asyncio.sleep(0)
            left.append(len(agent._retired))
        assert left[0] == BUILD_STEP * 3 + 5
        assert left == [BUILD_STEP * 3 + 5, BUILD_STEP * 2 + 5, BUILD_STEP + 5, 5, 0]
    finally:
        await agent.stop()


async def test_the_answer_of_a_worker_gone_from_the_inventory_meanwhile_is_not_kept() -> None:
    clock = FakeClock(start=100.0)
    agent = _agent(3, clock)
    pool = HeldPool()
    agent._scrapes = pool  # type: ignore[assignment]
    try:
        async with TaskSupervisor(registry=new_registry()) as tasks:
            round_ = tasks.spawn("round", agent.scrape_round(whole=True))
            await clock.settle()
            assert pool.in_flight == 3
            del agent._workers["gpu-001"]  # as an inventory sync does for a worker gone
            pool.release.set()
            await round_
        assert set(agent._scraped) == {"gpu-000", "gpu-002"}
        assert [g.id for g in agent.view.gpus] == ["gpu-000", "gpu-002"]
    finally:
        await agent.stop()


async def test_a_bug_taking_in_one_answer_does_not_stop_the_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(start=100.0)
    agent = _agent(SCRAPES_IN_FLIGHT + 3, clock)
    pool = HeldPool()
    pool.release.set()
    agent._scrapes = pool  # type: ignore[assignment]
    take = agent._take_scrape

    def buggy(worker: GpuWorker, result: GpuMetrics) -> None:
        if worker.id.endswith("7"):
            raise RuntimeError("a bug")
        take(worker, result)

    agent._take_scrape = buggy  # type: ignore[method-assign]
    try:
        await agent.scrape_round(whole=True)
        workers = SCRAPES_IN_FLIGHT + 3
        expected = {f"gpu-{i:03d}" for i in range(workers) if not str(i).endswith("7")}
        assert set(agent._scraped) == expected
        assert "taking in gpu-007's scrape failed unexpectedly" in caplog.text
    finally:
        await agent.stop()


async def test_an_ejection_takes_the_gpu_out_of_the_view_at_once_without_a_rebuild() -> None:
    clock = FakeClock(start=100.0)
    agent = _agent(BUILD_STEP * 2, clock)
    try:
        now = clock.monotonic()
        for i in range(BUILD_STEP * 2):
            for _ in range(agent.health.config.rise):
                agent.health.observe_check(f"gpu-{i:03d}", True, now)
        agent.rebuild()
        view = agent.view
        gid = "gpu-007"
        assert view.by_model[LLAMA_8B].available[7]
        _eject(agent, gid, now)
        ejected = agent.view
        assert ejected is not view
        index = ejected.by_model[LLAMA_8B]
        assert not index.available[7]
        assert str(index.reasons[7]).startswith("ejected (outlier)")
        # One entry made again, the other GPUs' states kept: no rebuild of the zone.
        assert ejected.built_at == view.built_at
        assert sum(a is not b for a, b in zip(view.gpus, ejected.gpus, strict=True)) == 1
        # A sliced rebuild begun before the ejection read the GPU's health before it:
        # it is dropped, the ejection's view stays.
        async with TaskSupervisor(registry=new_registry()) as tasks:
            sliced = tasks.spawn("sliced", agent._rebuild_sliced())
            await asyncio.sleep(0)
            _eject(agent, "gpu-009", now)
            after = agent.view
            await sliced
        assert agent.view is after
        assert not agent.view.by_model[LLAMA_8B].available[7]
        agent.on_ejection("gpu-unknown")  # not in the view: nothing to do
        assert agent.view is after
    finally:
        await agent.stop()


def _eject(agent: ZoneAgent, gpu_id: str, now: float) -> None:
    """Failures in a row until the GPU is ejected, as the data path records them."""
    while not agent.health.record(gpu_id, Outcome.TIMEOUT, now):
        pass
    agent.on_ejection(gpu_id)


async def test_an_ejection_the_view_cannot_take_alone_rebuilds_it_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(start=100.0)
    agent = _agent(4, clock)
    try:
        now = clock.monotonic()
        for i in range(4):
            for _ in range(agent.health.config.rise):
                agent.health.observe_check(f"gpu-{i:03d}", True, now)
        agent.rebuild()
        view = agent.view

        def refuse(*args: object) -> None:
            raise ValueError("serves other models now")

        agent._builder.with_gpu = refuse  # type: ignore[method-assign,assignment]
        _eject(agent, "gpu-002", now)
        assert agent.view is not view
        assert not agent.view.by_model[LLAMA_8B].available[2]
        assert sum(a is not b for a, b in zip(view.gpus, agent.view.gpus, strict=True)) == 4
        assert "could not take GPU gpu-002 out of the view alone" in caplog.text
    finally:
        await agent.stop()


Probe = Callable[[object, str, float], Awaitable[bool]]


def _probed(
    monkeypatch: pytest.MonkeyPatch, workers: int, clock: FakeClock, probe: Probe
) -> ZoneAgent:
    """An agent whose active checks are ``probe`` (by the worker's URL, ending in
    ``/w<i>``), a GPU down after one failed check."""
    agent = _agent(workers, clock, HealthConfig(fall=1))
    monkeypatch.setattr("zone_agent.app.probe", probe)
    agent._probes = HeldPool()  # type: ignore[assignment]  # (a session to close; unused)
    return agent


async def test_a_gpu_failing_its_check_leaves_the_view_before_the_slowest_check_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A check round lasts as long as its slowest check (a black-holed worker's, up to
    the check timeout). A GPU whose check fails meanwhile is out of the view at once,
    not when that round ends."""
    clock = FakeClock(start=100.0)
    silent = asyncio.Event()
    answers = {"w0": True, "w1": True, "w2": True}

    async def probe(session: object, url: str, timeout_s: float) -> bool:
        name = url.rsplit("/", 1)[1]
        if name == "w2" and not silent.is_set():
            await silent.wait()  # black-holed until released
        return answers[name]

    agent = _probed(monkeypatch, 3, clock, probe)
    try:
        silent.set()
        for _ in range(agent.health.config.rise):
            await agent.check_round()
        assert bool(agent.view.by_model[LLAMA_8B].available.all())
        silent.clear()
        answers["w1"] = False
        async with TaskSupervisor(registry=new_registry()) as tasks:
            round_ = tasks.spawn("round", agent.check_round())
            await clock.settle()
            assert not round_.done()  # gpu-002's check still hangs
            available = agent.view.by_model[LLAMA_8B].available.tolist()
            assert available == [True, False, True]
            silent.set()
            await round_
    finally:
        await agent.stop()


async def test_changes_seen_during_a_rebuild_take_one_more_rebuild_not_one_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(start=100.0)
    up = True

    async def probe(session: object, url: str, timeout_s: float) -> bool:
        await asyncio.sleep(0)
        return up or url.endswith("0")  # w0, w10, w20...: still up

    agent = _probed(monkeypatch, BUILD_STEP * 2, clock, probe)
    builds = "gtm_zone_view_build_seconds_count"
    try:
        for _ in range(agent.health.config.rise):
            await agent.check_round()
        before = agent.registry.get_sample_value(builds) or 0.0
        up = False
        await agent.check_round()
        rebuilds = (agent.registry.get_sample_value(builds) or 0.0) - before
        index = agent.view.by_model[LLAMA_8B]
        down = [gid for gid, ok in zip(index.ids, index.available.tolist(), strict=True) if not ok]
        assert len(down) == BUILD_STEP * 2 - 13  # every GPU but w0, w10 ... w120
        assert 1 <= rebuilds <= 3  # not one per GPU that went down
    finally:
        await agent.stop()
