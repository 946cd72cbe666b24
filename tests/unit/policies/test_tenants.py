from __future__ import annotations

import pytest

from policies import tenants as tenants_module
from policies.apikeys import ScryptCost, StoredHash, hash_key, verify_key
from policies.documents import ApiKeyEntry, Tenant
from policies.errors import ApiKeyError
from policies.loader import load_examples
from policies.tenants import TenantDirectory

FAST = ScryptCost(n=1024)


def tenant(tenant_id: str, *keys: str, models: tuple[str, ...] | None = None) -> Tenant:
    entries = tuple(ApiKeyEntry(id=k.split("-")[1], hash=hash_key(k, FAST)) for k in keys)
    return Tenant(id=tenant_id, api_keys=entries, allowed_models=models)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts scrypt verifications."""
    seen: list[str] = []
    real = verify_key

    def counting(api_key: str, stored: StoredHash) -> bool:
        seen.append(api_key)
        return real(api_key, stored)

    monkeypatch.setattr(tenants_module, "verify_key", counting)
    return seen


def test_demo_keys_authenticate_with_the_shipped_examples() -> None:
    directory = TenantDirectory(load_examples().tenants)
    assert directory.authenticate("gtm-demo-global").id == "demo-global"
    assert directory.authenticate("gtm-demo-eu").id == "demo-eu"
    assert directory.authenticate("gtm-acme-health-example").id == "acme-health"
    assert len(directory) == 3


def test_lookup_costs_one_scrypt_per_key_sharing_the_id(calls: list[str]) -> None:
    directory = TenantDirectory(
        {
            t.id: t
            for t in [tenant("a", "gtm-aaa-1"), tenant("b", "gtm-bbb-2"), tenant("c", "gtm-ccc-3")]
        }
    )
    assert directory.authenticate("gtm-bbb-2").id == "b"
    assert calls == ["gtm-bbb-2"]
    assert directory.authenticate("gtm-bbb-2").id == "b"
    assert calls == ["gtm-bbb-2"]  # cached: no second scrypt


def test_unknown_ids_cost_no_scrypt_and_wrong_secrets_one(calls: list[str]) -> None:
    directory = TenantDirectory({"a": tenant("a", "gtm-aaa-right")})
    with pytest.raises(ApiKeyError, match="unknown API key \\(id 'zzz'\\)"):
        directory.authenticate("gtm-zzz-whatever")
    assert calls == []
    for _ in range(3):
        with pytest.raises(ApiKeyError, match="invalid API key \\(id 'aaa'\\)") as info:
            directory.authenticate("gtm-aaa-wrong")
        assert "wrong" not in str(info.value)
    assert calls == ["gtm-aaa-wrong"]
    with pytest.raises(ApiKeyError, match="malformed"):
        directory.authenticate("sk-123")


def test_shared_ids_check_each_candidate() -> None:
    directory = TenantDirectory(
        {t.id: t for t in [tenant("g", "gtm-demo-global"), tenant("e", "gtm-demo-eu")]}
    )
    assert directory.authenticate("gtm-demo-eu").id == "e"
    assert directory.authenticate("gtm-demo-global").id == "g"


def test_cache_is_bounded(calls: list[str]) -> None:
    directory = TenantDirectory({"a": tenant("a", "gtm-aaa-1")}, cache_size=1)
    directory.authenticate("gtm-aaa-1")
    with pytest.raises(ApiKeyError):
        directory.authenticate("gtm-aaa-2")  # evicts the first
    directory.authenticate("gtm-aaa-1")
    assert calls == ["gtm-aaa-1", "gtm-aaa-2", "gtm-aaa-1"]


def test_models_and_lookup_by_id() -> None:
    directory = TenantDirectory(
        {"open": tenant("open"), "narrow": tenant("narrow", models=("llama",))}
    )
    assert directory.allows_model("open", "anything")
    assert directory.allows_model("narrow", "llama")
    assert not directory.allows_model("narrow", "gpt")
    assert not directory.allows_model("ghost", "llama")
    assert directory.get("open") is not None
    assert directory.get("ghost") is None
