from __future__ import annotations

import pytest

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.plugins.canary_filter import CanaryFilter, Params
from zone_agent.request import CanaryChoice

GPUS = [
    Gpu("stable", labels=(("version", "v1"),)),
    Gpu("canary", labels=(("canary", "true"), ("version", "v2"))),
]


@pytest.mark.parametrize(
    ("choice", "version", "fraction", "removed"),
    [
        (CanaryChoice.AUTO, None, 0.0, ["canary"]),
        (CanaryChoice.AUTO, None, 1.0, []),
        (CanaryChoice.ALWAYS, None, 0.0, ["stable"]),
        (CanaryChoice.NEVER, None, 1.0, ["canary"]),
        (CanaryChoice.AUTO, "v1", 1.0, ["canary"]),
        (CanaryChoice.AUTO, "v2", 1.0, ["stable"]),
        (CanaryChoice.AUTO, "v3", 1.0, ["stable", "canary"]),
    ],
)
def test_rules(
    choice: CanaryChoice, version: str | None, fraction: float, removed: list[str]
) -> None:
    b = batch(make_view(GPUS), make_request(canary=choice, version=version))
    result = CanaryFilter(params=Params(fraction=fraction)).removes(b)
    got = [] if result is None else [b.index.ids[i] for i in range(len(b)) if result.mask[i]]
    assert sorted(got) == sorted(removed)


def test_auto_never_refuses_because_of_canaries() -> None:
    b = batch(make_view(GPUS[1:]), make_request())
    assert CanaryFilter().removes(b) is None


def test_fraction_is_about_right_and_deterministic() -> None:
    view = make_view(GPUS)
    f = CanaryFilter(params=Params(fraction=0.2))
    allowed = sum(
        f.removes(batch(view, make_request(request_id=f"r{i}"))) is None for i in range(2000)
    )
    assert 300 < allowed < 500
    again = sum(
        f.removes(batch(view, make_request(request_id=f"r{i}"))) is None for i in range(2000)
    )
    assert again == allowed


def test_no_canaries_no_pin_no_work() -> None:
    assert CanaryFilter().removes(batch(make_view([Gpu("a")]), make_request())) is None
