from __future__ import annotations

import pytest

from gtm.errors import PluginError
from gtm.routing import Picker
from gtm.routing.pickers.max_score import TYPE_NAME, MaxScorePicker, Params
from tests.unit.gtm.routing.helpers import Node, request, scored


@pytest.mark.parametrize(
    ("case", "pairs", "expected"),
    [
        ("single", [("a", 0.1)], "a"),
        ("highest wins", [("a", 0.2), ("b", 0.9), ("c", 0.5)], "b"),
        ("tie goes to smallest id", [("c", 0.7), ("b", 0.7), ("a", 0.1)], "b"),
        ("all zero", [("z", 0.0), ("y", 0.0)], "y"),
        ("ids compare as strings", [("gpu-10", 1.0), ("gpu-9", 1.0)], "gpu-10"),
    ],
)
def test_max_score(case: str, pairs: list[tuple[str, float]], expected: str) -> None:
    picker: MaxScorePicker[Node] = MaxScorePicker()
    assert picker.pick(request(), scored(*pairs)).id == expected, case
    assert picker.pick(request(), list(reversed(scored(*pairs)))).id == expected, case


def test_name_params_and_protocol() -> None:
    picker: MaxScorePicker[Node] = MaxScorePicker("best", Params())
    assert picker.name == "best"
    assert MaxScorePicker().name == TYPE_NAME
    assert isinstance(picker, Picker)


def test_empty_input_is_a_plugin_error() -> None:
    with pytest.raises(PluginError, match="no candidates"):
        MaxScorePicker().pick(request(), [])
