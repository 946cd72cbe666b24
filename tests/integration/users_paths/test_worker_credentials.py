"""Workers have their own key; a tenant's key never reaches one.

``gtm up --processes --worker-api-key-file KEY`` on private loopback addresses: every
emulated GPU runs with vLLM's ``--api-key`` (the key in ``VLLM_API_KEY``), every zone
agent is given the file. The GPUs write an access line per request with every request
header in it (``GTM_ACCESS_LOG_FILE``/``GTM_ACCESS_LOG_HEADERS``, the environment form of
``gtm gpu-sim --access-log-file``/``--access-log-headers``), so a key that reached a
worker would be in that log. A tenant then uses the front door with the OpenAI SDK —
its key in ``Authorization``, and in ``x-api-key``/``api-key`` as other SDKs send it:

* the requests succeed (streamed and not): the zone agents authenticate to the workers;
* a GPU asked directly with the tenant's key answers vLLM's 401: the workers really
  are guarded, so the success is the zone's key at work;
* the workers' access log has a line per request, each with the zone's key (masked by
  the worker as ``<worker key #1>``), and the tenant's key nowhere.

And a zone agent given the wrong key (``gtm zone --worker-api-key-file`` in front of a
``gtm gpu-sim --api-key``) answers the client at once with a 502 that says the worker
refused the zone's key — not the worker's 401 (the client's own key was fine) and not a
hang.

Before, the tenant's ``Authorization`` crossed every tier to the worker (a vLLM with
``--api-key`` refused every request and logged tenants' keys), and neither ``gtm up`` nor
``gtm zone`` had a worker key to give.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI, InternalServerError
from openai.types.chat import ChatCompletionMessageParam

from gtm.net import free_port
from gtm.state.etcd_server import EtcdServer
from gtm.testing.processes import running
from tests.integration.gtmctl.up.helpers import running_up
from tests.integration.users_paths.direct_clients import (
    MODEL,
    TENANT_KEY,
    deployment,
    tenant_client,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: Longest start of the whole deployment (a shared 2-core machine under load).
START_TIMEOUT_S = 150.0
#: Longest wait for the access lines of requests already answered.
LINES_WITHIN_S = 20.0
#: A refused key is answered at once: well inside the client's own timeout.
REFUSAL_WITHIN_S = 10.0
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Which key did you see?"}]


def key_file(path: Path) -> tuple[Path, str]:
    key = f"sk-worker-{secrets.token_hex(8)}"
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path, key


def chat_lines(log: Path) -> list[str]:
    text = log.read_text() if log.exists() else ""
    return [line for line in text.splitlines() if "POST /v1/chat/completions" in line]


async def access_lines(log: Path, at_least: int) -> list[str]:
    """The workers' ``POST /v1/chat/completions`` lines, once there are ``at_least``."""
    deadline = time.monotonic() + LINES_WITHIN_S
    while True:
        lines = chat_lines(log)
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        await asyncio.sleep(0.2)


async def test_the_tenants_key_stops_at_the_tiers_and_workers_get_their_own(
    tmp_path: Path, own_etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, worker_key = key_file(tmp_path / "worker.key")
    log = tmp_path / "workers-access.log"
    monkeypatch.setenv("GTM_ACCESS_LOG_FILE", str(log))
    monkeypatch.setenv("GTM_ACCESS_LOG_HEADERS", "1")
    async with running_up(
        tmp_path,
        *("--processes", "--state", own_etcd_server.etcd_url, "--speedup", "20"),
        *("--worker-api-key-file", str(path)),
        regions=("eu-west",),
        start_timeout_s=START_TIMEOUT_S,
    ) as up:
        # The tenant's key in every header a client may put it in.
        credentials = {"x-api-key": TENANT_KEY, "api-key": TENANT_KEY}
        async with tenant_client(up, **credentials) as client:
            answer = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=4
            )
            assert answer.choices[0].message.content
            stream = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=4, stream=True
            )
            assert [chunk async for chunk in stream]

        # A key sent straight to a worker: refused, and in its log (what a leak looks like).
        stray = f"sk-stray-{secrets.token_hex(8)}"
        gpus = [g["url"] for g in (await deployment(up))["gpus"] if g["url"]]
        assert gpus
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                gpus[0] + "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4},
                headers={"Authorization": f"Bearer {stray}"},
            ) as direct,
        ):
            assert direct.status == 401
            assert await direct.json() == {"error": "Unauthorized"}

        lines = await access_lines(log, at_least=3)
    assert any(stray in line and '" 401 Unauthorized' in line for line in lines), lines
    proxied = [line for line in lines if '" 200 OK' in line]
    assert len(proxied) >= 2, lines
    assert all("authorization: bearer <worker key #1>" in line.lower() for line in proxied), proxied
    text = log.read_text()
    assert TENANT_KEY not in text
    assert worker_key not in text


async def test_a_wrong_worker_key_is_a_clear_error_at_once(tmp_path: Path) -> None:
    right, _ = key_file(tmp_path / "right.key")
    wrong, _ = key_file(tmp_path / "wrong.key")
    gpu_argv = ["gpu-sim", "--port", "0", "--gpu-type", "H100", "--speedup", "50"]
    async with running([*gpu_argv, "--api-key", right.read_text().strip()]) as gpu:
        zone_argv = [
            *("zone", "--zone", "zone-a", "--region", "region-1"),
            *("--listen", f"127.0.0.1:{free_port('127.0.0.1')}"),
            *("--worker", f"{gpu.url},gpu=H100,id=gpu-0", "--worker-api-key-file", str(wrong)),
        ]
        async with (
            running(zone_argv) as zone,
            AsyncOpenAI(
                base_url=zone.url + "/v1", api_key=TENANT_KEY, max_retries=0, timeout=60.0
            ) as client,
        ):
            started = time.monotonic()
            with pytest.raises(InternalServerError) as refused:
                await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
            assert time.monotonic() - started < REFUSAL_WITHIN_S
    assert refused.value.status_code == 502
    assert "refused the zone's worker API key" in str(refused.value)
