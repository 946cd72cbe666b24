"""Every injectable fault, as a client of the emulated worker sees it."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from gtm.gpu_profiles import LLAMA_8B

from .conftest import Sim, SimFactory, value

pytestmark = pytest.mark.integration

HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Say hello to the fault injector, please."}
]
IGNORE_EOS = {"ignore_eos": True}


async def _chat(sim: Sim, max_tokens: int = 5, client: openai.AsyncOpenAI | None = None) -> str:
    response = await (client or sim.client).chat.completions.create(
        model=LLAMA_8B,
        messages=HELLO,
        max_tokens=max_tokens,
        extra_body=IGNORE_EOS,
    )
    content = response.choices[0].message.content
    assert content is not None
    return content


async def _drain(stream: AsyncStream[ChatCompletionChunk], received: list[str]) -> None:
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received.append(chunk.choices[0].delta.content)


async def _mean_itl(sim: Sim, tokens: int) -> float:
    """Mean inter-token latency (engine time) of one request, from /metrics deltas."""
    label = {"model_name": LLAMA_8B}
    before = await sim.scrape()
    await _chat(sim, tokens)
    after = await sim.scrape()
    total = value(after, "vllm:inter_token_latency_seconds_sum", **label) - value(
        before, "vllm:inter_token_latency_seconds_sum", **label
    )
    count = value(after, "vllm:inter_token_latency_seconds_count", **label) - value(
        before, "vllm:inter_token_latency_seconds_count", **label
    )
    assert count == tokens - 1
    return total / count


async def test_admin_faults_get_post_delete(sim: Sim) -> None:
    assert (await sim.faults("GET"))["error_rate"] == 0.0
    merged = await sim.faults("POST", {"error_rate": 0.25})
    merged = await sim.faults("POST", {"added_latency_ms": 5})
    assert (merged["error_rate"], merged["added_latency_ms"]) == (0.25, 5.0)
    cleared = await sim.faults("DELETE")
    assert cleared["error_rate"] == 0.0
    bad = await sim.http.post(sim.url + "/admin/faults", json={"error_rate": 3})
    assert bad.status_code == 400
    assert "error_rate" in bad.json()["error"]["message"]
    put = await sim.http.put(sim.url + "/admin/faults", json={})
    assert put.status_code == 405


async def test_error_rate_fails_requests_with_the_chosen_status(sim: Sim) -> None:
    await sim.faults("POST", {"error_rate": 1.0, "error_status": 503})
    with pytest.raises(openai.InternalServerError) as unavailable:
        await _chat(sim)
    assert unavailable.value.status_code == 503
    await sim.faults("POST", {"error_status": 429})
    with pytest.raises(openai.RateLimitError):
        await _chat(sim)
    await sim.faults("DELETE")
    assert await _chat(sim)
    samples = await sim.scrape()
    assert value(samples, "gtm_gpusim_faults_injected_total", fault="error") == 2


async def test_added_latency_delays_the_answer(sim: Sim) -> None:
    await sim.faults("POST", {"added_latency_ms": 150})
    started = time.monotonic()
    await _chat(sim)
    assert time.monotonic() - started >= 0.15


async def test_hang_accepts_and_never_answers(sim: Sim) -> None:
    await sim.faults("POST", {"hang": True})
    impatient = sim.client.with_options(timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        await _chat(sim, client=impatient)
    samples = await sim.scrape()
    assert value(samples, "gtm_gpusim_faults_injected_total", fault="hang") == 1
    assert (await sim.http.get(sim.url + "/health")).status_code == 200  # only inference hangs
    await sim.faults("DELETE")
    assert await _chat(sim)


async def test_black_hole_silences_every_endpoint_but_the_faults_own(sim: Sim) -> None:
    """A black-holed host: inference, the scrape, the health check and what the peers
    poll all go unanswered; only ``/admin/faults`` answers, so the fault can be cleared,
    and then everything answers again."""
    await sim.faults("POST", {"black_hole": True})
    impatient = sim.client.with_options(timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        await _chat(sim, client=impatient)
    for path in ("/metrics", "/health", "/v1/models", "/get_load"):
        with pytest.raises(httpx.TimeoutException):
            await sim.http.get(sim.url + path, timeout=0.3)
    assert (await sim.faults("GET"))["black_hole"] is True
    await sim.faults("DELETE")
    for path in ("/health", "/v1/models", "/get_load"):
        assert (await sim.http.get(sim.url + path)).status_code == 200
    assert await _chat(sim)
    samples = await sim.scrape()
    assert value(samples, "gtm_gpusim_faults_injected_total", fault="black_hole") == 5


async def test_slowdown_and_thermal_throttle_stretch_every_pass(sim: Sim) -> None:
    normal = await _mean_itl(sim, 40)
    await sim.faults("POST", {"slowdown": 8.0})
    started = time.monotonic()
    slowed = await _mean_itl(sim, 40)
    # Wall time too: 39 passes, each 8× longer, at the configured speedup.
    assert time.monotonic() - started >= 39 * slowed / sim.server.config.speedup
    assert slowed == pytest.approx(8.0 * normal, rel=1e-6)
    await sim.faults("POST", {"slowdown": 1.0, "thermal_throttle": True})
    throttled = await _mean_itl(sim, 40)
    assert throttled == pytest.approx(normal / 0.8, rel=1e-6)


async def test_stop_stream_cuts_the_connection_mid_response(sim: Sim) -> None:
    await sim.faults("POST", {"stop_stream_after": 5})
    stream = await sim.client.chat.completions.create(
        model=LLAMA_8B,
        messages=HELLO,
        max_tokens=50,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError, match=r"incomplete chunked read|peer closed"):
        await _drain(stream, received)
    assert len(received) == 5
    await sim.faults("DELETE")
    assert await _chat(sim)


async def test_crash_exits_the_process(make_sim: SimFactory) -> None:
    exits: list[int] = []
    sim = await make_sim(exit_fn=exits.append)
    response = await sim.http.post(sim.url + "/admin/faults", json={"crash": True})
    assert response.status_code == 200
    assert response.json()["crash"] is True
    assert exits == [70]
