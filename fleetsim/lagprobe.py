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
import math
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram

#: Probe period (s): fine enough to see 10 ms stalls, cheap (200 wake-ups/s).
PROBE_INTERVAL_S = 0.005
#: Samples kept for percentiles: 60 s at the default interval.
WINDOW_SAMPLES = 12_000

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


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty list)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class LagProbe:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        interval: float = PROBE_INTERVAL_S,
        window: int = WINDOW_SAMPLES,
    ) -> None:
        self._interval = interval
        self._samples: deque[float] = deque(maxlen=window)
        self._histogram = Histogram(
            "gtm_gpusim_event_loop_lag_seconds",
            "How late the event loop ran a timer that was due (lag probe).",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

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
            p50_s=percentile(values, 0.50),
            p99_s=percentile(values, 0.99),
            max_s=values[-1] if values else 0.0,
        )

    def reset(self) -> None:
        self._samples.clear()
