from __future__ import annotations

import pytest

from gtm.fastmetrics import FastHistogram
from gtm.metrics import DECISION_LATENCY_BUCKETS, new_registry
from gtm.routing import RoutingMetrics


@pytest.mark.parametrize("loop_only", [False, True])
def test_metric_names_and_buckets(loop_only: bool) -> None:
    registry = new_registry()
    metrics = RoutingMetrics(registry, loop_only=loop_only)
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


def test_only_a_loop_only_tier_gets_the_lock_free_histograms() -> None:
    # The global LB also decides in its DNS UDP thread: it keeps the locked ones.
    shared = RoutingMetrics(new_registry())
    assert not isinstance(shared.plugin_duration, FastHistogram)
    assert not isinstance(shared.decision_duration, FastHistogram)
    loop = RoutingMetrics(new_registry(), loop_only=True)
    assert isinstance(loop.plugin_duration, FastHistogram)
    assert isinstance(loop.decision_duration, FastHistogram)
