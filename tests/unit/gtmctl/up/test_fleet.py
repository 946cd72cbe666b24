from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gtm.clock import FakeClock
from gtm.gpu_profiles import BGE_LARGE, LLAMA_8B, LLAMA_70B
from gtm.metrics import new_registry
from gtm.models import ModelLoad, Region, RegionSummary, Zone, ZoneSummary
from gtm.policy_store import apply, load_from_store
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from gtmctl.up.config import UpConfig
from gtmctl.up.fleet import (
    Plan,
    load_policies,
    make_plan,
    remove_run_dir,
    seed_store,
    store_problems,
    unseed_store,
    zone_problem,
)
from policies import TenantDirectory
from policies.loader import examples_path, load_paths


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    return make_plan(UpConfig(run_dir=str(tmp_path / "run")))


def test_default_policies_are_the_examples_plus_the_load_tenant() -> None:
    policy_set = load_policies(())
    assert {"demo-global", "demo-eu", "load-test"} <= set(policy_set.tenants)
    assert TenantDirectory(policy_set.tenants).authenticate("gtm-load-test").id == "load-test"
    assert len(policy_set.regions) == 6


def test_plan_writes_the_geo_map_into_the_run_dir(plan: Plan) -> None:
    document = json.loads(plan.geo_map_path.read_text())
    assert len(document["networks"]) == 500
    assert not plan.owns_run_dir
    remove_run_dir(plan)
    assert plan.run_dir.exists()  # given by the user: kept


def test_a_temporary_run_dir_is_removed() -> None:
    plan = make_plan(UpConfig())
    assert plan.owns_run_dir
    remove_run_dir(plan)
    assert not plan.run_dir.exists()


async def test_seed_writes_policies_regions_zones_and_unseed_removes_them(
    plan: Plan, fake_clock: FakeClock
) -> None:
    store = MemoryStore(fake_clock, new_registry())
    generation = await seed_store(store, plan, fake_clock)
    assert generation == 1
    stored = await load_from_store(store)
    assert stored is not None
    assert stored.policy_set.digest == plan.policy_set.digest
    kv = await store.get(keys.region("eu-west"))
    assert kv is not None
    region = codec.decode(kv.key, kv.value, Region)
    assert region.endpoints[0].url == "http://127.0.1.3:8080"
    zone_kv = await store.get(keys.zone("eu-west", "eu-west-b"))
    assert zone_kv is not None
    assert codec.decode(zone_kv.key, zone_kv.value, Zone).endpoints[0].url.endswith(":8102")
    await unseed_store(store, plan)
    assert (await store.range(keys.prefix(keys.Kind.REGION))).kvs == ()
    assert (await store.range(keys.prefix(keys.Kind.ZONE))).kvs == ()
    await store.aclose()


async def test_seed_says_what_it_replaces_and_saves_it_in_the_run_dir(
    plan: Plan, fake_clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An etcd used before: an operator applied a tenant of their own there.
    store = MemoryStore(fake_clock, new_registry())
    extra = tmp_path / "soak.yaml"
    extra.write_text(
        "apiVersion: gtm.dev/v1\nkind: Tenants\nmetadata: {name: soak-test}\n"
        "spec: {tenants: [{id: soak-test, name: Soak}]}\n"
    )
    before = load_paths([examples_path(), extra])
    await apply(store, before, 0, clock=fake_clock)
    with caplog.at_level(logging.WARNING, logger="gtmctl.up.fleet"):
        assert await seed_store(store, plan, fake_clock) == 2
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    [saved] = (plan.run_dir / "policy-backups").iterdir()
    assert saved.name.startswith("generation-1-revision-")
    assert warning.startswith("gtm up replaces policy generation 1 of the store with its own")
    assert "deleted Tenants/soak-test" in warning
    assert f"saved in {saved} (gtm policy apply --prune --state <gtm up's private etcd> " in warning
    assert (saved / "Tenants-soak-test.json").is_file()
    # A store holding gtm up's own policies already: nothing to say.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gtmctl.up.fleet"):
        await seed_store(store, plan, fake_clock)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    await store.aclose()


def _load(model: str, gpus: int, healthy: int) -> ModelLoad:
    return ModelLoad(model=model, gpus=gpus, healthy_gpus=healthy, prefill_tokens_per_s=1.0)


def test_zone_is_ready_when_every_gpu_of_every_model_is(plan: Plan) -> None:
    zone = plan.deployment.region("us-east").zones[0]  # H100 (8B, 70B) + L4 (8B, bge)
    assert zone_problem(zone, None) == "zone us-east-a: no summary yet"
    partial = ZoneSummary(
        zone_id=zone.id,
        region_id="us-east",
        published_at=1.0,
        models=(_load(LLAMA_8B, 2, 1), _load(LLAMA_70B, 1, 1), _load(BGE_LARGE, 1, 1)),
    )
    assert "1/2 GPUs ready for meta-llama/Llama-3.1-8B-Instruct" in zone_problem(zone, partial)
    full = partial.model_copy(
        update={"models": (_load(LLAMA_8B, 2, 2), _load(LLAMA_70B, 1, 1), _load(BGE_LARGE, 1, 1))}
    )
    assert zone_problem(zone, full) == ""


def test_store_problems_name_regions_without_summaries_or_healthy_zones(plan: Plan) -> None:
    summaries = {"us-east": RegionSummary(region_id="us-east", published_at=1.0, zones_healthy=1)}
    problems = store_problems(plan.deployment, {}, summaries)
    assert "region us-east: 1/2 zones healthy" in problems
    assert "region eu-west: no summary yet" in problems
    assert sum(p.startswith("zone ") for p in problems) == 12
