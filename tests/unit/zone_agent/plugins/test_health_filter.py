from __future__ import annotations

import pytest

from gtm.models import WorkerState
from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.health import HealthStatus
from zone_agent.plugins.health_filter import HealthFilter


@pytest.mark.parametrize(
    ("gpus", "removed"),
    [
        ([Gpu("a"), Gpu("b")], []),
        ([Gpu("a", health=HealthStatus(False, "ejected")), Gpu("b")], ["a"]),
        ([Gpu("a", drained=True), Gpu("b", state=WorkerState.DRAINING)], ["a", "b"]),
        ([Gpu("a", health=HealthStatus(True, half_open=True))], []),  # idle trial GPU
    ],
)
def test_removes_unavailable_gpus(gpus: list[Gpu], removed: list[str]) -> None:
    b = batch(make_view(gpus), make_request())
    result = HealthFilter().removes(b)
    got = [] if result is None else [b.index.ids[i] for i in range(len(b)) if result.mask[i]]
    assert got == removed


def test_half_open_gpu_takes_one_request_at_a_time() -> None:
    acc = Accounting()
    view = make_view([Gpu("a", health=HealthStatus(True, half_open=True)), Gpu("b")], acc)
    acc.start("a", prefill_tokens=1)
    b = batch(view, make_request())
    result = HealthFilter().removes(b)
    assert result is not None
    assert list(result.mask) == [True, False]
    assert "half-open" in result.reason(0)
