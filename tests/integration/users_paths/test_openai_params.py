"""A client that sends a parameter of the wrong type or range gets OpenAI's 400 naming it,
from whichever tier it reached, and nothing is decided or served for it.

``gtm up --processes`` on private loopback addresses; the client is the openai SDK,
pointed at the front door, at a regional LB (as ``<region>.api`` hands it out) and at a
zone agent directly. It sends ``temperature: "abc"`` and ``n: 0``; the SDK must raise
``BadRequestError`` whose ``param`` names the parameter, and no tier may count a routing
decision or an assignment to a GPU for them (the same counters move for a valid
request sent afterwards). Before, the front door let ``temperature: "abc"`` through to
an emulated worker and the client got a 200.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gtm.state.etcd_server import EtcdServer
from tests.integration.gtmctl.up.helpers import Up, running_up
from tests.integration.users_paths.test_openai_errors import _tiers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: The demo tenant every region may serve: gtm up prints its key.
TENANT_KEY = "gtm-demo-global"
#: What counts a decision or a GPU's work at each tier (every label summed).
DECISIONS = (
    "gtm_global_decisions_total",
    "gtm_regional_admitted_total",
    "gtm_zone_assignments_total",
)


async def _decisions(session: aiohttp.ClientSession, up: Up) -> float:
    """Decisions and GPU assignments counted so far, over every tier of the deployment."""
    total = 0.0
    for base in _tiers(up).values():
        async with session.get(f"{base}/metrics") as response:
            assert response.status == 200, base
            text = await response.text()
        for family in text_string_to_metric_families(text):
            total += sum(s.value for s in family.samples if s.name in DECISIONS)
    return total


async def test_bad_parameters_are_400s_naming_them_before_any_decision(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    async with (
        running_up(
            tmp_path,
            *("--processes", "--state", own_etcd_server.etcd_url, "--speedup", "10"),
            regions=("eu-west",),
        ) as up,
        aiohttp.ClientSession() as session,
    ):
        before = await _decisions(session, up)
        for tier, base in _tiers(up).items():
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=TENANT_KEY, max_retries=0)
            async with client:
                with pytest.raises(openai.BadRequestError) as chat:
                    await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": "hi"}],
                        max_tokens=2,
                        extra_body={"temperature": "abc"},
                    )
                with pytest.raises(openai.BadRequestError) as completion:
                    await client.completions.create(model=MODEL, prompt="hi", max_tokens=2, n=0)
            assert (chat.value.param, chat.value.code) == ("temperature", "invalid_type"), tier
            assert chat.value.body == {
                "message": "Invalid type for 'temperature': expected a decimal, "
                "but got a string instead.",
                "type": "invalid_request_error",
                "param": "temperature",
                "code": "invalid_type",
            }, tier
            assert completion.value.param == "n", tier
            assert completion.value.code == "integer_below_min_value", tier
        assert await _decisions(session, up) == before

        valid = openai.AsyncOpenAI(base_url=f"{up.base_url}/v1", api_key=TENANT_KEY)
        async with valid:
            answer = await valid.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                temperature=0.5,
            )
        assert answer.choices
        # Counted by the front door, the regional LB and the zone agent: the counters
        # read above are the ones a request that passes moves.
        assert await _decisions(session, up) >= before + 3
