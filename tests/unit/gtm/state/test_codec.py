from __future__ import annotations

import pytest

from gtm.errors import CodecError
from gtm.models import GeoPoint, Region, Tenant
from gtm.state.codec import MAX_VALUE_BYTES, decode, encode


def _region() -> Region:
    return Region(
        id="eu-west", location=GeoPoint(lat=53.35, lon=-6.26), jurisdiction="EU", country="IE"
    )


def test_round_trip() -> None:
    region = _region()
    raw = encode(region)
    assert isinstance(raw, bytes)
    assert decode("/gtm/v1/regions/eu-west", raw, Region) == region


def test_invalid_json_names_the_key() -> None:
    with pytest.raises(CodecError, match="regions/eu-west") as raised:
        decode("/gtm/v1/regions/eu-west", b"{not json", Region)
    assert raised.value.key == "/gtm/v1/regions/eu-west"


def test_wrong_record_type_names_the_field() -> None:
    raw = encode(Tenant(id="acme"))
    with pytest.raises(CodecError, match=r"Region\.location") as raised:
        decode("/k", raw, Region)
    assert "Region" in raised.value.reason


def test_newer_schema_is_refused() -> None:
    raw = encode(_region()).replace(b'"schema":1', b'"schema":9')
    with pytest.raises(CodecError, match="upgrade gtm"):
        decode("/k", raw, Region)


def test_oversized_values_are_refused_before_parsing() -> None:
    with pytest.raises(CodecError, match=f"limit {MAX_VALUE_BYTES}"):
        decode("/k", b" " * (MAX_VALUE_BYTES + 1), Region)


def test_non_utf8_bytes_are_a_codec_error() -> None:
    with pytest.raises(CodecError):
        decode("/k", b"\xff\xfe", Region)
