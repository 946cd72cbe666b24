"""Admin APIs from the outside: real servers on loopback, real HTTP clients, the real
``gtm admin`` CLI, and the audit chain checked with the residency log's verifier."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from chaos.proxy.server import FaultProxyServer
from chaos.proxy.service import FaultProxyService
from gpusim.cli import gpu_sim
from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.admin_auth import AdminGuard, Role, TokenFile
from gtm.clock import SystemClock
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from gtmctl.cli import cli
from policies.audit import verify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[tuple[GpuSimServer, TokenFile]]:
    tokens = TokenFile(tmp_path / "tokens.json")
    guard = AdminGuard.from_options(
        token_file=tokens.path, audit_dir=tmp_path / "audit", clock=SystemClock()
    )
    config = GpuSimConfig(port=0, speedup=1000.0, models=(LLAMA_8B,), warmup_passes=0)
    server = GpuSimServer(config, registry=new_registry(), admin=guard)
    await server.start()
    try:
        yield server, tokens
    finally:
        await server.stop()
        guard.close()


async def test_emulator_fault_api_needs_tokens_and_roles(
    emulator: tuple[GpuSimServer, TokenFile], tmp_path: Path
) -> None:
    server, tokens = emulator
    reader, _ = tokens.create(Role.READ_ONLY, now=0.0)
    operator, operator_record = tokens.create(Role.OPERATOR, now=0.0)
    faults = f"{server.url}/admin/faults"
    async with aiohttp.ClientSession() as session:
        async with session.get(faults) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="gtm-admin"'
            body = await response.json()
            assert body["error"]["type"] == "authentication_error"
            assert body["error"]["code"] == "missing_token"
        async with session.get(faults, headers=_bearer(operator[:-2] + "xx")) as response:
            assert response.status == 401
            assert "invalid_token" in response.headers["WWW-Authenticate"]
        async with session.get(faults, headers=_bearer(reader)) as response:
            assert response.status == 200
        async with session.post(
            faults, json={"slowdown": 2.0}, headers=_bearer(reader)
        ) as response:
            assert response.status == 403
            assert (await response.json())["error"]["code"] == "insufficient_role"
        async with session.post(
            faults, json={"slowdown": 2.0}, headers=_bearer(operator)
        ) as response:
            assert response.status == 200
            assert (await response.json())["slowdown"] == 2.0
        async with session.delete(f"{server.url}/admin/lag", headers=_bearer(operator)) as response:
            assert response.status == 200
        # Revoked while the server runs: refused from the next request on.
        assert tokens.revoke(operator_record.id)
        async with session.delete(faults, headers=_bearer(operator)) as response:
            assert response.status == 401
        # The data plane is not an admin API: no token needed.
        body = {"model": LLAMA_8B, "prompt": "hi", "max_tokens": 2}
        async with session.post(f"{server.url}/v1/completions", json=body) as response:
            assert response.status == 200
    report = verify([tmp_path / "audit"])
    assert report.ok, report.problems
    assert report.records == 7
    records = [
        json.loads(line)["record"]
        for path in sorted((tmp_path / "audit").glob("admin-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert [r["status"] for r in records] == [401, 401, 200, 403, 200, 200, 401]
    assert records[4]["who"] == operator_record.id
    assert records[4]["method"] == "POST"
    assert records[4]["target"] == "/admin/faults"
    # Never a token, in the audit log or anywhere in the audit directory.
    for path in (tmp_path / "audit").iterdir():
        text = path.read_text()
        assert operator not in text
        assert reader not in text


async def test_emulator_without_token_file_trusts_loopback_only() -> None:
    config = GpuSimConfig(port=0, speedup=1000.0, models=(LLAMA_8B,), warmup_passes=0)
    async with (
        GpuSimServer(config, registry=new_registry()) as server,
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/admin/faults") as response,
    ):
        assert response.status == 200  # loopback


async def test_fault_proxy_auth_is_opt_in(tmp_path: Path) -> None:
    registry = new_registry()
    plain = FaultProxyServer(FaultProxyService(registry=registry, rng=random.Random(1)), registry)
    await plain.start("127.0.0.1", 0)
    tokens = TokenFile(tmp_path / "tokens.json")
    reader, _ = tokens.create(Role.READ_ONLY, now=0.0)
    operator, _ = tokens.create(Role.OPERATOR, now=0.0)
    guard = AdminGuard(tokens=tokens, clock=SystemClock())
    registry2 = new_registry()
    guarded = FaultProxyServer(
        FaultProxyService(registry=registry2, rng=random.Random(2)), registry2, guard
    )
    await guarded.start("127.0.0.1", 0)
    proxy = {"name": "p", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"}
    try:
        async with aiohttp.ClientSession() as session:
            # Default: Toxiproxy-compatible, no authentication.
            async with session.get(f"{plain.url}/proxies") as response:
                assert response.status == 200
            # With a token file: 401 in the Toxiproxy error shape, /version stays open.
            async with session.get(f"{guarded.url}/proxies") as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
                body = json.loads(await response.text())
                assert body["status"] == 401
                assert "admin token" in body["error"]
            async with session.get(f"{guarded.url}/version") as response:
                assert response.status == 200
            async with session.post(
                f"{guarded.url}/proxies", json=proxy, headers=_bearer(reader)
            ) as response:
                assert response.status == 403
            async with session.post(
                f"{guarded.url}/proxies", json=proxy, headers=_bearer(operator)
            ) as response:
                assert response.status == 201
            async with session.get(f"{guarded.url}/proxies", headers=_bearer(reader)) as response:
                assert "p" in await response.json()
    finally:
        await plain.close()
        await guarded.close()


def test_cli_creates_lists_revokes_and_refuses_remote_binds(tmp_path: Path) -> None:
    runner = CliRunner()
    path = tmp_path / "tokens.json"
    created = runner.invoke(
        cli, ["admin", "token", "create", "--role", "operator", "--token-file", str(path)]
    )
    assert created.exit_code == 0, created.output
    token = created.stdout.strip()
    record = TokenFile(path).authenticate(token)
    assert record is not None
    assert record.role is Role.OPERATOR
    assert token not in path.read_text()
    listed = runner.invoke(cli, ["admin", "token", "list", "--token-file", str(path)])
    assert f"{record.id}\toperator" in listed.stdout
    assert token not in listed.output
    revoked = runner.invoke(cli, ["admin", "token", "revoke", record.id, "--token-file", str(path)])
    assert revoked.exit_code == 0
    assert TokenFile(path).authenticate(token) is None
    again = runner.invoke(cli, ["admin", "token", "revoke", record.id, "--token-file", str(path)])
    assert again.exit_code == 2  # an unknown id is a bad argument, refused in one line
    assert "no token" in again.output
    # An admin API beyond loopback needs the explicit flag *and* a token file.
    remote = runner.invoke(gpu_sim, ["--host", "0.0.0.0", "--port", "0"])
    assert remote.exit_code == 2
    assert "--admin-token-file" in remote.output
    flag_only = runner.invoke(gpu_sim, ["--host", "0.0.0.0", "--allow-remote-admin"])
    assert flag_only.exit_code == 2
    chaos_remote = runner.invoke(cli, ["chaos", "proxy", "--host", "0.0.0.0"])
    assert chaos_remote.exit_code == 2
