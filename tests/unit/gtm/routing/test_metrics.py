from __future__ import annotations

from gtm.metrics import DECISION_LATENCY_BUCKETS, new_registry
from gtm.routing import RoutingMetrics


def test_metric_names_and_buckets() -> None:
    registry = new_registry()
    metrics = RoutingMetrics(registry)
    metrics.plugin_duration.labels("zone", "scorer", "kv").observe(3e-6)
    labels = {"tier": "zone", "extension_point": "scorer", "plugin": "kv"}
    name = "gtm_routing_plugin_duration_seconds_bucket"
    for bound in DECISION_LATENCY_BUCKETS:
        expected = 1.0 if bound >= 3e-6 else 0.0
        assert registry.get_sample_value(name, {**labels, "le": repr(bound)}) == expected
    metrics.no_eligible.labels("global", "default", "residency").inc()
    assert (
        registry.get_sample_value(
            "gtm_routing_no_eligible_candidate_total",
            {"tier": "global", "profile": "default", "filter": "residency"},
        )
        == 1.0
    )
