"""A drained region reached directly spills its clients to allowed peers, never elsewhere.

``gtm up --processes`` with eu-central, eu-west and us-east. The operator drains
eu-central; clients that still use its address (their DNS answer, or one cached before
the drain) are spilled:

* a Berlin client (GDPR: EEA regions only) to eu-west — 200 with
  ``x-gtm-spilled-from: eu-central``;
* once eu-west is drained too, never to us-east, although us-east is healthy and idle:
  it is not in the Berlin client's allowed set;
* a client of unknown location (an untrusted peer: its X-Forwarded-For is not
  believed) follows the policy's ``unknown_client_location`` (assume world), as at the
  front door: us-east may serve it, and it is spilled there.

Before, the regional LB did not know a direct client's country and refused to spill a
request whose country it did not know: the drained region served it itself.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.gtmctl.up.helpers import running_up
from tests.integration.gtmctl.up.test_up import eventually
from tests.integration.users_paths.direct_clients import (
    BERLIN,
    UNTRUSTED_SOURCE,
    ask,
    deployment,
    region_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(240)]


def gtm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gtmctl", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def drain(region: str, state: str) -> None:
    done = await asyncio.to_thread(gtm, "drain", "region", region, "--state", state)
    assert done.returncode == 0, done.stderr


async def test_a_drained_region_spills_direct_clients_within_their_allowed_set(
    tmp_path: Path,
) -> None:
    regions = ("eu-central", "eu-west", "us-east")
    async with running_up(tmp_path, "--processes", "--speedup", "20", regions=regions) as up:
        document = await deployment(up)
        eu_central = region_url(document, "eu-central")
        await drain("eu-central", document["state"])

        async def berlin_spilled_to_eu_west() -> bool:
            answer = await ask(eu_central, client=BERLIN)
            assert answer.region != "us-east", answer
            return answer.status == 200 and answer.spilled_from == "eu-central"

        await eventually(
            berlin_spilled_to_eu_west, "a direct client spilled from drained eu-central"
        )
        spilled = await ask(eu_central, client=BERLIN)
        assert (spilled.status, spilled.region, spilled.spilled_from) == (
            200,
            "eu-west",
            "eu-central",
        ), spilled

        await drain("eu-west", document["state"])

        async def unknown_spilled_to_us_east() -> bool:
            answer = await ask(eu_central, source=UNTRUSTED_SOURCE, client=BERLIN)
            return answer.region == "us-east"

        await eventually(unknown_spilled_to_us_east, "eu-west drained, us-east takes spills")
        for _ in range(5):
            held = await ask(eu_central, client=BERLIN)
            assert held.region != "us-east", held
            assert held.status in (200, 503), held  # served here, or waits for room
        unknown = await ask(eu_central, source=UNTRUSTED_SOURCE)
        assert (unknown.status, unknown.region, unknown.spilled_from) == (
            200,
            "us-east",
            "eu-central",
        ), unknown
