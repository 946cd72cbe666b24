"""The emulator's vLLM ``--api-key`` and access log (gpusim.auth), over real HTTP.

vLLM's behaviour mirrored: /v1/* needs ``Authorization: Bearer <key>`` (any of the keys,
the scheme in any case) or answers ``401 {"error": "Unauthorized"}``; /health and
/metrics stay open; ``--api-key`` wins over ``VLLM_API_KEY``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI, AuthenticationError
from pydantic import SecretStr

from gpusim.auth import WorkerAuth, WorkerAuthConfig, api_keys
from gpusim.cli import gpu_sim
from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry

KEYS = ("worker-key-1", "worker-key-2")
CHAT = {"model": LLAMA_8B, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[GpuSimServer]:
    auth = WorkerAuthConfig(
        api_keys=tuple(SecretStr(k) for k in KEYS),
        access_log=str(tmp_path / "access.log"),
        access_log_headers=True,
    )
    server = GpuSimServer(
        GpuSimConfig(port=0, speedup=1000.0), registry=new_registry(), auth=WorkerAuth(auth)
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Basic {KEYS[0]}", f"Bearer {KEYS[0]}x", KEYS[0]],
)
async def test_v1_without_the_key_is_vllms_401(
    sim: GpuSimServer, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    async with httpx.AsyncClient(base_url=sim.url, headers=headers) as http:
        for response in (
            await http.post("/v1/chat/completions", json=CHAT),
            await http.get("/v1/models"),
            await http.get("/v1/no-such-path"),
        ):
            assert response.status_code == 401
            assert response.json() == {"error": "Unauthorized"}


@pytest.mark.parametrize("authorization", [f"Bearer {KEYS[0]}", f"bearer {KEYS[1]}"])
async def test_any_of_the_keys_opens_v1(sim: GpuSimServer, authorization: str) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        response = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": authorization}
        )
    assert response.status_code == 200, response.text


async def test_health_metrics_and_preflight_stay_open(sim: GpuSimServer) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.options("/v1/models")).status_code != 401


async def test_the_openai_sdk_sees_an_authentication_error(sim: GpuSimServer) -> None:
    async with AsyncOpenAI(base_url=sim.url + "/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(AuthenticationError):
            await client.chat.completions.create(
                model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
    async with AsyncOpenAI(base_url=sim.url + "/v1", api_key=KEYS[1], max_retries=0) as client:
        answer = await client.chat.completions.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert answer.choices


async def test_the_access_log_shows_each_request_and_with_headers_every_value(
    sim: GpuSimServer, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        await http.get("/v1/models", headers={"Authorization": "Bearer tenant-secret"})
        await http.get("/v1/models", headers={"Authorization": f"Bearer {KEYS[1]}"})
        await http.get("/health")
    lines = (tmp_path / "access.log").read_text().splitlines()
    assert len(lines) == 3
    assert '"GET /v1/models HTTP/1.1" 401 Unauthorized' in lines[0]
    assert "Bearer tenant-secret" in lines[0]  # a credential that reaches it shows
    assert '"GET /v1/models HTTP/1.1" 200 OK' in lines[1]
    assert "Bearer <worker key #2>" in lines[1]
    assert KEYS[1] not in lines[1]  # its own key is masked
    assert '"GET /health HTTP/1.1" 200 OK' in lines[2]


def test_the_key_comes_from_vllms_variable_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vllm = {"VLLM_API_KEY": "from-vllm-variable"}
    assert api_keys((), vllm) == ("from-vllm-variable",)
    assert api_keys(("a", "b"), vllm) == ("a", "b")
    assert api_keys((), {}) == ()
    monkeypatch.setenv("GTM_API_KEY", "from-gtm-variable")  # gtm's rule for every flag
    assert gpu_sim.make_context("gpu-sim", []).params["api_keys"] == ("from-gtm-variable",)
