from __future__ import annotations

import pytest

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.plugins.fits_filter import FitsFilter, Params, PromptTooLong

# 100 blocks × 16 tokens = a 1,600-token context.
SMALL = {"running": 0.0, "kv_blocks": 100, "block_size": 16}


@pytest.mark.parametrize(
    ("tokens", "max_output", "removed"),
    [
        (100, None, []),
        (1599, None, ["small"]),  # 1599 + 1 fits 1600 but needs 101 blocks > 100
        (1500, 200, ["small"]),  # context: 1700 > 1600
        (10, 10, []),
    ],
)
def test_hard_limits(tokens: int, max_output: int | None, removed: list[str]) -> None:
    view = make_view([Gpu("big"), Gpu("small", **SMALL)])  # type: ignore[arg-type]
    b = batch(view, make_request(tokens=tokens, max_output=max_output))
    result = FitsFilter().removes(b)
    got = [] if result is None else [b.index.ids[i] for i in range(len(b)) if result.mask[i]]
    assert got == removed


def test_too_long_for_every_gpu_names_the_largest_limit() -> None:
    view = make_view([Gpu("a", **SMALL), Gpu("b", running=0.0, kv_blocks=200, block_size=16)])  # type: ignore[arg-type]
    with pytest.raises(PromptTooLong) as info:
        FitsFilter().removes(batch(view, make_request(tokens=5000)))
    assert info.value.limit == 3200
    assert info.value.needed == 5001
    assert "maximum context length is 3200 tokens" in str(info.value)


def test_free_kv_is_soft() -> None:
    acc = Accounting()
    gpus = [
        Gpu("a-full", running=1.0, kv_usage=0.99, kv_blocks=1000, block_size=16),
        Gpu("b-free", running=1.0, kv_usage=0.0, kv_blocks=1000, block_size=16),
    ]
    b = batch(make_view(gpus, acc), make_request(tokens=800))
    result = FitsFilter().removes(b)
    assert result is not None
    assert list(result.mask) == [True, False]
    assert "free KV blocks" in result.reason(0)
    # When no GPU has the room, nobody is removed: a full cache is a queue.
    only_full = batch(make_view(gpus[:1], acc), make_request(tokens=800))
    assert FitsFilter().removes(only_full) is None
    assert FitsFilter(params=Params(free_kv=False)).removes(b) is None


def test_what_we_sent_since_the_scrape_counts_against_free_kv() -> None:
    acc = Accounting()
    gpus = [
        Gpu("a", running=0.0, kv_blocks=1000, block_size=16),
        Gpu("b", running=0.0, kv_blocks=1000, block_size=16),
    ]
    view = make_view(gpus, acc)
    acc.start("a", prefill_tokens=0, kv_blocks=950)
    result = FitsFilter().removes(batch(view, make_request(tokens=1000)))
    assert result is not None
    assert list(result.mask) == [True, False]
