"""Residency rules, resolved to region sets, with their specificity and conflicts.

Precedence (the contract every tier relies on; ``gtm policy explain`` shows it):

1. **Deny overrides allow.** Every matching ``deny`` rule removes its regions, whatever
   its specificity. Write hard legal constraints as denies (``effect: deny, outside:
   true``): no more specific allow can lift them.
2. **The most specific matching allow rule gives the allowed set.** Specificity
   compares which match fields a rule names, in this order (lexicographic, so a rule
   naming a data class beats every rule that does not, whatever else they name):

   ====  ========================  ==========================================
   rank  field                     why
   ====  ========================  ==========================================
   1     ``data_classes``          the data's own classification is strongest
   2     ``tenants``               a contract with one customer
   3     ``client_countries``      law of the client's country
   4     ``client_jurisdictions``  law of a group of countries
   5     ``models``                model licensing / availability
   ====  ========================  ==========================================

   A rule naming both client countries and client jurisdictions ranks as a
   jurisdiction rule (its location set is the broader one).
3. **No matching allow rule means refusal** (fail closed): a policy set that should
   allow traffic by default says so with a catch-all ``allow`` (``match: {}``).
4. **Two allow rules of equal specificity that can match the same request must agree**
   (same regions, same ``on_saturation``); otherwise loading fails with
   :class:`~policies.errors.PolicyConflictError` naming both. An allow and a deny of
   equal specificity are fine: the deny wins (rule 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntFlag

from policies.documents import Effect, Region, Rule, SaturationPolicy


class Specificity(IntFlag):
    """Bits of a rule's specificity; a larger integer is more specific."""

    MODEL = 1
    CLIENT_JURISDICTION = 2
    CLIENT_COUNTRY = 4
    TENANT = 8
    DATA_CLASS = 16


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule with every reference resolved. ``None`` match sets match anything;
    ``locations`` is the set of client countries the rule covers."""

    name: str
    effect: Effect
    specificity: int
    tenants: frozenset[str] | None
    data_classes: frozenset[str] | None
    locations: frozenset[str] | None
    models: frozenset[str] | None
    regions: frozenset[str]
    on_saturation: SaturationPolicy | None
    source: str
    line: int

    def matches(
        self,
        tenant: str,
        data_class: str,
        country: str | None,
        assumed: frozenset[str] | None,
        model: str,
    ) -> bool:
        """Whether the rule applies. The client is in ``country`` when known, else
        somewhere in ``assumed`` (``None``: location unknown and nothing assumed)."""
        if self.tenants is not None and tenant not in self.tenants:
            return False
        if self.data_classes is not None and data_class not in self.data_classes:
            return False
        if self.models is not None and model not in self.models:
            return False
        if self.locations is not None:
            if country is not None:
                return country in self.locations
            # Somewhere in ``assumed``: the rule applies only if it covers all of it.
            return assumed is not None and assumed <= self.locations
        return True


def specificity_of(rule: Rule) -> int:
    match = rule.match
    bits = Specificity(0)
    if match.data_classes is not None:
        bits |= Specificity.DATA_CLASS
    if match.tenants is not None:
        bits |= Specificity.TENANT
    if match.client_jurisdictions is not None:
        bits |= Specificity.CLIENT_JURISDICTION
    elif match.client_countries is not None:
        bits |= Specificity.CLIENT_COUNTRY
    if match.models is not None:
        bits |= Specificity.MODEL
    return int(bits)


def describe_specificity(value: int) -> str:
    names = [flag.name.lower() for flag in Specificity if value & flag and flag.name]
    return "+".join(reversed(names)) or "catch-all"


def compile_rule(
    rule: Rule,
    *,
    source: str,
    line: int,
    jurisdictions: Mapping[str, frozenset[str]],
    regions: Mapping[str, Region],
) -> CompiledRule:
    """Resolve one rule's references. References must already be known to exist."""
    match = rule.match
    locations: frozenset[str] | None = None
    if match.client_countries is not None or match.client_jurisdictions is not None:
        locations = frozenset(match.client_countries or ()).union(
            *(jurisdictions[j] for j in match.client_jurisdictions or ())
        )
    return CompiledRule(
        name=rule.name,
        effect=rule.effect,
        specificity=specificity_of(rule),
        tenants=_opt(match.tenants),
        data_classes=_opt(match.data_classes),
        locations=locations,
        models=_opt(match.models),
        regions=select_regions(rule, jurisdictions, regions),
        on_saturation=rule.on_saturation,
        source=source,
        line=line,
    )


def _opt(values: Iterable[str] | None) -> frozenset[str] | None:
    return None if values is None else frozenset(values)


def select_regions(
    rule: Rule, jurisdictions: Mapping[str, frozenset[str]], regions: Mapping[str, Region]
) -> frozenset[str]:
    """The region ids a rule's selection names (its complement when ``outside``)."""
    if rule.all_regions:
        return frozenset(regions)
    countries = frozenset(rule.countries).union(*(jurisdictions[j] for j in rule.jurisdictions))
    selected = frozenset(rule.regions) | {
        rid for rid, region in regions.items() if region.country in countries
    }
    return frozenset(regions) - selected if rule.outside else selected


def _overlap(a: frozenset[str] | None, b: frozenset[str] | None) -> bool:
    return a is None or b is None or not a.isdisjoint(b)


def can_both_match(a: CompiledRule, b: CompiledRule) -> bool:
    """Whether some request matches both rules (exact: each field is a finite set or any).

    For an assumed location J the client matches a rule only if J ⊆ its locations, so
    two rules both match only if their location sets intersect — this check covers it.
    """
    return (
        _overlap(a.tenants, b.tenants)
        and _overlap(a.data_classes, b.data_classes)
        and _overlap(a.locations, b.locations)
        and _overlap(a.models, b.models)
    )


def find_conflicts(rules: Iterable[CompiledRule]) -> list[tuple[CompiledRule, CompiledRule]]:
    """Pairs of allow rules of equal specificity that can match one request but disagree."""
    by_specificity: dict[int, list[CompiledRule]] = {}
    for rule in rules:
        if rule.effect is Effect.ALLOW:
            by_specificity.setdefault(rule.specificity, []).append(rule)
    conflicts = []
    for group in by_specificity.values():
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                disagree = a.regions != b.regions or a.on_saturation != b.on_saturation
                if disagree and can_both_match(a, b):
                    conflicts.append((a, b))
    return conflicts
