"""The zone agent's size gauges (gtm_zone_*_entries): read from the accounting at
scrape time, and bounded as the structures they count are."""

from __future__ import annotations

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
