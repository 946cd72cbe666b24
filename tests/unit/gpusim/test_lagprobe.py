from __future__ import annotations

import asyncio

from gpusim.lagprobe import LagProbe, LagStats
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor


def test_a_probe_without_samples_reports_zeros() -> None:
    # /admin/lag answers 0, not NaN (which is not JSON), before the first sample.
    stats = LagProbe(new_registry(), interval=0.05).stats()
    assert stats == LagStats(samples=0, p50_s=0.0, p99_s=0.0, max_s=0.0)


def test_stats_render_in_milliseconds() -> None:
    stats = LagStats(samples=3, p50_s=0.001, p99_s=0.0125, max_s=0.02)
    assert stats.as_json() == {"samples": 3, "p50_ms": 1.0, "p99_ms": 12.5, "max_ms": 20.0}


async def test_probe_records_samples_into_window_and_histogram() -> None:
    registry = new_registry()
    probe = LagProbe(registry, interval=0.0, window=5)
    async with TaskSupervisor(registry=registry) as supervisor:
        supervisor.spawn("probe", probe.run())
        for _ in range(20):
            await asyncio.sleep(0)
        stats = probe.stats()
        assert stats.samples == 5  # bounded window
        assert 0.0 <= stats.p50_s <= stats.p99_s <= stats.max_s
        count = registry.get_sample_value("gtm_gpusim_event_loop_lag_seconds_count")
        assert count is not None
        assert count >= 5
        probe.reset()
        assert probe.stats().samples == 0


def test_window_keeps_a_minute_of_samples_at_any_interval() -> None:
    assert LagProbe(new_registry(), interval=0.05).window_samples == 1200
    assert LagProbe(new_registry(), interval=0.005).window_samples == 12_000
    assert LagProbe(new_registry(), interval=0.05, window=7).window_samples == 7
