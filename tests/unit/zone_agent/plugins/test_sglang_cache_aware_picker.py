from __future__ import annotations

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.plugins.sglang_cache_aware_picker import SglangCacheAwarePicker
from zone_agent.request import ZoneRequest
from zone_agent.view import ZoneView

PROMPT = "a long shared system prompt " * 200


def _choice(view: ZoneView, request: ZoneRequest) -> str:
    b = batch(view, request)
    return str(b.index.ids[int(SglangCacheAwarePicker().scores(b).argmax())])


def test_highest_match_above_threshold() -> None:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b")], acc)
    request = make_request(tokens=1500, text=PROMPT)
    acc.start("b", prefill_tokens=0, prefix_hashes=request.prefix_hashes, prefix_capacity=10_000)
    assert _choice(view, request) == "b"


def test_low_match_goes_to_the_smallest_tree() -> None:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b")], acc)
    acc.start(
        "a", prefill_tokens=0, prefix_hashes=tuple(range(1, 50)), prefix_capacity=10_000
    ).close()
    assert _choice(view, make_request(tokens=1500, text="unrelated " * 300)) == "b"


def test_imbalance_goes_to_the_least_loaded() -> None:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b")], acc)
    request = make_request(tokens=1500, text=PROMPT)
    acc.start("b", prefill_tokens=0, prefix_hashes=request.prefix_hashes, prefix_capacity=10_000)
    for _ in range(100):  # b: 101 in flight, a: 0 → 101 - 0 > 64 and 101 > 1.5 × 0
        acc.start("b", prefill_tokens=0)
    assert _choice(view, request) == "a"
