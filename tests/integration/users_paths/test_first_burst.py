"""A fresh tenant's first burst is not refused by its quota.

``gtm up --processes`` with two regions: ``demo-global`` (600 requests/min,
``max_concurrent: 64``, no regional shares) draws on one pool shared by both regional
LBs, so each holds half of it — on its rate alone 5 requests a second. A client sends 60
requests at once, as a new user's first batch would: every one is answered, none with
429 (the burst allowance of ``regional_lb.quota``). Before, 55 of them got 429.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest
from openai import AsyncOpenAI

from gtm.gpu_profiles import LLAMA_8B
from gtm.state.etcd_server import EtcdServer
from tests.integration.gtmctl.up.helpers import running_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LONDON = "81.2.69.7"
BURST = 60


async def test_a_first_burst_of_60_within_the_quota_gets_no_429(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    async with running_up(
        tmp_path,
        *("--processes", "--state", own_etcd_server.etcd_url, "--speedup", "50"),
        regions=("eu-west", "eu-central"),
    ) as up:
        client = AsyncOpenAI(
            base_url=up.base_url + "/v1",
            api_key="gtm-demo-global",
            max_retries=0,
            timeout=60.0,
            default_headers={"X-Forwarded-For": LONDON},
        )

        async def one(i: int) -> int:
            try:
                await client.chat.completions.create(
                    model=LLAMA_8B,
                    messages=[{"role": "user", "content": f"burst {i}"}],
                    max_tokens=4,
                )
            except openai.APIStatusError as exc:
                return exc.status_code
            return 200

        try:
            statuses = await asyncio.gather(*(one(i) for i in range(BURST)))
        finally:
            await client.close()
    assert 429 not in statuses, sorted(statuses)
    assert statuses.count(200) == BURST, sorted(statuses)
