from __future__ import annotations

from typing import Any

import pytest

from policies.documents import GeoPoint, Region, Rule
from policies.rules import (
    Specificity,
    can_both_match,
    compile_rule,
    describe_specificity,
    find_conflicts,
    select_regions,
    specificity_of,
)

REGIONS = {
    rid: Region(id=rid, country=cc, location=GeoPoint(lat=0, lon=0))
    for rid, cc in [("us-east", "US"), ("eu-west", "IE"), ("eu-central", "DE"), ("jp", "JP")]
}
JURISDICTIONS = {"eu": frozenset({"IE", "DE", "FR"}), "us": frozenset({"US"})}


def rule(**fields: Any) -> Rule:
    fields.setdefault("name", "r")
    fields.setdefault("effect", "allow")
    if not any(k in fields for k in ("regions", "jurisdictions", "countries")):
        fields.setdefault("all_regions", True)
    return Rule.model_validate(fields)


def compiled(**fields: Any) -> Any:
    return compile_rule(
        rule(**fields), source="f.yaml", line=3, jurisdictions=JURISDICTIONS, regions=REGIONS
    )


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        ({}, 0),
        ({"models": ["m"]}, Specificity.MODEL),
        ({"client_jurisdictions": ["eu"]}, Specificity.CLIENT_JURISDICTION),
        ({"client_countries": ["DE"]}, Specificity.CLIENT_COUNTRY),
        (
            {"client_countries": ["DE"], "client_jurisdictions": ["us"]},
            Specificity.CLIENT_JURISDICTION,
        ),
        ({"tenants": ["t"]}, Specificity.TENANT),
        ({"data_classes": ["d"]}, Specificity.DATA_CLASS),
        ({"tenants": ["t"], "models": ["m"]}, Specificity.TENANT | Specificity.MODEL),
    ],
)
def test_specificity(match: dict[str, Any], expected: int) -> None:
    assert specificity_of(rule(match=match)) == expected


def test_specificity_is_lexicographic() -> None:
    data_class_only = specificity_of(rule(match={"data_classes": ["d"]}))
    everything_else = specificity_of(
        rule(match={"tenants": ["t"], "client_countries": ["DE"], "models": ["m"]})
    )
    assert data_class_only > everything_else
    assert describe_specificity(everything_else) == "tenant+client_country+model"
    assert describe_specificity(0) == "catch-all"


def test_selection() -> None:
    assert select_regions(rule(regions=["jp"]), JURISDICTIONS, REGIONS) == {"jp"}
    assert select_regions(rule(jurisdictions=["eu"]), JURISDICTIONS, REGIONS) == {
        "eu-west",
        "eu-central",
    }
    assert select_regions(rule(countries=["DE"], regions=["jp"]), JURISDICTIONS, REGIONS) == {
        "eu-central",
        "jp",
    }
    outside = rule(effect="deny", jurisdictions=["eu"], outside=True)
    assert select_regions(outside, JURISDICTIONS, REGIONS) == {"us-east", "jp"}
    assert select_regions(rule(), JURISDICTIONS, REGIONS) == set(REGIONS)


def test_matching_known_and_assumed_locations() -> None:
    gdpr = compiled(match={"client_jurisdictions": ["eu"]})
    assert gdpr.matches("t", "default", "FR", None, "m")
    assert not gdpr.matches("t", "default", "US", None, "m")
    # Unknown location: the rule applies only if it covers all the assumed countries.
    assert gdpr.matches("t", "default", None, frozenset({"FR", "DE"}), "m")
    assert not gdpr.matches("t", "default", None, frozenset({"FR", "US"}), "m")
    assert not gdpr.matches("t", "default", None, None, "m")
    anywhere = compiled()
    assert anywhere.matches("t", "x", None, None, "m")
    narrow = compiled(match={"tenants": ["a"], "data_classes": ["pii"], "models": ["m"]})
    assert narrow.matches("a", "pii", "US", None, "m")
    assert not narrow.matches("b", "pii", "US", None, "m")
    assert not narrow.matches("a", "default", "US", None, "m")
    assert not narrow.matches("a", "pii", "US", None, "other")


def test_conflicts_need_equal_specificity_overlap_and_disagreement() -> None:
    eu = compiled(name="a", match={"tenants": ["t", "u"]}, jurisdictions=["eu"])
    us = compiled(name="b", match={"tenants": ["u"]}, jurisdictions=["us"])
    other_tenant = compiled(name="c", match={"tenants": ["v"]}, jurisdictions=["us"])
    same_regions = compiled(name="d", match={"tenants": ["t"]}, countries=["IE", "DE"])
    deny = compiled(name="e", effect="deny", match={"tenants": ["t"]}, jurisdictions=["us"])
    broader = compiled(name="f", jurisdictions=["us"])
    assert can_both_match(eu, us)
    assert not can_both_match(eu, other_tenant)
    pairs = find_conflicts([eu, us, other_tenant, same_regions, deny, broader])
    assert [(a.name, b.name) for a, b in pairs] == [("a", "b")]
    saturation = compiled(
        name="g", match={"tenants": ["t"]}, jurisdictions=["eu"], on_saturation="reject"
    )
    assert [(a.name, b.name) for a, b in find_conflicts([eu, saturation])] == [("a", "g")]
