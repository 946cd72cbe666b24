"""A fault logs once when it starts, counts while it lasts and logs once when it ends —
on an injected clock, for the core's outage log and the loops that use it."""

from __future__ import annotations

import asyncio
import logging
import random
import re

import pytest

from gtm.clock import FakeClock
from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.outage import OutageLog, describe
from gtm.policy_store import PolicyWatcher, apply
from gtm.state.memory import MemoryStore
from gtm.tasks import Backoff, TaskSupervisor
from gtm.testing.outage import OutageStore
from policies import load_examples

LOG = logging.getLogger("tests.outage")


def lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]


def test_a_fault_is_one_line_a_count_and_one_line(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(start=0.0)
    counted: list[None] = []
    outage = OutageLog("loop summary", logger=LOG, clock=clock, count=lambda: counted.append(None))
    assert outage.recovered() is None  # nothing to end
    down = StateUnavailable("etcd at 127.0.0.1:2379 unavailable during put")
    assert outage.failed(down)
    for _ in range(999):
        clock.advance_nowait(0.016)
        assert not outage.failed(down)
    assert outage.active
    assert outage.attempts == len(counted) == 1000
    clock.advance_nowait(0.016)
    assert outage.recovered() == pytest.approx(16.0)
    assert not outage.active
    start, end = lines(caplog, "tests.outage")
    assert start.getMessage() == (
        "loop summary failed: etcd at 127.0.0.1:2379 unavailable during put; retrying"
    )
    assert start.levelno == end.levelno == logging.WARNING
    assert start.exc_info is None  # an expected fault: no traceback
    assert end.getMessage() == "loop summary back after 16.0 s (1000 failed attempts)"


def test_an_unexpected_error_keeps_one_traceback(caplog: pytest.LogCaptureFixture) -> None:
    outage = OutageLog("loop quota-leases", logger=LOG, clock=FakeClock())
    for _ in range(50):
        outage.failed(KeyError("tenant"))
    (start,) = lines(caplog, "tests.outage")
    assert start.getMessage() == "loop quota-leases failed: KeyError: 'tenant'; retrying"
    assert start.exc_info is not None


def test_a_new_kind_of_error_during_a_fault_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = OutageLog("policy watch", logger=LOG, clock=FakeClock(), consequence="serving")
    for _ in range(10):
        outage.failed(StateUnavailable("down"))
        outage.failed(ValueError("a bug"))
    first, second = lines(caplog, "tests.outage")
    assert first.getMessage() == "policy watch failed: down; serving"
    assert second.getMessage() == "policy watch still failing, now: ValueError: a bug"
    assert second.exc_info is not None
    outage.recovered()
    outage.failed(StateUnavailable("down again"))  # a new fault starts with its own line
    assert lines(caplog, "tests.outage")[-1].getMessage() == (
        "policy watch failed: down again; serving"
    )


def test_describe_names_foreign_errors_by_type() -> None:
    assert describe(StateUnavailable("etcd gone")) == "etcd gone"
    assert describe(ConnectionResetError()) == "ConnectionResetError"
    assert describe(RuntimeError("x")) == "RuntimeError: x"


async def test_a_supervised_loop_logs_a_store_outage_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(start=0.0)
    registry = new_registry()
    store = OutageStore(MemoryStore(clock, registry))
    recovered = asyncio.Event()

    async def publish() -> None:
        await store.put("/gtm/v1/test", b"x")
        if clock.monotonic() > 16.0:
            recovered.set()

    store.down = True
    caplog.set_level(logging.INFO, logger="gtm.tasks")
    async with TaskSupervisor(registry=registry, clock=clock, rng=random.Random(3)) as tasks:
        tasks.run_loop("summary", publish, interval=1.0, backoff=Backoff(0.1, 0.5))
        await clock.advance_until(lambda: clock.monotonic() >= 16.0, step=0.05)
        store.down = False
        await clock.advance_until(recovered.is_set, step=0.05)
    start, end = lines(caplog, "gtm.tasks")
    assert start.getMessage() == "loop summary failed: simulated outage; retrying"
    assert re.fullmatch(
        r"loop summary back after 1[67]\.\d s \(\d+ failed attempts\)", end.getMessage()
    )
    assert start.exc_info is None
    failures = registry.get_sample_value(
        "gtm_task_failures_total", {"component": "gtm", "task": "summary"}
    )
    assert failures is not None
    assert failures > 30


async def test_the_policy_watcher_logs_a_store_outage_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(start=0.0)
    registry = new_registry()
    inner = MemoryStore(clock, registry)
    await apply(inner, load_examples(), None, clock=clock)
    store = OutageStore(inner)
    watcher = PolicyWatcher(store, clock=clock, registry=registry)
    async with TaskSupervisor(registry=registry, clock=clock) as tasks:
        tasks.spawn("policy", watcher.run())
        await watcher.wait_for_generation(1)
        await clock.settle()  # the watch is open
        store.down = True
        await clock.advance_until(lambda: clock.monotonic() >= 16.0)
        store.down = False
        await clock.advance_until(lambda: clock.monotonic() >= 22.0)  # past a backoff
    records = [r.getMessage() for r in lines(caplog, "gtm.policy_store")]
    assert records[-2] == (
        "policy watch failed: simulated outage: watch stream lost; serving the policy in force"
    )
    # The outage lasted 16 s; the watcher's jittered backoff (up to 5 s) may take it to 22.
    assert re.fullmatch(
        r"policy watch back after (1[6-9]|2[0-2])\.\d s \(\d+ failed attempts\)", records[-1]
    )
    failures = registry.get_sample_value("gtm_policy_watch_failures_total")
    assert failures is not None
    assert failures >= 5
