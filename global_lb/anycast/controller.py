"""The anycast controller: gathers the region's signals, applies the plan, withdraws on stop.

One loop (:meth:`AnycastController.run`): every ``interval_s`` it reads the signals
(:class:`ProbeSignals`: each local service's readiness check, the drain file), debounces
health (a service is withdrawn after ``fall`` failed checks in a row and announced again
after ``rise`` good ones, so one lost probe does not flap a route), decides
(:func:`global_lb.anycast.policy.decide`) and, when the plan changed, hands it to the
speaker and waits until the speaker has taken it. :meth:`AnycastController.stop` (SIGTERM)
makes the next round withdraw everything, waits for the speaker to take that, then lingers
``linger_s`` so the withdrawal reaches the neighbours before the process exits — the front
door behind it should stop only after (``After=``/``Before=`` in systemd).

The fleet (:class:`FleetSignals`, with ``--state``) is read as the global tier reads it:
the store's snapshot (:class:`~gtm.state.snapshot.SnapshotWatcher`) through the same view
builder (:func:`global_lb.keeper.build_view`), so "which regions can serve a jurisdiction"
and "is this region drained" (``gtm drain region ID``; the record's ``at`` is when it
began) mean what they mean to the front door. When the store is unreachable the watcher
keeps the last snapshot and says it is stale — static stability: an etcd outage neither
undoes a drain nor withdraws a route. A drain can also come from a file (``--drain-file``:
present = drained; its modification time is when), so a deploy script drains one host
without the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from global_lb.anycast.policy import (
    Announcement,
    AnycastPrefix,
    DrainPolicy,
    Plan,
    RegionSignals,
    Service,
    decide,
)
from global_lb.anycast.speaker import Speaker, SpeakerError
from global_lb.health import HealthTable
from global_lb.keeper import build_view
from gtm.models import Drain, DrainTarget
from gtm.policy_store import ActivePolicy
from gtm.state.snapshot import FleetSnapshot, SnapshotWatcher

log = logging.getLogger("gtm.anycast")


def region_jurisdictions(policy: ActivePolicy, region: str) -> frozenset[str]:
    """Every jurisdiction ``region`` is in, by the rule the global tier's view uses
    (:func:`global_lb.view.jurisdiction_members`)."""
    view = build_view(policy, FleetSnapshot(revision=0), HealthTable())
    if region not in view.by_id:
        known = ", ".join(sorted(view.by_id))
        raise KeyError(f"region {region!r} is not in the policies (known: {known})")
    return frozenset(j for j, members in view.jurisdictions.items() if region in members)


@dataclass(frozen=True, slots=True)
class FleetReading:
    reachable: bool
    drain: Drain | None
    servable: frozenset[str]
    any_available: bool


@dataclass
class FleetSignals:
    """The fleet as the global tier sees it, from the store (kept through an outage)."""

    snapshots: SnapshotWatcher
    policy: ActivePolicy
    #: As ``gtm global --require-summaries``: a region without a summary is down.
    require_summaries: bool = False

    def read(self, region: str) -> FleetReading:
        snapshot = self.snapshots.current
        view = build_view(
            self.policy, snapshot, HealthTable(), require_summaries=self.require_summaries
        )
        available = view.available_ids()
        return FleetReading(
            reachable=not self.snapshots.stale,
            drain=snapshot.drains.get(f"{DrainTarget.REGION.value}/{region}"),
            servable=frozenset(j for j, m in view.jurisdictions.items() if m & available),
            any_available=bool(available),
        )


@dataclass
class Debounce:
    """Rise/fall counting for one service's readiness (sans-io)."""

    rise: int = 2
    fall: int = 2
    up: bool = False
    _streak: int = 0

    def observe(self, ok: bool) -> bool:
        if ok == self.up:
            self._streak = 0
        else:
            self._streak += 1
            if self._streak >= (self.rise if ok else self.fall):
                self.up, self._streak = ok, 0
        return self.up


@dataclass
class ProbeSignals:
    """Signals from HTTP readiness checks (200 = ready), the fleet and a drain file."""

    region: str
    jurisdictions: frozenset[str]
    checks: Mapping[Service, str]
    drain_file: Path | None = None
    #: The fleet in the state store (``None``: not followed).
    fleet: FleetSignals | None = None
    check_timeout_s: float = 1.0
    rise: int = 2
    fall: int = 2
    _debounce: dict[Service, Debounce] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    async def read(self) -> RegionSignals:
        results = await asyncio.gather(*(self._check(url) for url in self.checks.values()))
        ready = set()
        for service, ok in zip(self.checks, results, strict=True):
            debounce = self._debounce.setdefault(service, Debounce(self.rise, self.fall))
            if debounce.observe(ok):
                ready.add(service)
        fleet = None if self.fleet is None else self.fleet.read(self.region)
        draining, age = self._drain(None if fleet is None else fleet.drain)
        signals = RegionSignals(
            region=self.region,
            jurisdictions=self.jurisdictions,
            ready=frozenset(ready),
            draining=draining,
            drain_age_s=age,
        )
        if fleet is None:
            return signals
        return replace(
            signals,
            store_reachable=fleet.reachable,
            servable=fleet.servable,
            any_available=fleet.any_available,
        )

    async def _check(self, url: str) -> bool:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.check_timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        try:
            async with self._session.get(url) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    def _drain(self, stored: Drain | None) -> tuple[bool, float | None]:
        """Drained by the store or the file; the age of the older drain."""
        began: list[float] = []
        if stored is not None:
            began.append(stored.at)
        if self.drain_file is not None:
            with contextlib.suppress(FileNotFoundError):
                began.append(self.drain_file.stat().st_mtime)
        if not began:
            return False, None
        return True, max(0.0, time.time() - min(began))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class AnycastMetrics:
    """``gtm_anycast_announced{prefix}`` (1 while announced, draining included),
    ``gtm_anycast_draining{prefix}``, ``gtm_anycast_transitions_total{prefix,to}`` and
    ``gtm_anycast_last_change_timestamp_seconds``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.announced = Gauge(
            "gtm_anycast_announced",
            "1 while the prefix is announced (draining included), else 0.",
            ["prefix"],
            registry=registry,
        )
        self.draining = Gauge(
            "gtm_anycast_draining",
            "1 while the prefix is announced as draining (prepended / lower local-pref).",
            ["prefix"],
            registry=registry,
        )
        self.transitions = Counter(
            "gtm_anycast_transitions",
            "Changes of a prefix's announcement, by the state entered.",
            ["prefix", "to"],
            registry=registry,
        )
        self.last_change = Gauge(
            "gtm_anycast_last_change_timestamp_seconds",
            "Unix time of the last announcement change the speaker took.",
            registry=registry,
        )

    def record(self, before: Plan | None, after: Plan) -> None:
        for decision in after.decisions:
            prefix, state = str(decision.prefix), decision.announcement
            self.announced.labels(prefix).set(0 if state is Announcement.WITHDRAW else 1)
            self.draining.labels(prefix).set(1 if state is Announcement.DRAINING else 0)
            old = None if before is None else before.by_prefix[decision.prefix.network]
            if old is None or old.announcement is not state:
                self.transitions.labels(prefix, state.value).inc()
        self.last_change.set(time.time())


def changed(before: Plan | None, after: Plan) -> bool:
    if before is None:
        return True
    states = [d.announcement for d in before.decisions]
    return states != [d.announcement for d in after.decisions]


@dataclass
class AnycastController:
    prefixes: Sequence[AnycastPrefix]
    source: ProbeSignals
    speaker: Speaker
    drain: DrainPolicy = field(default_factory=DrainPolicy)
    metrics: AnycastMetrics | None = None
    interval_s: float = 0.2
    linger_s: float = 1.0
    plan: Plan | None = None
    signals: RegionSignals | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    #: Whether stopping withdraws first (not when the speaker itself is gone).
    _withdraw: bool = True

    def stop(self) -> None:
        self._stopping.set()

    def abandon(self) -> None:
        """Stop without withdrawing or lingering: the speaker is gone (ExaBGP, which
        runs this process, exited), and its BGP sessions, so its routes, with it."""
        self._withdraw = False
        self._stopping.set()

    async def step(self, *, stopping: bool = False) -> Plan:
        """One round: read, decide, apply if changed."""
        signals = await self.source.read()
        if stopping:
            signals = replace(signals, stopping=True)
        self.signals = signals
        plan = decide(self.prefixes, signals, self.drain)
        if changed(self.plan, plan):
            await self.speaker.apply(plan)
            for decision in plan.decisions:
                old = None if self.plan is None else self.plan.by_prefix[decision.prefix.network]
                if old is None or old.announcement is not decision.announcement:
                    log.info(
                        "anycast prefix=%s state=%s reason=%s speaker=%s",
                        decision.prefix,
                        decision.announcement,
                        decision.reason,
                        self.speaker.name,
                    )
            if self.metrics is not None:
                self.metrics.record(self.plan, plan)
            self.plan = plan
        return plan

    async def run(self) -> None:
        """Until :meth:`stop`: then withdraw, wait for the speaker, linger, return."""
        try:
            while not self._stopping.is_set():
                try:
                    await self.step()
                except SpeakerError as exc:  # the plan is retried next round
                    log.warning("anycast speaker=%s error=%s", self.speaker.name, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.interval_s)
        finally:
            if self._withdraw:
                await self.step(stopping=True)
                log.info("anycast withdrawn; lingering %.1f s before exit", self.linger_s)
                await asyncio.sleep(self.linger_s)
            await self.source.close()
            await self.speaker.close()

    def state(self) -> dict[str, object]:
        """The controller's state as JSON (``GET /api/v1/anycast``)."""
        decisions = [] if self.plan is None else self.plan.decisions
        return {
            "region": self.source.region,
            "speaker": self.speaker.name,
            "prefixes": [
                {
                    "prefix": str(d.prefix),
                    "service": d.prefix.service.value,
                    "jurisdiction": d.prefix.jurisdiction,
                    "state": d.announcement.value,
                    "reason": d.reason,
                }
                for d in decisions
            ],
        }
