"""Audit anchoring against a real etcd, and ``gtm audit verify --state`` as users run it.

The issue's scenario: an audit file truncated and its ``.head`` deleted verified as OK.
With the anchor in etcd, the real command exits 1 and says what is missing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gtm.audit_anchor import AuditAnchorer, read_anchors
from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.state.etcd_server import EtcdServer
from gtm.state.url import open_store
from gtm.tasks import TaskSupervisor
from policies.audit import AuditWriter, FsyncPolicy, Head, chain_files
from tests.unit.policies.test_audit import record

pytestmark = [pytest.mark.etcd, pytest.mark.integration]


def gtm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gtmctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_and_anchor(directory: Path, url: str, count: int) -> tuple[list[Head], int]:
    """``count`` records in ``directory``'s chain, anchored in etcd; (heads, revision)."""

    async def main() -> tuple[list[Head], int]:
        clock = SystemClock()
        store = open_store(url, clock=clock, registry=new_registry())
        try:
            with AuditWriter(directory, prefix="global", fsync=FsyncPolicy.NEVER) as audit:
                anchoring = AuditAnchorer(audit, store, clock=clock, registry=new_registry())
                heads = [audit.append(record(i)) for i in range(1, count + 1)]
                assert await anchoring.step()
                anchored = anchoring.anchored
            assert anchored is not None
            assert [a.key for a in await read_anchors(store) if a.key == anchored.key]
            return heads, anchored.revision
        finally:
            await store.aclose()

    return asyncio.run(main())


def test_a_truncated_file_with_its_head_deleted_fails_gtm_audit_verify(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    url = own_etcd_server.etcd_url
    directory = tmp_path / "audit" / "global"
    heads, revision = write_and_anchor(directory, url, 10)
    # The steps: truncate the audit file, delete its .head.
    (path,) = chain_files(directory, "global")
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:6]))
    (directory / "global.head").unlink()

    # The files alone cannot show it (as before), and the command now says so.
    alone = gtm("audit", "verify", str(directory))
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "warning: no state store given" in alone.stderr

    checked = gtm("audit", "verify", str(directory), "--state", url)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"{path}: tail may be missing: the anchor at revision {revision} (" in checked.stdout
    assert (
        f") records 10 records (last seq 10, hash {heads[-1].hash}, in {path.name}) but the "
        "chain ends at seq 6: 4 record(s) cut" in checked.stdout
    )
    assert f"{directory / 'global.head'}: missing, but the anchor at revision" in checked.stdout
    assert "FAILED: 2 problem(s) in 6 records" in checked.stderr

    # GTM_STATE is the locator the other commands read too.
    walked = subprocess.run(
        [sys.executable, "-m", "gtmctl", "audit", "verify", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "GTM_STATE": url},
    )
    assert walked.returncode == 1, walked.stdout + walked.stderr
    assert walked.stdout.splitlines()[-1] == "verified 1 chain(s): 0 OK, 1 FAILED"


def test_an_intact_chain_verifies_up_to_its_anchor(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    url = own_etcd_server.etcd_url
    directory = tmp_path / "global"
    heads, revision = write_and_anchor(directory, url, 3)
    checked = gtm("audit", "verify", str(directory), "--state", url)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith(
        f"OK: 3 records in 1 file(s); head seq 3 hash {heads[-1].hash}"
    )
    assert f"OK up to the anchor at revision {revision} (" in checked.stdout
    assert checked.stderr == ""
    # An unreachable store is not an OK: the command says it could not check.
    own_etcd_server.stop()
    down = gtm("audit", "verify", str(directory), "--state", url)
    assert down.returncode == 1, down.stdout + down.stderr
    assert f"cannot read the audit anchors from {url}" in down.stderr


async def test_anchoring_rides_out_an_etcd_outage_and_resumes(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    url = own_etcd_server.etcd_url
    clock = SystemClock()
    store = open_store(url, clock=clock, registry=new_registry())
    supervisor = TaskSupervisor(registry=new_registry(), clock=clock)
    directory = tmp_path / "global"
    try:
        with AuditWriter(directory, prefix="global", fsync=FsyncPolicy.NEVER) as audit:
            registry = new_registry()
            anchoring = AuditAnchorer(
                audit, store, clock=clock, registry=registry, interval=0.5, poll=0.1
            )

            def failures() -> float:
                labels = {"chain": "global"}
                return registry.get_sample_value("gtm_audit_anchor_failures_total", labels) or 0

            supervisor.spawn("audit-anchor", anchoring.run())
            audit.append(record(1))
            await until(lambda: anchoring.anchored is not None, "the first anchor")
            await asyncio.to_thread(own_etcd_server.stop)
            # Appending never waits for the store: a plain call, nothing to await.
            heads = [audit.append(record(i)) for i in range(2, 12)]
            await until(lambda: failures() >= 2, "the anchorer tried, and failed, meanwhile")
            assert anchoring.anchored is not None
            assert anchoring.anchored.anchor.seq == 1
            await asyncio.to_thread(own_etcd_server.start)
            await until(
                lambda: (
                    anchoring.anchored is not None
                    and anchoring.anchored.anchor.hash == heads[-1].hash
                ),
                "anchoring resumed",
            )
    finally:
        await supervisor.aclose()
        await store.aclose()
    checked = await asyncio.to_thread(gtm, "audit", "verify", str(directory), "--state", url)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip().endswith(": seq 11")
    assert checked.stderr == ""


async def until(condition: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.1)
