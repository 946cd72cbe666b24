from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from gtm.errors import PluginError
from gtm.routing import Batch, Filter
from gtm.routing.filters.allow_list import TYPE_NAME, AllowListFilter, AllowListSource, Params
from tests.unit.gtm.routing.helpers import batch, request

LISTED = "not in the allow list of filter 'allow'"
CONTEXT = "not allowed for this request by the snapshot"


@pytest.mark.parametrize(
    ("case", "params", "allowed", "kept", "removed"),
    [
        ("static list", Params(ids=frozenset({"a", "c"})), None, ("a", "c"), (("b", LISTED),)),
        (
            "from context",
            Params(from_context=True),
            frozenset({"b"}),
            ("b",),
            (("a", CONTEXT), ("c", CONTEXT)),
        ),
        ("context without opinion", Params(from_context=True), None, ("a", "b", "c"), ()),
        (
            "both must allow",
            Params(ids=frozenset({"a", "b"}), from_context=True),
            frozenset({"b", "c"}),
            ("b",),
            (("a", CONTEXT), ("c", LISTED)),
        ),
        (
            "empty list fails closed",
            Params(ids=frozenset()),
            None,
            (),
            (("a", LISTED), ("b", LISTED), ("c", LISTED)),
        ),
    ],
)
def test_allow_list(
    case: str,
    params: Params,
    allowed: frozenset[str] | None,
    kept: tuple[str, ...],
    removed: tuple[tuple[str, str], ...],
) -> None:
    chosen = batch("a", "b", "c", allowed=allowed)
    removal = AllowListFilter("allow", params).removes(chosen)
    got = () if removal is None else tuple(np.flatnonzero(removal.mask).tolist())
    assert tuple(i for k, i in enumerate(chosen.ids) if k not in got) == kept, case
    assert removal is None or tuple((chosen.ids[k], removal.reason(k)) for k in got) == removed


def test_params_need_a_source_and_forbid_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="set ids, from_context"):
        Params()
    with pytest.raises(ValidationError, match="Extra inputs"):
        Params.model_validate({"ids": ["a"], "colour": "red"})
    assert Params.model_validate({"ids": ["a", "a", "b"]}).ids == frozenset({"a", "b"})


def test_context_without_allowed_ids_is_a_plugin_error() -> None:
    flt = AllowListFilter("allow", Params(from_context=True))
    with pytest.raises(PluginError, match=r"'allow'.*Batch has no allowed_ids"):
        flt.removes(Batch(("a",), request(), None))


def test_name_and_protocols() -> None:
    flt = AllowListFilter(TYPE_NAME, Params(ids=frozenset({"a"})))
    assert flt.name == TYPE_NAME
    assert isinstance(flt, Filter)
    assert isinstance(batch("a"), AllowListSource)
