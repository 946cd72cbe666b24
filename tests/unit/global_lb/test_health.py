from __future__ import annotations

from collections import deque

from global_lb.health import HealthCheckConfig, HealthChecker, HealthTable, ProbeResult
from global_lb.metrics import GlobalMetrics
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor


class ScriptedProber:
    """A verified fake: each URL answers from its script, then repeats the last answer."""

    def __init__(self, scripts: dict[str, list[bool]]) -> None:
        self.scripts = {url: deque(s) for url, s in scripts.items()}
        self.calls: list[str] = []

    def set(self, url: str, *results: bool) -> None:
        self.scripts[url] = deque(results)

    async def probe(self, url: str, /) -> ProbeResult:
        self.calls.append(url)
        script = self.scripts[url]
        ok = script.popleft() if len(script) > 1 else script[0]
        return ProbeResult(ok, "" if ok else "connection refused")


def checker(
    prober: ScriptedProber, rise: int = 2, fall: int = 2
) -> tuple[HealthChecker, list[HealthTable]]:
    seen: list[HealthTable] = []
    hc = HealthChecker(
        prober,
        clock=FakeClock(),
        metrics=GlobalMetrics(new_registry()),
        config=HealthCheckConfig(rise=rise, fall=fall),
        on_change=seen.append,
    )
    hc.set_targets({"a": "http://a", "b": "http://b", "c": "http://c"})
    return hc, seen


async def test_first_result_decides_then_fall_and_rise_thresholds() -> None:
    prober = ScriptedProber({"http://a": [True], "http://b": [True], "http://c": [False]})
    hc, seen = checker(prober, rise=3, fall=2)
    assert not hc.ready
    assert await hc.check_once()
    assert hc.ready
    assert hc.table.is_down("c") == "connection refused"
    assert hc.table.is_down("a") is None
    prober.set("http://a", False)
    assert not await hc.check_once()  # one failure: still up
    assert await hc.check_once()  # the second: down
    assert hc.table.is_down("a") is not None
    prober.set("http://c", True)
    assert not await hc.check_once()
    assert not await hc.check_once()
    assert await hc.check_once()  # third success: up
    assert hc.table.is_down("c") is None
    assert [t.epoch for t in seen] == [1, 2, 3]


async def test_a_flap_shorter_than_fall_changes_nothing() -> None:
    prober = ScriptedProber(
        {"http://a": [True, False, True, False, True], "http://b": [True], "http://c": [True]}
    )
    hc, seen = checker(prober, fall=2)
    for _ in range(5):
        await hc.check_once()
    assert len(seen) == 1  # only the first results
    assert hc.table.is_down("a") is None


async def test_fail_open_when_every_check_fails_at_once() -> None:
    prober = ScriptedProber({"http://a": [False], "http://b": [False], "http://c": [False]})
    hc, _ = checker(prober)
    await hc.check_once()
    assert hc.table.fail_open
    assert all(hc.table.is_down(r) is None for r in "abc")
    prober.set("http://b", True)
    await hc.check_once()
    await hc.check_once()
    assert not hc.table.fail_open
    assert hc.table.is_down("a") is not None
    assert hc.table.is_down("b") is None


async def test_run_probes_every_interval_on_the_injected_clock() -> None:
    prober = ScriptedProber({"http://a": [True], "http://b": [True], "http://c": [True]})
    clock = FakeClock()
    hc = HealthChecker(
        prober,
        clock=clock,
        metrics=GlobalMetrics(new_registry()),
        config=HealthCheckConfig(interval=1.0),
    )
    hc.set_targets({"a": "http://a"})
    async with TaskSupervisor(registry=new_registry(), clock=clock) as tasks:
        tasks.spawn("health", hc.run())
        await clock.advance_until(lambda: hc.rounds >= 3, step=0.5)
    assert hc.rounds >= 3
    assert set(prober.calls) == {"http://a"}


async def test_targets_that_leave_are_forgotten() -> None:
    prober = ScriptedProber({"http://a": [False], "http://b": [True], "http://c": [True]})
    hc, _ = checker(prober)
    await hc.check_once()
    hc.set_targets({"b": "http://b"})
    await hc.check_once()
    assert "a" not in hc.table.status
    assert hc.table.is_down("a") is None
