"""Prometheus metrics of routing decisions, one set per registry.

A tier builds one :class:`RoutingMetrics` for its registry and hands it to every profile
it builds — including the profiles rebuilt when a routing policy is hot-reloaded — because
a :class:`~prometheus_client.CollectorRegistry` refuses a second collector of the same
name. Series are keyed by plugin name, so an old and a new profile share them.

The two duration histograms are observed on the decision path. A tier whose decisions all
run on its event loop's thread says so (``loop_only``) and gets
:class:`gtm.fastmetrics.FastHistogram`'s (no lock, the same exposition); the default keeps
prometheus_client's locked ones (the global LB also decides in its DNS UDP thread).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gtm.fastmetrics import FastHistogram
from gtm.metrics import DECISION_LATENCY_BUCKETS


class RoutingMetrics:
    """The routing framework's collectors on one registry.

    ``loop_only``: every runner given these metrics decides on one thread, the event
    loop's (the zone agent): the duration histograms then take no lock.
    """

    def __init__(self, registry: CollectorRegistry, *, loop_only: bool = False) -> None:
        histogram = FastHistogram if loop_only else Histogram
        # Same labels as llm-d's RecordPluginProcessingLatency (extension point, plugin).
        self.plugin_duration = histogram(
            "gtm_routing_plugin_duration_seconds",
            "Time spent in one routing plugin call (on a sample of decisions: one in the "
            "profile's plugin_timing_every).",
            ("tier", "extension_point", "plugin"),
            buckets=DECISION_LATENCY_BUCKETS,
            registry=registry,
        )
        self.decision_duration = histogram(
            "gtm_routing_decision_duration_seconds",
            "Time of one whole routing decision (filters, scorers, picker, cost, trace).",
            ("tier", "profile"),
            buckets=DECISION_LATENCY_BUCKETS,
            registry=registry,
        )
        self.score_issues = Counter(
            "gtm_routing_score_issues_total",
            "Scores the runner repaired: NaN or missing → 0, outside [0, 1] → clamped.",
            ("tier", "plugin", "kind"),
            registry=registry,
        )
        self.no_eligible = Counter(
            "gtm_routing_no_eligible_candidate_total",
            "Decisions refused because a filter removed every candidate.",
            ("tier", "profile", "filter"),
            registry=registry,
        )
        self.fast_path = Gauge(
            "gtm_routing_fast_path",
            "1 when the profile takes the tier's declared fast path, 0 when its plugins lack "
            "a capability the path needs (the log says which).",
            ("tier", "profile", "path"),
            registry=registry,
        )
        self.profile_reload_failures = Counter(
            "gtm_routing_profile_reload_failures_total",
            "Routing profiles from a new policy that did not build; the last good one stays.",
            ("tier", "profile"),
            registry=registry,
        )
