import pytest

from chaos.proxy.errors import ApiError
from chaos.proxy.models import (
    Direction,
    ProxyFields,
    ProxyPatch,
    ProxyView,
    ToxicFields,
    ToxicView,
    parse_direction,
    parse_struct,
)


def test_defaults_and_nulls() -> None:
    fields = parse_struct(ProxyFields, {"name": "a", "enabled": None}, "Proxy")
    assert fields == ProxyFields(name="a", listen="", upstream="", enabled=True)
    assert parse_struct(ProxyFields, None, "Proxy") == ProxyFields()


def test_unknown_keys_are_ignored() -> None:
    assert parse_struct(ProxyPatch, {"name": "x", "foo": 1}, "Proxy") == ProxyPatch()


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (
            ProxyFields,
            {"enabled": "yes"},
            "json: cannot unmarshal string into Go struct field Proxy.enabled of type bool",
        ),
        (
            ProxyFields,
            {"name": 5},
            "json: cannot unmarshal number into Go struct field Proxy.name of type string",
        ),
        (
            ToxicFields,
            {"toxicity": "1"},
            "json: cannot unmarshal string into Go struct field ToxicWrapper.toxicity "
            "of type float32",
        ),
        (
            ToxicFields,
            {"toxicity": 1e39},
            "json: cannot unmarshal number 1e+39 into Go struct field ToxicWrapper.toxicity "
            "of type float32",
        ),
        (
            ToxicFields,
            {"attributes": [1]},
            "json: cannot unmarshal array into Go struct field ToxicWrapper.attributes "
            "of type toxics.NoopToxic",
        ),
    ],
)
def test_wrong_types_are_400_in_go_words(
    model: type, body: dict[str, object], message: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse_struct(model, body, _go(model))
    assert caught.value.status == 400
    assert caught.value.message == f"bad request body: {message}"


def _go(model: type) -> str:
    return "Proxy" if model is ProxyFields else "ToxicWrapper"


def test_a_non_object_body_is_refused() -> None:
    with pytest.raises(
        ApiError, match=r"cannot unmarshal array into Go value of type toxiproxy\.Proxy"
    ):
        parse_struct(ProxyFields, [], "Proxy")


def test_integers_are_accepted_for_toxicity() -> None:
    assert parse_struct(ToxicFields, {"toxicity": 0}, "ToxicWrapper").toxicity == 0.0


@pytest.mark.parametrize("stream", ["upstream", "UPSTREAM", "UpStream"])
def test_stream_parses_case_insensitively(stream: str) -> None:
    assert parse_direction(stream) is Direction.UPSTREAM


@pytest.mark.parametrize("stream", ["", "walrustream", "up"])
def test_invalid_stream(stream: str) -> None:
    with pytest.raises(ApiError, match="stream was invalid, can be either upstream or downstream"):
        parse_direction(stream)


def test_views_keep_toxiproxy_key_order() -> None:
    toxic = ToxicView(attributes={"rate": 5}, name="b", type="bandwidth", stream="UP", toxicity=1)
    proxy = ProxyView(name="p", listen="l", upstream="u", enabled=True, toxics=(toxic,))
    wire = proxy.to_wire()
    assert list(wire) == ["name", "listen", "upstream", "enabled", "toxics"]
    assert list(toxic.to_wire()) == ["attributes", "name", "type", "stream", "toxicity"]
    assert wire["toxics"] == [toxic.to_wire()]
    assert ProxyView.model_validate(wire) == proxy


def test_optional_fields_still_name_their_go_type() -> None:
    with pytest.raises(ApiError, match=r"Proxy\.enabled of type bool"):
        parse_struct(ProxyPatch, {"enabled": 1}, "Proxy")
