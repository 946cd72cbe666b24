"""Prometheus helpers. Library code never touches the global default registry.

Every component takes a :class:`prometheus_client.CollectorRegistry` in its
constructor; :func:`new_registry` makes one for a process or a test. Metric names are
prefixed ``gtm_``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

# Latency buckets for in-process decisions, in seconds: routing plugins run in
# microseconds, so the default Prometheus buckets (5 ms .. 10 s) would put everything
# in the first bucket.
DECISION_LATENCY_BUCKETS: tuple[float, ...] = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1,
)  # fmt: skip


def new_registry() -> CollectorRegistry:
    """A fresh registry without the process/platform collectors (tests assert exact samples)."""
    return CollectorRegistry(auto_describe=True)
