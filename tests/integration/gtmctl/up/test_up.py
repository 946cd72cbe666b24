"""``gtm up`` as a user runs it: a subprocess, queried with dnspython and the OpenAI
SDK, drained and undrained, stopped with SIGINT — in one process (the default) and as
one process per tier against a real etcd."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import openai
import pytest

from gtm.state.etcd_server import EtcdServer
from tests.integration.gtmctl.up.helpers import Up, chromium, processes_with, running_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHAT = "meta-llama/Llama-3.1-8B-Instruct"
LONDON = "81.2.69.0/24"
EU = {"eu-west", "eu-central"}
#: How long a drain may take to reach DNS: the snapshot watch plus one view rebuild;
#: generous for a loaded machine (each check below polls, it never just sleeps).
CONVERGE_S = 15.0


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + CONVERGE_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {CONVERGE_S} s: {what}")
        await asyncio.sleep(0.1)


async def check_dns(up: Up) -> None:
    assert await up.resolve("api.inference.example.", LONDON) == [up.address("eu-west")]
    eu = await up.resolve("eu.api.inference.example.")
    assert eu
    assert {up.region_of(a) for a in eu} <= EU


async def check_openai(up: Up) -> None:
    client = openai.AsyncOpenAI(base_url=f"{up.base_url}/v1", api_key="gtm-demo-global")
    async with client:
        raw = await client.chat.completions.with_raw_response.create(
            model=CHAT, messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert raw.headers["x-gtm-region"] in {r.id for r in up.topology.regions}
        assert raw.headers["x-gtm-zone"].startswith(raw.headers["x-gtm-region"])
        assert raw.headers["x-gtm-gpu"].startswith(raw.headers["x-gtm-zone"])
        reply = raw.parse()
        assert reply.choices[0].message.content
        stream = await client.chat.completions.with_raw_response.create(
            model=CHAT, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
        assert stream.headers["x-gtm-gpu"]
        chunks = [c async for c in stream.parse()]
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1
    eu_client = openai.AsyncOpenAI(base_url=f"{up.base_url}/v1", api_key="gtm-demo-eu")
    async with eu_client:
        raw = await eu_client.chat.completions.with_raw_response.create(
            model=CHAT, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert raw.headers["x-gtm-region"] in EU


async def check_status_page(up: Up, tmp_path: Path) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{up.base_url}/api/v1/fleet") as response,
    ):
        assert response.status == 200
        fleet = await response.json()
    assert [r["id"] for r in fleet["regions"]] == [r.id for r in up.topology.regions]
    assert fleet["totals"]["gpus_ready"] == 24
    dom = await chromium(tmp_path, f"{up.base_url}/status", "--dump-dom")
    assert 'data-ready="1"' in dom
    for region in up.topology.regions:
        assert f'class="region" data-region="{region.id}" data-status="healthy"' in dom
        assert f'<article class="card" data-region="{region.id}">' in dom
    shot = tmp_path / "status.png"
    await chromium(tmp_path, f"{up.base_url}/status", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # a map and six tables, not a blank page


async def drain_through_status_api(up: Up) -> None:
    url = f"{up.base_url}/api/v1/drains/region/eu-west"
    async with aiohttp.ClientSession() as anonymous, anonymous.post(url) as response:
        assert response.status == 401  # the drain API needs gtm up's operator token
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    async with aiohttp.ClientSession(headers=up.admin_headers()) as session:
        async with session.post(url) as response:
            assert response.status == 200
            assert (await response.json())["was"] is None  # it was serving

        async def moved() -> bool:
            return await up.resolve("api.inference.example.", LONDON) == [up.address("eu-central")]

        await eventually(moved, "a drained eu-west no longer answers London")
        async with session.delete(url) as response:
            answer = await response.json()
        assert answer["existed"] is True
        assert answer["was"]["reason"] == "status page"  # the drain it ended

        async def back() -> bool:
            return await up.resolve("api.inference.example.", LONDON) == [up.address("eu-west")]

        await eventually(back, "an undrained eu-west answers London again")
        async with session.post(f"{up.base_url}/api/v1/drains/planet/earth") as response:
            assert response.status == 400
        # An id the store does not know is refused, naming the known ones.
        async with session.post(f"{up.base_url}/api/v1/drains/region/planet-x") as response:
            assert response.status == 404
            refusal = await response.json()
        assert "eu-west" in refusal["known"]
        assert "unknown region 'planet-x'" in refusal["error"]
    # `gtm drain --api` sends the same token (read from --token-file).
    token_file = str(up.admin_dir / "operator.token")
    for verb, said in (("drain", "drained zone"), ("undrain", "undrained zone")):
        # A loaded CI machine may take longer than the default 2 s to answer.
        command = [sys.executable, "-m", "gtmctl", verb, "zone", "eu-west-a",
                   "--api", up.base_url, "--token-file", token_file, "--timeout", "20"]  # fmt: skip
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr.decode()
        assert said in done.stdout.decode()
    command = [sys.executable, "-m", "gtmctl", "drain", "region", "planet-x",
               "--api", up.base_url, "--token-file", token_file, "--timeout", "20"]  # fmt: skip
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=30)
    assert done.returncode == 2, done.stderr.decode()
    [line] = done.stderr.decode().splitlines()
    assert "unknown region 'planet-x'" in line
    assert "eu-west" in line


async def check_load(up: Up, tmp_path: Path) -> None:
    summary_path = tmp_path / "load.json"
    command = [
        sys.executable, "-m", "gtmctl", "load", "--trace", "azure-conv",
        "--duration", "5", "--rate-scale", "2", "--url", up.base_url,
        "--json", str(summary_path), "--min-success", "0.99",
    ]  # fmt: skip
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    summary = json.loads(summary_path.read_text())
    assert summary["requests"] >= 10
    assert summary["success_ratio"] >= 0.99
    assert summary["ttft_ms"]["p50"] > 0
    assert len(summary["region_share"]) >= 2  # clients from cities all over the world
    assert "TTFT       p50" in done.stdout.decode()


async def test_in_process_default(tmp_path: Path) -> None:
    async with running_up(tmp_path, "--speedup", "10") as up:
        assert "gtm-demo-global" in up.banner
        assert "gtm-demo-eu" in up.banner
        assert f"-p {up.dns_port} api.inference.example A +subnet={LONDON}" in up.banner
        assert "6 regions, 12 zones, 24 emulated GPUs" in up.banner
        await check_dns(up)
        await check_openai(up)
        await check_status_page(up, tmp_path)
        await drain_through_status_api(up)
        await check_load(up, tmp_path)
    await check_audit_trail(tmp_path / "run")


async def check_audit_trail(run_dir: Path) -> None:
    """`gtm audit verify RUN_DIR` finds the per-tier chains gtm up wrote and verifies each."""
    command = [sys.executable, "-m", "gtmctl", "audit", "verify", str(run_dir)]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
    out = done.stdout.decode()
    assert done.returncode == 0, (out, done.stderr.decode())
    assert f"OK: {run_dir / 'admin-audit'} (admin chain): " in out  # the drains above
    assert out.splitlines()[-1].startswith("verified ")


async def test_processes_against_etcd(tmp_path: Path, own_etcd_server: EtcdServer) -> None:
    state = own_etcd_server.etcd_url

    def gtm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "gtmctl", *args]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=30)

    async with running_up(
        tmp_path,
        "--processes",
        "--state",
        state,
        "--speedup",
        "10",
        regions=("eu-west", "eu-central"),
    ) as up:
        # The children (gtm up starts them with an explicit log level; gtm up itself
        # has the same --state on its command line, but not that).
        children = processes_with("--log-level info", f"--state {state}")
        assert len(children) == 8 + 4 + 2 + 1  # GPUs, zone agents, regional LBs, global
        await check_dns(up)
        await check_openai(up)
        # The status page has a port of its own here (the front door is another process).
        status = f"http://127.0.0.1:{up.http_port + 1}"
        assert f"{status}/status" in up.banner
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{status}/api/v1/fleet") as response,
        ):
            fleet = await response.json()
        assert {r["id"]: r["status"] for r in fleet["regions"]} == {
            "eu-west": "healthy",
            "eu-central": "healthy",
        }

        # The front door has no drain API here: the error names the --state to use.
        token_file = str(up.admin_dir / "operator.token")
        wrong = await asyncio.to_thread(
            gtm, "drain", "region", "eu-west", "--api", up.base_url, "--token-file",
            token_file, check=False,
        )  # fmt: skip
        assert wrong.returncode == 1
        [line] = wrong.stderr.splitlines()
        assert f"--state {state}" in line, line
        assert f"--api {status}" in line, line
        unknown = await asyncio.to_thread(
            gtm, "drain", "region", "planet-x", "--state", state, check=False
        )
        assert unknown.returncode == 2
        assert "known regions: eu-central, eu-west" in unknown.stderr
        await asyncio.to_thread(gtm, "drain", "region", "eu-west", "--state", state)

        async def moved() -> bool:
            return await up.resolve("api.inference.example.", LONDON) == [up.address("eu-central")]

        await eventually(moved, "a drained eu-west no longer answers London")
        await asyncio.to_thread(gtm, "undrain", "region", "eu-west", "--state", state)

        async def back() -> bool:
            answer = await up.resolve("api.inference.example.", LONDON)
            return answer == [up.address("eu-west")]

        await eventually(back, "an undrained eu-west answers London again")
    assert processes_with("--log-level info", f"--state {state}") == []
