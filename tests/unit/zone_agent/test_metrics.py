"""The zone agent's metrics: the size gauges (gtm_zone_*_entries) are read from the
accounting at scrape time, and bounded as the structures they count are; the per-request
counters and histograms (gtm.fastmetrics) scrape as prometheus_client's would."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

import gtm.routing.metrics
import zone_agent.metrics
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from tests.unit.zone_agent.helpers import NOW, Gpu, make_view
from zone_agent.accounting import Accounting
from zone_agent.metrics import ZoneMetrics


def test_size_gauges_follow_the_accounting_and_stay_within_its_bounds() -> None:
    acc = Accounting()
    view = make_view([Gpu("g1"), Gpu("g2")], acc)
    registry = new_registry()
    ZoneMetrics(registry, lambda: view, FakeClock(start=NOW))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("gtm_zone_prefix_index_entries", index="sent") == 0.0
    assert value("gtm_zone_ledger_entries", ledger="open") == 0.0
    # 1000 distinct blocks per request, 8 requests per GPU, each GPU's index capped at 3000.
    tickets = [
        acc.start(gpu, prefill_tokens=10, prefix_hashes=tuple(range(k * 1000, (k + 1) * 1000)),
                  prefix_capacity=3000)
        for k, gpu in enumerate(["g1", "g2"] * 8)
    ]  # fmt: skip
    assert value("gtm_zone_prefix_index_entries", index="sent") == 2 * 3000
    assert value("gtm_zone_ledger_entries", ledger="open") == 16
    hot = value("gtm_zone_hot_blocks_entries")
    assert hot is not None
    assert 0 < hot <= 256
    acc.hold(tickets[0], until=NOW + 5)
    assert value("gtm_zone_ledger_entries", ledger="held") == 1
    assert value("gtm_zone_prefix_index_entries", index="answered") == 1000
    acc.expire(NOW + 5)
    for ticket in tickets:
        ticket.close()
    assert value("gtm_zone_ledger_entries", ledger="open") == 0
    assert value("gtm_zone_ledger_entries", ledger="held") == 0


def _serve(registry: CollectorRegistry, requests: int) -> bytes:
    """``requests`` requests through the metric updates the agent's request path makes
    (app's request counter, DataPath.count_assignment, ZoneRelay.next_target and
    first_byte, the runner's decision and sampled plugin timings), then a scrape."""
    acc = Accounting()
    view = make_view([Gpu("g1"), Gpu("g2")], acc)
    metrics = ZoneMetrics(registry, lambda: view, FakeClock(start=NOW))
    decided = metrics.routing.decision_duration.labels("zone", "default").observe
    timed = metrics.routing.plugin_duration.labels("zone", "scorer", "zone-ttft").observe
    for i in range(requests):
        seconds = (i % 7) * 0.0003 + (i % 3) * 0.2
        metrics.requests.labels("/v1/chat/completions", str((200, 200, 429)[i % 3])).inc()
        metrics.assignments.labels(("g1", "g2")[i % 2], "default").inc()
        metrics.decision.observe(seconds / 10)
        metrics.observe_first_byte(("m-a", "m-b", "m-c")[i % 3], seconds)
        decided(seconds / 100)
        if i % 16 == 0:
            timed(seconds / 1000)
    return generate_latest(registry)


def test_the_per_request_metrics_scrape_as_prometheus_clients_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.5)  # the _created series
    fast = _serve(new_registry(), 500)
    monkeypatch.setattr(zone_agent.metrics, "FastCounter", Counter)
    monkeypatch.setattr(zone_agent.metrics, "FastHistogram", Histogram)
    monkeypatch.setattr(gtm.routing.metrics, "FastHistogram", Histogram)
    reference = _serve(new_registry(), 500)
    assert fast == reference
    assert b'gtm_zone_assignments_total{gpu="g1",profile="default"} 250.0' in fast
    assert b'gtm_zone_first_byte_seconds_count{model="m-b"} 167.0' in fast
