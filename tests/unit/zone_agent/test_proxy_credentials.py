"""The zone agent's worker hop (zone_agent.proxy): a client's credentials never reach a
worker, the worker's own key does, and a worker that refuses that key is retried
elsewhere and ends, if every GPU refuses it, in a 502 that says so."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import cast

import pytest
from aiohttp.test_utils import make_mocked_request

from gtm.errors import AttemptFailed
from gtm.relay import Failure
from zone_agent.errors import ApiError
from zone_agent.proxy import DataPath, ZoneRelay

from .helpers import RecordingPool, chat_relay, relay_target

TENANT_KEY = "gtm-tenant-secret"
CLIENT_HEADERS = {
    "Authorization": f"Bearer {TENANT_KEY}",
    "Proxy-Authorization": f"Basic {TENANT_KEY}",
    "x-api-key": TENANT_KEY,
    "api-key": TENANT_KEY,
    "Content-Type": "application/json",
}


def relay(pool: RecordingPool, keys: dict[str, tuple[str, str]]) -> ZoneRelay:
    request = make_mocked_request("POST", "/v1/chat/completions", headers=CLIENT_HEADERS)
    return chat_relay(request, pool, keys.get)


async def test_the_worker_gets_its_own_key_and_none_of_the_clients() -> None:
    pool = RecordingPool()
    await relay(pool, {"g": ("Authorization", "Bearer worker-key")}).open(relay_target("g"))
    (sent,) = pool.sent
    assert [(k, v) for k, v in sent if k.lower() == "authorization"] == [
        ("Authorization", "Bearer worker-key")
    ]
    assert all(TENANT_KEY not in v for _, v in sent)
    assert ("Content-Type", "application/json") in sent


async def test_without_a_key_the_worker_gets_no_authorization_at_all() -> None:
    pool = RecordingPool()
    await relay(pool, {}).open(relay_target("g"))
    (sent,) = pool.sent
    assert not [k for k, _ in sent if k.lower() in ("authorization", "x-api-key", "api-key")]
    assert all(TENANT_KEY not in v for _, v in sent)


def test_a_refused_key_moves_on_and_the_client_learns_why() -> None:
    zone = relay(RecordingPool(), {})
    assert zone.retry_status(401)
    assert not zone.retry_status(400)
    failure = AttemptFailed(Failure.STATUS, "HTTP 401", status=401, body=b"")
    failure.target = "g"
    zone.failures.append(failure)
    with pytest.raises(ApiError) as caught:
        raise zone.exhausted()
    assert caught.value.status == 502
    assert "a worker refused the zone's worker API key (HTTP 401)" in str(caught.value)


def test_a_refused_key_is_logged_once_per_gpu(caplog: pytest.LogCaptureFixture) -> None:
    path = cast(DataPath, SimpleNamespace(_refused=set()))
    with caplog.at_level(logging.WARNING, "zone_agent.proxy"):
        for gpu in ("g1", "g1", "g2"):
            DataPath.key_refused(path, gpu)
    assert [r.getMessage().split()[1] for r in caplog.records] == ["g1", "g2"]
