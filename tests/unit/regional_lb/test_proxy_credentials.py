"""The regional LB authenticates the tenant and keeps its key to itself on the way to a
zone (regional_lb.proxy.LocalRelay); a peer region authenticates the tenant again, so a
spill (PeerRelay) carries the key."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request

from gtm.errors import AttemptFailed
from regional_lb.metrics import RegionalMetrics
from regional_lb.proxy import (
    Carrier,
    LocalRelay,
    PeerRelay,
    ProxySettings,
    Target,
    TargetKind,
    Trip,
    _RegionalRelay,
)

TENANT_KEY = "gtm-tenant-secret"
HEADERS = {
    "Authorization": f"Bearer {TENANT_KEY}",
    "x-api-key": TENANT_KEY,
    "api-key": TENANT_KEY,
    "Content-Type": "application/json",
}


class Session:
    def __init__(self) -> None:
        self.sent: list[list[tuple[str, str]]] = []

    async def post(self, url: str, *, headers: list[tuple[str, str]], **_: Any) -> Any:
        self.sent.append(headers)
        raise aiohttp.ClientConnectionError("recorded")


async def sent_by(kind: type[_RegionalRelay]) -> list[tuple[str, str]]:
    session = Session()
    metrics = cast(RegionalMetrics, SimpleNamespace(stream_breaks=None))
    carrier = Carrier(lambda: cast(aiohttp.ClientSession, session), metrics, ProxySettings())
    trip = cast(Trip, SimpleNamespace(body=b"{}"))
    request = make_mocked_request("POST", "/v1/chat/completions", headers=HEADERS)
    relay = object.__new__(kind)
    _RegionalRelay.__init__(relay, request, carrier, trip, {"x-request-id": "r-1"})
    with pytest.raises(AttemptFailed):
        await relay.open(Target("t", "http://t", TargetKind.ZONE))
    (sent,) = session.sent
    return sent


async def test_a_zone_gets_no_client_credential() -> None:
    sent = await sent_by(LocalRelay)
    assert all(TENANT_KEY not in value for _, value in sent)
    assert ("Content-Type", "application/json") in sent


async def test_a_peer_region_gets_the_key_to_authenticate_the_tenant_again() -> None:
    sent = await sent_by(PeerRelay)
    assert ("Authorization", f"Bearer {TENANT_KEY}") in sent
