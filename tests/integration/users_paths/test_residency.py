"""Residency holds for clients that reach a region directly, not only through the front door.

``gtm up --processes`` with us-east and eu-central, started with a policy that lacks the
GDPR rule. A Berlin client uses us-east's address — the answer its resolver got — and
is served there, as that policy allows. Then the operator applies the shipped policy
(GDPR: clients where it applies are served in the EEA only, for every tenant). The
client keeps the old address, as a cached DNS answer would, and from then on:

* the Berlin client is refused at us-east (never served outside the EEA) and served at
  eu-central; a New York client is served at us-east;
* a forged ``x-gtm-client-country: US`` (with or without a made-up signature) changes
  nothing: the regional LB locates the client itself;
* an untrusted peer's ``X-Forwarded-For`` is not believed: its client is of unknown
  location and the policy's ``unknown_client_location`` decides;
* through the front door, the location the front door found is signed and believed;
* every decision is in the regional LB's audit trail with where the location came
  from, and ``gtm audit verify`` verifies it.

Before, the regional LB had no GeoIP: a direct client was "somewhere in the world" (the
shipped ``unknown_client_location``), so the Berlin client was served in us-east, a
client could name its own country, and nothing it served appeared in an audit log.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from policies.loader import examples_path
from tests.integration.gtmctl.up.helpers import running_up
from tests.integration.gtmctl.up.test_up import eventually
from tests.integration.users_paths.direct_clients import (
    BERLIN,
    NEW_YORK,
    UNTRUSTED_SOURCE,
    ask,
    audit_records,
    deployment,
    region_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(240)]

GDPR_RULE = "gdpr-stays-in-eea"


def policy_without_gdpr(tmp_path: Path) -> Path:
    """The shipped policies less their GDPR deny rule."""
    folder = tmp_path / "policies-before"
    shutil.copytree(examples_path(), folder)
    path = folder / "residency.yaml"
    document = yaml.safe_load(path.read_text())
    document["spec"]["rules"] = [r for r in document["spec"]["rules"] if r["name"] != GDPR_RULE]
    path.write_text(yaml.safe_dump(document))
    return folder


def gtm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gtmctl", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def test_a_direct_client_is_held_to_residency_at_the_region(tmp_path: Path) -> None:
    before = policy_without_gdpr(tmp_path)
    regions = ("us-east", "eu-central")
    async with running_up(
        tmp_path, "--processes", "--speedup", "20", "--policies", str(before), regions=regions
    ) as up:
        document = await deployment(up)
        us_east, eu_central = region_url(document, "us-east"), region_url(document, "eu-central")

        # The policy in force lets the Berlin client be served in us-east (or wherever
        # us-east's capacity split spills it: every region is allowed).
        async def served_at_us_east() -> bool:
            served = await ask(us_east, client=BERLIN)
            assert served.status in (200, 429), served  # 429: the quota's first lease round
            return served.status == 200

        await eventually(served_at_us_east, "the Berlin client served before the change")

        # The operator applies the shipped policy; the client keeps its old answer.
        applied = await asyncio.to_thread(
            gtm, "policy", "apply", str(examples_path()), "--state", document["state"],
            "--backup", str(tmp_path / "policy-backups"),
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr

        async def refused_at_us_east() -> bool:
            return (await ask(us_east, client=BERLIN)).status == 451

        await eventually(refused_at_us_east, "the GDPR rule holds at us-east for a direct client")
        refused = await ask(us_east, client=BERLIN)
        assert refused.region is None
        assert refused.body["error"]["code"] == "region_not_allowed"
        assert (await ask(eu_central, client=BERLIN)).region == "eu-central"
        assert (await ask(us_east, client=NEW_YORK)).status == 200

        # A client naming its own country, or forging a signature, is not believed.
        forged = {"x-gtm-client-country": "US", "x-gtm-location-source": "geoip"}
        assert (await ask(us_east, client=BERLIN, headers=forged)).status == 451
        signature = {**forged, "x-gtm-tier-auth": "v1;global;1;" + "0" * 64}
        assert (await ask(us_east, client=BERLIN, headers=signature)).status == 451

        # An untrusted peer's X-Forwarded-For is not believed: unknown location, and
        # the shipped policy's unknown_client_location (assume world) decides.
        untrusted = await ask(us_east, client=NEW_YORK, source=UNTRUSTED_SOURCE)
        assert untrusted.status == 200, untrusted

        # Through the front door (once it has the new policy too), the location it
        # found is signed and believed at the region.
        async def via_front_door() -> bool:
            front = await ask(up.base_url, client=BERLIN)
            assert front.region != "us-east", front
            return (front.status, front.region) == (200, "eu-central")

        await eventually(via_front_door, "a Berlin client served in eu-central via the front door")

    run_dir = document["run_dir"]
    records = audit_records(run_dir, "us-east")
    located = {(r["client_country"], r.get("location_source"), r["chosen_region"]) for r in records}
    # Served (here or spilled) before the policy change, refused after it.
    assert {("DE", "trusted-proxy-xff", r) for r in regions} & located
    assert ("DE", "trusted-proxy-xff", None) in located
    assert {("US", "trusted-proxy-xff", r) for r in regions} & located
    assert {(None, "unknown-policy", r) for r in regions} & located  # the untrusted peer's
    assert not any(country == "US" and chosen is None for country, _, chosen in located)
    at_eu = audit_records(run_dir, "eu-central")
    assert any(
        r["client_country"] == "DE" and r.get("location_source") == "signed-upstream" for r in at_eu
    ), at_eu
    for region in regions:
        verified = await asyncio.to_thread(
            gtm, "audit", "verify", str(Path(run_dir) / "audit" / f"regional-{region}")
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
