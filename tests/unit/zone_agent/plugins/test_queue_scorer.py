from __future__ import annotations

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting, SlotLoad
from zone_agent.plugins.queue_scorer import QueueScorer


def test_shortest_scraped_queue_corrected_by_what_we_sent_since() -> None:
    acc = Accounting()
    gpus = [
        Gpu("a", running=0.0, waiting=4.0, own_at_scrape=SlotLoad(prefilling=0)),
        Gpu("b", running=0.0, waiting=0.0),
        Gpu("c", running=0.0, waiting=2.0),
    ]
    view = make_view(gpus, acc)
    for _ in range(3):
        acc.start("b", prefill_tokens=1)
    assert list(QueueScorer().scores(batch(view, make_request()))) == [0.0, 0.5, 1.0]
