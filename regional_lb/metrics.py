"""The regional LB's Prometheus metrics (on an injected registry; names ``gtm_regional_*``).

Counters and histograms are updated on the request path; queue depths are read from the
fair queue when ``/metrics`` is scraped. Lease shares are
``gtm_regional_quota_lease_share{tenant}`` (:mod:`regional_lb.leases`); per-plugin zone
choice latency is the routing framework's ``gtm_routing_plugin_duration_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gtm.metrics import DECISION_LATENCY_BUCKETS, ModelLabel
from gtm.models import Priority, Tier
from gtm.relay import StreamBreaks
from gtm.routing.metrics import RoutingMetrics

#: Queue waits and upstream latencies, s: milliseconds to minutes.
WAIT_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip


class RegionalMetrics:
    """Every collector of one regional LB."""

    def __init__(self, registry: CollectorRegistry, queue_depth: Callable[[Priority], int]) -> None:
        self.routing = RoutingMetrics(registry)
        self.admitted = Counter(
            "gtm_regional_admitted",
            "Requests admitted, by tenant and where they went (local, spill, queue).",
            ["tenant", "route"],
            registry=registry,
        )
        self.rejected = Counter(
            "gtm_regional_rejected",
            "Requests refused, by tenant and reason (quota dimension, queue_full, "
            "queue_timeout, residency, ...).",
            ["tenant", "reason"],
            registry=registry,
        )
        self.responses = Counter(
            "gtm_regional_responses",
            "Responses by endpoint and HTTP status.",
            ["endpoint", "status"],
            registry=registry,
        )
        depth = Gauge(
            "gtm_regional_queue_depth",
            "Requests waiting in the fair queue.",
            ["band"],
            registry=registry,
        )
        for band in Priority:
            depth.labels(band.value).set_function(_reader(queue_depth, band))
        self.queue_wait = Histogram(
            "gtm_regional_queue_wait_seconds",
            "Time requests waited in the fair queue before a zone took them, by band.",
            ["band"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.spills = Counter(
            "gtm_regional_spills",
            "Requests spilled to a peer region, by peer and reason (saturated, degraded, "
            "region-drained, no-healthy-zone).",
            ["peer", "reason"],
            registry=registry,
        )
        self.spilled_in = Counter(
            "gtm_regional_spilled_in",
            "Requests received from a peer region's spillover, by origin.",
            ["origin"],
            registry=registry,
        )
        self.upstream = Counter(
            "gtm_regional_upstream_attempts",
            "Forwarding attempts by target (zone or peer region) and outcome.",
            ["target", "outcome"],
            registry=registry,
        )
        #: Streams from a zone or peer region that broke after the first byte, by cause.
        self.stream_breaks = StreamBreaks(registry, Tier.REGIONAL)
        self.decision = Histogram(
            "gtm_regional_decision_duration_seconds",
            "Admission + zone choice per request (quota, residency, routing), s.",
            buckets=DECISION_LATENCY_BUCKETS,
            registry=registry,
        )
        self.first_byte = Histogram(
            "gtm_regional_first_byte_seconds",
            "From the request's arrival to the first response byte, s, by model (bounded: "
            "gtm.metrics.ModelLabel).",
            ["model"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        #: The ``model`` label of :attr:`first_byte` (bounded).
        self.model_label = ModelLabel()


def _reader(queue_depth: Callable[[Priority], int], band: Priority) -> Callable[[], float]:
    return lambda: float(queue_depth(band))
