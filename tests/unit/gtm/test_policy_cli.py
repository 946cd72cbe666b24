from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gtm import policy_cli
from gtm.clock import FakeClock
from gtm.policy_store import load_from_store
from gtm.state import keys
from gtm.state.memory import MemoryStore
from gtmctl.cli import cli
from policies.loader import examples_path


class KeptOpen(MemoryStore):
    """The CLI closes the store it opened; keep this one readable after the command."""

    async def aclose(self) -> None:
        return None


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    shared = KeptOpen(FakeClock())
    opened: list[str] = []

    def open_store(url: Any, **_: Any) -> MemoryStore:
        opened.append(str(url))
        return shared

    monkeypatch.setattr(policy_cli, "open_store", open_store)
    return shared


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(autouse=True)
def backups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where ``apply`` saves the generations it replaces (never the user's home)."""
    root = tmp_path / "backups"
    monkeypatch.setenv("GTM_POLICY_BACKUP_DIR", str(root))
    return root


LOAD_TEST = """\
apiVersion: gtm.dev/v1
kind: Tenants
metadata: {name: load-test}
spec:
  tenants:
    - id: load-test
      name: Load test
      priority: batch
      regional_shares: [{region: eu-west, share: 0.5}]
"""


@pytest.fixture
def load_test(tmp_path: Path) -> Path:
    """A tenant applied on its own, as the load test's was."""
    path = tmp_path / "load-test.yaml"
    path.write_text(LOAD_TEST)
    return path


def edited_examples(tmp_path: Path) -> Path:
    """The examples with demo-eu's request rate raised from 300 to 400 a minute."""
    target = tmp_path / "edited"
    target.mkdir()
    for source in examples_path().iterdir():
        text = source.read_text().replace("requests_per_minute: 300", "requests_per_minute: 400")
        (target / source.name).write_text(text)
    return target


def stored_tenants(store: MemoryStore) -> set[str]:
    stored = asyncio.run(load_from_store(store))
    assert stored is not None
    return set(stored.policy_set.tenants)


def undo_line(out: str) -> list[str]:
    [line] = [line for line in out.splitlines() if line.startswith("undo: ")]
    command = shlex.split(line.removeprefix("undo: "))
    assert command[:3] == ["gtm", "policy", "apply"]
    return command[1:]


def test_apply_commits_and_is_idempotent(store: MemoryStore) -> None:
    code, out, _ = run("policy", "apply", str(examples_path()), "--state", "etcd://127.0.0.1:2379")
    assert code == 0
    first, *documents, undo = out.splitlines()
    assert first.startswith("applied generation 1 (digest ")
    assert first.endswith("; was generation 0): 6 added")
    assert "  added     Tenants/example-tenants" in documents
    assert len(documents) == 6
    assert undo.startswith("undo: there was no policy before generation 1")
    stored = asyncio.run(load_from_store(store))
    assert stored is not None
    assert stored.generation == 1
    code, out, _ = run("policy", "apply", str(examples_path()), "--state", "etcd://127.0.0.1")
    assert (code, out.strip()) == (
        0,
        "unchanged: generation 1 already has these policies (6 unchanged)",
    )


def test_apply_keeps_stored_documents_it_was_not_given(
    store: MemoryStore, load_test: Path, tmp_path: Path, backups: Path
) -> None:
    # The issue: a tenant applied on its own, then the policy directory without it.
    state = ("--state", "etcd://h:1")
    assert run("policy", "apply", str(examples_path()), *state)[0] == 0
    code, out, _ = run("policy", "apply", str(load_test), *state)
    assert code == 0, out
    assert "  added     Tenants/load-test" in out.splitlines()
    second = asyncio.run(load_from_store(store))
    code, out, err = run("policy", "apply", str(edited_examples(tmp_path)), *state)
    assert code == 0, err
    lines = out.splitlines()
    assert "store revision" in lines[0]
    assert lines[0].endswith("; was generation 2): 1 changed, 5 unchanged, 1 kept")
    assert "  replaced  Tenants/example-tenants" in lines
    assert "  kept      Tenants/load-test (not given; --prune would delete it)" in lines
    assert "load-test" in stored_tenants(store)
    saved = backups / "generation-2-revision-14"
    assert f"generation 2 was saved in {saved}" in lines
    assert (saved / "Tenants-load-test.json").is_file()
    # The undo it prints puts generation 2 back exactly.
    code, out, err = run(*undo_line(out))
    assert code == 0, err
    assert "applied generation 4 " in out
    assert "  replaced  Tenants/example-tenants" in out.splitlines()
    restored = asyncio.run(load_from_store(store))
    assert second is not None
    assert restored is not None
    assert restored.policy_set.digest == second.policy_set.digest
    code, out, _ = run("policy", "apply", "--prune", "--dry-run", str(saved), *state)
    assert (code, out.splitlines()[-1]) == (0, "dry run: nothing written (7 unchanged)")


def test_prune_lists_what_it_deletes_before_deleting_it(
    store: MemoryStore, load_test: Path
) -> None:
    state = ("--state", "etcd://h:1")
    assert run("policy", "apply", str(examples_path()), str(load_test), *state)[0] == 0
    code, out, _ = run("policy", "apply", "--prune", str(examples_path()), *state)
    assert code == 0
    lines = out.splitlines()
    assert lines[:2] == [
        "--prune: deleting 1 document(s) not given:",
        "  will delete  Tenants/load-test",
    ]
    assert lines[2].startswith("applied generation 2 ")
    assert lines[2].endswith("6 unchanged, 1 deleted")
    assert lines[3] == "  deleted   Tenants/load-test"
    assert "load-test" not in stored_tenants(store)
    assert asyncio.run(store.get(keys.policy("Tenants", "load-test"))) is None
    code, _, err = run(*undo_line(out))
    assert code == 0, err
    assert "load-test" in stored_tenants(store)


def test_dry_run_writes_nothing_and_shows_the_diff(
    store: MemoryStore, load_test: Path, tmp_path: Path, backups: Path
) -> None:
    state = ("--state", "etcd://h:1")
    assert run("policy", "apply", str(examples_path()), str(load_test), *state)[0] == 0
    revision = asyncio.run(store.current_revision())
    edited = str(edited_examples(tmp_path))
    code, out, _ = run("policy", "apply", "--dry-run", edited, *state)
    assert code == 0
    assert out.splitlines() == [
        "dry run: policies in etcd://h:1 at generation 1 (store revision "
        f"{revision}); applying would commit generation 2",
        "  would change  Tenants/example-tenants",
        "      spec.tenants[demo-eu].quotas.requests_per_minute: 300 → 400",
        "  unchanged     Jurisdictions/builtin",
        "  unchanged     Jurisdictions/example-jurisdictions",
        "  unchanged     Regions/example-regions",
        "  unchanged     Residency/example-residency",
        "  unchanged     RoutingProfiles/example-routing",
        "  kept          Tenants/load-test (not given; --prune would delete it)",
        "dry run: nothing written (1 changed, 5 unchanged, 1 kept)",
    ]
    code, out, _ = run("policy", "apply", "--dry-run", "--prune", edited, *state)
    assert code == 0
    assert "  would delete  Tenants/load-test" in out.splitlines()
    code, out, _ = run("policy", "apply", "--dry-run", str(load_test), *state)
    assert "applying would change nothing" in out.splitlines()[0]
    assert asyncio.run(store.current_revision()) == revision
    assert not backups.exists()


def test_a_document_is_checked_with_the_stored_ones_it_joins(
    store: MemoryStore, tmp_path: Path
) -> None:
    stray = tmp_path / "stray.yaml"
    stray.write_text(LOAD_TEST.replace("eu-west", "planet-x"))
    code, out, err = run("policy", "apply", str(stray), "--state", "etcd://h:1")
    assert code == 1
    assert f"{stray}:" in out
    assert "'planet-x'" in out
    assert "problem(s) in the next generation (the documents given, with the stored" in err
    assert asyncio.run(store.current_revision()) == 1


def test_a_backup_that_cannot_be_written_stops_the_apply(
    store: MemoryStore, load_test: Path, tmp_path: Path
) -> None:
    assert run("policy", "apply", str(examples_path()), "--state", "etcd://h:1")[0] == 0
    revision = asyncio.run(store.current_revision())
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    code, _, err = run("policy", "apply", str(load_test), "--state", "etcd://h:1",
                       "--backup", str(not_a_dir / "sub"))  # fmt: skip
    assert code == 1
    assert f"cannot save the policies to {not_a_dir / 'sub'}" in err
    assert "nothing was written" in err
    assert asyncio.run(store.current_revision()) == revision


def test_export_writes_what_apply_prune_restores(store: MemoryStore, tmp_path: Path) -> None:
    code, _, err = run("policy", "export", str(tmp_path / "none"), "--state", "etcd://h:1")
    assert (code, err.strip()) == (1, "gtm policy export: etcd://h:1 holds no committed policy")
    assert run("policy", "apply", str(examples_path()), "--state", "etcd://h:1")[0] == 0
    code, out, _ = run("policy", "export", str(tmp_path / "out"), "--state", "etcd://h:1")
    assert (code, out.strip()) == (
        0,
        f"exported generation 1 to {tmp_path / 'out'} (5 document(s))",
    )
    assert "gtm policy apply --prune" in (tmp_path / "out" / "README.txt").read_text()
    code, out, _ = run("policy", "apply", "--prune", str(tmp_path / "out"), "--state", "etcd://h:1")
    assert (code, out.strip()) == (
        0,
        "unchanged: generation 1 already has these policies (6 unchanged)",
    )
    code, _, err = run("policy", "export", str(tmp_path / "out"), "--state", "etcd://h:1")
    assert (code, "is not empty" in err) == (1, True)


def test_apply_refuses_a_stale_revision(store: MemoryStore) -> None:
    args = ("policy", "apply", str(examples_path()), "--state", "etcd://h:1")
    assert run(*args)[0] == 0
    code, _, err = run(*args, "--expected-revision", "0")
    assert code == 1
    assert "policies are at generation 1, not 0" in err


def test_apply_writes_nothing_when_a_file_is_invalid(store: MemoryStore, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: gtm.dev/v1\nkind: Tenants\nmetadata: {name: t}\nspec: {}\n")
    code, out, _ = run("policy", "apply", str(bad), "--state", "etcd://h:1")
    assert code == 1
    assert out.strip() == f"{bad}:4: spec.tenants: required field is missing"
    assert asyncio.run(store.current_revision()) == 1  # nothing was written


def test_apply_needs_a_shared_store() -> None:
    code, _, err = run("policy", "apply", str(examples_path()), "--state", "memory")
    assert code == 2
    assert "the embedded store lives inside one `gtm up` process" in err
    code, _, err = run("policy", "apply", str(examples_path()), "--state", "http://x")
    assert (code, "invalid state store" in err) == (2, True)


def test_gtm_mounts_the_policies_commands(tmp_path: Path) -> None:
    code, out, _ = run("policy", "--help")
    assert code == 0
    for name in ("apply", "check", "explain", "export", "hash-key", "schema"):
        assert f"  {name} " in out
    assert run("policy", "check", str(examples_path()))[0] == 0
    code, out, _ = run("audit", "verify", "--help")
    assert (code, "Verify audit FILES" in out) == (0, True)


MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAXMIND_TEST_CITY = Path(__file__).parents[3] / "data/geo/maxmind_test_dbs/GeoIP2-City-Test.mmdb"


def test_explain_looks_public_addresses_up_as_the_front_door_does() -> None:
    # 81.2.69.160 is London in the bundled GeoLite2 and in MaxMind's test database.
    code, out, err = run("policy", "explain", "--tenant", "demo-eu", "--model", MODEL,
                         "--client-ip", "81.2.69.160")  # fmt: skip
    assert code == 0, err
    assert out.splitlines()[0] == (
        "client: 81.2.69.160 → GB (the bundled GeoLite2-City database, network 81.2.68.0/23)"
    )
    assert "client_country=GB" in out
    db = str(MAXMIND_TEST_CITY)
    code, out, _ = run("policy", "explain", "--tenant", "demo-eu", "--model", MODEL,
                       "--client-ip", "81.2.69.160", "--geoip-db", db)  # fmt: skip
    assert code == 0
    assert f"→ GB ({MAXMIND_TEST_CITY}, network 81.2.69.160/27)" in out
    code, out, _ = run("policy", "explain", "--tenant", "demo-eu", "--model", MODEL,
                       "--client-ip", "10.1.2.3")  # fmt: skip
    assert "a private or special-purpose address: location unknown" in out


def test_explain_exit_status_says_allowed_or_refused() -> None:
    allowed = run("policy", "explain", "--tenant", "demo-eu", "--model", MODEL, "--country", "DE")
    refused = run("policy", "explain", "--tenant", "nobody", "--model", MODEL, "--country", "DE")
    assert (allowed[0], refused[0]) == (0, 1)
    assert "verdict: REFUSED (unknown-tenant)" in refused[1]
    _, out, _ = run("policy", "explain", "--help")
    assert "0 ALLOWED" in out
    assert "1 REFUSED" in out
    not_a_db = run("policy", "explain", "--tenant", "demo-eu", "--model", MODEL, "--client-ip",
                   "8.8.8.8", "--geoip-db", str(examples_path() / "tenants.yaml"))  # fmt: skip
    assert not_a_db[0] == 2
    assert "not a readable MaxMind database" in not_a_db[2]
