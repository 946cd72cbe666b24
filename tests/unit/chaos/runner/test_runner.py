"""The method executor on a fake clock: faults on the timeline, the gate, and rollbacks
on every way out (a step that raises, a rollback that raises, cancellation)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from chaos.faults import KillFault
from chaos.faults.base import Injected
from chaos.journal import FaultAction, Journal, Phase, RunStatus
from chaos.mutants import MUTANT_ENV, SITE_DIR, mutant
from chaos.probes import Measurement
from chaos.runner import (
    FaultHandle,
    RunOptions,
    Timeline,
    fault_targets,
    launch_spec,
    run_method,
)
from chaos.scenario import Step, load_scenario
from gtm.clock import FakeClock
from gtm.errors import GtmError
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor

Gate = Callable[[], Sequence[Measurement]]
SCENARIOS = Path(__file__).resolve().parents[4] / "chaos" / "scenarios"


class FakeFault:
    """Records when it was injected and rolled back; can fail either way."""

    def __init__(
        self,
        log: list[tuple[str, str, float]],
        step: str,
        clock: FakeClock,
        t0: float,
        *,
        fail_rollback: bool = False,
    ) -> None:
        self._log, self._step, self._clock, self._t0 = log, step, clock, t0
        self._fail_rollback = fail_rollback
        self.rollbacks = 0

    def describe(self) -> str:
        return f"fake {self._step}"

    async def rollback(self) -> None:
        self.rollbacks += 1
        self._log.append(("rollback", self._step, self._clock.monotonic() - self._t0))
        if self._fail_rollback:
            raise GtmError(f"cannot undo {self._step}")


def _step(
    step_id: str, at: float, duration: float | None = None, tier: str = "regional/eu-west"
) -> Step:
    return Step(id=step_id, at_s=at, duration_s=duration, fault=KillFault(tier=tier))


def _passing() -> Sequence[Measurement]:
    return [Measurement("gate", 1.0, "≥ 0.99", True, 10)]


def _failing() -> Sequence[Measurement]:
    return [Measurement("gate", 0.5, "≥ 0.99", False, 10)]


class Harness:
    def __init__(self, *, raise_on: str = "", fail_rollback: str = "") -> None:
        self.clock = FakeClock()
        self.journal = Journal(t0_wall=1_700_000_000.0)
        self.timeline = Timeline(self.clock, self.journal, self.clock.monotonic())
        self.timeline.enter(Phase.BEFORE)
        self.log: list[tuple[str, str, float]] = []
        self.faults: dict[str, FakeFault] = {}
        self._raise_on = raise_on
        self._fail_rollback = fail_rollback

    async def inject(self, step: Step) -> FaultHandle:
        now = self.clock.monotonic() - self.timeline.t0
        if step.id == self._raise_on:
            raise GtmError(f"{step.id} refused")
        self.log.append(("inject", step.id, now))
        fault = FakeFault(
            self.log,
            step.id,
            self.clock,
            self.timeline.t0,
            fail_rollback=step.id == self._fail_rollback,
        )
        self.faults[step.id] = fault
        return fault

    async def run(
        self, steps: Sequence[Step], gate: Gate = _passing, *, until: float = 100.0
    ) -> RunStatus:
        async with TaskSupervisor(registry=new_registry(), clock=self.clock) as supervisor:
            task = supervisor.spawn("method", run_method(steps, self.inject, self.timeline, gate))
            await self.clock.advance_until(task.done, step=0.5, limit=until)
            result: RunStatus = await task
        return result


async def test_faults_follow_the_timeline_and_phases() -> None:
    h = Harness()
    status = await h.run([_step("a", 2, 3), _step("b", 4)])
    assert status is RunStatus.COMPLETED
    assert h.log == [
        ("inject", "a", 2.0),
        ("inject", "b", 4.0),
        ("rollback", "a", 5.0),
        ("rollback", "b", 5.0),
    ]
    assert [p.phase for p in h.journal.phases] == [Phase.BEFORE, Phase.DURING, Phase.AFTER]
    assert h.journal.phase_start(Phase.DURING) == 2.0
    actions = [(f.step, f.action) for f in h.journal.faults]
    assert actions == [
        ("a", FaultAction.INJECT),
        ("b", FaultAction.INJECT),
        ("a", FaultAction.ROLLBACK),
        ("b", FaultAction.ROLLBACK),
    ]
    assert h.journal.faults[0].targets == ("eu-west",)


async def test_a_failed_gate_injects_nothing() -> None:
    h = Harness()
    status = await h.run([_step("a", 2, 3)], gate=_failing)
    assert status is RunStatus.ABORTED
    assert h.log == []
    assert "steady state not met" in h.journal.notes[0].text
    assert "gate = 0.5 (≥ 0.99)" in h.journal.notes[0].text


async def test_a_step_that_raises_rolls_back_what_was_injected() -> None:
    h = Harness(raise_on="b")
    status = await h.run([_step("a", 1), _step("b", 2), _step("c", 3)])
    assert status is RunStatus.FAILED
    assert h.log == [("inject", "a", 1.0), ("rollback", "a", 2.0)]
    failed = [f for f in h.journal.faults if f.error]
    assert failed[0].step == "b"
    assert "b refused" in failed[0].error


async def test_a_failed_rollback_does_not_skip_the_others() -> None:
    h = Harness(fail_rollback="b")
    status = await h.run([_step("a", 1), _step("b", 2), _step("c", 3)])
    assert status is RunStatus.COMPLETED
    assert [entry[:2] for entry in h.log if entry[0] == "rollback"] == [
        ("rollback", "c"),
        ("rollback", "b"),
        ("rollback", "a"),
    ]
    errors = [f for f in h.journal.faults if f.action is FaultAction.ROLLBACK and f.error]
    assert [f.step for f in errors] == ["b"]
    assert "cannot undo b" in errors[0].error


async def test_cancellation_rolls_back_every_fault_in_force() -> None:
    h = Harness()
    steps = [_step("a", 1), _step("b", 2), _step("c", 50)]
    async with TaskSupervisor(registry=new_registry(), clock=h.clock) as supervisor:
        task = supervisor.spawn("method", run_method(steps, h.inject, h.timeline, _passing))
        await h.clock.advance_until(lambda: len(h.faults) == 2, step=0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert h.faults["a"].rollbacks == 1
    assert h.faults["b"].rollbacks == 1
    assert "c" not in h.faults


async def test_rollback_at_the_same_time_as_an_injection_goes_first() -> None:
    h = Harness()
    await h.run([_step("a", 1, 2), _step("b", 3)])
    assert h.log[:3] == [("inject", "a", 1.0), ("rollback", "a", 3.0), ("inject", "b", 3.0)]


def test_fault_targets_from_the_spec() -> None:
    assert fault_targets(_step("a", 1, tier="zone/eu-west-a")) == ("eu-west-a",)
    assert fault_targets(_step("a", 1, tier="global")) == ()
    assert fault_targets(Step(at_s=1, duration_s=1, load_factor=2)) == ()


class _Refused(Injected):
    @property
    def refused(self) -> bool:
        return True


async def test_a_refused_injection_is_recorded_as_refused() -> None:
    h = Harness()

    async def inject(step: Step) -> FaultHandle:
        return _Refused("policy push: rejected") if step.id == "bad" else Injected("done")

    async with TaskSupervisor(registry=new_registry(), clock=h.clock) as supervisor:
        steps = [_step("bad", 1), _step("good", 2)]
        task = supervisor.spawn("method", run_method(steps, inject, h.timeline, _passing))
        await h.clock.advance_until(task.done, step=0.5, limit=10)
        assert await task is RunStatus.COMPLETED
    injected = {f.step: f.refused for f in h.journal.faults if f.action is FaultAction.INJECT}
    assert injected == {"bad": True, "good": False}


def test_a_mutant_reaches_the_launch_spec_and_nothing_else_does(tmp_path: Path) -> None:
    scenario, _ = load_scenario(SCENARIOS / "slow-gpu.yaml")
    topology = tmp_path / "topology.yaml"
    plain = launch_spec(scenario, topology, RunOptions(report_dir=tmp_path / "plain"))
    assert (plain.policies, plain.env) == ((), ())
    edited = launch_spec(
        scenario, topology, RunOptions(report_dir=tmp_path / "p", mutant=mutant("no-spill"))
    )
    assert edited.policies == (tmp_path / "p" / "mutant-policies",)
    assert "on_saturation: reject" in (edited.policies[0] / "residency.yaml").read_text()
    assert edited.env == ()
    patched = launch_spec(
        scenario, topology, RunOptions(report_dir=tmp_path / "c", mutant=mutant("no-fail-open"))
    )
    env = dict(patched.env)
    assert patched.policies == ()
    assert env[MUTANT_ENV] == "no-fail-open"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(SITE_DIR)
