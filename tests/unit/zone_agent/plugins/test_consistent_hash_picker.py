from __future__ import annotations

from collections import Counter

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.plugins.consistent_hash_picker import ConsistentHashPicker, Params
from zone_agent.prefix import consistent_hash_key
from zone_agent.request import ZoneRequest
from zone_agent.view import ZoneView


def _choice(
    view: ZoneView, request: ZoneRequest, plugin: ConsistentHashPicker | None = None
) -> str:
    b = batch(view, request)
    return str(b.index.ids[int((plugin or ConsistentHashPicker()).scores(b).argmax())])


def _keyed(text: str, request_id: str = "r") -> ZoneRequest:
    return make_request(request_id=request_id)._replace(hash_key=consistent_hash_key(text))


def test_same_prefix_same_gpu_and_spread_over_gpus() -> None:
    view = make_view([Gpu(f"g{i}") for i in range(4)])
    assert _choice(view, _keyed("hello " * 100)) == _choice(view, _keyed("hello " * 100, "other"))
    spread = Counter(_choice(view, _keyed(f"prompt {i}")) for i in range(400))
    assert len(spread) == 4
    assert min(spread.values()) > 50


def test_removing_a_gpu_moves_only_its_keys() -> None:
    gpus = [Gpu(f"g{i}") for i in range(4)]
    full = make_view(gpus)
    smaller = make_view(gpus[:3])
    moved = sum(
        _choice(full, _keyed(f"p{i}")) != _choice(smaller, _keyed(f"p{i}"))
        for i in range(400)
        if _choice(full, _keyed(f"p{i}")) != "g3"
    )
    assert moved == 0


def test_bounded_load_walks_past_a_full_gpu() -> None:
    acc = Accounting()
    view = make_view([Gpu(f"g{i}") for i in range(4)], acc)
    request = _keyed("hot prefix")
    home = _choice(view, request)
    for _ in range(10):
        acc.start(home, prefill_tokens=0)
    assert _choice(view, request) == home  # plain consistent hashing does not care
    bounded = ConsistentHashPicker(params=Params(bounded_load_epsilon=0.25))
    assert _choice(view, request, bounded) != home
