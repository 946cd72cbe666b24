"""A regional LB without --policies follows the policy applied to the store, hot."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from gtm.clock import SystemClock
from gtm.policy_store import activate, apply
from gtm.state.memory import MemoryStore
from regional_lb.quota import Dimension
from tests.integration.regional_lb.conftest import RegionFactory, chat, until
from tests.unit.regional_lb.policy_fixtures import policy

pytestmark = pytest.mark.integration


async def test_policies_come_from_the_store_and_reload(
    make_region: RegionFactory, store: MemoryStore, clock: SystemClock, tmp_path: Path
) -> None:
    first = policy(tmp_path / "one", quotas={"alpha": {"requests_per_minute": 6000}})
    await apply(store, first.policy_set, 0, clock=clock)
    region = await make_region("us-east", policy=None, static_policy=False)
    await until(lambda: region.service.policy is not None)
    assert region.service.limiter.pool_limits("alpha")[Dimension.REQUESTS] == 6000
    second = policy(tmp_path / "two", quotas={"alpha": {"requests_per_minute": 60}})
    await apply(store, second.policy_set, 1, clock=clock)
    await until(lambda: region.service.limiter.pool_limits("alpha").get(Dimension.REQUESTS) == 60)
    assert region.service.policy is not None
    assert region.service.policy.generation == 2
    async with aiohttp.ClientSession() as http, await chat(http, region, model="none") as response:
        assert response.status == 404  # served with the new policy: authenticated, no zone
    # A policy whose regional profile this tier cannot build is applied with the last
    # good profile kept, and the failure is logged and counted.
    profile = region.service.router.profile if region.service.router is not None else None
    broken = policy(
        tmp_path / "three",
        quotas={"alpha": {"requests_per_minute": 30}},
        regional_scorer="no-such-scorer",
    )
    await apply(store, broken.policy_set, 2, clock=clock)
    watcher = region.service.policies
    assert watcher is not None
    await watcher.wait_for_generation(3)
    await until(lambda: region.service.policy is not None and region.service.policy.generation == 3)
    assert region.service.router is not None
    assert region.service.router.profile is profile
    failures = region.service.registry.get_sample_value(
        "gtm_routing_profile_reload_failures_total",
        {"tier": "regional", "profile": "regional-default"},
    )
    assert failures == 1
    assert region.service.limiter.pool_limits("alpha").get(Dimension.REQUESTS) == 30


async def test_policies_given_at_start_give_way_to_the_store(
    make_region: RegionFactory, store: MemoryStore, clock: SystemClock, tmp_path: Path
) -> None:
    # `gtm regional --policies DIR` (as the Kubernetes and systemd examples start it)
    # serves DIR until a policy is applied, then follows the store, as the front door
    # does: before, the files stayed in force and `gtm policy apply` never reached it.
    files = policy(tmp_path / "files", quotas={"alpha": {"requests_per_minute": 6000}})
    given = activate(0, files.policy_set)  # what the CLI makes of --policies
    region = await make_region("us-east", policy=given)
    assert region.service.policy is given
    assert region.service.limiter.pool_limits("alpha")[Dimension.REQUESTS] == 6000
    applied = policy(tmp_path / "applied", quotas={"alpha": {"requests_per_minute": 60}})
    await apply(store, applied.policy_set, 0, clock=clock)
    await until(lambda: region.service.limiter.pool_limits("alpha").get(Dimension.REQUESTS) == 60)
    assert region.service.policy is not None
    assert region.service.policy.generation == 1
