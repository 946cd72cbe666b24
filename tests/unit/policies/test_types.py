"""The shared field types (gtm.models imports them): what they accept, how they refuse,
and that they accept exactly what the plain pattern constraints (gtm.models' own types
before it imported these) accepted."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field, TypeAdapter, ValidationError

from policies.types import (
    FORMAT_ERROR,
    CountryCode,
    Identifier,
    ModelName,
    is_country_code,
    is_identifier,
)

ID = TypeAdapter(Identifier)
COUNTRY = TypeAdapter(CountryCode)
MODEL = TypeAdapter(ModelName)


def accepts(adapter: TypeAdapter[Any], value: str) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("eu-west", True),
        ("a", True),
        ("0", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("", False),
        ("-eu", False),
        ("eu-", False),
        ("EU-west", False),
        ("eu_west", False),
        ("eu-west\n", False),  # "$" alone would let a trailing newline through
    ],
)
def test_identifier(value: str, valid: bool) -> None:
    assert accepts(ID, value) is valid
    assert is_identifier(value) is valid  # the check for headers and options


@pytest.mark.parametrize(
    ("value", "valid"),
    [("DE", True), ("de", False), ("DEU", False), ("D", False), ("DE\n", False)],
)
def test_country_code(value: str, valid: bool) -> None:
    assert accepts(COUNTRY, value) is valid
    assert is_country_code(value) is valid


def test_a_refusal_is_one_format_error_saying_what_was_expected() -> None:
    for bad in ("EU", 12, "a" * 64):
        with pytest.raises(ValidationError) as info:
            ID.validate_python(bad)
        (error,) = info.value.errors()
        assert error["type"] == FORMAT_ERROR
        assert error["msg"].startswith("expected a lowercase id")


# The plain constraints: what the JSON Schema publishes, and what gtm.models validated
# with before it imported these types.
SCHEMA_ID = TypeAdapter(
    Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")]
)
SCHEMA_COUNTRY = TypeAdapter(Annotated[str, Field(pattern=r"^[A-Z]{2}$")])
SCHEMA_MODEL = TypeAdapter(
    Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9._:/@+-]+$")]
)
ID_ALPHABET = st.text(alphabet="abz09-A_\n .", max_size=70)


@given(st.one_of(ID_ALPHABET, st.text(max_size=70)))
def test_identifier_accepts_what_the_schema_pattern_accepts(value: str) -> None:
    assert accepts(ID, value) is accepts(SCHEMA_ID, value) is is_identifier(value)


@given(st.one_of(st.text(alphabet="DEde\n", max_size=4), st.text(max_size=4)))
def test_country_code_accepts_what_the_schema_pattern_accepts(value: str) -> None:
    assert accepts(COUNTRY, value) is accepts(SCHEMA_COUNTRY, value) is is_country_code(value)


@given(st.one_of(st.text(alphabet="aZ9./:@+-_ \n", max_size=260), st.text(max_size=40)))
def test_model_name_accepts_what_the_schema_pattern_accepts(value: str) -> None:
    assert accepts(MODEL, value) is accepts(SCHEMA_MODEL, value)
