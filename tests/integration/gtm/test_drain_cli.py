"""``gtm drain`` / ``gtm undrain`` against a real etcd."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget, GeoPoint, Region, Zone
from gtm.state import codec, keys
from gtm.state.etcd_server import EtcdServer
from gtm.state.url import open_store
from gtmctl.cli import cli

pytestmark = [pytest.mark.etcd, pytest.mark.integration]


def _read(url: str, key: str) -> Drain | None:
    async def main() -> Drain | None:
        store = open_store(url, clock=SystemClock(), registry=new_registry())
        try:
            kv = await store.get(key)
            return None if kv is None else codec.decode(key, kv.value, Drain)
        finally:
            await store.aclose()

    return asyncio.run(main())


def _put(url: str, key: str, value: bytes) -> None:
    async def main() -> None:
        store = open_store(url, clock=SystemClock(), registry=new_registry())
        try:
            await store.put(key, value)
        finally:
            await store.aclose()

    asyncio.run(main())


def test_drain_and_undrain_a_zone(etcd_server: EtcdServer) -> None:
    runner = CliRunner()
    url = etcd_server.etcd_url
    record = Zone(id="drain-test-zone", region_id="drain-test-region")
    _put(url, keys.zone("drain-test-region", "drain-test-zone"), codec.encode(record))
    key = keys.drain(DrainTarget.ZONE, "drain-test-zone")
    result = runner.invoke(
        cli,
        [
            "drain",
            "zone",
            "drain-test-zone",
            "--state",
            url,
            "--reason",
            "maintenance",
            "--by",
            "ops",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("drained zone drain-test-zone at store revision ")
    assert result.output.strip().endswith(
        f"(was: serving); undo: gtm undrain zone drain-test-zone --state {url}"
    )
    drain = _read(url, key)
    assert drain is not None
    assert (drain.target, drain.id, drain.reason, drain.by) == (
        DrainTarget.ZONE,
        "drain-test-zone",
        "maintenance",
        "ops",
    )
    assert drain.at > 0
    result = runner.invoke(cli, ["undrain", "zone", "drain-test-zone", "--state", url])
    assert result.exit_code == 0
    assert result.output.startswith("undrained zone drain-test-zone at store revision ")
    assert "(was: drained by ops since " in result.output
    assert result.output.strip().endswith(
        f"undo: gtm drain zone drain-test-zone --state {url} --force --reason maintenance --by ops"
    )
    assert _read(url, key) is None
    again = runner.invoke(cli, ["undrain", "zone", "drain-test-zone", "--state", url])
    assert "was not drained" in again.output


def test_drain_refuses_the_embedded_store_and_bad_ids() -> None:
    runner = CliRunner()
    memory = runner.invoke(cli, ["drain", "region", "eu-west", "--state", "memory"])
    assert memory.exit_code == 2
    assert "shared store" in memory.output
    bad = runner.invoke(cli, ["drain", "gpu", "bad id!", "--state", "etcd://127.0.0.1:1"])
    assert bad.exit_code == 2
    assert "invalid key segment" in bad.output


def test_an_unreachable_store_is_a_clean_error() -> None:
    result = CliRunner().invoke(
        cli, ["drain", "region", "eu-west", "--state", "etcd://127.0.0.1:1", "--timeout", "0.2"]
    )
    assert result.exit_code == 1
    assert "Error:" in result.output


def _region(region_id: str) -> Region:
    return Region(
        id=region_id, location=GeoPoint(lat=50.1, lon=8.7), jurisdiction="eu", country="DE"
    )


def test_an_unknown_target_is_refused_naming_the_known_ones(etcd_server: EtcdServer) -> None:
    url = etcd_server.etcd_url
    for region in ("drain-known-a", "drain-known-b"):
        _put(url, keys.region(region), codec.encode(_region(region)))
    runner = CliRunner()
    result = runner.invoke(cli, ["drain", "region", "planet-x", "--state", url], prog_name="gtm")
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert "unknown region 'planet-x'" in line
    assert "drain-known-a, drain-known-b" in line
    assert "--force" in line
    assert _read(url, keys.drain(DrainTarget.REGION, "planet-x")) is None
    forced = runner.invoke(cli, ["drain", "region", "planet-x", "--state", url, "--force"])
    assert forced.exit_code == 0, forced.output
    assert _read(url, keys.drain(DrainTarget.REGION, "planet-x")) is not None
    runner.invoke(cli, ["undrain", "region", "planet-x", "--state", url])
    known = runner.invoke(cli, ["drain", "region", "drain-known-a", "--state", url])
    assert known.exit_code == 0, known.output
    runner.invoke(cli, ["undrain", "region", "drain-known-a", "--state", url])
