"""A worker declared as a GPU type gtm has no profile of converges to its real pricing.

Real processes: ``gtm gpu-sim --gpu-type X1 --emulate H100`` (an H100's speed under a
name gtm does not know) and ``gtm zone`` in front of it. The zone agent prices it by the
conservative prior (the slowest profile of the model) and says so, then by its own
metrics once they hold ``MIN_SAMPLES × MIN_REQUESTS`` finished requests: within 10 % of
an H100's prefill rate. And a worker declared as an H100 that runs at an L40S's speed
drifts from its profile and is priced by what it measures, within the same bound.
Requests go one at a time and each waits for a scrape after it, so the request at which
the price flips is exact up to one scrape's worth.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gtm.gpu_profiles import LLAMA_8B, get_profile, shipped
from gtm.testing.processes import GtmProcess, running
from zone_agent.calibration import MIN_REQUESTS, MIN_SAMPLES, prior_profile

pytestmark = pytest.mark.integration

STARTUP_TIMEOUT = 30.0
GPU = "gpu-x"
#: Distinct long prompts (compute-bound even on the slow prior), no prefix-cache hits.
WORDS = 1200


@asynccontextmanager
async def zone_over(
    tmp_path: Path, declared: str, emulated: str, flavor: str
) -> AsyncIterator[GtmProcess]:
    """A zone agent in front of one worker declared as ``declared``, running at the speed
    of ``emulated``, exposing ``flavor``'s metric names; SIGINT on the way out."""
    sim_args = [
        "gpu-sim", "--port", "0", "--gpu-type", declared, "--emulate", emulated,
        "--model", LLAMA_8B, "--speedup", "20", "--warmup-passes", "0",
        "--metrics-flavor", flavor,
    ]  # fmt: skip
    async with running(sim_args, stop_signal=signal.SIGINT) as sim:
        worker = f"{sim.url},gpu={declared},id={GPU},model={LLAMA_8B}"
        zone_args = [
            "zone", "--zone", "zone-a", "--region", "region-1", "--listen", "127.0.0.1:0",
            "--scrape-interval", "0.05", "--worker", worker,
        ]  # fmt: skip
        async with running(zone_args, log=tmp_path / "zone.log", stop_signal=signal.SIGINT) as zone:
            yield zone


@pytest.fixture(params=["vllm", "sglang"])
async def zone(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GtmProcess]:
    """The worker in each engine's metric names (vLLM: per-request prefill histograms;
    SGLang: TTFT less queue time, prompt less cached tokens)."""
    async with zone_over(tmp_path, "X1", "H100", request.param) as agent:
        yield agent


Samples = Mapping[tuple[str, frozenset[tuple[str, str]]], float]


async def _metrics(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _source(samples: Samples) -> str:
    found = [
        dict(labels)["source"]
        for (name, labels), value in samples.items()
        if name == "gtm_zone_profile_source" and dict(labels)["gpu"] == GPU and value == 1.0
    ]
    assert len(found) == 1, found
    return found[0]


def _rate(samples: Samples) -> float:
    key = frozenset({"gpu": GPU, "model": LLAMA_8B}.items())
    return samples[("gtm_zone_profile_prefill_tokens_per_second", key)]


async def _scraped_after(http: aiohttp.ClientSession, url: str, moment: float) -> Samples:
    """The agent's metrics once it has scraped the worker after ``moment`` (monotonic)."""
    key = ("gtm_zone_scrape_age_seconds", frozenset({"gpu": GPU}.items()))
    deadline = moment + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        asked = time.monotonic()
        samples = await _metrics(http, url)
        # The scrape happened at (collection time − age) ≥ (asked − age).
        if key in samples and asked - samples[key] > moment + 0.01:
            return samples
    raise AssertionError("the zone agent did not scrape the worker")


async def _until_calibrated(
    http: aiohttp.ClientSession, url: str, bound: int, before: float
) -> tuple[int | None, Samples]:
    """Requests one at a time, each followed by a scrape, until the GPU is priced by
    calibration (the request count then) or ``bound`` requests were sent (None)."""
    samples: Samples = {}
    for n in range(1, bound + 1):
        body = {
            "model": LLAMA_8B,
            "messages": [{"role": "user", "content": f"{n} " + "lorem ipsum " * WORDS}],
            "max_tokens": 4,
        }
        async with http.post(url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
            assert response.headers["x-gtm-gpu"] == GPU
            usage = (await response.json())["usage"]
        assert usage["prompt_tokens"] > 1000
        samples = await _scraped_after(http, url, time.monotonic())
        if _source(samples) == "calibrated":
            return n, samples
        assert _rate(samples) == pytest.approx(before), n
    return None, samples


async def test_an_h100_declared_as_an_unknown_type_converges_to_h100_pricing(
    zone: GtmProcess,
) -> None:
    url = zone.url
    h100 = get_profile("H100", LLAMA_8B).prefill_tokens_per_s
    prior = prior_profile(shipped(), "X1", LLAMA_8B).profile.prefill_tokens_per_s
    bound = MIN_SAMPLES * MIN_REQUESTS
    async with aiohttp.ClientSession() as http:
        samples = await _scraped_after(http, url, time.monotonic())
        assert _source(samples) == "prior"
        assert _rate(samples) == pytest.approx(prior)
        flipped_at, samples = await _until_calibrated(http, url, bound, prior)
    # Priced by measurements within the bound, and not before the samples could exist.
    assert flipped_at is not None, f"still on the prior after {bound} requests"
    assert flipped_at > (MIN_SAMPLES - 1) * MIN_REQUESTS
    assert _rate(samples) == pytest.approx(h100, rel=0.10)
    assert _rate(samples) > 4 * prior
    # Logged once, naming the GPU type, the model and what to do.
    await zone.stop(signal.SIGINT)
    log = zone.log_text()
    warnings = [line for line in log.splitlines() if "no performance profile" in line]
    assert len(warnings) == 1, log
    for part in ("'X1'", LLAMA_8B, "--profiles"):
        assert part in warnings[0]


async def test_a_worker_slower_than_its_profile_is_priced_by_what_it_measures(
    tmp_path: Path,
) -> None:
    """Declared H100, running at an L40S's speed: the H100 profile drifts, so it is
    priced by its measurements, within the same bound."""
    shipped_rate = get_profile("H100", LLAMA_8B).prefill_tokens_per_s
    real = get_profile("L40S", LLAMA_8B).prefill_tokens_per_s
    bound = MIN_SAMPLES * MIN_REQUESTS
    async with zone_over(tmp_path, "H100", "L40S", "vllm") as zone, aiohttp.ClientSession() as http:
        url = zone.url
        samples = await _scraped_after(http, url, time.monotonic())
        assert _source(samples) == "shipped"
        flipped_at, samples = await _until_calibrated(http, url, bound, shipped_rate)
    assert flipped_at is not None, f"still on the H100 profile after {bound} requests"
    assert flipped_at > (MIN_SAMPLES - 1) * MIN_REQUESTS
    assert _rate(samples) == pytest.approx(real, rel=0.10)
