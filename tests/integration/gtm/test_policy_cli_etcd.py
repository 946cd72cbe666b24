"""``gtm policy apply`` against a real etcd: an apply keeps what it was not given,
``--dry-run`` writes nothing, ``--prune`` lists what it deletes, and the undo it prints
puts the previous generation back."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.policy_store import GENERATION_KEY, StoredPolicy, load_from_store
from gtm.state.etcd_server import EtcdServer
from gtm.state.url import open_store
from gtmctl.cli import cli
from policies.loader import examples_path

pytestmark = [pytest.mark.etcd, pytest.mark.integration]

LOAD_TEST = """\
apiVersion: gtm.dev/v1
kind: Tenants
metadata: {name: load-test}
spec:
  tenants: [{id: load-test, name: Load test, priority: batch}]
"""


def stored(url: str) -> tuple[StoredPolicy, int]:
    """The committed policy and the store revision of its commit."""

    async def read() -> tuple[StoredPolicy, int]:
        store = open_store(url, clock=SystemClock(), registry=new_registry(), timeout=5.0)
        try:
            policy = await load_from_store(store)
            commit = await store.get(GENERATION_KEY)
            assert policy is not None
            assert commit is not None
            return policy, commit.mod_revision
        finally:
            await store.aclose()

    return asyncio.run(read())


def test_apply_keeps_prunes_on_request_and_prints_its_undo(
    own_etcd_server: EtcdServer, tmp_path: Path
) -> None:
    url = own_etcd_server.etcd_url
    tenant = tmp_path / "load-test.yaml"
    tenant.write_text(LOAD_TEST)
    runner = CliRunner()

    def gtm(*args: str) -> tuple[int, str]:
        result = runner.invoke(
            cli, [*args, "--state", url, "--backup", str(tmp_path / "backups")], prog_name="gtm"
        )
        return result.exit_code, result.stdout + result.stderr

    assert gtm("policy", "apply", str(examples_path()))[0] == 0
    assert gtm("policy", "apply", str(tenant))[0] == 0
    # The issue: the directory without the tenant, applied again, deleted it.
    code, out = gtm("policy", "apply", str(examples_path()))
    assert code == 0, out
    assert out.startswith("unchanged: generation 2 already has these policies")
    policy, revision = stored(url)
    assert "load-test" in policy.policy_set.tenants

    code, out = gtm("policy", "apply", "--prune", "--dry-run", str(examples_path()))
    assert code == 0, out
    assert "  would delete  Tenants/load-test" in out.splitlines()
    assert stored(url)[1] == revision  # a dry run commits nothing

    code, out = gtm("policy", "apply", "--prune", str(examples_path()))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[:2] == [
        "--prune: deleting 1 document(s) not given:",
        "  will delete  Tenants/load-test",
    ]
    assert lines[2].startswith("applied generation 3 ")
    assert "  deleted   Tenants/load-test" in lines
    after, commit_revision = stored(url)
    assert "load-test" not in after.policy_set.tenants
    assert f"store revision {commit_revision};" in lines[2]

    [undo] = [line for line in lines if line.startswith("undo: ")]
    command = shlex.split(undo.removeprefix("undo: "))
    result = runner.invoke(cli, command[1:], prog_name="gtm")
    assert result.exit_code == 0, result.output
    assert "  added     Tenants/load-test" in result.stdout.splitlines()
    restored, _ = stored(url)
    assert restored.generation == 4
    assert restored.policy_set.digest == policy.policy_set.digest
