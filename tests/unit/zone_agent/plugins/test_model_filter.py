from __future__ import annotations

from tests.unit.zone_agent.helpers import MODEL, Gpu, batch, make_request, make_view
from zone_agent.plugins.model_filter import ModelFilter


def test_removes_workers_whose_fresh_metrics_lack_the_model() -> None:
    view = make_view(
        [
            Gpu("a", running=0, metrics_models=("other-model",)),
            Gpu("b", running=0),
            Gpu("c"),  # never scraped: the inventory is trusted
        ]
    )
    result = ModelFilter().removes(batch(view, make_request()))
    assert result is not None
    assert list(result.mask) == [True, False, False]
    assert MODEL in result.reason(0)


def test_nothing_to_remove() -> None:
    view = make_view([Gpu("a", running=0)])
    assert ModelFilter().removes(batch(view, make_request())) is None
