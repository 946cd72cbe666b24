import pytest

from chaos.proxy import gojson


def test_reads_only_the_first_value() -> None:
    assert gojson.decode_body(b'  {"name": "x"} trailing garbage') == {"name": "x"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [(b"", "EOF"), (b"  \n", "EOF"), (b'{"name": ', "unexpected EOF")],
)
def test_empty_and_truncated_bodies(raw: bytes, message: str) -> None:
    with pytest.raises(gojson.GoJsonError, match=message):
        gojson.decode_body(raw)


@pytest.mark.parametrize("raw", [b"NaN", b'{"toxicity": Infinity}', b"-Infinity", b"{x}"])
def test_rejects_what_is_not_json(raw: bytes) -> None:
    with pytest.raises(gojson.GoJsonError):
        gojson.decode_body(raw)


def test_rejects_absurd_nesting_and_numbers() -> None:
    with pytest.raises(gojson.GoJsonError):
        gojson.decode_body(b"[" * 100_000)
    with pytest.raises(gojson.GoJsonError):
        gojson.decode_body(b"1" * 5000)


def test_keys_match_case_insensitively_and_the_last_wins() -> None:
    assert gojson.decode_body(b'{"Name": "a", "NAME": "b", "enabled": true}') == {
        "name": "b",
        "enabled": True,
    }


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    assert gojson.decode_body(b'{"name": "a\xffb"}') == {"name": "a\ufffdb"}


def test_dumps_like_go() -> None:
    assert gojson.dumps({"a": [1, True, None], "b": "<&>\u2028\u2029é"}) == (
        '{"a":[1,true,null],"b":"\\u003c\\u0026\\u003e\\u2028\\u2029é"}'
    )


@pytest.mark.parametrize(
    ("value", "printed"),
    [(1.0, 1), (0.2, 0.2), (0.5, 0.5), (-1.0, -1), (0.1, 0.1), (1e-3, 0.001), (2.5e6, 2500000)],
)
def test_float32_prints_shortest(value: float, printed: float) -> None:
    assert gojson.float32_value(value) == printed
    assert type(gojson.float32_value(value)) is type(printed)


def test_to_float32_rounds() -> None:
    assert gojson.to_float32(0.1) != 0.1
    assert gojson.to_float32(0.5) == 0.5


@pytest.mark.parametrize(
    ("value", "kind"),
    [(True, "bool"), (1, "number"), (1.5, "number"), ("s", "string"), ([], "array"),
     ({}, "object"), (None, "null")],
)  # fmt: skip
def test_json_kind(value: object, kind: str) -> None:
    assert gojson.json_kind(value) == kind
