import dataclasses
import json

import pytest
from pydantic import ValidationError

from gtm.models import (
    CandidateScore,
    ClientInfo,
    Decision,
    DecisionTrace,
    FilterStep,
    GeoPoint,
    ModelLoad,
    Priority,
    Region,
    RouteRequest,
    ScoreIssue,
    ScoreIssueKind,
    StoredRecord,
    Tier,
    construct_every_field,
    decision_adapter,
    decision_trace_adapter,
)


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


# ---------------------------------------------------------------------------- decisions


def _decision() -> Decision:
    trace = DecisionTrace(
        profile="gpu-default",
        candidates=("g1", "g2", "g3"),
        filters=(FilterStep("health", ("g1",), (("g1", "unhealthy"),), 2),),
        scores=(
            CandidateScore("g2", (("queue", 0.25), ("ttft", 1.0)), 0.75),
            CandidateScore("g3", (("queue", 1.0), ("ttft", 0.0)), 0.5),
        ),
        picker="max-score-picker",
        weights=(("queue", 1.0), ("ttft", 2.0)),
        score_issues=(ScoreIssue("ttft", "g3", ScoreIssueKind.NAN),),
        scores_omitted=0,
    )
    return Decision(
        request_id="r-1", tier=Tier.ZONE, choice="g2", trace=trace, predicted_ttft_ms=42.5
    )


def test_decision_round_trips_through_json() -> None:
    decision = _decision()
    raw = decision_adapter.dump_json(decision)
    assert json.loads(raw)["trace"]["filters"][0]["reasons"] == [["g1", "unhealthy"]]
    back = decision_adapter.validate_json(raw)
    assert back == decision
    assert back.tier is Tier.ZONE
    assert back.trace.score_issues[0].kind is ScoreIssueKind.NAN
    assert type(back.trace.scores) is tuple
    assert type(back.trace.scores[0].scores[0]) is tuple


def test_decision_trace_round_trips_on_its_own() -> None:
    trace = _decision().trace
    assert decision_trace_adapter.validate_json(decision_trace_adapter.dump_json(trace)) == trace
    as_json = decision_trace_adapter.dump_python(trace, mode="json")
    assert decision_trace_adapter.validate_python(as_json) == trace


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("colour",), "blue", "Unexpected keyword argument"),
        (("trace", "scores_omitted"), -1, "greater than or equal to 0"),
        (("trace", "filters", 0, "remaining"), -2, "greater than or equal to 0"),
        (("predicted_ttft_ms",), -5.0, "greater than or equal to 0"),
        (("kind",), "other", "Input should be 'decision'"),
        (("tier",), "planet", "Input should be"),
    ],
)
def test_reading_a_decision_back_validates_it(
    path: tuple[str | int, ...], value: object, message: str
) -> None:
    data = decision_adapter.dump_python(_decision(), mode="json")
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValidationError, match=message):
        decision_adapter.validate_python(data)


def test_decision_records_are_frozen_and_hashable() -> None:
    decision = _decision()
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.choice = "g3"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.trace.scores[0].total = 1.0  # type: ignore[misc]
    # Slotted, so no new attributes either. CPython 3.11's frozen+slots __setattr__ raises
    # TypeError for an unknown name (its super() refers to the pre-slots class, gh-90562).
    with pytest.raises((AttributeError, TypeError)):
        decision.extra = 1  # type: ignore[attr-defined]
    assert not hasattr(decision, "extra")
    assert hash(decision) == hash(_decision())
    assert decision == _decision()


def test_trace_helpers() -> None:
    trace = _decision().trace
    assert trace.removed_by() == {"g1": "health"}
    assert trace.scores[0].score("ttft") == 1.0
    assert trace.scores[0].score("absent") is None


def test_candidate_score_batch_equals_one_by_one_construction() -> None:
    ids = ["a", "b", "c"]
    rows = [(("s", 0.5),), (("s", 1.0),), ()]
    totals = [0.5, 1.0, 0.0]
    batch = CandidateScore.batch(ids, rows, totals)
    assert batch == tuple(map(CandidateScore, ids, rows, totals))
    assert all(type(record) is CandidateScore for record in batch)
    assert CandidateScore.batch([], [], []) == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch[0].candidate = "z"  # type: ignore[misc]


def test_candidate_score_batch_refuses_columns_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="2 candidates, 1 score rows, 2 totals"):
        CandidateScore.batch(["a", "b"], [()], [0.0, 0.0])


def _every_route_request_field() -> dict[str, object]:
    return {
        "request_id": "r-1",
        "model": "m",
        "input_tokens": 900,
        "max_output_tokens": 20,
        "tenant": "acme",
        "client": ClientInfo(country="FR"),
        "data_class": "default",
        "priority": Priority.BATCH,
        "prefix_hashes": (1, 2, 3),
    }


def test_constructing_every_field_is_model_construct() -> None:
    fast = construct_every_field(RouteRequest, _every_route_request_field())
    slow = RouteRequest.model_construct(**_every_route_request_field())  # type: ignore[arg-type]
    assert fast == slow
    assert list(fast.__dict__) == list(slow.__dict__)
    assert fast.model_fields_set == slow.model_fields_set
    assert repr(fast) == repr(slow)
    assert fast.model_dump() == slow.model_dump()
    with pytest.raises(ValidationError):
        fast.input_tokens = 1  # type: ignore[misc]  # still frozen


def test_constructing_with_a_field_missing_or_unknown_is_model_construct() -> None:
    partial = _every_route_request_field()
    del partial["data_class"]
    # The default is filled in, as model_construct fills it.
    assert construct_every_field(RouteRequest, dict(partial)).data_class == "default"
    unknown = {**_every_route_request_field(), "colour": "red"}
    built = construct_every_field(RouteRequest, unknown)
    assert "colour" not in built.__dict__
    # Aliased fields are model_construct's to map: StoredRecord's ``schema``.
    values = dict(_region().__dict__)
    values["schema"] = values.pop("schema_version")
    assert construct_every_field(Region, values) == _region()
