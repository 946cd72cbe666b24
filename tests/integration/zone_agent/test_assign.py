"""``POST /v1/assign``: the decision without the bytes (for nginx auth_request / Envoy)."""

from __future__ import annotations

import pytest

from gtm.gpu_profiles import LLAMA_8B
from gtm.models import decision_adapter

from .conftest import ZoneFactory

pytestmark = pytest.mark.integration

CHAT = {"model": LLAMA_8B, "messages": [{"role": "user", "content": "hello " * 50}]}


async def test_assign_from_a_body_returns_the_gpu_and_the_trace(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "A100-80GB"], assign_hold_s=60.0)
    async with zone.http.post(zone.url + "/v1/assign", json=CHAT) as response:
        assert response.status == 200
        body = await response.json()
        headers = response.headers
    assert body["gpu"] in zone.ids
    assert headers["x-gtm-gpu"] == body["gpu"]
    assert headers["x-gtm-upstream"] == zone.sim(body["gpu"]).url.removeprefix("http://")
    assert body["predicted_ttft_ms"] > 0
    decision = decision_adapter.validate_python(body["decision"])
    assert decision.choice == body["gpu"]
    assert set(decision.trace.candidates) == set(zone.ids)
    # The choice is charged for assign_hold_s: the next decision sees the load.
    assert zone.agent.accounting.totals().streams == 1


async def test_assign_from_headers(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100"])
    headers = {"x-gtm-model": LLAMA_8B, "x-gtm-input-tokens": "1500"}
    async with zone.http.post(zone.url + "/v1/assign", headers=headers) as response:
        assert response.status == 200
        assert (await response.json())["uncached_tokens"] == 1500


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({}, 400),
        ({"headers": {"x-gtm-model": LLAMA_8B, "x-gtm-input-tokens": "-5"}}, 400),
        ({"headers": {"x-gtm-model": "nope"}}, 404),
        ({"json": CHAT, "params": {"endpoint": "fax"}}, 400),
        ({"data": b"{oops"}, 400),
    ],
)
async def test_assign_bad_input(
    make_zone: ZoneFactory, kwargs: dict[str, object], status: int
) -> None:
    zone = await make_zone(["H100"])
    async with zone.http.post(zone.url + "/v1/assign", **kwargs) as response:  # type: ignore[arg-type]
        assert response.status == status
        assert "error" in await response.json()
