"""``gtm chaos run``: one game day, start to report.

1. launch ``gtm up --processes`` (or attach to a running one) — :mod:`chaos.deployment`;
2. start the load (:mod:`chaos.traffic`) and the DNS poller; t = 0 is the load's start;
3. run the method: each step's fault is injected at its ``at_s`` and rolled back after
   its ``duration_s``; right before the first injection the ``before`` probes are the
   gate — if they fail nothing is injected and the run is *aborted*;
4. whatever happens — a step that raises, Ctrl-C — every fault still in force is rolled
   back (in reverse order, each on its own: one failed rollback does not skip the rest);
5. when the load is done, every probe is measured on the journal and the report is
   written (:mod:`chaos.report`).

The method executor (:func:`run_method`) takes the injection as a function, so the
rollback guarantees are tested with fakes and a :class:`~gtm.clock.FakeClock`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from chaos.deployment import Deployment, DeploymentError, LaunchSpec
from chaos.faults import Injected
from chaos.journal import (
    FaultAction,
    FaultRecord,
    Journal,
    MetricRecord,
    NoteRecord,
    Phase,
    PhaseRecord,
    RunStatus,
)
from chaos.mutants import Mutant
from chaos.mutants.policy import write_policies
from chaos.probes import Measurement, MetricValue, Window
from chaos.progress import ProgressLine
from chaos.report import collect_environment, verdict, write_report
from chaos.scenario import Scenario, Step
from chaos.traffic import DnsPoller, Planned, Traffic, plan
from fleetsim.traces import load_trace
from gtm.clock import Clock
from gtm.errors import GtmError
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor
from gtm.topology import load_topology, on_private_block, write_topology

log = logging.getLogger(__name__)

#: How often the live line is redrawn, s.
PROGRESS_INTERVAL_S = 0.5
#: How long the run's own tasks (DNS poller, progress line) get to stop at teardown; a
#: task stuck past it is named in the journal instead of hanging the run.
TEARDOWN_TASKS_S = 10.0


class FaultHandle(Protocol):
    """What an injected fault gives back (:class:`chaos.faults.base.Injected`)."""

    def describe(self) -> str: ...

    async def rollback(self) -> None: ...


Injector = Callable[[Step], Awaitable[FaultHandle]]


def fault_targets(step: Step) -> tuple[str, ...]:
    """The regions (or zones, GPUs) a fault takes away, from its spec's fields:
    ``region``, ``zone``, ``gpu``, or a tier ``regional/<region>`` / ``zone/<zone>``."""
    fault = step.fault
    found: list[str] = []
    if fault is None:
        return ()
    for name in ("region", "zone", "gpu"):
        value = getattr(fault, name, None)
        if isinstance(value, str):
            found.append(value)
    tier = getattr(fault, "tier", None)
    if isinstance(tier, str) and "/" in tier:
        found.append(tier.split("/", 1)[1])
    return tuple(found)


class Timeline:
    """Run time (s since the load started) on the injected clock, and phase changes."""

    def __init__(self, clock: Clock, journal: Journal, t0: float) -> None:
        self.clock = clock
        self.journal = journal
        self.t0 = t0
        self.phase = Phase.SETUP

    def now(self) -> float:
        return self.clock.monotonic() - self.t0

    async def until(self, at: float) -> None:
        delay = at - self.now()
        if delay > 0:
            await self.clock.sleep(delay)

    def enter(self, phase: Phase) -> None:
        self.phase = phase
        self.journal.phases.append(PhaseRecord(self.now(), phase))

    def note(self, text: str) -> None:
        self.journal.notes.append(NoteRecord(self.now(), text))


@dataclass(frozen=True, slots=True)
class _Event:
    at: float
    order: int
    action: FaultAction
    step: Step


def _events(steps: Sequence[Step]) -> list[_Event]:
    events = [_Event(s.at_s, 1, FaultAction.INJECT, s) for s in steps]
    events += [
        _Event(s.at_s + s.duration_s, 0, FaultAction.ROLLBACK, s)
        for s in steps
        if s.duration_s is not None
    ]
    # At equal times a rollback goes first: a fault ending as another starts.
    return sorted(events, key=lambda e: (e.at, e.order))


async def _rollback(timeline: Timeline, step: Step, handle: FaultHandle) -> None:
    error = ""
    try:
        await handle.rollback()
    except (GtmError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        log.error("rollback of %s failed: %s", step.id, error)
    timeline.journal.faults.append(
        FaultRecord(
            timeline.now(),
            FaultAction.ROLLBACK,
            step.id,
            step.kind,
            handle.describe(),
            fault_targets(step),
            error,
        )
    )


async def run_method(
    steps: Sequence[Step],
    inject: Injector,
    timeline: Timeline,
    gate: Callable[[], Sequence[Measurement]],
) -> RunStatus:
    """Inject and roll back on the timeline; returns completed, aborted (the gate
    failed) or failed (an injection raised). Every fault in force is rolled back on
    every way out, Ctrl-C (cancellation) included."""
    injected: dict[str, FaultHandle] = {}
    status = RunStatus.COMPLETED
    try:
        for event in _events(steps):
            await timeline.until(event.at)
            step = event.step
            if event.action is FaultAction.ROLLBACK:
                handle = injected.pop(step.id, None)
                if handle is not None:
                    await _rollback(timeline, step, handle)
                continue
            if timeline.phase is not Phase.DURING:
                failed = [m for m in gate() if not m.passed]
                if failed:
                    timeline.note(
                        "steady state not met before the first fault; nothing injected: "
                        + "; ".join(f"{m.name} = {m.value_text()} ({m.tolerance})" for m in failed)
                    )
                    return RunStatus.ABORTED
                timeline.enter(Phase.DURING)
            try:
                handle = await inject(step)
            except GtmError as exc:
                timeline.journal.faults.append(
                    FaultRecord(
                        timeline.now(),
                        FaultAction.INJECT,
                        step.id,
                        step.kind,
                        f"{step.kind} failed",
                        fault_targets(step),
                        f"{type(exc).__name__}: {exc}",
                    )
                )
                status = RunStatus.FAILED
                return status
            injected[step.id] = handle
            timeline.journal.faults.append(
                FaultRecord(
                    timeline.now(),
                    FaultAction.INJECT,
                    step.id,
                    step.kind,
                    handle.describe(),
                    fault_targets(step),
                    refused=isinstance(handle, Injected) and handle.refused,
                )
            )
        return status
    finally:
        for step_id in reversed(list(injected)):
            step = next(s for s in steps if s.id == step_id)
            await _rollback(timeline, step, injected.pop(step_id))
        if status is not RunStatus.ABORTED and timeline.phase is Phase.DURING:
            timeline.enter(Phase.AFTER)


# ---------------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True)
class RunOptions:
    report_dir: Path
    attach: str | None = None
    toxiproxy_url: str | None = None
    run_dir: Path | None = None
    #: Run against this breakage of the product (:mod:`chaos.mutants`); the caller
    #: applies a patch mutant to its own process too.
    mutant: Mutant | None = None


@dataclass(frozen=True, slots=True)
class RunOutcome:
    status: RunStatus
    passed: bool
    results: tuple[Measurement, ...]
    summary: Path


def region_by_address(deployment: Deployment) -> dict[str, str]:
    """DNS answers are regional LB addresses; which region each one is."""
    return {(urlsplit(r.url).hostname or r.url): name for name, r in deployment.regions.items()}


def metrics_url(deployment: Deployment, source: str) -> str:
    """Where ``source`` (``global``, ``regional/<region>``, ``zone/<zone>``) serves
    ``/metrics``; an unknown one is :class:`~chaos.deployment.UnknownTarget`."""
    kind, _, name = source.partition("/")
    if kind == "global":
        base = deployment.front_door_url
    elif kind == "regional":
        base = deployment.region(name).url
    else:
        base = deployment.zone(name).url
    return base.rstrip("/") + "/metrics"


def parse_metrics(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    """Every sample of a Prometheus text exposition: (name, sorted labels, value)."""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise DeploymentError(f"not a Prometheus exposition: {exc}") from None
    return [
        (sample.name, tuple(sorted(sample.labels.items())), float(sample.value))
        for family in families
        for sample in family.samples
    ]


class _Deployment(Deployment):
    """The deployment handle, with ``--toxiproxy-url`` in place of its own fault proxy
    (so the network faults drive a real Toxiproxy when one is given)."""

    toxiproxy_url: str | None = None

    @property
    def chaos_api_url(self) -> str | None:
        return self.toxiproxy_url or super().chaos_api_url


def _open_deployment(scenario: Scenario, topology: Path | None, options: RunOptions) -> Deployment:
    if options.attach is not None:
        handle = _Deployment.attach(options.attach)
    else:
        private = private_topology(topology, options.report_dir, random.Random())
        handle = _Deployment.launch(launch_spec(scenario, private, options))
    if isinstance(handle, _Deployment):
        handle.toxiproxy_url = options.toxiproxy_url
    return handle


def private_topology(source: Path | None, directory: Path, rng: random.Random) -> Path:
    """A copy of the topology on a private block (:func:`gtm.topology.on_private_block`),
    so a run never collides with ``make up`` or another run."""
    directory.mkdir(parents=True, exist_ok=True)
    moved = on_private_block(load_topology(source), rng)
    return write_topology(moved, directory / "topology.yaml")


def launch_spec(scenario: Scenario, topology: Path, options: RunOptions) -> LaunchSpec:
    spec = scenario.deployment
    mutant = options.mutant
    policies: tuple[Path, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    if mutant is not None and mutant.policy is not None:
        policies = (write_policies(mutant.policy, options.report_dir / "mutant-policies"),)
    if mutant is not None:
        env = tuple(sorted(mutant.environment(os.environ).items()))
    return LaunchSpec(
        topology=topology,
        policies=policies,
        env=env,
        speedup=spec.speedup,
        etcd_members=spec.etcd_members,
        chaos_links=spec.chaos_links,
        ready_timeout_s=spec.ready_timeout_s,
        scrape_interval_s=spec.scrape_interval_s,
        run_dir=options.run_dir,
    )


def _describe_deployment(scenario: Scenario, topology: Path | None, options: RunOptions) -> str:
    if options.attach is not None:
        return f"attached to {options.attach}"
    spec = scenario.deployment
    links = ",".join(k.value for k in spec.chaos_links) or "none"
    logs = f", logs in {options.run_dir / 'logs'}" if options.run_dir is not None else ""
    mutant = options.mutant
    broken = f", MUTANT {mutant.name} ({mutant.breaks})" if mutant is not None else ""
    return (
        f"gtm up --processes, topology {topology or 'example'}, speedup {spec.speedup:g}×, "
        f"{spec.etcd_members} etcd member(s), chaos links {links}{logs}{broken}"
    )


def prune_etcd_data(run_dir: Path) -> None:
    """Drop the private etcd's data directories from a finished run's artifacts: etcd
    preallocates 64 MB per WAL file, and the data is the store of a deployment that is
    gone. The etcd logs (``etcd/<member>.log``) stay."""
    for member in run_dir.glob("etcd/*/member"):
        shutil.rmtree(member, ignore_errors=True)


class ScenarioRun:
    """One run of one scenario (use once)."""

    def __init__(
        self,
        scenario: Scenario,
        source: str,
        topology: Path | None,
        options: RunOptions,
        *,
        clock: Clock,
        out: TextIO,
    ) -> None:
        self.scenario = scenario
        self.source = source
        self.topology = topology
        self.options = options
        self.clock = clock
        self.progress = ProgressLine(out)
        self.journal = Journal(t0_wall=clock.wall())
        self.timeline = Timeline(clock, self.journal, clock.monotonic())
        self._traffic: Traffic | None = None
        self._gate_results: dict[int, Measurement] = {}

    async def run(self) -> RunOutcome:
        scenario, timeline = self.scenario, self.timeline
        trace = load_trace(scenario.load.trace, seed=scenario.load.seed)
        planned = plan(scenario.effective_load(), trace)
        status = RunStatus.FAILED
        self.progress.message(
            f"gtm chaos run: {scenario.title} — {len(planned)} requests over "
            f"{scenario.load.duration_s:g} s, {len(scenario.method)} fault step(s)"
        )
        try:
            async with _open_deployment(scenario, self.topology, self.options) as deployment:
                status = await self._with(deployment, planned)
        except asyncio.CancelledError:
            status = RunStatus.INTERRUPTED
            timeline.note("interrupted (Ctrl-C): faults rolled back, deployment stopped")
            raise
        except GtmError as exc:
            status = RunStatus.FAILED
            timeline.note(f"run failed: {type(exc).__name__}: {exc}")
            self.progress.message(f"error: {exc}")
        finally:
            outcome = self._finish(status)
        return outcome

    async def _with(self, deployment: Deployment, planned: Sequence[Planned]) -> RunStatus:
        scenario, timeline = self.scenario, self.timeline
        # t = 0: the load starts now; start-up notes before it have negative times.
        setup = timeline.now()
        timeline.t0 = self.clock.monotonic()
        self.journal.t0_wall = self.clock.wall()
        timeline.journal.notes.append(
            NoteRecord(
                -setup,
                f"deployment ready ({_describe_deployment(scenario, self.topology, self.options)})",
            )
        )
        timeline.enter(Phase.BEFORE)
        supervisor = TaskSupervisor(registry=new_registry(), clock=self.clock, component="chaos")
        traffic = Traffic(
            scenario.load,
            planned,
            deployment.front_door_url,
            self.journal,
            clock=self.clock,
            t0=timeline.t0,
            supervisor=supervisor,
            region_urls={name: r.url for name, r in deployment.regions.items()},
        )
        self._traffic = traffic
        poller = DnsPoller(
            scenario.dns,
            (deployment.dns.host, deployment.dns.port),
            region_by_address(deployment),
            self.journal,
            clock=self.clock,
            t0=timeline.t0,
        )
        try:
            load = supervisor.spawn("load", traffic.run())
            if scenario.dns.names:
                supervisor.run_loop("dns", poller.poll_once, interval=scenario.dns.interval_s)
            supervisor.run_loop("progress", self._draw, interval=PROGRESS_INTERVAL_S)

            async def inject(step: Step) -> FaultHandle:
                self.progress.message(f"{timeline.now():6.1f} s  inject {step.id}: {step.kind}")
                if step.fault is None:
                    # The traffic plan already carries the surge (effective_load).
                    return Injected(f"arrivals ×{step.load_factor:g}")
                return await step.fault.inject(deployment)

            status = await run_method(scenario.steps(), inject, timeline, self._gate)
            if status is RunStatus.COMPLETED:
                await load
            else:
                load.cancel()
            await self._scrape_metrics(deployment)
            timeline.enter(Phase.TEARDOWN)
            return status
        finally:
            await self._stop_tasks(supervisor)

    async def _scrape_metrics(self, deployment: Deployment) -> None:
        """The ``/metrics`` of each source a ``metric`` probe names, once, at the end."""
        sources = sorted({p.source for p in self.scenario.hypothesis if isinstance(p, MetricValue)})
        for source in sources:
            try:
                url = metrics_url(deployment, source)
                async with deployment.session.get(url) as response:
                    text = await response.text()
            except (GtmError, aiohttp.ClientError, TimeoutError) as exc:
                self.timeline.note(f"metrics of {source}: {type(exc).__name__}: {exc}")
                continue
            at = self.timeline.now()
            self.journal.metrics += [
                MetricRecord(at, source, name, labels, value)
                for name, labels, value in parse_metrics(text)
            ]

    async def _stop_tasks(self, supervisor: TaskSupervisor) -> None:
        names = supervisor.names
        try:
            async with asyncio.timeout(TEARDOWN_TASKS_S):
                await supervisor.aclose()
        except TimeoutError:
            stuck = ", ".join(sorted(names))
            text = f"teardown: tasks {stuck} did not stop in {TEARDOWN_TASKS_S:g} s"
            log.warning("%s", text)
            self.timeline.note(text)

    def _gate(self) -> list[Measurement]:
        """The ``before`` probes, measured right before the first fault. They are kept
        as the run's "before" results: requests sent before the fault but still in
        flight when it struck belong to the fault, not to the steady state."""
        gate = {
            i: p.measure(self.journal)
            for i, p in enumerate(self.scenario.hypothesis)
            if p.window is Window.BEFORE
        }
        self._gate_results = gate
        return list(gate.values())

    async def _draw(self) -> None:
        in_flight = self._traffic.in_flight if self._traffic is not None else 0
        self.progress.update(self.journal, self.timeline.now(), self.timeline.phase, in_flight)

    def _finish(self, status: RunStatus) -> RunOutcome:
        timeline = self.timeline
        if self.options.attach is None and self.options.run_dir is not None:
            prune_etcd_data(self.options.run_dir)
        if not self.journal.phases or self.journal.phases[-1].phase is not Phase.TEARDOWN:
            timeline.enter(Phase.TEARDOWN)
        self.journal.ended_at = self.journal.phases[-1].at
        self.progress.finish()
        results = tuple(
            self._gate_results.get(i) or p.measure(self.journal)
            for i, p in enumerate(self.scenario.hypothesis)
        )
        environment = collect_environment(
            _describe_deployment(self.scenario, self.topology, self.options)
        )
        summary = write_report(
            self.options.report_dir,
            self.scenario,
            self.source,
            self.journal,
            results,
            status,
            environment,
        )
        return RunOutcome(status, verdict(status, results), results, summary)
