"""What a process's event loop holds, on ``/metrics``: ``gtm_event_loop_tasks``.

A task that never ends (a stream nobody closes, a per-request helper nobody awaits)
is a leak that memory alone shows late; the count of the running loop's tasks shows it
at once, and in a steady load it stays level. Read at scrape time
(``asyncio.all_tasks``), so it costs nothing between scrapes; outside a running loop
(a registry collected by a test) the family has no sample.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

NAME = "gtm_event_loop_tasks"
HELP = "Tasks of the process's running event loop (not done), at scrape time."


class LoopTasks(Collector):
    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(NAME, HELP)]

    def collect(self) -> Iterable[Metric]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return []
        family = GaugeMetricFamily(NAME, HELP)
        family.add_metric([], len(asyncio.all_tasks(loop)))
        return [family]


def register_loop_tasks(registry: CollectorRegistry) -> None:
    """Export ``gtm_event_loop_tasks`` from ``registry`` (once: a second call, for a
    second app on the same registry, is a no-op)."""
    with contextlib.suppress(ValueError):  # already registered for this registry
        registry.register(LoopTasks())


__all__ = ["NAME", "LoopTasks", "register_loop_tasks"]
