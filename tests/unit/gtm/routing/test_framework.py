from __future__ import annotations

import random

import numpy as np
import pytest

from gtm.routing import (
    Batch,
    Capability,
    CostModel,
    ExtensionPoint,
    Filter,
    Picker,
    Plugin,
    Scorer,
    capabilities_of,
    removal_where,
    request_rng,
    uniform_index,
)
from gtm.routing.pickers.max_score import MaxScorePicker
from tests.unit.gtm.routing.helpers import LoadCost, LoadScorer, batch, drop, request


def test_removal_where_masks_the_survivors_it_gives_a_reason_for() -> None:
    chosen = batch("a", "b", "c", "d")
    chosen.alive[3] = False  # an earlier filter's: not asked again
    chosen.all_alive = False
    asked: list[int] = []

    def why(position: int) -> str | None:
        asked.append(position)
        return "odd" if position % 2 else None

    removal = removal_where(chosen, why)
    assert removal is not None
    assert removal.mask.tolist() == [False, True, False, False]
    assert removal.reason(1) == "odd"
    assert asked == [0, 1, 2]
    assert removal_where(chosen, lambda _: None) is None


def test_a_batch_starts_all_alive_and_seals_its_survivors() -> None:
    chosen = Batch(("a", "b", "c"), request(), None)
    assert chosen.all_alive
    assert chosen.survivors.tolist() == [0, 1, 2]
    chosen.alive[1] = False
    chosen.seal()
    chosen.alive[0] = False  # after the filters nothing changes the survivors
    assert chosen.survivors.tolist() == [0, 2]
    assert chosen.rng(3).random() == request_rng(request(), 3).random()


def test_request_rng_depends_only_on_seed_and_request_id() -> None:
    a = request_rng(request("r1"), 7).random()
    assert a == request_rng(request("r1"), 7).random()
    assert a != request_rng(request("r2"), 7).random()
    assert a != request_rng(request("r1"), 8).random()
    assert a == random.Random("7:r1").random()


@pytest.mark.parametrize(
    ("draw", "n", "expected"), [(0.0, 5, 0), (0.99, 5, 4), (0.5, 4, 2), (1.0, 3, 2)]
)
def test_uniform_index_stays_in_range(draw: float, n: int, expected: int) -> None:
    class Fixed(random.Random):
        def random(self) -> float:
            return draw

    assert uniform_index(Fixed(), n) == expected


def test_capabilities_are_declared_on_the_class() -> None:
    assert capabilities_of(MaxScorePicker()) == frozenset({Capability.PICKS_MAX_TOTAL})
    assert capabilities_of(Plugin("plain")) == frozenset()
    assert capabilities_of(object()) == frozenset()
    assert Plugin("plain").prepare(np.zeros(1)) is None


def test_runtime_protocol_checks_tell_extension_points_apart() -> None:
    assert isinstance(drop("a"), Filter)
    assert not isinstance(drop("a"), Scorer)
    assert isinstance(LoadScorer(), Scorer)
    assert isinstance(LoadCost(), CostModel)
    assert isinstance(MaxScorePicker(), Picker)
    assert not isinstance(MaxScorePicker(), Filter)
    assert [p.value for p in ExtensionPoint] == ["filter", "scorer", "picker", "cost_model"]
