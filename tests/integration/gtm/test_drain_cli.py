"""``gtm drain`` / ``gtm undrain`` against a real etcd."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget
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


def test_drain_and_undrain_a_zone(etcd_server: EtcdServer) -> None:
    runner = CliRunner()
    url = etcd_server.etcd_url
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
    assert "drained zone drain-test-zone" in result.output
    record = _read(url, key)
    assert record is not None
    assert (record.target, record.id, record.reason, record.by) == (
        DrainTarget.ZONE,
        "drain-test-zone",
        "maintenance",
        "ops",
    )
    assert record.at > 0
    result = runner.invoke(cli, ["undrain", "zone", "drain-test-zone", "--state", url])
    assert result.exit_code == 0
    assert "undrained zone drain-test-zone" in result.output
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
