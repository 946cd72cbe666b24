from __future__ import annotations

from pathlib import Path

import pytest

from policies.documents import SaturationPolicy
from policies.loader import load_examples, load_paths
from policies.residency import ReasonCode, ResidencyEngine, ResidencyQuery, Verdict, compile
from tests.unit.policies.conftest import document

EU = frozenset({"eu-west", "eu-central"})
US = frozenset({"us-east", "us-west"})
DE = frozenset({"eu-central"})
ALL = EU | US | {"ap-northeast", "ap-southeast"}


@pytest.fixture(scope="module")
def engine() -> ResidencyEngine:
    return compile(load_examples())


@pytest.mark.parametrize(
    ("tenant", "country", "data_class", "allowed", "reason", "rule", "denied_by"),
    [
        ("demo-global", "US", "default", ALL, ReasonCode.ALLOWED, "default-anywhere", ()),
        ("demo-global", None, "default", ALL, ReasonCode.ALLOWED, "default-anywhere", ()),
        ("demo-global", "FR", "default", EU, ReasonCode.ALLOWED_AFTER_DENY, "default-anywhere",
         ("gdpr-stays-in-eea",)),
        ("demo-global", "NO", "default", EU, ReasonCode.ALLOWED_AFTER_DENY, "default-anywhere",
         ("gdpr-stays-in-eea",)),
        ("demo-global", "CH", "default", ALL, ReasonCode.ALLOWED, "default-anywhere", ()),
        ("demo-global", "JP", "de-only", DE, ReasonCode.ALLOWED, "de-only-data", ()),
        ("demo-eu", "US", "default", EU, ReasonCode.ALLOWED, "eu-tenant-in-eu", ()),
        ("demo-eu", "DE", "default", EU, ReasonCode.ALLOWED, "eu-tenant-in-eu", ()),
        ("acme-health", "US", "default", US, ReasonCode.ALLOWED, "healthcare-us", ()),
        ("acme-health", "JP", "default", US, ReasonCode.ALLOWED, "healthcare-us", ()),
        ("acme-health", "DE", "default", frozenset(), ReasonCode.DENIED, "healthcare-us",
         ("gdpr-stays-in-eea",)),
        ("acme-health", "US", "de-only", frozenset(), ReasonCode.DENIED, "de-only-data",
         ("healthcare-pinned-to-us",)),
        ("nobody", "US", "default", frozenset(), ReasonCode.UNKNOWN_TENANT, None, ()),
    ],
)  # fmt: skip
def test_example_policies(
    engine: ResidencyEngine,
    tenant: str,
    country: str | None,
    data_class: str,
    allowed: frozenset[str],
    reason: ReasonCode,
    rule: str | None,
    denied_by: tuple[str, ...],
) -> None:
    verdict: Verdict = engine.allowed_regions(
        ResidencyQuery(tenant=tenant, model="m", data_class=data_class, client_country=country)
    )
    assert (verdict.allowed, verdict.reason, verdict.rule, verdict.denied_by) == (
        allowed,
        reason,
        rule,
        denied_by,
    )
    assert verdict.refused is (not allowed)


def test_saturation_policy_comes_from_the_rule_or_the_set(engine: ResidencyEngine) -> None:
    health = engine.allowed_regions(ResidencyQuery("acme-health", "m", client_country="US"))
    assert health.on_saturation is SaturationPolicy.REJECT
    anywhere = engine.allowed_regions(ResidencyQuery("demo-global", "m", client_country="US"))
    assert anywhere.on_saturation is SaturationPolicy.SPILL_WITHIN_ALLOWED


def test_assumed_location_is_reported(engine: ResidencyEngine) -> None:
    verdict = engine.allowed_regions(ResidencyQuery("demo-global", "m"))
    assert verdict.assumed_jurisdiction == "world"
    assert "assumed 'world'" in verdict.explain()


def write(tmp_path: Path, residency: str, tenants: str = "") -> Path:
    (tmp_path / "regions.yaml").write_text(
        document(
            "Regions",
            "r",
            "  regions:\n"
            '    - {id: eu-west, country: "IE", location: {lat: 53, lon: -6}}\n'
            '    - {id: us-east, country: "US", location: {lat: 39, lon: -77}}\n',
        )
    )
    (tmp_path / "residency.yaml").write_text(document("Residency", "res", residency))
    if tenants:
        (tmp_path / "tenants.yaml").write_text(document("Tenants", "t", tenants))
    return tmp_path


def test_no_matching_rule_fails_closed(tmp_path: Path) -> None:
    rule = '{name: eu, match: {client_countries: ["DE"]}, effect: allow, regions: [eu-west]}'
    policy_set = load_paths([write(tmp_path, f"  rules:\n    - {rule}\n")])
    engine = compile(policy_set)
    verdict = engine.allowed_regions(ResidencyQuery("t", "m", client_country="US"))
    assert (verdict.allowed, verdict.reason, verdict.rule) == (
        frozenset(),
        ReasonCode.NO_MATCHING_RULE,
        None,
    )
    assert verdict.refused
    assert verdict.explain() == "no-matching-rule: regions {none}"


def test_unknown_location_is_refused_by_default(tmp_path: Path) -> None:
    engine = compile(
        load_paths(
            [write(tmp_path, "  rules:\n    - {name: all, effect: allow, all_regions: true}\n")]
        )
    )
    verdict = engine.allowed_regions(ResidencyQuery("t", "m", client_country=None))
    assert verdict.reason is ReasonCode.UNKNOWN_CLIENT_LOCATION
    assert verdict.refused
    assert engine.allowed_regions(ResidencyQuery("t", "m", client_country="BR")).allowed == {
        "eu-west",
        "us-east",
    }


def test_assuming_a_jurisdiction_applies_rules_covering_it(tmp_path: Path) -> None:
    spec = (
        "  unknown_client_location: {action: assume, jurisdiction: eu}\n"
        "  rules:\n"
        "    - {name: eea-clients, match: {client_jurisdictions: [eea]},\n"
        "       effect: allow, regions: [eu-west]}\n"
        '    - {name: de-clients, match: {client_countries: ["DE"]},\n'
        "       effect: allow, regions: [us-east]}\n"
    )
    engine = compile(load_paths([write(tmp_path, spec)]))
    verdict = engine.allowed_regions(ResidencyQuery("t", "m"))
    # EU ⊆ EEA, so the EEA rule applies; "somewhere in the EU" is not "in DE".
    assert (verdict.allowed, verdict.rule, verdict.assumed_jurisdiction) == (
        frozenset({"eu-west"}),
        "eea-clients",
        "eu",
    )


def test_an_allow_selecting_no_existing_region_refuses(tmp_path: Path) -> None:
    spec = '  rules:\n    - {name: japan, effect: allow, countries: ["JP"]}\n'
    engine = compile(load_paths([write(tmp_path, spec)]))
    verdict = engine.allowed_regions(ResidencyQuery("t", "m", client_country="US"))
    assert (verdict.reason, verdict.rule, verdict.refused) == (
        ReasonCode.NO_REGION_SELECTED,
        "japan",
        True,
    )


def test_unknown_tenants_are_refused_only_when_tenants_are_defined(tmp_path: Path) -> None:
    spec = "  rules:\n    - {name: all, effect: allow, all_regions: true}\n"
    engine = compile(load_paths([write(tmp_path, spec, "  tenants:\n    - id: known\n")]))
    assert (
        engine.allowed_regions(ResidencyQuery("stranger", "m", client_country="US")).reason
        is ReasonCode.UNKNOWN_TENANT
    )
    assert not engine.allowed_regions(ResidencyQuery("known", "m", client_country="US")).refused


def test_verdicts_are_memoised(engine: ResidencyEngine) -> None:
    query = ResidencyQuery("demo-eu", "some-model", client_country="SE")
    first = engine.allowed_regions(query)
    hits = engine.cache_info().hits
    assert (
        engine.allowed_regions(ResidencyQuery("demo-eu", "some-model", client_country="SE"))
        is first
    )
    assert engine.cache_info().hits == hits + 1


def test_matching_rules_most_specific_first(engine: ResidencyEngine) -> None:
    names = [
        r.name for r in engine.matching_rules(ResidencyQuery("acme-health", "m", "de-only", "FR"))
    ]
    assert names == [
        "de-only-data",
        "healthcare-pinned-to-us",
        "healthcare-us",
        "gdpr-stays-in-eea",
        "default-anywhere",
    ]


def test_engine_exposes_its_policy(engine: ResidencyEngine) -> None:
    assert engine.regions == ALL
    assert engine.digest == engine.policy_set.digest
