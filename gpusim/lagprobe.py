"""Event-loop lag, measured inside the process whose responsiveness we care about.

A probe task sleeps ``interval`` seconds over and over and records how late it wakes
up: that delay is how long any ready callback (a token to stream, a new connection)
waited for the loop. It uses the event loop's own clock on purpose — lag is a property
of the real loop, not of the injected (possibly fake) clock.

The recent samples are kept (a bounded window) for ``/admin/lag`` percentiles, and
every sample goes to the ``gtm_gpusim_event_loop_lag_seconds`` histogram.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram

from gtm.stats import percentile_of_sorted

#: Probe period (s). The probe samples the loop's lateness at a steady rate, so its
#: percentiles estimate the share of time the loop is late whatever the period; a
#: shorter one only gathers samples faster. Every wake-up costs the process CPU, and a
#: ``gtm up`` fleet runs many idle workers on a small machine, so the period is long
#: enough that their probes are no load of their own (``bench/sim_fidelity.py`` prints
#: the idle deployment's CPU). Benchmarks of the worker itself (``bench/gpu_sim.py``)
#: pass ``--lag-probe-interval 0.005`` for more samples.
PROBE_INTERVAL_S = 0.05
#: Seconds of samples kept for percentiles.
WINDOW_S = 60.0

LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True, slots=True)
class LagStats:
    samples: int
    p50_s: float
    p99_s: float
    max_s: float

    def as_json(self) -> dict[str, float | int]:
        return {
            "samples": self.samples,
            "p50_ms": round(self.p50_s * 1e3, 3),
            "p99_ms": round(self.p99_s * 1e3, 3),
            "max_ms": round(self.max_s * 1e3, 3),
        }


class LagProbe:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        interval: float = PROBE_INTERVAL_S,
        window: int | None = None,
    ) -> None:
        """``window``: samples kept for percentiles (default: :data:`WINDOW_S` of them)."""
        self._interval = interval
        if window is None:
            window = max(1, round(WINDOW_S / interval)) if interval > 0 else 1
        self._samples: deque[float] = deque(maxlen=window)
        self._histogram = Histogram(
            "gtm_gpusim_event_loop_lag_seconds",
            "How late the event loop ran a timer that was due (lag probe).",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    @property
    def window_samples(self) -> int:
        """How many recent samples the percentiles are taken over."""
        return self._samples.maxlen or 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._interval
            await asyncio.sleep(self._interval)
            lag = max(0.0, loop.time() - due)
            self._samples.append(lag)
            self._histogram.observe(lag)

    def stats(self) -> LagStats:
        values = sorted(self._samples)
        return LagStats(
            samples=len(values),
            p50_s=percentile_of_sorted(values, 0.50) if values else 0.0,
            p99_s=percentile_of_sorted(values, 0.99) if values else 0.0,
            max_s=values[-1] if values else 0.0,
        )

    def reset(self) -> None:
        self._samples.clear()
