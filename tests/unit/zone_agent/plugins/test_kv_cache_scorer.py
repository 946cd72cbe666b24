from __future__ import annotations

import pytest

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.plugins.kv_cache_scorer import KvCacheScorer


@pytest.mark.parametrize(("usage", "score"), [(0.0, 1.0), (0.25, 0.75), (1.0, 0.0)])
def test_one_minus_usage(usage: float, score: float) -> None:
    view = make_view([Gpu("a", running=1.0, kv_usage=usage, kv_blocks=1000)])
    assert KvCacheScorer().scores(batch(view, make_request()))[0] == pytest.approx(score)
