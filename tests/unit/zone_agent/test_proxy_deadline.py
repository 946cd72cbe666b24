"""The first-byte deadline of a streamed response (``ProxySettings.first_byte_timeout``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from zone_agent.proxy import ProxySettings
from zone_agent.request import Endpoint, zone_request
from zone_agent.router import ZoneDecision

SETTINGS = ProxySettings(
    "z", first_byte_floor_s=5.0, first_byte_ttft_factor=4.0, first_byte_cap_s=60.0
)


def _facts(stream: bool) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return zone_request(body, Endpoint.CHAT, request_id="r")


def _decision(predicted_ms: float | None) -> ZoneDecision:
    return cast(ZoneDecision, SimpleNamespace(predicted_ttft_ms=predicted_ms))


def test_non_streamed_requests_have_no_first_byte_deadline() -> None:
    assert SETTINGS.first_byte_timeout(_facts(False), _decision(100.0)) is None


@pytest.mark.parametrize(
    ("predicted_ms", "expected_s"),
    [
        (None, 5.0),  # no cost model (baseline profiles): the floor
        (200.0, 5.0),  # 4 × 0.2 s is under the floor
        (3_000.0, 12.0),  # 4 × the predicted TTFT
        (60_000.0, 60.0),  # capped at the upstream timeout
    ],
)
def test_streamed_deadline_is_the_floor_or_a_multiple_of_the_prediction(
    predicted_ms: float | None, expected_s: float
) -> None:
    assert SETTINGS.first_byte_timeout(_facts(True), _decision(predicted_ms)) == expected_s
