"""An operator's session against ``gtm up --processes``, following what the CLI says.

One deployment (its private etcd, two EU regions); the operator works the way the README
and the error lines lead them:

1. ``gtm drain region eu-west --api <the front door>`` — the URL they know — is not a
   drain API under ``--processes``; the one line it prints names the ``--state`` to use,
   and that very ``--state`` drains eu-west (London's DNS answer moves to eu-central);
2. a typo, ``gtm drain region planet-x``, is refused (exit 2) naming the known regions;
3. the private etcd is killed (a crash, not a drill): ``gtm up`` starts it again and
   the undrain written afterwards reaches DNS;
4. after Ctrl-C, ``gtm audit verify RUN_DIR`` verifies each per-tier chain it wrote;
5. ``gtm policy explain`` places a public address with the front door's database and
   answers in its exit status.

Before issue 22 each step failed: "HTTP 404 without a JSON body", exit 0 for planet-x,
an etcd left dead (every tier on a stale snapshot), "no audit files given", and
"`policy explain` has no GeoIP database" with exit 0 on REFUSED.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.gtmctl.up.helpers import Up, running_up
from tests.integration.gtmctl.up.test_up import LONDON, eventually

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(180)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def gtm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gtmctl", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def run(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(gtm, *args)


async def etcd_member(up: Up) -> dict[str, Any]:
    url = f"http://127.0.0.1:{up.http_port + 1}/api/v1/deployment"
    async with (
        aiohttp.ClientSession(headers=up.admin_headers()) as session,
        session.get(url) as response,
    ):
        [member] = (await response.json())["etcd"]
    return dict(member)


async def test_an_operator_session(tmp_path: Path) -> None:
    regions = ("eu-west", "eu-central")
    async with running_up(tmp_path, "--processes", "--speedup", "10", regions=regions) as up:
        token = str(up.admin_dir / "operator.token")

        async def london_goes_to(region: str) -> bool:
            return await up.resolve("api.inference.example.", LONDON) == [up.address(region)]

        # 1. The front door is not the drain API here; the error says what is.
        wrong = await run("drain", "region", "eu-west", "--api", up.base_url, "--token-file", token)
        assert wrong.returncode == 1
        [line] = wrong.stderr.splitlines()
        found = re.search(r"--state (etcd://\S+)", line)
        assert found is not None, line
        state = found.group(1)
        drained = await run("drain", "region", "eu-west", "--state", state)
        assert drained.returncode == 0, drained.stderr
        await eventually(lambda: london_goes_to("eu-central"), "eu-west drained")

        # 2. A typo is an error naming the known regions, and drains nothing.
        typo = await run("drain", "region", "planet-x", "--state", state)
        assert typo.returncode == 2
        [line] = typo.stderr.splitlines()
        assert "unknown region 'planet-x'; known regions: eu-central, eu-west" in line

        # 3. The private etcd dies; gtm up restarts it and the tiers follow it again.
        member = await etcd_member(up)
        os.kill(member["pid"], signal.SIGKILL)

        async def back() -> bool:
            now = await etcd_member(up)
            return now["restarts"] == 1 and now["pid"] not in (None, member["pid"])

        await eventually(back, "gtm up restarted its etcd")
        undrained = await run("undrain", "region", "eu-west", "--state", state)
        assert undrained.returncode == 0, undrained.stderr
        await eventually(lambda: london_goes_to("eu-west"), "eu-west undrained after the restart")

    said = (tmp_path / "up.stderr").read_text()  # the outage: one line as it starts, one as it ends
    assert said.count(f"etcd member {member['name']} died") == 1, said[-3000:]
    assert said.count(f"etcd member {member['name']} is back") == 1, said[-3000:]

    # 4. Every per-tier audit chain of the run directory is found and verified.
    run_dir = tmp_path / "run"
    verified = await run("audit", "verify", str(run_dir))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"OK: {run_dir / 'admin-audit'} (admin chain): " in verified.stdout
    assert verified.stdout.splitlines()[-1].startswith("verified ")

    # 5. A public address is placed as the front door places it; the verdict is the status.
    allowed = await run("policy", "explain", "--tenant", "demo-eu", "--model", MODEL,
                        "--client-ip", "81.2.69.160")  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    assert "client_country=GB" in allowed.stdout
    refused = await run("policy", "explain", "--tenant", "nobody", "--model", MODEL,
                        "--client-ip", "81.2.69.160")  # fmt: skip
    assert refused.returncode == 1
    assert "verdict: REFUSED" in refused.stdout
