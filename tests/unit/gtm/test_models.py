import pytest
from pydantic import ValidationError

from gtm.models import GeoPoint, ModelLoad, Region, RouteRequest, StoredRecord


def _region(**overrides: object) -> Region:
    fields: dict[str, object] = {
        "id": "eu-west",
        "location": GeoPoint(lat=53.35, lon=-6.26),
        "jurisdiction": "EU",
        "country": "IE",
    }
    fields.update(overrides)
    return Region.model_validate(fields)


def test_stored_record_round_trips_with_schema_field() -> None:
    region = _region()
    raw = region.to_json()
    assert b'"schema":1' in raw
    assert Region.model_validate_json(raw) == region


def test_newer_schema_is_refused_with_upgrade_hint() -> None:
    raw = _region().to_json().replace(b'"schema":1', b'"schema":2')
    with pytest.raises(ValidationError, match="upgrade gtm"):
        Region.model_validate_json(raw)


def test_records_are_frozen_and_reject_unknown_fields() -> None:
    region = _region()
    with pytest.raises(ValidationError):
        region.id = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        _region(colour="blue")


@pytest.mark.parametrize("bad_id", ["", "EU-West", "-eu", "eu_west", "a" * 64])
def test_identifiers_are_dns_label_like(bad_id: str) -> None:
    with pytest.raises(ValidationError):
        _region(id=bad_id)


def test_haversine_matches_published_distance() -> None:
    # London Heathrow -> New York JFK is 5,540 km great-circle (within 0.5 %).
    lhr = GeoPoint(lat=51.4700, lon=-0.4543)
    jfk = GeoPoint(lat=40.6413, lon=-73.7781)
    assert lhr.distance_km(jfk) == pytest.approx(5540, rel=0.005)


def test_model_load_rejects_inconsistent_counts() -> None:
    with pytest.raises(ValidationError, match="healthy_gpus"):
        ModelLoad(model="m", gpus=1, healthy_gpus=2, prefill_tokens_per_s=1.0)
    load = ModelLoad(
        model="m", gpus=2, healthy_gpus=2, prefill_tokens_per_s=2000.0, queued_prefill_tokens=1000
    )
    assert load.queue_delay_ms() == pytest.approx(500.0)


def test_route_request_bounds_prefix_hashes() -> None:
    with pytest.raises(ValidationError, match="65536"):
        RouteRequest(model="m", input_tokens=1, tenant="t", prefix_hashes=tuple(range(65_537)))


def test_every_stored_record_declares_a_schema_version() -> None:
    for cls in StoredRecord.__subclasses__():
        assert cls.SCHEMA_VERSION >= 1
        assert "schema_version" in cls.model_fields
