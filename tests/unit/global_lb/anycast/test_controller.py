"""The controller: debounce, apply-on-change, metrics, the withdrawal on stop, and the
region's jurisdictions from the shipped example policies."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from global_lb.anycast.controller import (
    AnycastController,
    AnycastMetrics,
    Debounce,
    FleetSignals,
    ProbeSignals,
    region_jurisdictions,
)
from global_lb.anycast.policy import Announcement, AnycastPrefix, Plan, Service
from global_lb.anycast.speaker import SpeakerError
from global_lb.app import load_policy
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from gtm.state.snapshot import SnapshotWatcher
from gtm.tasks import TaskSupervisor
from gtm.testing.outage import OutageStore

FRONT = AnycastPrefix(ipaddress.ip_network("198.51.100.0/24"))
EU = AnycastPrefix(ipaddress.ip_network("203.0.113.0/24"), jurisdiction="eu")


def test_debounce_needs_rise_goods_and_fall_bads_in_a_row() -> None:
    d = Debounce(rise=2, fall=3)
    assert [d.observe(ok) for ok in (True, True)] == [False, True]
    assert [d.observe(ok) for ok in (False, False, True, False, False, False)] == [
        True, True, True, True, True, False,
    ]  # fmt: skip


def test_region_jurisdictions_from_the_example_policies() -> None:
    policies = load_policy(())
    assert "eu" in region_jurisdictions(policies, "eu-west")
    assert "eu" not in region_jurisdictions(policies, "us-east")
    assert "us" in region_jurisdictions(policies, "us-east")
    with pytest.raises(KeyError, match="known"):
        region_jurisdictions(policies, "mars-1")


@dataclass
class RecordingSpeaker:
    name: str = "recording"
    plans: list[Plan] = field(default_factory=list)
    fail: bool = False

    async def apply(self, plan: Plan) -> None:
        if self.fail:
            raise SpeakerError("refused")
        self.plans.append(plan)

    async def close(self) -> None:
        return None


class ReadyFlags(ProbeSignals):
    """ProbeSignals whose checks answer from ``answers`` instead of HTTP."""

    answers: dict[str, bool]

    async def _check(self, url: str) -> bool:
        return self.answers[url]


def source(tmp_path: Path, *, ready: bool = True) -> ReadyFlags:
    s = ReadyFlags(
        "eu-west",
        frozenset({"eu"}),
        {Service.FRONT_DOOR: "front"},
        drain_file=tmp_path / "drain",
        rise=1,
        fall=1,
    )
    s.answers = {"front": ready}
    return s


def states(plan: Plan) -> list[Announcement]:
    return [d.announcement for d in plan.decisions]


async def test_the_controller_applies_only_changes_and_withdraws_on_stop(tmp_path: Path) -> None:
    registry = new_registry()
    speaker = RecordingSpeaker()
    signals = source(tmp_path)
    controller = AnycastController(
        (FRONT, EU), signals, speaker, metrics=AnycastMetrics(registry), linger_s=0.0
    )
    await controller.step()
    await controller.step()
    assert len(speaker.plans) == 1
    assert states(speaker.plans[0]) == [Announcement.ANNOUNCE] * 2
    (tmp_path / "drain").touch()
    await controller.step()
    assert states(speaker.plans[-1]) == [Announcement.DRAINING] * 2
    value = registry.get_sample_value
    assert value("gtm_anycast_draining", {"prefix": "198.51.100.0/24"}) == 1.0
    assert value("gtm_anycast_announced", {"prefix": "198.51.100.0/24"}) == 1.0
    labels = {"prefix": "198.51.100.0/24", "to": "draining"}
    assert value("gtm_anycast_transitions_total", labels) == 1.0
    controller.stop()
    await controller.run()
    assert states(speaker.plans[-1]) == [Announcement.WITHDRAW] * 2
    assert value("gtm_anycast_announced", {"prefix": "198.51.100.0/24"}) == 0.0
    assert (value("gtm_anycast_last_change_timestamp_seconds") or 0) > 0
    state = controller.state()
    assert state["speaker"] == "recording"


async def test_a_failed_check_withdraws_its_service(tmp_path: Path) -> None:
    speaker = RecordingSpeaker()
    signals = source(tmp_path)
    controller = AnycastController((FRONT,), signals, speaker, linger_s=0.0)
    await controller.step()
    signals.answers["front"] = False
    await controller.step()
    assert states(speaker.plans[-1]) == [Announcement.WITHDRAW]


async def test_a_refused_plan_is_tried_again(tmp_path: Path) -> None:
    speaker = RecordingSpeaker(fail=True)
    controller = AnycastController((FRONT,), source(tmp_path), speaker, linger_s=0.0)
    with pytest.raises(SpeakerError):
        await controller.step()
    assert controller.plan is None
    speaker.fail = False
    await controller.step()
    assert states(speaker.plans[-1]) == [Announcement.ANNOUNCE]


@asynccontextmanager
async def fleet_of(
    store: OutageStore[MemoryStore], clock: FakeClock
) -> AsyncIterator[FleetSignals]:
    snapshots = SnapshotWatcher(store, clock=clock, registry=new_registry())
    supervisor = TaskSupervisor(registry=new_registry(), clock=clock)
    supervisor.spawn("snapshots", snapshots.run())
    try:
        yield FleetSignals(snapshots, load_policy(()))
    finally:
        await supervisor.aclose()


async def test_a_region_drain_in_the_store_drains_and_an_outage_keeps_it(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = OutageStore(MemoryStore(clock, new_registry()))
    async with fleet_of(store, clock) as fleet:
        signals = source(tmp_path)
        signals.fleet = fleet
        speaker = RecordingSpeaker()
        controller = AnycastController((FRONT,), signals, speaker, linger_s=0.0)
        await fleet.snapshots.wait_ready()
        await controller.step()
        assert states(speaker.plans[-1]) == [Announcement.ANNOUNCE]
        drain = Drain(target=DrainTarget.REGION, id="eu-west", at=time.time())
        key = keys.drain(DrainTarget.REGION, "eu-west")
        await fleet.snapshots.wait_for_revision(await store.put(key, codec.encode(drain)))
        await controller.step()
        assert states(speaker.plans[-1]) == [Announcement.DRAINING]
        # etcd goes away: the drain stays in force, nothing is withdrawn for the outage.
        store.down = True
        await fleet.snapshots.wait_stale(True)
        await controller.step()
        assert controller.signals is not None
        assert not controller.signals.store_reachable
        assert states(speaker.plans[-1]) == [Announcement.DRAINING]
        # Back, undrained: announced again.
        store.down = False
        await clock.advance_until(lambda: not fleet.snapshots.stale)
        assert await store.delete(key)
        await fleet.snapshots.wait_for_revision((await store.range("/")).revision)
        await controller.step()
        assert states(speaker.plans[-1]) == [Announcement.ANNOUNCE]


async def test_no_available_region_in_a_jurisdiction_withdraws_its_prefix(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = OutageStore(MemoryStore(clock, new_registry()))
    async with fleet_of(store, clock) as fleet:
        signals = source(tmp_path)
        signals.fleet = fleet
        speaker = RecordingSpeaker()
        controller = AnycastController((FRONT, EU), signals, speaker, linger_s=0.0)
        await fleet.snapshots.wait_ready()
        revision = 0
        for region in ("eu-west", "eu-central"):
            drain = Drain(target=DrainTarget.REGION, id=region, at=time.time())
            revision = await store.put(keys.drain(DrainTarget.REGION, region), codec.encode(drain))
        await fleet.snapshots.wait_for_revision(revision)
        await controller.step()
        eu = speaker.plans[-1].by_prefix[EU.network]
        assert eu.announcement is Announcement.WITHDRAW
        assert eu.reason == "no available region in eu"
        # The unbound prefix: other regions are available, this one drains.
        assert speaker.plans[-1].by_prefix[FRONT.network].announcement is Announcement.DRAINING
        # The same stale view during an etcd outage withdraws nothing more.
        store.down = True
        await fleet.snapshots.wait_stale(True)
        await controller.step()
        assert speaker.plans[-1].by_prefix[EU.network].announcement is Announcement.DRAINING


async def test_an_etcd_outage_alone_keeps_announcing(tmp_path: Path) -> None:
    clock = FakeClock()
    store = OutageStore(MemoryStore(clock, new_registry()))
    store.down = True
    async with fleet_of(store, clock) as fleet:
        signals = source(tmp_path)
        signals.fleet = fleet
        speaker = RecordingSpeaker()
        controller = AnycastController((FRONT, EU), signals, speaker, linger_s=0.0)
        await controller.step()
        assert states(speaker.plans[-1]) == [Announcement.ANNOUNCE] * 2
        assert "static stability" in speaker.plans[-1].decisions[0].reason


async def test_an_abandoned_controller_stops_without_a_withdrawal(tmp_path: Path) -> None:
    speaker = RecordingSpeaker()
    controller = AnycastController((FRONT,), source(tmp_path), speaker, linger_s=3600.0)
    await controller.step()
    controller.abandon()
    await controller.run()  # no linger either: it returns at once
    assert [states(p) for p in speaker.plans] == [[Announcement.ANNOUNCE]]
