"""Admission's parts that need no server: API keys, peer proof, which tenants have limits."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from gtm.clock import FakeClock
from gtm.trust import TierKey
from regional_lb.admission import Admission, authenticate, has_limits
from regional_lb.config import RegionalSettings
from regional_lb.errors import Unauthorized
from regional_lb.fairqueue import FairQueue, QueueSettings
from regional_lb.location import ClientLocator
from regional_lb.metrics import RegionalMetrics
from regional_lb.quota import QuotaLimiter, QuotaSettings
from regional_lb.request import HEADER_PEER_TOKEN
from regional_lb.summary import RateMeter
from tests.unit.regional_lb.policy_fixtures import KEYS, policy


def _admission(peer_token: str | None) -> Admission:
    queue: FairQueue[object] = FairQueue(QueueSettings())
    clock = FakeClock()
    registry = CollectorRegistry()
    return Admission(
        RegionalSettings(region="us-east", replica_id="r1", peer_token=peer_token),
        policy=lambda: None,
        limiter=QuotaLimiter(QuotaSettings()),
        metrics=RegionalMetrics(registry, queue.depth),
        clock=clock,
        audit=None,
        spill_in=RateMeter(),
        locator=ClientLocator(
            region="us-east",
            key=TierKey(peer_token) if peer_token else None,
            locator=None,
            trusted_proxies=(),
            clock=clock,
            registry=registry,
        ),
    )


def test_only_a_matching_peer_token_proves_a_peer() -> None:
    admission = _admission("s3cret")
    assert admission.from_peer({HEADER_PEER_TOKEN: "s3cret"})
    assert not admission.from_peer({HEADER_PEER_TOKEN: "guess"})
    assert not admission.from_peer({})
    assert not _admission(None).from_peer({HEADER_PEER_TOKEN: "s3cret"})


def test_a_peer_region_proves_itself_with_a_signature_the_front_door_does_not_spill() -> None:
    admission = _admission("s3cret")
    key = TierKey("s3cret")
    peer: CIMultiDict[str] = CIMultiDict({"x-request-id": "r1", "x-gtm-spilled-from": "eu-west"})
    key.sign(peer, issuer="region/eu-west", now=FakeClock().wall())
    assert admission.from_peer(peer)
    front: CIMultiDict[str] = CIMultiDict({"x-request-id": "r1"})
    key.sign(front, issuer="global", now=FakeClock().wall())
    assert not admission.from_peer(front)
    assert not _admission("other").from_peer(peer)


async def test_the_api_key_names_the_tenant(tmp_path: Path) -> None:
    active = policy(tmp_path)
    request = make_mocked_request("POST", "/", headers={"Authorization": f"Bearer {KEYS['beta']}"})
    assert (await authenticate(request, active)).id == "beta"


@pytest.mark.parametrize("header", ["", "Basic abc", "Bearer ", "Bearer gtm-nobody"])
async def test_a_missing_or_unknown_key_is_401(tmp_path: Path, header: str) -> None:
    active = policy(tmp_path)
    request = make_mocked_request("POST", "/", headers={"Authorization": header})
    with pytest.raises(Unauthorized) as refused:
        await authenticate(request, active)
    assert refused.value.status == 401


def test_a_tenant_without_any_quota_needs_no_lease(tmp_path: Path) -> None:
    unlimited = policy(tmp_path / "u", quotas={"alpha": {}})
    limited = policy(tmp_path / "l", quotas={"alpha": {"max_concurrent": 3}})
    assert not has_limits(unlimited.policy_set.tenants["alpha"].quotas)
    assert has_limits(limited.policy_set.tenants["alpha"].quotas)
