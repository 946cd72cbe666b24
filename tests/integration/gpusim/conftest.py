"""A running emulated worker on 127.0.0.1:0 and a real OpenAI SDK client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.gpu_profiles import BGE_LARGE, LLAMA_8B
from gtm.metrics import new_registry

#: Fast enough that a 100-token answer takes about a millisecond of wall time.
SPEEDUP = 1000.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Sim:
    server: GpuSimServer
    client: AsyncOpenAI
    http: httpx.AsyncClient

    @property
    def url(self) -> str:
        return self.server.url

    async def scrape(self) -> Samples:
        """Every sample on /metrics, parsed with prometheus_client's own parser."""
        response = await self.http.get(self.url + "/metrics")
        assert response.status_code == 200
        samples: Samples = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return samples

    async def complete(self, prompt: str) -> None:
        """One completion of ``prompt`` (one token), asserted served."""
        body = {"model": LLAMA_8B, "prompt": prompt, "max_tokens": 1}
        response = await self.http.post(self.url + "/v1/completions", json=body)
        assert response.status_code == 200, response.text

    async def faults(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.http.request(method, self.url + "/admin/faults", json=body)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


SimFactory = Callable[..., Coroutine[Any, Any, Sim]]


@pytest.fixture
async def make_sim() -> AsyncIterator[SimFactory]:
    """Start workers with config overrides; everything is stopped at the end of the test."""
    started: list[Sim] = []

    async def make(**overrides: Any) -> Sim:
        options: dict[str, Any] = {
            "port": 0,
            "speedup": SPEEDUP,
            "gpu_type": "H100",
            "models": (LLAMA_8B, BGE_LARGE),
            "seed": 1,
            "warmup_passes": 0,
        }
        server_kwargs = {
            k: overrides.pop(k) for k in ("clock", "store", "exit_fn") if k in overrides
        }
        options.update(overrides)
        server = GpuSimServer(
            GpuSimConfig.model_validate(options), registry=new_registry(), **server_kwargs
        )
        await server.start()
        client = AsyncOpenAI(
            base_url=server.url + "/v1", api_key="test-key", max_retries=0, timeout=20.0
        )
        sim = Sim(server, client, httpx.AsyncClient(timeout=20.0))
        started.append(sim)
        return sim

    yield make
    for sim in started:
        await sim.client.close()
        await sim.http.aclose()
        await sim.server.stop()


@pytest.fixture
async def sim(make_sim: SimFactory) -> Sim:
    return await make_sim()
