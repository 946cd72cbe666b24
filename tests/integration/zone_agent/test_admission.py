"""The zone's flow control (``gtm zone --admission slo``) from the client's side: a real
agent in front of an emulated H100 at real speed. While a request decodes with little
TPOT slack left, a long prompt that would break it waits in the agent and goes when the
decode ends; without flow control it goes at once and stalls the decode. And a request
over the queue budget waits until the GPU's queue drains; one held on another client's
queue goes as soon as a scrape finds that queue gone, not at the next regular scrape."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gtm.errors import ConfigError
from gtm.gpu_profiles import LLAMA_8B
from gtm.routing.registry import load_profile_spec
from tests.integration.zone_agent.conftest import Zone, ZoneFactory, eventually
from zone_agent.flow import AdmissionMode, AdmissionSettings, others_queued
from zone_agent.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE, build_zone_profile

#: A decode step of the emulated H100 at batch 1 or 2 is about 8 ms: a TPOT bound of
#: 9 ms leaves a 200-token answer ~160 ms of prefill it can share passes with.
TIGHT = AdmissionSettings(mode=AdmissionMode.SLO, tpot_slo_ms=9.0)
#: 10,000 tokens: ~0.5 s of prefill on an H100, over that slack.
LONG_PROMPT = "word " * 10_000


async def stream(http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> Any:
    """A streamed completion: (time of its first chunk, time of its end), loop time."""
    loop = asyncio.get_running_loop()
    body = {"model": LLAMA_8B, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    first = None
    async with http.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for _ in response.content.iter_any():
            if first is None:
                first = loop.time()
    return first, loop.time()


def sample(zone: Zone, name: str, labels: dict[str, str] | None = None) -> float:
    return zone.agent.registry.get_sample_value(name, labels or {}) or 0.0


@pytest.mark.parametrize("admission", [True, False], ids=["slo", "off"])
async def test_a_long_prompt_waits_for_a_decode_it_would_stall(
    make_zone: ZoneFactory, admission: bool
) -> None:
    zone = await make_zone(
        ["H100"],
        sim_overrides={"speedup": 1.0},
        admission=TIGHT if admission else AdmissionSettings(),
    )
    http, url = zone.http, zone.url
    async with asyncio.TaskGroup() as group:
        decoding = group.create_task(stream(http, url, "hello there", 200))
        await eventually(lambda: _decoding(zone))
        long_first, _ = await stream(http, url, LONG_PROMPT, 4)
    _, decode_end = decoding.result()
    if admission:
        assert long_first >= decode_end  # it waited for the decode to end
        assert sample(zone, "gtm_zone_admission_released_total", {"reason": "room"}) == 1.0
        assert sample(zone, "gtm_zone_admission_wait_seconds_count") == 1.0
    else:
        assert long_first < decode_end  # it went at once, into the decode's passes
    assert sample(zone, "gtm_zone_admission_waiting") == 0.0
    await zone.no_leaks()


async def _decoding(zone: Zone) -> bool:
    """One request in flight, past its first byte."""
    accounting = zone.agent.accounting
    return accounting.open_tickets == 1 and accounting.totals().prefilling == 0


async def test_a_request_over_the_queue_budget_waits_for_the_queue_to_drain(
    make_zone: ZoneFactory,
) -> None:
    zone = await make_zone(
        ["H100"],
        admission=AdmissionSettings(mode=AdmissionMode.SLO),
        first_byte_floor_s=60.0,
    )
    sim = zone.sims[0]
    await zone.faults(sim, {"hang": True})
    http, url = zone.http, zone.url
    async with asyncio.TaskGroup() as group:
        # ~1.5 s of prefill queued (30,000 tokens on an H100), over the 500 ms budget.
        queued = group.create_task(stream(http, url, "word " * 30_000, 4))
        await eventually(lambda: _charged(zone, 1))
        held = group.create_task(stream(http, url, "hello", 4))

        async def waiting() -> bool:
            return sample(zone, "gtm_zone_admission_waiting") == 1.0

        await eventually(waiting)
        assert zone.agent.accounting.open_tickets == 1  # the worker has not seen it
        await zone.faults(sim)  # the GPU answers again: the queue drains
    assert queued.result()[0] <= held.result()[0]
    assert sample(zone, "gtm_zone_admission_released_total", {"reason": "room"}) == 1.0
    await zone.no_leaks()


async def _charged(zone: Zone, n: int) -> bool:
    return zone.agent.accounting.open_tickets == n


async def test_a_profile_without_a_ttft_prediction_is_refused_while_flow_control_runs(
    make_zone: ZoneFactory,
) -> None:
    zone = await make_zone(["H100"], admission=AdmissionSettings(mode=AdmissionMode.SLO))
    data = BUILTIN_PROFILES[DEFAULT_PROFILE].model_dump(mode="json")
    data["profile"]["scorers"] = [{"ref": "kv-cache", "weight": 1.0}]
    data["profile"]["cost_model"] = None
    blind = build_zone_profile(load_profile_spec(data))
    in_force = zone.agent.profile
    with pytest.raises(ConfigError, match="needs a profile that predicts TTFT"):
        zone.agent.set_profile(blind)
    assert zone.agent.profile is in_force
    # The agent serves under the profile in force (stream checks the 200).
    first, end = await stream(zone.http, zone.url, "hello", 2)
    assert first is not None
    assert first <= end
    await zone.no_leaks()


@pytest.mark.parametrize("admission", [True, False], ids=["slo", "off"])
async def test_a_request_sent_at_once_is_decided_once(
    make_zone: ZoneFactory, admission: bool
) -> None:
    # Flow control judges a request by deciding it; one that goes at once is sent with
    # that decision, not decided again (counted by the runner, one per decision).
    zone = await make_zone(
        ["H100", "H100"],
        admission=AdmissionSettings(mode=AdmissionMode.SLO) if admission else AdmissionSettings(),
    )
    decisions = {"tier": "zone", "profile": DEFAULT_PROFILE}
    before = sample(zone, "gtm_routing_decision_duration_seconds_count", decisions)
    for n in range(5):
        first, end = await stream(zone.http, zone.url, f"hello {n}", 2)
        assert first is not None
        assert first <= end
    decided = sample(zone, "gtm_routing_decision_duration_seconds_count", decisions) - before
    assert decided == 5
    assert sample(zone, "gtm_zone_admission_wait_seconds_count") == 0.0  # nobody waited
    await zone.no_leaks()


async def test_a_request_held_on_another_clients_queue_goes_when_a_scrape_finds_it_gone(
    make_zone: ZoneFactory,
) -> None:
    # Another client (a second agent, another router) queues requests at the GPU. The
    # agent's last scrape saw them; by the time a request comes they are all answered.
    # It is held on that picture, and flow control asks for a scrape at once: no wait
    # for the next regular one (a minute away here; the request would have gone only at
    # its longest wait, released for max_wait, not for room).
    zone = await make_zone(
        ["H100"],
        sim_overrides={"speedup": 1.0},
        admission=AdmissionSettings(mode=AdmissionMode.SLO, max_wait_s=60.0),
        scrape_interval_s=60.0,
    )
    sim, agent = zone.sims[0], zone.agent
    async with asyncio.TaskGroup() as group:
        # 24 prompts of ~1,000 tokens: one pass prefills 8 (8,192 tokens), 16 wait,
        # ~0.8 s of predicted prefill, over the 500 ms queue budget.
        for _ in range(24):
            group.create_task(stream(zone.http, sim.url, "word " * 1_000, 1))

        async def seen() -> bool:
            await agent.scrape_round()
            return bool(others_queued(agent.view))

        await eventually(seen)
    # Every one answered; the picture still has them.
    assert others_queued(agent.view) == {"gpu-0"}
    assert sample(zone, "gtm_zone_scrapes_early_total") == 0.0
    first, _ = await stream(zone.http, zone.url, "hello", 1)
    assert first is not None
    assert sample(zone, "gtm_zone_admission_wait_seconds_count") == 1.0  # it was held
    assert sample(zone, "gtm_zone_admission_released_total", {"reason": "room"}) == 1.0
    assert sample(zone, "gtm_zone_admission_released_total", {"reason": "max_wait"}) == 0.0
    assert sample(zone, "gtm_zone_scrapes_early_total") >= 1.0
    assert not others_queued(agent.view)
    await zone.no_leaks()


async def test_another_clients_waiting_request_weighs_what_the_worker_computed_lately(
    make_zone: ZoneFactory,
) -> None:
    # The worker's own counters say what its requests weigh: another client's ~40-token
    # prompts count as ~40 tokens each when they wait, not the fixed 1,024 of a guess.
    zone = await make_zone(["H100"], scrape_interval_s=60.0)
    sim, agent = zone.sims[0], zone.agent
    assert agent.view.gpus[0].prompt_tokens == {}  # nothing prefilled yet
    for n in range(8):  # each its own first block: no prefix-cache hit
        await stream(zone.http, sim.url, f"{n} " + "word " * 40, 1)
    await agent.scrape_round()
    [(label, weight)] = agent.view.gpus[0].prompt_tokens.items()
    assert label in ("", LLAMA_8B)
    assert 30.0 <= weight <= 60.0


async def test_an_early_scrape_reads_only_the_gpus_flow_control_asked_for(
    make_zone: ZoneFactory,
) -> None:
    # Flow control asks for a fresher look at the GPUs where it saw others' work; the
    # early scrape reads those, not the whole zone (which may be a thousand GPUs).
    zone = await make_zone(
        ["H100", "H100"],
        admission=AdmissionSettings(mode=AdmissionMode.SLO, rescrape_s=0.05),
        scrape_interval_s=60.0,
    )
    agent = zone.agent

    def scraped_at() -> dict[str, float]:
        return {g.id: g.metrics.scraped_at for g in agent.view.gpus if g.metrics is not None}

    before = scraped_at()
    assert set(before) == {"gpu-0", "gpu-1"}
    assert agent.flow is not None
    agent.flow._rescrape(frozenset({"gpu-1"}))  # type: ignore[misc]  # what _stale calls

    async def rescraped() -> bool:
        return scraped_at()["gpu-1"] > before["gpu-1"]

    await eventually(rescraped)
    assert scraped_at()["gpu-0"] == before["gpu-0"]
    assert sample(zone, "gtm_zone_scrapes_early_total") == 1.0
