"""Both servers of the zone's OpenAI endpoints (gtm zone --http-server) give a client
the same answers and the operator the same access lines and counts."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from gtm.access import ACCESS_LOGGER
from gtm.gpu_profiles import LLAMA_8B
from gtm.serve import HttpServerKind

from .conftest import ZoneFactory

pytestmark = pytest.mark.integration

CHAT = {"model": LLAMA_8B, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
#: Fields that differ from one request to the next whatever the server.
_VARYING = {"request_id", "decision_id", "ttft_ms", "duration_ms", "client", "peer"}


@pytest.fixture
def http_server() -> HttpServerKind:
    """This module makes one zone per server itself."""
    return HttpServerKind.LEAN


async def _exchange(http: aiohttp.ClientSession, url: str) -> list[tuple[int, str, bytes]]:
    """Each kind of request once: (status, content type, body less its varying parts)."""
    deep = b'{"a":' * 80 + b"1" + b"}" * 80
    sent: list[dict[str, Any]] = [
        {"json": CHAT},
        {"json": {**CHAT, "stream": True}},
        {"data": b"{not json", "headers": {"Content-Type": "application/json"}},
        {"data": deep, "headers": {"Content-Type": "application/json"}},
        {"json": {**CHAT, "model": "no-such-model"}},
        {"json": CHAT, "headers": {"x-gtm-canary": "sometimes"}},
    ]
    got = []
    for kwargs in sent:
        async with http.post(url + "/v1/chat/completions", **kwargs) as response:
            body = await response.read()
            kind = response.headers.get("Content-Type", "")
            shown = body if response.status >= 400 else b""
            got.append((response.status, kind, shown))
    return got


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    lines = []
    for record in caplog.records:
        if record.name.startswith(ACCESS_LOGGER):
            fields = {k: v for k, v in vars(record).items() if k in _FIELDS}
            lines.append({k: v for k, v in fields.items() if k not in _VARYING})
    caplog.clear()
    return lines


_FIELDS = {
    "request_id", "decision_id", "tenant", "model", "country", "location_source", "region",
    "zone", "gpu", "spill_from", "spill_to", "status", "end", "ttft_ms", "tokens_in",
    "tokens_out", "tokens_source", "duration_ms", "method", "path", "client", "peer",
}  # fmt: skip


async def test_both_servers_answer_log_and_count_alike(
    make_zone: ZoneFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    seen = {}
    for kind in HttpServerKind:
        zone = await make_zone(["H100"], http_server=kind)
        answers = await _exchange(zone.http, zone.url)
        counted = {
            (s.labels["endpoint"], s.labels["status"]): s.value
            for family in zone.agent.registry.collect()
            if family.name == "gtm_zone_requests"
            for s in family.samples
            if s.name.endswith("_total")
        }
        seen[kind] = (answers, _lines(caplog), counted)
        fallbacks = [
            s.value
            for family in zone.agent.registry.collect()
            if family.name == "gtm_http_fallbacks"
            for s in family.samples
            if s.name.endswith("_total")
        ]
        # The lean zone answered every request itself; the aiohttp one has no lean front.
        assert fallbacks == ([0.0] * 8 if kind is HttpServerKind.LEAN else [])
        await zone.no_leaks()
    lean, plain = seen[HttpServerKind.LEAN], seen[HttpServerKind.AIOHTTP]
    assert [status for status, _, _ in lean[0]] == [200, 200, 400, 400, 404, 400]
    assert lean[0] == plain[0]
    assert len(lean[1]) == len(plain[1]) == 6
    assert lean[1] == plain[1]
    assert lean[2] == plain[2]
