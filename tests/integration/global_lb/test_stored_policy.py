"""A global tier started without policy files on a store other tiers share serves the
store's policy from its first request, never the shipped examples (whose demo API keys
are public): it waits out an unreachable store and refuses to start on one without a
policy, saying how to give one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from global_lb.app import GlobalTier
from global_lb.config import GlobalConfig
from gtm.clock import SystemClock
from gtm.errors import ConfigError
from gtm.metrics import new_registry
from gtm.policy_store import apply
from gtm.state.memory import MemoryStore
from gtm.testing.outage import OutageStore
from tests.unit.regional_lb.policy_fixtures import policy

pytestmark = pytest.mark.integration

#: A demo key of the shipped examples (gtmctl/up/banner.py): public, so never accepted
#: by a tier that was not told to serve the examples.
DEMO_KEY = "gtm-demo-global"


def _tier(store: OutageStore[MemoryStore]) -> GlobalTier:
    config = GlobalConfig(dns_listen=None, http_listen="127.0.0.1:0")
    return GlobalTier(config, clock=SystemClock(), registry=new_registry(), store=store)


async def test_a_store_without_a_policy_is_refused_with_how_to_give_one() -> None:
    tier = _tier(OutageStore(MemoryStore(clock=SystemClock())))
    with pytest.raises(ConfigError, match=r"gtm policy apply .*--policies"):
        await tier.start()
    assert tier.endpoints is None or tier.endpoints.http is None


async def test_the_stored_policy_is_in_force_before_the_first_request(tmp_path: Path) -> None:
    store = OutageStore(MemoryStore(clock=SystemClock()))
    stored = policy(tmp_path / "stored", quotas={})
    await apply(store.inner, stored.policy_set, 0, clock=SystemClock())
    store.down = True  # the tier comes up while the store does not answer
    tier = _tier(store)
    starting = asyncio.get_running_loop().create_task(tier.start())
    deadline = asyncio.get_running_loop().time() + 10.0
    while store.calls < 2:  # it tried, and tries again
        assert asyncio.get_running_loop().time() < deadline, "the tier never asked the store"
        await asyncio.sleep(0.01)
    assert not starting.done()  # not serving on the examples meanwhile
    store.down = False
    endpoints = await asyncio.wait_for(starting, 10.0)
    try:
        current = tier.policies.current
        assert current is not None
        assert current.generation == 1
        assert current.policy_set.digest == stored.policy_set.digest
        assert endpoints.http is not None
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{endpoints.http}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {DEMO_KEY}"},
            ) as response,
        ):
            assert response.status == 401
    finally:
        await tier.stop()
