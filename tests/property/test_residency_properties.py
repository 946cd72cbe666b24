"""Property tests for the residency engine: random policy sets, random requests.

The engine is compared with an oracle written directly from the documented precedence
(policies.rules), sharing no code with the engine's matching or selection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from policies.documents import (
    Effect,
    GeoPoint,
    JurisdictionsDocument,
    Region,
    RegionsDocument,
    ResidencyDocument,
    Rule,
    TenantsDocument,
    UnknownLocationAction,
)
from policies.policyset import LoadedDocument, PolicySet, build_policy_set
from policies.residency import ReasonCode, ResidencyEngine, ResidencyQuery, Verdict, compile
from policies.rules import CompiledRule, compile_rule, find_conflicts

REGIONS = {
    "us-east": "US",
    "us-west": "US",
    "eu-west": "IE",
    "eu-central": "DE",
    "ap-northeast": "JP",
    "ap-southeast": "SG",
}
COUNTRIES = ["US", "IE", "DE", "FR", "NO", "JP", "SG", "BR"]
JURISDICTIONS = {
    "eu": ["IE", "DE", "FR"],
    "eea": ["IE", "DE", "FR", "NO"],
    "us": ["US"],
    "asia": ["JP", "SG"],
    "everywhere": COUNTRIES,
}
TENANTS = ["t1", "t2", "t3"]
DATA_CLASSES = ["default", "pii", "de-only"]
MODELS = ["m1", "m2"]
REFUSALS = {
    ReasonCode.NO_MATCHING_RULE,
    ReasonCode.DENIED,
    ReasonCode.NO_REGION_SELECTED,
    ReasonCode.UNKNOWN_CLIENT_LOCATION,
    ReasonCode.UNKNOWN_TENANT,
}

PROPERTY_SETTINGS = settings(
    max_examples=100,
    derandomize=True,  # deterministic: the same examples on every run
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _subset(pool: list[str]) -> st.SearchStrategy[list[str] | None]:
    return st.none() | st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True)


@st.composite
def rules(draw: st.DrawFn, name: str) -> Rule:
    match = {
        "tenants": draw(_subset(TENANTS)),
        "data_classes": draw(_subset(DATA_CLASSES)),
        "client_countries": draw(_subset(COUNTRIES)),
        "client_jurisdictions": draw(_subset(list(JURISDICTIONS))),
        "models": draw(_subset(MODELS)),
    }
    effect = draw(st.sampled_from(["allow", "deny"]))
    fields: dict[str, Any] = {"name": name, "effect": effect, "match": match}
    if draw(st.integers(0, 5)) == 0:
        fields["all_regions"] = True
    else:
        fields["regions"] = draw(st.lists(st.sampled_from(list(REGIONS)), max_size=2, unique=True))
        fields["jurisdictions"] = draw(
            st.lists(st.sampled_from(list(JURISDICTIONS)), max_size=2, unique=True)
        )
        fields["countries"] = draw(st.lists(st.sampled_from(COUNTRIES), max_size=2, unique=True))
        if not (fields["regions"] or fields["jurisdictions"] or fields["countries"]):
            fields["regions"] = [draw(st.sampled_from(list(REGIONS)))]
        fields["outside"] = draw(st.booleans())
    if effect == "allow":
        fields["on_saturation"] = draw(st.sampled_from([None, "reject", "spill_within_allowed"]))
    return Rule.model_validate(fields)


def _region_models() -> dict[str, Region]:
    return {
        rid: Region(id=rid, country=cc, location=GeoPoint(lat=0.0, lon=0.0))
        for rid, cc in REGIONS.items()
    }


def _without_conflicts(candidates: list[Rule]) -> list[Rule]:
    """Keep rules in order, dropping any allow that would conflict with one kept."""
    jurisdictions = {k: frozenset(v) for k, v in JURISDICTIONS.items()}
    regions = _region_models()
    kept: list[Rule] = []
    compiled: list[CompiledRule] = []
    for rule in candidates:
        new = compile_rule(rule, source="gen", line=0, jurisdictions=jurisdictions, regions=regions)
        if not find_conflicts([*compiled, new]):
            kept.append(rule)
            compiled.append(new)
    return kept


def _doc(model: type[Any], kind: str, spec: dict[str, Any]) -> LoadedDocument:
    data = {"apiVersion": "gtm.dev/v1", "kind": kind, "metadata": {"name": "gen"}, "spec": spec}
    return LoadedDocument(source=f"{kind}.yaml", document=model.model_validate(data))


def build(rule_list: list[Rule], unknown: dict[str, Any]) -> PolicySet:
    return build_policy_set(
        [
            _doc(
                JurisdictionsDocument,
                "Jurisdictions",
                {"jurisdictions": [{"id": k, "countries": v} for k, v in JURISDICTIONS.items()]},
            ),
            _doc(
                RegionsDocument,
                "Regions",
                {"regions": [r.model_dump() for r in _region_models().values()]},
            ),
            _doc(TenantsDocument, "Tenants", {"tenants": [{"id": t} for t in TENANTS]}),
            _doc(
                ResidencyDocument,
                "Residency",
                {
                    "unknown_client_location": unknown,
                    "rules": [r.model_dump(mode="json") for r in rule_list],
                },
            ),
        ]
    )


@dataclass(frozen=True)
class Case:
    rules: list[Rule]
    unknown: dict[str, Any]
    policy_set: PolicySet
    engine: ResidencyEngine


@st.composite
def cases(draw: st.DrawFn) -> Case:
    count = draw(st.integers(0, 8))
    candidates = [draw(rules(f"r{i}")) for i in range(count)]
    rule_list = _without_conflicts(candidates)
    unknown = draw(
        st.sampled_from(
            [{"action": "deny"}] + [{"action": "assume", "jurisdiction": j} for j in JURISDICTIONS]
        )
    )
    policy_set = build(rule_list, unknown)
    return Case(rule_list, unknown, policy_set, compile(policy_set))


queries = st.builds(
    ResidencyQuery,
    tenant=st.sampled_from(TENANTS),
    model=st.sampled_from(MODELS),
    data_class=st.sampled_from(DATA_CLASSES),
    client_country=st.none() | st.sampled_from(COUNTRIES),
)


# ---------------------------------------------------------------------------- the oracle


def _location_set(rule: Rule) -> set[str] | None:
    match = rule.match
    if match.client_countries is None and match.client_jurisdictions is None:
        return None
    found = set(match.client_countries or ())
    for jid in match.client_jurisdictions or ():
        found |= set(JURISDICTIONS[jid])
    return found


def matches(rule: Rule, query: ResidencyQuery, assumed: set[str] | None) -> bool:
    m = rule.match
    if m.tenants is not None and query.tenant not in m.tenants:
        return False
    if m.data_classes is not None and query.data_class not in m.data_classes:
        return False
    if m.models is not None and query.model not in m.models:
        return False
    where = _location_set(rule)
    if where is None:
        return True
    if query.client_country is not None:
        return query.client_country in where
    return assumed is not None and assumed <= where


def selected(rule: Rule) -> set[str]:
    if rule.all_regions:
        return set(REGIONS)
    countries = set(rule.countries)
    for jid in rule.jurisdictions:
        countries |= set(JURISDICTIONS[jid])
    chosen = set(rule.regions) | {r for r, cc in REGIONS.items() if cc in countries}
    return set(REGIONS) - chosen if rule.outside else chosen


def specificity(rule: Rule) -> tuple[bool, bool, bool, bool, bool]:
    """data class > tenant > client country > client jurisdiction > model."""
    m = rule.match
    jurisdiction = m.client_jurisdictions is not None
    country_only = m.client_countries is not None and not jurisdiction
    return (
        m.data_classes is not None,
        m.tenants is not None,
        country_only,
        jurisdiction,
        m.models is not None,
    )


def _assumed(case: Case) -> set[str] | None:
    if case.unknown["action"] == UnknownLocationAction.ASSUME:
        return set(JURISDICTIONS[case.unknown["jurisdiction"]])
    return None


def matching(case: Case, query: ResidencyQuery, effect: Effect) -> list[Rule]:
    return [r for r in case.rules if r.effect is effect and matches(r, query, _assumed(case))]


def oracle(case: Case, query: ResidencyQuery) -> set[str]:
    if query.client_country is None and _assumed(case) is None:
        return set()
    allows = matching(case, query, Effect.ALLOW)
    if not allows:
        return set()
    best = max(allows, key=specificity)
    result = selected(best)
    for deny in matching(case, query, Effect.DENY):
        result -= selected(deny)
    return result


# ---------------------------------------------------------------------------- properties


@PROPERTY_SETTINGS
@given(case=cases(), query_list=st.lists(queries, min_size=1, max_size=10))
def test_every_allowed_region_is_allowed_by_the_matching_rules(
    case: Case, query_list: list[ResidencyQuery]
) -> None:
    for query in query_list:
        verdict = case.engine.allowed_regions(query)
        assert verdict.allowed == oracle(case, query)
        assert verdict.allowed <= set(REGIONS)
        if verdict.allowed:
            deciding = next(r for r in case.rules if r.name == verdict.rule)
            assert deciding.effect is Effect.ALLOW
            assert matches(deciding, query, _assumed(case))
            assert verdict.allowed <= selected(deciding)


@PROPERTY_SETTINGS
@given(case=cases(), query_list=st.lists(queries, min_size=1, max_size=10))
def test_an_empty_allowed_set_always_refuses(case: Case, query_list: list[ResidencyQuery]) -> None:
    for query in query_list:
        verdict: Verdict = case.engine.allowed_regions(query)
        assert verdict.refused is (not verdict.allowed)
        assert (verdict.reason in REFUSALS) is verdict.refused
        if not matching(case, query, Effect.ALLOW):
            # Fail closed: no allow rule never means "any region".
            assert verdict.refused


@PROPERTY_SETTINGS
@given(
    case=cases(),
    query_list=st.lists(queries, min_size=1, max_size=10),
    extra=rules("extra-deny"),
)
def test_deny_always_beats_allow(case: Case, query_list: list[ResidencyQuery], extra: Rule) -> None:
    deny = extra.model_copy(update={"effect": Effect.DENY, "on_saturation": None})
    with_deny = compile(build([*case.rules, deny], case.unknown))
    for query in query_list:
        verdict = case.engine.allowed_regions(query)
        for rule in matching(case, query, Effect.DENY):
            assert verdict.allowed.isdisjoint(selected(rule))
        after = with_deny.allowed_regions(query).allowed
        assert after <= verdict.allowed  # adding a deny never adds a region
        if matches(deny, query, _assumed(case)):
            assert after == verdict.allowed - selected(deny)


@PROPERTY_SETTINGS
@given(case=cases(), query=queries, data=st.data())
def test_more_specific_beats_less_specific(
    case: Case, query: ResidencyQuery, data: st.DataObject
) -> None:
    verdict = case.engine.allowed_regions(query)
    allows = matching(case, query, Effect.ALLOW)
    if verdict.rule is not None:
        deciding = next(r for r in case.rules if r.name == verdict.rule)
        assert specificity(deciding) == max(specificity(r) for r in allows)
    # A new allow rule naming this exact request outranks every rule that matched before.
    location = (
        {"client_countries": [query.client_country]} if query.client_country is not None else {}
    )
    narrow = Rule.model_validate(
        {
            "name": "narrowest",
            "effect": "allow",
            "match": {
                "tenants": [query.tenant],
                "data_classes": [query.data_class],
                "models": [query.model],
                **location,
            },
            "regions": data.draw(
                st.lists(st.sampled_from(list(REGIONS)), min_size=1, max_size=3, unique=True)
            ),
        }
    )
    extended = [*case.rules, narrow]
    assume(len(_without_conflicts(extended)) == len(extended))
    engine = compile(build(extended, case.unknown))
    after = engine.allowed_regions(query)
    if after.reason is ReasonCode.UNKNOWN_CLIENT_LOCATION:
        return
    if query.client_country is not None or all(
        specificity(narrow) > specificity(r) for r in allows
    ):
        assert after.rule == "narrowest"
        denied: set[str] = set()
        for deny in matching(case, query, Effect.DENY):
            denied |= selected(deny)
        assert after.allowed == selected(narrow) - denied
