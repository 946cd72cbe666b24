"""A tenant applied on its own survives an apply of the policy directory without it.

The issue: ``gtm up`` adds ``gtm load``'s tenant (the ``gtm-up-load-test`` document) to
the policies it applies; the operator applied the policy directory, which does not hold
it, and ``gtm policy apply`` deleted it ("0 written, 1 deleted") — the load test's
requests got 401. Now, against a ``gtm up --processes``:

1. a soak-test tenant is applied on its own (one file); both tenants' keys are served;
2. the policy directory, edited, is applied: the output names both tenants as kept,
   every tier loads the new generation, and both keys are still served (200), at the
   front door and at each regional LB;
3. ``--prune --dry-run`` shows both would be deleted, and writes nothing;
4. ``--prune`` lists them before deleting them; once the tiers load that generation
   their keys get 401;
5. the undo the output printed puts them back, and their keys are served again.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from policies.apikeys import hash_key
from policies.loader import examples_path
from tests.integration.gtmctl.up.helpers import running_up
from tests.integration.gtmctl.up.test_up import eventually
from tests.integration.users_paths.direct_clients import BERLIN, ask, deployment, region_url

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(240)]

REGIONS = ("eu-west", "eu-central")
#: gtm load's tenant, which gtm up adds to the shipped policies.
LOAD_TEST_KEY = "gtm-load-test"
SOAK_KEY = "gtm-soak-8fX2kq9Lr0aZt3uVwYc5Qe1sHn7J"
SOAK = """\
apiVersion: gtm.dev/v1
kind: Tenants
metadata: {{name: soak-test}}
spec:
  tenants:
    - id: soak-test
      name: Soak test
      priority: batch
      api_keys: [{{id: soak, hash: "{hash}"}}]
      quotas: {{requests_per_minute: 6000, max_concurrent: 64}}
"""


def gtm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gtmctl", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def run(*args: str) -> subprocess.CompletedProcess[str]:
    done = await asyncio.to_thread(gtm, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def edited_policies(tmp_path: Path) -> Path:
    """The shipped policy directory with one change (demo-eu's request rate)."""
    folder = tmp_path / "policies"
    folder.mkdir()
    for source in examples_path().iterdir():
        text = source.read_text().replace("requests_per_minute: 300", "requests_per_minute: 400")
        (folder / source.name).write_text(text)
    return folder


async def policy_generations(urls: list[str]) -> list[int]:
    """``gtm_policy_revision`` of each tier at ``urls`` (0 if it cannot say)."""
    found = []
    async with aiohttp.ClientSession() as session:
        for url in urls:
            async with session.get(f"{url}/metrics") as response:
                text = await response.text()
            match = re.search(r"^gtm_policy_revision (\S+)$", text, re.MULTILINE)
            found.append(int(float(match.group(1))) if match else 0)
    return found


def generation_in(out: str) -> int:
    match = re.match(r"applied generation (\d+) ", out)
    assert match is not None, out
    return int(match.group(1))


async def test_tenants_applied_on_their_own_survive_an_apply_without_them(
    tmp_path: Path,
) -> None:
    soak = tmp_path / "soak-test.yaml"
    soak.write_text(SOAK.format(hash=hash_key(SOAK_KEY)))
    backups = ("--backup", str(tmp_path / "policy-backups"))
    async with running_up(tmp_path, "--processes", "--speedup", "50", regions=REGIONS) as up:
        document = await deployment(up)
        state = ("--state", document["state"])
        tiers = [up.base_url, *(region_url(document, r) for r in REGIONS)]

        async def served(status: int) -> bool:
            answers = [
                await ask(url, client=BERLIN, key=key)
                for url in tiers
                for key in (LOAD_TEST_KEY, SOAK_KEY)
            ]
            assert all(a.status in (200, 401) for a in answers), answers
            return all(a.status == status for a in answers)

        async def in_force(generation: int) -> None:
            async def loaded() -> bool:
                return min(await policy_generations(tiers)) >= generation

            await eventually(loaded, f"every tier on policy generation {generation}")

        # 1. A soak test's tenant, applied on its own beside gtm load's.
        applied = await run("policy", "apply", str(soak), *state, *backups)
        lines = applied.stdout.splitlines()
        assert "  added     Tenants/soak-test" in lines
        assert "  kept      Tenants/gtm-up-load-test (not given; --prune would delete it)" in lines
        await in_force(generation_in(applied.stdout))
        await eventually(lambda: served(200), "both test tenants' keys served")

        # 2. The policy directory, without them: both kept, both still served.
        applied = await run("policy", "apply", str(edited_policies(tmp_path)), *state, *backups)
        lines = applied.stdout.splitlines()
        assert "  replaced  Tenants/example-tenants" in lines
        assert "  kept      Tenants/gtm-up-load-test (not given; --prune would delete it)" in lines
        assert "  kept      Tenants/soak-test (not given; --prune would delete it)" in lines
        await in_force(generation_in(applied.stdout))
        assert await served(200)

        # 3. A dry run of the prune shows the deletions and writes nothing.
        dry = await run("policy", "apply", "--prune", "--dry-run", str(examples_path()), *state)
        lines = dry.stdout.splitlines()
        assert "  would delete  Tenants/gtm-up-load-test" in lines
        assert "  would delete  Tenants/soak-test" in lines
        assert lines[-1].startswith("dry run: nothing written")

        # 4. The prune lists the tenants before deleting them; their keys are refused after.
        pruned = await run("policy", "apply", "--prune", str(examples_path()), *state, *backups)
        lines = pruned.stdout.splitlines()
        assert lines[:3] == [
            "--prune: deleting 2 document(s) not given:",
            "  will delete  Tenants/gtm-up-load-test",
            "  will delete  Tenants/soak-test",
        ]
        await in_force(generation_in(lines[3]))
        assert await served(401)

        # 5. The undo it printed brings them back.
        [undo] = [line for line in lines if line.startswith("undo: ")]
        command = shlex.split(undo.removeprefix("undo: "))
        assert command[:2] == ["gtm", "policy"]
        restored = await run(*command[1:], *backups)
        assert "  added     Tenants/soak-test" in restored.stdout.splitlines()
        await in_force(generation_in(restored.stdout))
        await eventually(lambda: served(200), "both test tenants' keys served again")
