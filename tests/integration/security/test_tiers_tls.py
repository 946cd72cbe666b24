"""The tiers' own servers and clients with mutual TLS: a zone agent in front of emulated
GPUs (TLS or not), the identities each side accepts, no plaintext fallback, and the
command-line options that turn it on."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.clock import SystemClock
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from gtm.tls import (
    DEFAULT_CLIENTS,
    DEFAULT_PEERS,
    TlsConfig,
    TlsMaterial,
    client_session_options,
    connector_ssl,
)
from gtmctl.cli import cli
from tests.integration.security.conftest import Pki
from zone_agent.app import ZoneAgent
from zone_agent.config import ZoneConfig, parse_worker

pytestmark = pytest.mark.integration

CHAT = {"model": LLAMA_8B, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _material(config: TlsConfig | None) -> TlsMaterial | None:
    if config is None:
        return None
    return TlsMaterial(config, clock=SystemClock(), registry=new_registry())


@asynccontextmanager
async def _zone(
    worker_tls: TlsConfig | None, zone_tls: TlsConfig, *, plain_workers: bool = False
) -> AsyncIterator[str]:
    async with AsyncExitStack() as stack:
        sim_config = GpuSimConfig.model_validate(
            {"port": 0, "speedup": 1000.0, "gpu_type": "H100", "models": (LLAMA_8B,)}
        )
        sim = GpuSimServer(sim_config, registry=new_registry(), tls=_material(worker_tls))
        await sim.start()
        stack.push_async_callback(sim.stop)
        config = ZoneConfig.model_validate(
            {
                "zone": "zone-a",
                "region": "region-1",
                "port": 0,
                "workers": (parse_worker(f"{sim.url},gpu=H100,id=g0,model={LLAMA_8B}"),),
            }
        )
        agent = ZoneAgent(
            config, registry=new_registry(), tls=_material(zone_tls), plain_workers=plain_workers
        )
        await agent.start()
        stack.push_async_callback(agent.stop)
        yield agent.url


async def _chat(url: str, context: ssl.SSLContext) -> tuple[int, dict[str, Any]]:
    connector = aiohttp.TCPConnector(ssl=connector_ssl(context))
    async with (
        aiohttp.ClientSession(connector=connector, **client_session_options(context)) as s,
        s.post(f"{url}/v1/chat/completions", json=CHAT) as response,
    ):
        return response.status, await response.json()


def _zone_config(pki: Pki) -> TlsConfig:
    return pki.config("zone/zone-a", peers=DEFAULT_PEERS["zone"], clients=DEFAULT_CLIENTS["zone"])


def _region_client(pki: Pki) -> ssl.SSLContext:
    material = _material(pki.config("region/region-1", peers=("zone/*",)))
    assert material is not None
    return material.client_context()


async def test_zone_serves_through_a_tls_worker(pki: Pki) -> None:
    async with _zone(pki.config("gpu/g0"), _zone_config(pki)) as url:
        assert url.startswith("https://")
        status, body = await _chat(url, _region_client(pki))
        exposition = await _metrics(url, _region_client(pki))
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]
    # The worker's /metrics was read over TLS too (the scrapes' own pool).
    assert 'gtm_zone_scrape_age_seconds{gpu="g0"}' in exposition
    assert 'gtm_zone_scrape_failures_total{gpu="g0"}' not in exposition


async def _metrics(url: str, context: ssl.SSLContext) -> str:
    connector = aiohttp.TCPConnector(ssl=connector_ssl(context))
    async with (
        aiohttp.ClientSession(connector=connector, **client_session_options(context)) as s,
        s.get(f"{url}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


@pytest.mark.parametrize("worker", ["plain", "wrong identity", "other CA"])
async def test_zone_refuses_workers_it_cannot_verify(pki: Pki, other_pki: Pki, worker: str) -> None:
    worker_tls = {
        "plain": None,
        "wrong identity": pki.config("zone/impostor"),
        "other CA": other_pki.config("gpu/g0"),
    }[worker]
    async with _zone(worker_tls, _zone_config(pki)) as url:
        status, body = await _chat(url, _region_client(pki))
    assert status == 503, body  # no GPU it could verify: never a plaintext fallback


async def test_plain_workers_only_when_allowed(pki: Pki) -> None:
    async with _zone(None, _zone_config(pki), plain_workers=True) as url:
        status, body = await _chat(url, _region_client(pki))
    assert status == 200, body


async def test_zone_refuses_a_client_of_the_wrong_tier(pki: Pki) -> None:
    gpu_client = _material(pki.config("gpu/g9", peers=("zone/*",)))
    assert gpu_client is not None
    async with _zone(pki.config("gpu/g0"), _zone_config(pki)) as url:
        with pytest.raises(aiohttp.ClientError):
            await _chat(url, gpu_client.client_context())


@pytest.mark.parametrize("command", ["global", "regional", "zone", "gpu-sim"])
def test_partial_tls_options_are_a_usage_error(command: str) -> None:
    args = [command, "--tls-cert", "cert.pem"]
    if command == "regional":
        args += ["--region", "eu-west", "--state", "memory"]
    if command == "zone":
        args += ["--zone", "eu-west-a", "--region", "eu-west"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "missing --tls-ca, --tls-key" in result.output
