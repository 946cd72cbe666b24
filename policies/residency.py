"""The residency engine: which regions may serve a request. One implementation, used by
every tier as a hard pre-filter before any scoring.

``compile(policy_set)`` precomputes, per tenant, the short list of rules that can
apply (sorted most specific first), so a verdict scans a handful of rules; verdicts
are memoised on the query (a bounded LRU), so steady traffic is a dict lookup.

**Fail closed.** An empty allowed set is a refusal with a :class:`ReasonCode`, never a
fallback to "any region": no matching allow rule, deny rules removing everything, an
allow selecting no existing region, an unknown tenant, or an unknown client location
when the policy says ``deny``. Precedence is documented in :mod:`policies.rules`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from policies.documents import Effect, SaturationPolicy, UnknownLocationAction
from policies.policyset import PolicySet
from policies.rules import CompiledRule

#: Distinct queries remembered. A query is (tenant, data class, country, model): with
#: 100 tenants × 3 classes × 50 countries × 5 models = 75k combinations in play, the
#: working set of a real deployment fits; evictions only cost a re-evaluation.
DEFAULT_CACHE_SIZE = 65_536


#: (tenant, client country) pairs whose pre-filtered rule lists are kept: 1,000 tenants ×
#: 250 countries; each entry is two short tuples.
_MAX_LOCATED = 250_000


class ReasonCode(StrEnum):
    ALLOWED = "allowed"
    #: Allowed, but deny rules removed some of the regions the allow rule selected.
    ALLOWED_AFTER_DENY = "allowed-after-deny"
    NO_MATCHING_RULE = "no-matching-rule"
    DENIED = "denied"
    #: The deciding allow rule selects no region that exists.
    NO_REGION_SELECTED = "no-region-selected"
    UNKNOWN_CLIENT_LOCATION = "unknown-client-location"
    UNKNOWN_TENANT = "unknown-tenant"


@dataclass(frozen=True, slots=True)
class ResidencyQuery:
    """What residency depends on. ``client_country`` is ISO 3166-1 alpha-2, or ``None``
    when unknown. Holds no prompt text."""

    tenant: str
    model: str
    data_class: str = "default"
    client_country: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: frozenset[str]
    reason: ReasonCode
    #: The allow rule that gave the base set (``None`` if none matched).
    rule: str | None = None
    #: Deny rules that removed at least one region, in evaluation order.
    denied_by: tuple[str, ...] = ()
    on_saturation: SaturationPolicy = SaturationPolicy.REJECT
    #: The jurisdiction assumed for a client of unknown location, if any.
    assumed_jurisdiction: str | None = None

    @property
    def refused(self) -> bool:
        return not self.allowed

    def explain(self) -> str:
        """One line for logs and ``gtm policy explain``."""
        regions = ", ".join(sorted(self.allowed)) or "none"
        parts = [f"{self.reason.value}: regions {{{regions}}}"]
        if self.rule:
            parts.append(f"allow rule {self.rule!r}")
        if self.denied_by:
            parts.append("minus deny rule(s) " + ", ".join(map(repr, self.denied_by)))
        if self.assumed_jurisdiction:
            parts.append(f"client location unknown, assumed {self.assumed_jurisdiction!r}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class _RuleLists:
    allows: tuple[CompiledRule, ...]  # most specific first
    denies: tuple[CompiledRule, ...]


class ResidencyEngine:
    """Compiled residency rules. Immutable; safe to share between threads and tasks."""

    def __init__(self, policy_set: PolicySet, *, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._policy_set = policy_set
        self._regions = frozenset(policy_set.regions)
        settings = policy_set.settings
        self._on_saturation = settings.on_saturation
        unknown = settings.unknown_client_location
        self._assumed_name = (
            unknown.jurisdiction if unknown.action is UnknownLocationAction.ASSUME else None
        )
        self._assumed = policy_set.jurisdictions[self._assumed_name] if self._assumed_name else None
        self._check_tenant = bool(policy_set.tenants)
        rules = sorted(policy_set.rules, key=lambda r: (-r.specificity, r.name))
        self._any_tenant = _lists(r for r in rules if r.tenants is None)
        mentioned = {t for r in rules if r.tenants is not None for t in r.tenants}
        self._by_tenant: Mapping[str, _RuleLists] = {
            t: _lists(r for r in rules if r.tenants is None or t in r.tenants)
            for t in mentioned | set(policy_set.tenants)
        }
        self._by_location: dict[tuple[str, str | None], _RuleLists] = {}
        self._cached = functools.lru_cache(maxsize=cache_size)(self._evaluate)

    @property
    def policy_set(self) -> PolicySet:
        return self._policy_set

    @property
    def regions(self) -> frozenset[str]:
        return self._regions

    @property
    def digest(self) -> str:
        return self._policy_set.digest

    def allowed_regions(self, query: ResidencyQuery) -> Verdict:
        """The regions that may serve ``query``; ``verdict.refused`` when there are none."""
        return self._cached(query)

    def matching_rules(self, query: ResidencyQuery) -> tuple[CompiledRule, ...]:
        """Every rule that matches ``query``, most specific first (for explanations;
        not memoised)."""
        lists = self._by_tenant.get(query.tenant, self._any_tenant)
        assumed = self._assumed if query.client_country is None else None
        args = (query.tenant, query.data_class, query.client_country, assumed, query.model)
        found = [r for r in (*lists.allows, *lists.denies) if r.matches(*args)]
        return tuple(sorted(found, key=lambda r: (-r.specificity, r.name)))

    def cache_info(self) -> functools._CacheInfo:
        return self._cached.cache_info()

    def _evaluate(self, query: ResidencyQuery) -> Verdict:
        if self._check_tenant and query.tenant not in self._policy_set.tenants:
            return self._refuse(ReasonCode.UNKNOWN_TENANT)
        country = query.client_country
        if country is None and self._assumed is None:
            return self._refuse(ReasonCode.UNKNOWN_CLIENT_LOCATION)
        assumed_name = self._assumed_name if country is None else None
        lists = self._located(query.tenant, country)
        data_class, model = query.data_class, query.model
        # Tenant and location are already filtered: only data class and model remain.
        base = None
        for rule in lists.allows:
            if (rule.data_classes is None or data_class in rule.data_classes) and (
                rule.models is None or model in rule.models
            ):
                base = rule
                break
        if base is None:
            return self._refuse(ReasonCode.NO_MATCHING_RULE, assumed=assumed_name)
        allowed = base.regions
        denied_by = []
        for deny in lists.denies:
            if (
                not allowed.isdisjoint(deny.regions)
                and (deny.data_classes is None or data_class in deny.data_classes)
                and (deny.models is None or model in deny.models)
            ):
                allowed = allowed - deny.regions
                denied_by.append(deny.name)
        if not allowed:
            reason = ReasonCode.DENIED if denied_by else ReasonCode.NO_REGION_SELECTED
        else:
            reason = ReasonCode.ALLOWED_AFTER_DENY if denied_by else ReasonCode.ALLOWED
        return Verdict(
            allowed=allowed,
            reason=reason,
            rule=base.name,
            denied_by=tuple(denied_by),
            on_saturation=base.on_saturation or self._on_saturation,
            assumed_jurisdiction=assumed_name,
        )

    def _located(self, tenant: str, country: str | None) -> _RuleLists:
        """The tenant's rules that match a client in ``country`` (or, when ``None``,
        somewhere in the assumed jurisdiction), most specific first. Memoised per
        (tenant, country) up to a bound; past it, computed each time."""
        key = (tenant, country)
        lists = self._by_location.get(key)
        if lists is None:
            assumed = self._assumed if country is None else None
            base = self._by_tenant.get(tenant, self._any_tenant)
            lists = _RuleLists(
                allows=tuple(r for r in base.allows if _at(r, country, assumed)),
                denies=tuple(r for r in base.denies if _at(r, country, assumed)),
            )
            if len(self._by_location) < _MAX_LOCATED:
                self._by_location[key] = lists  # a racing thread stores an equal value
        return lists

    def _refuse(self, reason: ReasonCode, *, assumed: str | None = None) -> Verdict:
        return Verdict(
            allowed=frozenset(),
            reason=reason,
            on_saturation=self._on_saturation,
            assumed_jurisdiction=assumed,
        )


def _at(rule: CompiledRule, country: str | None, assumed: frozenset[str] | None) -> bool:
    if rule.locations is None:
        return True
    if country is not None:
        return country in rule.locations
    return assumed is not None and assumed <= rule.locations


def _lists(rules: Iterable[CompiledRule]) -> _RuleLists:
    ordered = tuple(rules)
    return _RuleLists(
        allows=tuple(r for r in ordered if r.effect is Effect.ALLOW),
        denies=tuple(r for r in ordered if r.effect is Effect.DENY),
    )


def compile(policy_set: PolicySet, *, cache_size: int = DEFAULT_CACHE_SIZE) -> ResidencyEngine:
    """Compile a validated policy set into a :class:`ResidencyEngine`."""
    return ResidencyEngine(policy_set, cache_size=cache_size)
