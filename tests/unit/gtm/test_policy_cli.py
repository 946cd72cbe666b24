from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gtm import policy_cli
from gtm.clock import FakeClock
from gtm.policy_store import load_from_store
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


def test_apply_commits_and_is_idempotent(store: MemoryStore) -> None:
    code, out, _ = run("policy", "apply", str(examples_path()), "--state", "etcd://127.0.0.1:2379")
    assert code == 0
    assert out.startswith("applied generation 1 (digest ")
    assert "6 document(s) written, 0 deleted" in out
    stored = asyncio.run(load_from_store(store))
    assert stored is not None
    assert stored.generation == 1
    code, out, _ = run("policy", "apply", str(examples_path()), "--state", "etcd://127.0.0.1")
    assert (code, out.strip()) == (0, "unchanged: generation 1 already has these policies")


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
    for name in ("apply", "check", "explain", "hash-key", "schema"):
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
