"""An audit trail whose tail was cut shows the cut, against the store the tiers anchor in.

The operator's path of the issue: ``gtm up --processes`` against etcd serves requests,
each residency decision goes to the global and regional audit chains; after Ctrl-C the
global chain's file is truncated and its ``.head`` deleted. Before, ``gtm audit verify``
called that OK. Now each tier anchors its chain's head in etcd (at an interval, at every
rotation and on the way out), and ``gtm audit verify RUN_DIR --state etcd://…`` checks
the files against the anchors: the intact run verifies up to its anchors, the cut one
exits 1 naming the anchor and how many records are missing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from gtm.state.etcd_server import EtcdServer
from policies.audit import chain_files
from tests.integration.gtmctl.up.helpers import running_up
from tests.integration.gtmctl.up.test_up import CHAT

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(240)]


async def gtm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gtmctl", *args]
    return await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=60, check=False
    )


async def test_a_cut_audit_tail_shows_against_the_tiers_anchors(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    url = own_etcd_server.etcd_url
    up_args = ("--processes", "--state", url, "--speedup", "10")
    async with running_up(tmp_path, *up_args, regions=("eu-west",)) as up:
        client = openai.AsyncOpenAI(base_url=f"{up.base_url}/v1", api_key="gtm-demo-global")
        async with client:
            for i in range(6):
                reply = await client.chat.completions.create(
                    model=CHAT, messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=4
                )
                assert reply.choices[0].message.content
    run_dir = tmp_path / "run"
    global_dir = run_dir / "audit" / "global"

    # Intact: every tier's chain reaches its anchor, and its last records are anchored
    # (each tier anchors on the way out).
    intact = await gtm("audit", "verify", str(run_dir), "--state", url)
    assert intact.returncode == 0, intact.stdout + intact.stderr
    for name, prefix in (("global", "global"), ("regional-eu-west", "regional")):
        line = next(
            line
            for line in intact.stdout.splitlines()
            if line.startswith(f"OK: {run_dir / 'audit' / name} ({prefix} chain): ")
        )
        assert "; OK up to the anchor at revision " in line, line
    assert "not yet anchored" not in intact.stderr, intact.stderr

    # The cut: truncate the global chain's file, delete its .head.
    (path,) = chain_files(global_dir, "global")
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 6
    path.write_bytes(b"".join(lines[:2]))
    (global_dir / "global.head").unlink()

    alone = await gtm("audit", "verify", str(global_dir))
    assert alone.returncode == 0  # the files alone still cannot show it …
    assert "warning: no state store given" in alone.stderr  # … and the command says so

    cut = await gtm("audit", "verify", str(run_dir), "--state", url)
    assert cut.returncode == 1, cut.stdout + cut.stderr
    missing = len(lines) - 2
    assert any(
        line.startswith(f"{path}: tail may be missing: the anchor at revision ")
        and line.endswith(f"but the chain ends at seq 2: {missing} record(s) cut")
        for line in cut.stdout.splitlines()
    ), cut.stdout
    assert f"{global_dir / 'global.head'}: missing, but the anchor at revision" in cut.stdout
    assert f"FAILED: {global_dir} (global chain): 2 problem(s) in 2 records" in cut.stderr
    assert cut.stdout.splitlines()[-1].endswith(" OK, 1 FAILED")
