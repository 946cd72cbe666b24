"""Workers that fail, hang, reset, cut streams or speak garbage, via the emulator's fault
API: the agent retries before the first byte, ejects outliers, never hangs or crashes,
and releases every charge."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx
import openai
import pytest
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from gtm.clock import SystemClock
from gtm.gpu_profiles import LLAMA_8B, get_profile
from zone_agent.health import HealthConfig
from zone_agent.profiles import builtin_profile
from zone_agent.scrape import scrape
from zone_agent.upstream import UpstreamPool

from .conftest import FAST_HEALTH, Zone, ZoneFactory, eventually

pytestmark = pytest.mark.integration

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello, faults."}]


async def _drain(stream: AsyncStream[ChatCompletionChunk], received: list[str]) -> None:
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received.append(chunk.choices[0].delta.content)


async def _ask(zone: object, client: openai.AsyncOpenAI) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=LLAMA_8B, messages=HELLO, max_tokens=3
    )
    return raw.headers["x-gtm-gpu"]


async def test_5xx_is_retried_elsewhere_and_the_gpu_ejected(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "H100"])
    await zone.faults(zone.sims[0], {"error_rate": 1.0, "error_status": 500})
    zone.agent.set_profile(builtin_profile("round-robin"))  # make sure gpu-0 gets asked
    served = [await _ask(zone, zone.client) for _ in range(6)]
    assert set(served) == {"gpu-1"}
    retries = zone.agent.registry.get_sample_value("gtm_zone_retries_total", {"reason": "http_500"})
    assert retries == 2  # FAST_HEALTH: ejected after 2 consecutive failures
    assert zone.agent.health.ejected_until("gpu-0") is not None
    assert zone.agent.registry.get_sample_value("gtm_zone_ejections_total", {"gpu": "gpu-0"}) == 1
    gpu0 = zone.agent.view.gpu("gpu-0")
    assert gpu0 is not None
    assert "ejected" in (gpu0.unavailable_reason() or "")
    await zone.no_leaks()


async def test_every_gpu_failing_is_a_502_not_a_hang(make_zone: ZoneFactory) -> None:
    zone = await make_zone(
        ["H100", "H100"],
        health=HealthConfig(**{**FAST_HEALTH.model_dump(), "consecutive_failures": 50}),
    )
    for sim in zone.sims:
        await zone.faults(sim, {"error_rate": 1.0, "error_status": 503})
    with pytest.raises(openai.APIStatusError) as info:
        await zone.client.chat.completions.create(model=LLAMA_8B, messages=HELLO, max_tokens=3)
    assert info.value.status_code == 502
    assert "failed on 2 GPU(s)" in info.value.message
    await zone.no_leaks()


async def test_a_hanging_worker_times_out_and_the_request_moves_on(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "H100"], upstream_timeout_s=0.5)
    await zone.faults(zone.sims[0], {"hang": True})
    zone.agent.set_profile(builtin_profile("round-robin"))
    started = time.monotonic()
    served = [await _ask(zone, zone.client) for _ in range(2)]
    assert served.count("gpu-1") == 2
    assert time.monotonic() - started >= 0.5
    assert (
        zone.agent.registry.get_sample_value("gtm_zone_retries_total", {"reason": "timeout"}) == 1
    )
    await zone.no_leaks()
    await zone.faults(zone.sims[0])


async def test_a_silent_gpu_misses_the_first_byte_deadline_and_the_stream_moves_on(
    make_zone: ZoneFactory,
) -> None:
    """A streamed request must see its first chunk within max(floor, factor × predicted
    TTFT), not the (long) upstream timeout: a black-holed GPU costs one floor, then the
    request is served by another GPU and the silent one is charged a timeout."""
    zone = await make_zone(["H100", "H100"], upstream_timeout_s=60.0, first_byte_floor_s=0.5)
    await zone.faults(zone.sims[0], {"hang": True})
    zone.agent.set_profile(builtin_profile("round-robin"))  # one of two asks gpu-0
    started = time.monotonic()
    for _ in range(2):
        raw = await zone.client.chat.completions.with_raw_response.create(
            model=LLAMA_8B, messages=HELLO, max_tokens=3, stream=True
        )
        received: list[str] = []
        await _drain(raw.parse(), received)
        assert raw.headers["x-gtm-gpu"] == "gpu-1"
        assert received
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 10.0  # one floor, far from the 60 s upstream timeout
    assert (
        zone.agent.registry.get_sample_value(
            "gtm_zone_upstream_failures_total", {"gpu": "gpu-0", "outcome": "timeout"}
        )
        == 1
    )
    await zone.no_leaks()
    await zone.faults(zone.sims[0])


async def test_a_cut_stream_reaches_the_client_as_an_error(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100"])
    await zone.faults(zone.sims[0], {"stop_stream_after": 3})
    stream = await zone.client.chat.completions.create(
        model=LLAMA_8B, messages=HELLO, max_tokens=50, stream=True, extra_body={"ignore_eos": True}
    )
    received: list[str] = []
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        await _drain(stream, received)
    assert 0 < len(received) <= 3
    await zone.no_leaks()
    failures = zone.agent.registry.get_sample_value(
        "gtm_zone_upstream_failures_total", {"gpu": "gpu-0", "outcome": "reset"}
    )
    assert failures == 1


async def test_client_disconnect_cancels_upstream_and_releases(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100"], sim_overrides={"speedup": 20.0})
    sim = zone.sims[0]
    async with aiohttp.ClientSession() as http:
        response = await http.post(
            zone.url + "/v1/chat/completions",
            json={
                "model": LLAMA_8B,
                "messages": HELLO,
                "max_tokens": 5000,
                "stream": True,
                "ignore_eos": True,
            },
        )
        assert response.status == 200
        first = await response.content.readany()
        assert first.startswith(b"data:")
        assert zone.agent.accounting.totals().streams == 1
        response.close()  # the client goes away mid-stream
    await zone.no_leaks()

    async def worker_idle() -> bool:
        return sim.driver(LLAMA_8B).in_flight == 0

    await eventually(worker_idle)


async def test_a_dead_worker_is_retried_elsewhere(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "H100"])
    zone.agent.set_profile(builtin_profile("round-robin"))
    await zone.sims[0].stop()  # healthy a moment ago; now nothing listens there
    served = [await _ask(zone, zone.client) for _ in range(3)]
    assert set(served) == {"gpu-1"}
    retries = zone.agent.registry.get_sample_value("gtm_zone_retries_total", {"reason": "connect"})
    assert retries is not None
    assert retries >= 1
    await zone.no_leaks()


async def _garbage_worker() -> tuple[asyncio.Server, str]:
    """Healthy on GET, garbage (not HTTP at all) on every POST."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            if line.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            else:
                writer.write(b"\x00\x13garbage \xff\xfe not http\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def test_garbage_from_a_worker_is_retried_not_crashed_on(make_zone: ZoneFactory) -> None:
    server, url = await _garbage_worker()
    try:
        zone = await make_zone(
            ["H100"], extra_workers=[f"{url},gpu=H100,id=garbage,model={LLAMA_8B}"]
        )
        zone.agent.set_profile(builtin_profile("round-robin"))
        served = [await _ask(zone, zone.client) for _ in range(3)]
        assert set(served) == {"gpu-0"}
        resets = zone.agent.registry.get_sample_value(
            "gtm_zone_upstream_failures_total", {"gpu": "garbage", "outcome": "reset"}
        )
        assert resets is not None
        assert resets >= 1
        await zone.no_leaks()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_throttled_gpu_is_detected_and_deweighted(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "H100", "H100"], sim_overrides={"speedup": 1.0})
    zone.agent.set_profile(builtin_profile("round-robin"))
    await zone.faults(zone.sims[2], {"thermal_throttle": True})
    for _round in range(3):
        await asyncio.gather(
            *(
                zone.client.chat.completions.create(
                    model=LLAMA_8B, messages=HELLO, max_tokens=40, extra_body={"ignore_eos": True}
                )
                for _ in range(6)
            )
        )
        await zone.agent.scrape_round()
    weight = zone.agent.view.gpu("gpu-2")
    normal = zone.agent.view.gpu("gpu-0")
    assert weight is not None
    assert normal is not None
    assert weight.health.slowdown > 1.15
    assert normal.health.slowdown < 1.1
    assert weight.health.weight < 0.9


async def test_prefill_interference_is_not_taken_for_a_slow_gpu(
    make_zone: ZoneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long prompts arriving while others decode slow every decode step down (their
    chunks share the passes): that is load, which the cost model prices, not a
    throttled GPU; the throughput check must not de-weight healthy GPUs for it."""
    zone = await make_zone(["H100", "H100"], sim_overrides={"speedup": 1.0})
    zone.agent.set_profile(builtin_profile("round-robin"))
    long_prompt: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": " ".join(f"w{i % 997}" for i in range(6000))}
    ]

    async def decode() -> None:
        await zone.client.chat.completions.create(
            model=LLAMA_8B, messages=HELLO, max_tokens=150, extra_body={"ignore_eos": True}
        )

    async def prefill(k: int) -> None:
        await asyncio.sleep(0)  # the decoding requests are admitted first
        await zone.client.chat.completions.create(
            model=LLAMA_8B,
            messages=[{"role": "system", "content": f"caller {k}"}, *long_prompt],
            max_tokens=2,
        )

    # Decoding alone first: each GPU's own best is its quiet speed, as in production.
    await asyncio.gather(*(decode() for _ in range(4)))
    await zone.agent.scrape_round()
    before = {s.url: await scrape_itl(zone, s.url) for s in zone.sims}
    worst = {"gpu-0": 0.0, "gpu-1": 0.0}
    rebuild = zone.agent.rebuild

    def watched() -> None:  # every view the decisions saw while the load ran
        rebuild()
        for gid in worst:
            gpu = zone.agent.view.gpu(gid)
            assert gpu is not None
            worst[gid] = max(worst[gid], gpu.health.slowdown)

    monkeypatch.setattr(zone.agent, "rebuild", watched)
    await asyncio.gather(*(decode() for _ in range(4)), *(prefill(k) for k in range(12)))
    await zone.agent.scrape_round()
    monkeypatch.undo()
    profile = get_profile("H100", LLAMA_8B)
    for sim in zone.sims:
        itl_sum, itl_count = await scrape_itl(zone, sim.url)
        mean_itl = (itl_sum - before[sim.url][0]) / (itl_count - before[sim.url][1])
        # The interference was real: decode steps several times the profile's own.
        assert mean_itl > 3 * profile.decode_step_s(2, 64)
    assert max(worst.values()) < 1 + HealthConfig().regression_threshold, worst
    await zone.no_leaks()


async def scrape_itl(zone: Zone, url: str) -> tuple[float, float]:
    """A worker's cumulative inter-token latency (sum, count) for the chat model (an
    engine writes the histogram's series at its first observation: absent is zero)."""
    pool = UpstreamPool()
    try:
        metrics = await scrape(pool, url, clock=SystemClock(), timeout_s=5.0)
    finally:
        await pool.close()
    model = metrics.models[LLAMA_8B]
    return model.itl_sum or 0.0, model.itl_count or 0.0
