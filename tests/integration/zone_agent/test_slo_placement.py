"""The ``goodput`` profile from the client's side: a real agent (slow start on, as a
zone that just came up) in front of emulated H100s whose queues the client fills with
long prompts; when every GPU is late because of its queue, the next short request goes
where the lateness already is — and with the default profile it does not."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gtm.gpu_profiles import LLAMA_8B
from gtm.tokens import count_text_tokens
from tests.integration.zone_agent.conftest import FAST_HEALTH, Zone, ZoneFactory, eventually

#: About 20k prompt tokens a second on an emulated H100 (its profile), so these prompts
#: take 2.5 s, 3.5 s and 2.5 s alone: each later than the 2 s SLO by itself.
LONG_TOKENS = (50_000, 70_000, 50_000)


def prompt(tokens: int) -> str:
    text = "word " * tokens
    assert abs(count_text_tokens(text) - tokens) <= 2
    return text


async def send(http: aiohttp.ClientSession, url: str, tokens: int) -> None:
    """A streamed completion that the hung GPU never answers (cancelled at the end)."""
    body: dict[str, Any] = {
        "model": LLAMA_8B,
        "prompt": prompt(tokens),
        "max_tokens": 4,
        "stream": True,
    }
    async with http.post(url + "/v1/completions", json=body) as response:
        await response.read()


class Client:
    """Sends requests that hang (tasks of one group); they go away together."""

    def __init__(self, zone: Zone, group: asyncio.TaskGroup) -> None:
        self.zone, self.group = zone, group
        self.tasks: list[asyncio.Task[None]] = []

    async def place(self, tokens: int) -> str:
        """Send one request; the GPU the agent assigned it to."""
        zone = self.zone
        before = {gpu: zone.served_by(gpu) for gpu in zone.ids}
        self.tasks.append(self.group.create_task(send(zone.http, zone.url, tokens)))

        async def assigned() -> bool:
            return any(zone.served_by(gpu) > before[gpu] for gpu in zone.ids)

        await eventually(assigned)
        return next(gpu for gpu in zone.ids if zone.served_by(gpu) > before[gpu])

    def go_away(self) -> None:
        for task in self.tasks:
            task.cancel()


@pytest.mark.parametrize(("profile", "short_goes_to"), [("goodput", "gpu-1"), ("default", "gpu-0")])
async def test_when_every_gpu_is_late_the_goodput_profile_concentrates_the_lateness(
    make_zone: ZoneFactory, profile: str, short_goes_to: str
) -> None:
    # Slow start on: the whole zone just came up, every prediction 10× (ramp 0.1). The
    # goodput rule reads them without the ramp, or 25 s queues would be past its cap.
    health = FAST_HEALTH.model_copy(update={"slow_start_s": 600.0})
    zone = await make_zone(
        ["H100", "H100", "H100"],
        profile=profile,
        health=health,
        first_byte_floor_s=60.0,
        upstream_timeout_s=60.0,
    )
    for sim in zone.sims:
        await zone.faults(sim, {"hang": True})
    placed: list[str] = []
    async with asyncio.TaskGroup() as group:
        client = Client(zone, group)
        try:
            # Each long prompt is late by itself everywhere: it gets its best GPU, as
            # the default would give it (the idle ones, in id order).
            placed += [await client.place(n) for n in LONG_TOKENS]
            # Queues of 2.5 s, 3.5 s, 2.5 s: every GPU late, a short prompt on time alone
            # (and, with the goodput profile, the next one joins it: the others drain).
            placed += [await client.place(1_000) for _ in range(2)]
        finally:  # the hung requests go away: the agent releases their charges
            client.go_away()
    assert placed[:3] == ["gpu-0", "gpu-1", "gpu-2"]
    assert placed[3] == short_goes_to
    if profile == "goodput":
        assert placed[4] == "gpu-1"
    for sim in zone.sims:
        await zone.faults(sim)
    await zone.no_leaks()
