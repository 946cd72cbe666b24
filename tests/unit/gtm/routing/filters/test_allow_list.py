from __future__ import annotations

import pytest
from pydantic import ValidationError

from gtm.errors import PluginError
from gtm.routing import Filter
from gtm.routing.filters.allow_list import TYPE_NAME, AllowListFilter, AllowListSource, Params
from tests.unit.gtm.routing.helpers import Ctx, Node, nodes, request

LISTED = "not in the allow list of filter 'allow'"
CONTEXT = "not allowed for this request by the snapshot"


@pytest.mark.parametrize(
    ("case", "params", "ctx", "kept", "removed"),
    [
        ("static list", Params(ids=frozenset({"a", "c"})), Ctx(), ("a", "c"), (("b", LISTED),)),
        (
            "from context",
            Params(from_context=True),
            Ctx(allowed=frozenset({"b"})),
            ("b",),
            (("a", CONTEXT), ("c", CONTEXT)),
        ),
        ("context without opinion", Params(from_context=True), Ctx(), ("a", "b", "c"), ()),
        (
            "both must allow",
            Params(ids=frozenset({"a", "b"}), from_context=True),
            Ctx(allowed=frozenset({"b", "c"})),
            ("b",),
            (("a", CONTEXT), ("c", LISTED)),
        ),
        (
            "empty list fails closed",
            Params(ids=frozenset()),
            Ctx(),
            (),
            (("a", LISTED), ("b", LISTED), ("c", LISTED)),
        ),
    ],
)
def test_allow_list(
    case: str,
    params: Params,
    ctx: Ctx,
    kept: tuple[str, ...],
    removed: tuple[tuple[str, str], ...],
) -> None:
    result = AllowListFilter[Node]("allow", params).filter(request(), nodes("a", "b", "c"), ctx)
    assert tuple(c.id for c in result.kept) == kept, case
    assert result.removed == removed, case


def test_params_need_a_source_and_forbid_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="set ids, from_context"):
        Params()
    with pytest.raises(ValidationError, match="Extra inputs"):
        Params.model_validate({"ids": ["a"], "colour": "red"})
    assert Params.model_validate({"ids": ["a", "a", "b"]}).ids == frozenset({"a", "b"})


def test_context_without_allowed_ids_is_a_plugin_error() -> None:
    flt: AllowListFilter[Node] = AllowListFilter("allow", Params(from_context=True))
    with pytest.raises(PluginError, match=r"'allow'.*object has no allowed_ids"):
        flt.filter(request(), nodes("a"), object())


def test_name_and_protocols() -> None:
    flt: AllowListFilter[Node] = AllowListFilter(TYPE_NAME, Params(ids=frozenset({"a"})))
    assert flt.name == TYPE_NAME
    assert isinstance(flt, Filter)
    assert isinstance(Ctx(), AllowListSource)
