"""The policy document kinds: one envelope, five specs.

Every file holds one or more documents of this shape (Kubernetes style, so editors and
reviewers know it)::

    apiVersion: gtm.dev/v1
    kind: Residency            # Jurisdictions | Regions | Residency | Tenants | RoutingProfiles
    metadata: {name: gdpr}
    spec: {...}

Spec fields are snake_case. Models are frozen and forbid unknown fields. Checks that
need more than one document (references, duplicates, conflicts) live in
:mod:`policies.policyset`; checks here are about one document alone.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import Field, JsonValue, TypeAdapter, field_validator, model_validator

from policies.apikeys import parse_hash
from policies.types import (
    CountryCode,
    Description,
    Frozen,
    Identifier,
    ModelName,
    PluginType,
    PositiveInt,
    Share,
    Weight,
)

API_VERSION = "gtm.dev/v1"


class Kind(StrEnum):
    JURISDICTIONS = "Jurisdictions"
    REGIONS = "Regions"
    RESIDENCY = "Residency"
    TENANTS = "Tenants"
    ROUTING_PROFILES = "RoutingProfiles"


class Metadata(Frozen):
    name: Identifier
    description: Description = ""


# ---------------------------------------------------------------------------- Jurisdictions


class Jurisdiction(Frozen):
    """A named set of countries: its own ``countries`` plus those of ``include``."""

    id: Identifier
    description: Description = ""
    countries: tuple[CountryCode, ...] = ()
    include: tuple[Identifier, ...] = ()

    @model_validator(mode="after")
    def _not_empty(self) -> Jurisdiction:
        if not self.countries and not self.include:
            raise ValueError("expected at least one entry in 'countries' or 'include'")
        return self


class JurisdictionsSpec(Frozen):
    jurisdictions: tuple[Jurisdiction, ...] = Field(min_length=1)


# ---------------------------------------------------------------------------- Regions


class GeoPoint(Frozen):
    """WGS 84 degrees."""

    lat: float = Field(ge=-90.0, le=90.0, allow_inf_nan=False)
    lon: float = Field(ge=-180.0, le=180.0, allow_inf_nan=False)


class Endpoint(Frozen):
    url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://\S+$")
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None


class Region(Frozen):
    """A region is in every jurisdiction that contains its ``country``. ``jurisdiction``
    optionally names the one used as its label (DNS ``<jurisdiction>.api.<zone>``)."""

    id: Identifier
    name: Description = ""
    country: CountryCode
    location: GeoPoint
    jurisdiction: Identifier | None = None
    endpoints: tuple[Endpoint, ...] = ()


class RegionsSpec(Frozen):
    regions: tuple[Region, ...] = Field(min_length=1)


# ---------------------------------------------------------------------------- Residency


class Effect(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class SaturationPolicy(StrEnum):
    """What a tier does when every allowed region is saturated."""

    REJECT = "reject"  # refuse (HTTP 429/503) rather than leave the preferred region
    SPILL_WITHIN_ALLOWED = "spill_within_allowed"  # spill to another *allowed* region


class UnknownLocationAction(StrEnum):
    DENY = "deny"  # refuse requests whose client country is unknown
    ASSUME = "assume"  # treat the client as located somewhere in ``jurisdiction``


class UnknownClientLocation(Frozen):
    """What to do when the client's country is unknown (no GeoIP match, private address).

    ``assume`` places the client *somewhere* in the named jurisdiction: a rule that
    matches client locations then applies only if it covers the whole jurisdiction
    (assume ``world`` and only location-independent rules apply).
    """

    action: UnknownLocationAction
    jurisdiction: Identifier | None = None

    @model_validator(mode="after")
    def _consistent(self) -> UnknownClientLocation:
        if self.action is UnknownLocationAction.ASSUME and self.jurisdiction is None:
            raise ValueError("action 'assume' needs a 'jurisdiction' to assume")
        if self.action is UnknownLocationAction.DENY and self.jurisdiction is not None:
            raise ValueError("action 'deny' takes no 'jurisdiction'")
        return self


def _no_empty_lists(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if value is not None and not value:
        raise ValueError("expected at least one entry (omit the field to match anything)")
    return value


class Match(Frozen):
    """Which requests a rule applies to. An omitted field matches anything; a listed
    field matches any of its values. ``client_countries`` and ``client_jurisdictions``
    together describe one set of client locations (their union)."""

    tenants: tuple[Identifier, ...] | None = None
    data_classes: tuple[Identifier, ...] | None = None
    client_countries: tuple[CountryCode, ...] | None = None
    client_jurisdictions: tuple[Identifier, ...] | None = None
    models: tuple[ModelName, ...] | None = None

    _non_empty = field_validator(
        "tenants", "data_classes", "client_countries", "client_jurisdictions", "models"
    )(_no_empty_lists)


class Rule(Frozen):
    """``allow`` the selected regions, or ``deny`` them, for the matching requests.

    The selection is ``regions`` ∪ regions in ``jurisdictions`` ∪ regions in
    ``countries`` — or every region (``all_regions``). ``outside: true`` selects the
    complement instead: ``effect: deny, jurisdictions: [eea], outside: true`` reads
    "deny every region outside the EEA".
    """

    name: Identifier
    description: Description = ""
    match: Match = Match()
    effect: Effect
    regions: tuple[Identifier, ...] = ()
    jurisdictions: tuple[Identifier, ...] = ()
    countries: tuple[CountryCode, ...] = ()
    all_regions: bool = False
    outside: bool = False
    on_saturation: SaturationPolicy | None = None

    @model_validator(mode="after")
    def _selection(self) -> Rule:
        selected = bool(self.regions or self.jurisdictions or self.countries)
        if self.all_regions and (selected or self.outside):
            raise ValueError("'all_regions' cannot be combined with a selection or 'outside'")
        if not self.all_regions and not selected:
            raise ValueError(
                "expected a selection: 'regions', 'jurisdictions', 'countries' or 'all_regions'"
            )
        if self.on_saturation is not None and self.effect is Effect.DENY:
            raise ValueError("'on_saturation' applies to allow rules only")
        return self


class ResidencySpec(Frozen):
    unknown_client_location: UnknownClientLocation | None = None
    on_saturation: SaturationPolicy | None = None
    rules: tuple[Rule, ...] = ()


# ---------------------------------------------------------------------------- Tenants


class PriorityClass(StrEnum):
    """Same values as :class:`gtm.models.Priority`."""

    INTERACTIVE = "interactive"
    BATCH = "batch"
    BEST_EFFORT = "best-effort"


class ApiKeyEntry(Frozen):
    """A stored API key: its public ``id`` and a salted scrypt hash of the whole key
    (format in :mod:`policies.apikeys`; make one with ``gtm policy hash-key``)."""

    id: str = Field(pattern=r"^[a-z0-9]{1,32}$")
    hash: str = Field(max_length=512)
    description: Description = ""

    @field_validator("hash")
    @classmethod
    def _hash_format(cls, value: str) -> str:
        try:
            parse_hash(value)
        except ValueError as exc:
            raise ValueError(
                f"{exc}, as printed by `gtm policy hash-key` (never the key itself)"
            ) from None
        return value


class Quotas(Frozen):
    """Per-tenant limits; an omitted limit is unlimited.

    ``weighted_tokens_per_minute`` counts ``input + output_weight × output`` tokens:
    a generated token costs a decode step while prompt tokens are prefilled in bulk.
    The default weight 4 follows list prices where output costs about 4× input
    (e.g. OpenAI gpt-4o, 2.50 vs 10.00 USD per million tokens, openai.com/api/pricing).
    """

    requests_per_minute: PositiveInt | None = None
    input_tokens_per_minute: PositiveInt | None = None
    output_tokens_per_minute: PositiveInt | None = None
    weighted_tokens_per_minute: PositiveInt | None = None
    output_weight: Weight = 4.0
    max_concurrent: PositiveInt | None = None


class RegionalShare(Frozen):
    """Fraction of the tenant's quotas reserved for one region."""

    region: Identifier
    share: Share


class Tenant(Frozen):
    id: Identifier
    name: Description = ""
    priority: PriorityClass = PriorityClass.INTERACTIVE
    api_keys: tuple[ApiKeyEntry, ...] = ()
    quotas: Quotas = Quotas()
    #: Regions not listed share what the listed ones leave (1 − sum of shares).
    regional_shares: tuple[RegionalShare, ...] = ()
    #: ``None`` (omitted): any model.
    allowed_models: tuple[ModelName, ...] | None = None

    @model_validator(mode="after")
    def _shares(self) -> Tenant:
        total = math.fsum(s.share for s in self.regional_shares)
        if total > 1.0 + 1e-9:
            raise ValueError(f"regional shares add up to {total:g}; expected at most 1")
        regions = [s.region for s in self.regional_shares]
        if len(set(regions)) != len(regions):
            raise ValueError("a region appears twice in 'regional_shares'")
        return self


class TenantsSpec(Frozen):
    tenants: tuple[Tenant, ...] = Field(min_length=1)


# ---------------------------------------------------------------------------- RoutingProfiles


class TierName(StrEnum):
    """Same values as :class:`gtm.models.Tier`."""

    GLOBAL = "global"
    REGIONAL = "regional"
    ZONE = "zone"


class PluginSpec(Frozen):
    """A configured plugin instance (llm-d ``plugins: [{type, name, parameters}]``);
    ``name`` defaults to ``type``, as in llm-d. The routing framework
    (:mod:`gtm.routing.registry`) uses this model and :class:`ScorerRef` for every
    profile it builds, from the policy files or built in: one definition, one validation.
    Types read ``<concept>-<filter|scorer|picker|cost-model>`` (e.g. ``health-filter``);
    a tier keeps accepting the names used before as deprecated aliases.

    ``parameters`` is validated by the plugin's own parameter model when a tier builds
    it; policies only checks that it is JSON. Treat it as read-only.
    """

    type: PluginType
    name: Identifier | None = None
    parameters: dict[str, JsonValue] = Field(default_factory=dict)

    @property
    def plugin_name(self) -> str:
        return self.name if self.name is not None else self.type


#: Upper bound on a scorer weight: keeps Σ w finite; config weights are small (llm-d uses 1–3).
MAX_SCORER_WEIGHT = 1e6


class ScorerRef(Frozen):
    ref: Identifier
    #: > 0; remove the scorer to turn it off (same rule as gtm.routing.registry).
    weight: float = Field(default=1.0, gt=0.0, le=MAX_SCORER_WEIGHT, allow_inf_nan=False)


class Profile(Frozen):
    """filter → score → pick, by plugin name; exactly one picker, and optionally a cost
    model that prices the choice (predicted TTFT)."""

    name: Identifier
    tier: TierName
    filters: tuple[Identifier, ...] = ()
    scorers: tuple[ScorerRef, ...] = ()
    picker: Identifier
    cost_model: Identifier | None = None

    def refs(self) -> tuple[str, ...]:
        """Every plugin name the profile uses, in order, without repeats."""
        names = [*self.filters, *(s.ref for s in self.scorers), self.picker]
        if self.cost_model is not None:
            names.append(self.cost_model)
        return tuple(dict.fromkeys(names))


class RoutingProfilesSpec(Frozen):
    """Plugin instances shared by name, and the profiles that use them. Each tier builds
    the profiles of its own tier with its own registry and follows policy changes; a
    profile named ``<tier>-default`` replaces that tier's built-in default."""

    plugins: tuple[PluginSpec, ...] = Field(min_length=1)
    profiles: tuple[Profile, ...] = Field(min_length=1)


# ---------------------------------------------------------------------------- envelope


class _Document(Frozen):
    api_version: Literal["gtm.dev/v1"] = Field(alias="apiVersion")
    metadata: Metadata

    @property
    def name(self) -> str:
        return self.metadata.name


class JurisdictionsDocument(_Document):
    kind: Literal["Jurisdictions"]
    spec: JurisdictionsSpec


class RegionsDocument(_Document):
    kind: Literal["Regions"]
    spec: RegionsSpec


class ResidencyDocument(_Document):
    kind: Literal["Residency"]
    spec: ResidencySpec


class TenantsDocument(_Document):
    kind: Literal["Tenants"]
    spec: TenantsSpec


class RoutingProfilesDocument(_Document):
    kind: Literal["RoutingProfiles"]
    spec: RoutingProfilesSpec


PolicyDocument = (
    JurisdictionsDocument
    | RegionsDocument
    | ResidencyDocument
    | TenantsDocument
    | RoutingProfilesDocument
)

#: kind → document model. Read-only.
DOCUMENT_TYPES: Mapping[Kind, type[PolicyDocument]] = MappingProxyType(
    {
        Kind.JURISDICTIONS: JurisdictionsDocument,
        Kind.REGIONS: RegionsDocument,
        Kind.RESIDENCY: ResidencyDocument,
        Kind.TENANTS: TenantsDocument,
        Kind.ROUTING_PROFILES: RoutingProfilesDocument,
    }
)


def json_schema(kind: Kind | None = None) -> dict[str, JsonValue]:
    """The JSON Schema of one kind, or of any policy document (for editor validation)."""
    if kind is not None:
        schema: dict[str, JsonValue] = DOCUMENT_TYPES[kind].model_json_schema(by_alias=True)
    else:
        adapter: TypeAdapter[PolicyDocument] = TypeAdapter(
            Annotated[PolicyDocument, Field(discriminator="kind")]
        )
        schema = adapter.json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://gtm.dev/schemas/v1/{kind.value if kind else 'policy'}.json"
    return schema
