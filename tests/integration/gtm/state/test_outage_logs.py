"""A real etcd stopped and restarted: each component that retries against it logs the
outage once when it starts and once when it ends — no line and no traceback per retry —
while its Prometheus counter counts every failed attempt.

The loops of every tier go through the same three paths: a supervised loop
(``TaskSupervisor.run_loop``: summaries, registrations, quota leases, the global tier's
refresh), the snapshot watcher and the policy watcher. The test runs one of each on a
private etcd, kills etcd until each has failed a few times, starts it again, and waits
(bounded) until each is back.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

import pytest

from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.models import GeoPoint, Region
from gtm.policy_store import PolicyWatcher, apply
from gtm.state import keys
from gtm.state.etcd_server import EtcdServer
from gtm.state.publisher import LeasedPublisher
from gtm.state.snapshot import SnapshotWatcher
from gtm.state.url import open_store
from gtm.tasks import Backoff, TaskSupervisor
from policies import load_examples

pytestmark = [pytest.mark.etcd, pytest.mark.integration, pytest.mark.timeout(120)]

#: Bounds for a loaded 2-core machine; each wait polls and ends as soon as it holds.
WAIT_S = 30.0
RECORD = Region(
    id="us-east", location=GeoPoint(lat=37.4, lon=-78.7), jurisdiction="US", country="US"
)


async def until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.05)


async def test_an_etcd_outage_is_two_lines_per_component_and_no_traceback(
    own_etcd_server: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock = SystemClock()
    registry = new_registry()
    store = open_store(own_etcd_server.etcd_url, clock=clock, registry=registry, timeout=0.5)
    await apply(store, load_examples(), None, clock=clock)
    publisher = LeasedPublisher(store, keys.region("us-east"), ttl_s=30.0, what="test record")
    snapshots = SnapshotWatcher(
        store, clock=clock, registry=registry, backoff=Backoff(0.05, 0.5), probe_interval=0.2
    )
    policies = PolicyWatcher(store, clock=clock, registry=registry, backoff=Backoff(0.05, 0.5))

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    def failures() -> tuple[float, float, float]:
        return (
            sample("gtm_task_failures_total", component="gtm", task="summary"),
            sample("gtm_snapshot_reconnects_total", component="gtm"),
            sample("gtm_policy_watch_failures_total"),
        )

    caplog.set_level(logging.INFO, logger="gtm")
    try:
        async with TaskSupervisor(registry=registry, clock=clock) as tasks:
            tasks.run_loop(
                "summary",
                lambda: publisher.publish(RECORD),
                interval=0.2,
                backoff=Backoff(0.05, 0.5),
            )
            tasks.spawn("snapshots", snapshots.run())
            tasks.spawn("policies", policies.run())
            await snapshots.wait_ready()
            await policies.wait_for_generation(1)
            await until("a first summary", lambda: publisher.published > 0)
            caplog.clear()

            own_etcd_server.stop()
            await until("every component failed 3 times", lambda: min(failures()) >= 3)
            own_etcd_server.start()
            await until(
                "every component back",
                lambda: sum("back after" in r.getMessage() for r in caplog.records) >= 3,
            )
    finally:
        await store.aclose()

    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r for r in caplog.records if r.exc_info] == []
    messages = sorted(r.getMessage() for r in warnings)
    started = [m for m in messages if " failed: " in m]
    ended = [m for m in messages if " back after " in m]
    assert [m.split(" failed: ")[0] for m in started] == [
        "loop summary",
        "policy watch",
        "snapshot watch",
    ], messages
    assert all(re.search(r"back after \d+\.\d s \(\d+ failed attempts?\)", m) for m in ended)
    assert len(ended) == 3
    assert len(warnings) == 6, messages
