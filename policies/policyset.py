"""A complete, cross-checked set of policy documents.

:func:`build_policy_set` checks everything that spans documents — duplicate ids,
references to unknown jurisdictions, regions, tenants and plugins, include cycles,
conflicting rules — and reports each problem at the file and line of the *referencing*
field. A :class:`PolicySet` only exists if all of that passed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any

from policies.documents import (
    JurisdictionsDocument,
    Kind,
    PluginSpec,
    PolicyDocument,
    Profile,
    Region,
    RegionsDocument,
    ResidencyDocument,
    RoutingProfilesDocument,
    Rule,
    SaturationPolicy,
    Tenant,
    TenantsDocument,
    UnknownClientLocation,
    UnknownLocationAction,
)
from policies.errors import PolicyConflictError, PolicyValidationError, Problem
from policies.rules import CompiledRule, compile_rule, describe_specificity, find_conflicts
from policies.yamlsafe import ParsedDocument, format_path, parse_yaml
from policies.yamlsafe import Path as FieldPath

#: Key ids shared by more than this many keys are refused: each sharer costs one more
#: scrypt on a key's first use (see policies.apikeys).
MAX_KEYS_PER_ID = 4


@dataclass(frozen=True, slots=True)
class LoadedDocument:
    """A validated document and where it came from (a file, or a state-store key)."""

    source: str
    document: PolicyDocument
    parsed: ParsedDocument | None = None

    @property
    def kind(self) -> Kind:
        return Kind(self.document.kind)

    @property
    def name(self) -> str:
        return self.document.metadata.name

    def line_of(self, *path: str | int) -> int:
        return self.parsed.line_of(path) if self.parsed is not None else 0

    def where(self, *path: str | int) -> str:
        line = self.line_of(*path)
        return f"{self.source}:{line}" if line else self.source


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII: one byte string per value, for hashing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def document_json(document: PolicyDocument) -> bytes:
    """A document's canonical JSON (what ``gtm policy apply`` stores)."""
    return canonical_json(document.model_dump(mode="json", by_alias=True))


@dataclass(frozen=True, slots=True)
class ResidencySettings:
    """Set-wide residency settings. The defaults fail closed."""

    unknown_client_location: UnknownClientLocation = field(
        default_factory=lambda: UnknownClientLocation(action=UnknownLocationAction.DENY)
    )
    on_saturation: SaturationPolicy = SaturationPolicy.REJECT


@dataclass(frozen=True, slots=True)
class PolicySet:
    """Every document of a policy set, and the indexes the tiers use (read-only)."""

    documents: tuple[LoadedDocument, ...]
    jurisdictions: Mapping[str, frozenset[str]]
    regions: Mapping[str, Region]
    tenants: Mapping[str, Tenant]
    rules: tuple[CompiledRule, ...]
    settings: ResidencySettings
    plugins: Mapping[str, PluginSpec]
    profiles: Mapping[str, Profile]
    #: sha256 of the canonical JSON of every document, sorted by (kind, name):
    #: equal digests mean equal policies, whatever the files were called.
    digest: str

    def of_kind(self, kind: Kind) -> tuple[LoadedDocument, ...]:
        return tuple(d for d in self.documents if d.kind is kind)

    def rule(self, name: str) -> CompiledRule | None:
        return next((r for r in self.rules if r.name == name), None)

    def profile_config(self, name: str) -> dict[str, Any]:
        """One routing profile in the per-profile shape of ``gtm.routing.registry``
        (``{name, plugins, profile: {filters, scorers, picker, cost_model}}``), holding
        only the plugins it uses. Raises KeyError for an unknown profile."""
        profile = self.profiles[name]
        return {
            "name": profile.name,
            "plugins": [
                self.plugins[ref].model_dump(mode="json", exclude_none=True)
                for ref in profile.refs()
            ],
            "profile": profile.model_dump(mode="json", exclude={"name", "tier"}),
        }


@functools.cache
def known_countries() -> frozenset[str]:
    """ISO 3166-1 alpha-2 codes, from the ``world`` jurisdiction of the built-in data."""
    text = (resources.files("policies") / "data" / "jurisdictions.yaml").read_text("utf-8")
    (doc,) = parse_yaml(text)
    for entry in doc.data["spec"]["jurisdictions"]:
        if entry["id"] == "world":
            return frozenset(entry["countries"])
    raise RuntimeError("built-in jurisdictions.yaml has no 'world' jurisdiction")


def build_policy_set(documents: Iterable[LoadedDocument]) -> PolicySet:
    """Cross-check documents and index them.

    Raises:
        PolicyConflictError: only conflicting rules were found.
        PolicyValidationError: any other problem (all of them, in file order).
    """
    return _Builder(tuple(documents)).build()


def policy_digest(documents: Iterable[LoadedDocument]) -> str:
    ordered = sorted(documents, key=lambda d: (d.kind.value, d.name))
    body = b"\n".join(document_json(d.document) for d in ordered)
    return hashlib.sha256(body).hexdigest()


class _Builder:
    def __init__(self, documents: tuple[LoadedDocument, ...]) -> None:
        self._docs = documents
        self._problems: list[Problem] = []
        self._conflicts: list[Problem] = []
        self._countries = known_countries()

    def _problem(self, doc: LoadedDocument, path: FieldPath, message: str) -> None:
        self._problems.append(Problem(doc.source, doc.line_of(*path), format_path(path), message))

    def build(self) -> PolicySet:
        self._check_unique_documents()
        jurisdictions = self._jurisdictions()
        regions = self._regions(jurisdictions)
        tenants = self._tenants(regions)
        settings = self._settings(jurisdictions)
        rules = self._rules(jurisdictions, regions, tenants)
        plugins, profiles = self._routing()
        if self._problems or self._conflicts:
            problems = tuple(self._problems + self._conflicts)
            if self._problems:
                raise PolicyValidationError(problems)
            raise PolicyConflictError(problems)
        return PolicySet(
            documents=self._docs,
            jurisdictions=MappingProxyType(jurisdictions),
            regions=MappingProxyType(regions),
            tenants=MappingProxyType(tenants),
            rules=rules,
            settings=settings,
            plugins=MappingProxyType(plugins),
            profiles=MappingProxyType(profiles),
            digest=policy_digest(self._docs),
        )

    def _of(self, doc_type: type[Any]) -> list[tuple[LoadedDocument, Any]]:
        return [(d, d.document) for d in self._docs if isinstance(d.document, doc_type)]

    def _check_unique_documents(self) -> None:
        seen: dict[tuple[str, str], LoadedDocument] = {}
        for doc in self._docs:
            key = (doc.kind.value, doc.name)
            if key in seen:
                self._problem(
                    doc,
                    ("metadata", "name"),
                    f"a {doc.kind.value} document named {doc.name!r} is already defined at "
                    f"{seen[key].where('metadata', 'name')}",
                )
            else:
                seen[key] = doc

    def _unique(
        self,
        seen: dict[str, tuple[LoadedDocument, FieldPath]],
        doc: LoadedDocument,
        path: FieldPath,
        what: str,
        ident: str,
    ) -> bool:
        if ident in seen:
            first_doc, first_path = seen[ident]
            self._problem(
                doc, path, f"{what} {ident!r} is already defined at {first_doc.where(*first_path)}"
            )
            return False
        seen[ident] = (doc, path)
        return True

    def _country(self, doc: LoadedDocument, path: FieldPath, code: str) -> None:
        if code not in self._countries:
            self._problem(doc, path, f"unknown country code {code!r} (not in ISO 3166-1)")

    # ------------------------------------------------------------------ jurisdictions

    def _jurisdictions(self) -> dict[str, frozenset[str]]:
        seen: dict[str, tuple[LoadedDocument, FieldPath]] = {}
        entries = {}
        for doc, jdoc in self._of(JurisdictionsDocument):
            for i, j in enumerate(jdoc.spec.jurisdictions):
                path: FieldPath = ("spec", "jurisdictions", i)
                if self._unique(seen, doc, (*path, "id"), "jurisdiction", j.id):
                    entries[j.id] = (doc, path, j)
                for k, code in enumerate(j.countries):
                    self._country(doc, (*path, "countries", k), code)
        resolved: dict[str, frozenset[str]] = {}
        for jid in entries:
            self._resolve(jid, entries, resolved, ())
        return resolved

    def _resolve(
        self,
        jid: str,
        entries: dict[str, tuple[LoadedDocument, FieldPath, Any]],
        resolved: dict[str, frozenset[str]],
        stack: tuple[str, ...],
    ) -> frozenset[str]:
        if jid in resolved:
            return resolved[jid]
        doc, path, j = entries[jid]
        countries = set(j.countries)
        for k, inc in enumerate(j.include):
            where: FieldPath = (*path, "include", k)
            if inc not in entries:
                self._problem(doc, where, f"unknown jurisdiction {inc!r}{_known(entries)}")
            elif inc in stack or inc == jid:
                cycle = " → ".join((*stack, jid, inc))
                self._problem(doc, where, f"jurisdiction includes itself ({cycle})")
            else:
                countries |= self._resolve(inc, entries, resolved, (*stack, jid))
        resolved[jid] = frozenset(countries)
        return resolved[jid]

    def _jurisdiction_ref(
        self,
        doc: LoadedDocument,
        path: FieldPath,
        jid: str,
        jurisdictions: Mapping[str, frozenset[str]],
    ) -> bool:
        if jid not in jurisdictions:
            self._problem(doc, path, f"unknown jurisdiction {jid!r}{_known(jurisdictions)}")
            return False
        return True

    # ------------------------------------------------------------------ regions

    def _regions(self, jurisdictions: Mapping[str, frozenset[str]]) -> dict[str, Region]:
        seen: dict[str, tuple[LoadedDocument, FieldPath]] = {}
        regions: dict[str, Region] = {}
        for doc, rdoc in self._of(RegionsDocument):
            for i, region in enumerate(rdoc.spec.regions):
                path: FieldPath = ("spec", "regions", i)
                if self._unique(seen, doc, (*path, "id"), "region", region.id):
                    regions[region.id] = region
                self._country(doc, (*path, "country"), region.country)
                label = region.jurisdiction
                where: FieldPath = (*path, "jurisdiction")
                if (
                    label is not None
                    and self._jurisdiction_ref(doc, where, label, jurisdictions)
                    and region.country not in jurisdictions[label]
                ):
                    self._problem(
                        doc, where, f"jurisdiction {label!r} does not contain {region.country}"
                    )
        return regions

    def _region_ref(
        self, doc: LoadedDocument, path: FieldPath, rid: str, regions: Mapping[str, Region]
    ) -> None:
        if rid not in regions:
            self._problem(doc, path, f"unknown region {rid!r}{_known(regions)}")

    # ------------------------------------------------------------------ tenants

    def _tenants(self, regions: Mapping[str, Region]) -> dict[str, Tenant]:
        seen: dict[str, tuple[LoadedDocument, FieldPath]] = {}
        key_ids: dict[str, int] = {}
        tenants: dict[str, Tenant] = {}
        for doc, tdoc in self._of(TenantsDocument):
            for i, tenant in enumerate(tdoc.spec.tenants):
                path: FieldPath = ("spec", "tenants", i)
                if self._unique(seen, doc, (*path, "id"), "tenant", tenant.id):
                    tenants[tenant.id] = tenant
                for k, share in enumerate(tenant.regional_shares):
                    self._region_ref(
                        doc, (*path, "regional_shares", k, "region"), share.region, regions
                    )
                for k, entry in enumerate(tenant.api_keys):
                    key_ids[entry.id] = key_ids.get(entry.id, 0) + 1
                    if key_ids[entry.id] == MAX_KEYS_PER_ID + 1:
                        self._problem(
                            doc,
                            (*path, "api_keys", k, "id"),
                            f"more than {MAX_KEYS_PER_ID} keys share the key id {entry.id!r}; "
                            "generate keys with `gtm policy hash-key` (unique ids)",
                        )
        return tenants

    # ------------------------------------------------------------------ residency

    def _settings(self, jurisdictions: Mapping[str, frozenset[str]]) -> ResidencySettings:
        unknown: tuple[UnknownClientLocation, str] | None = None
        saturation: tuple[SaturationPolicy, str] | None = None
        for doc, rdoc in self._of(ResidencyDocument):
            spec = rdoc.spec
            if spec.unknown_client_location is not None:
                path: FieldPath = ("spec", "unknown_client_location")
                here = doc.where(*path)
                if unknown is not None and unknown[0] != spec.unknown_client_location:
                    self._problem(doc, path, f"conflicts with the setting at {unknown[1]}")
                unknown = unknown or (spec.unknown_client_location, here)
                assumed = spec.unknown_client_location.jurisdiction
                if assumed is not None:
                    self._jurisdiction_ref(doc, (*path, "jurisdiction"), assumed, jurisdictions)
            if spec.on_saturation is not None:
                path = ("spec", "on_saturation")
                if saturation is not None and saturation[0] != spec.on_saturation:
                    self._problem(doc, path, f"conflicts with the setting at {saturation[1]}")
                saturation = saturation or (spec.on_saturation, doc.where(*path))
        settings = ResidencySettings()
        return ResidencySettings(
            unknown_client_location=unknown[0] if unknown else settings.unknown_client_location,
            on_saturation=saturation[0] if saturation else settings.on_saturation,
        )

    def _rules(
        self,
        jurisdictions: Mapping[str, frozenset[str]],
        regions: Mapping[str, Region],
        tenants: Mapping[str, Tenant],
    ) -> tuple[CompiledRule, ...]:
        seen: dict[str, tuple[LoadedDocument, FieldPath]] = {}
        compiled: list[CompiledRule] = []
        for doc, rdoc in self._of(ResidencyDocument):
            for i, rule in enumerate(rdoc.spec.rules):
                path: FieldPath = ("spec", "rules", i)
                unique = self._unique(seen, doc, (*path, "name"), "rule", rule.name)
                before = len(self._problems)
                self._rule_refs(doc, path, rule, jurisdictions, regions, tenants)
                if unique and len(self._problems) == before:
                    compiled.append(
                        compile_rule(
                            rule,
                            source=doc.source,
                            line=doc.line_of(*path),
                            jurisdictions=jurisdictions,
                            regions=regions,
                        )
                    )
        for a, b in find_conflicts(compiled):
            self._conflicts.append(
                Problem(
                    b.source,
                    b.line,
                    f"rule {b.name!r}",
                    f"conflicts with rule {a.name!r} at {a.source}:{a.line}: both are "
                    f"{describe_specificity(a.specificity)} allow rules that can match the "
                    f"same request but allow different regions "
                    f"({_regions(a)} vs {_regions(b)}) or saturation handling; "
                    "make one more specific, narrow their matches, or make them agree",
                )
            )
        return tuple(compiled)

    def _rule_refs(
        self,
        doc: LoadedDocument,
        path: FieldPath,
        rule: Rule,
        jurisdictions: Mapping[str, frozenset[str]],
        regions: Mapping[str, Region],
        tenants: Mapping[str, Tenant],
    ) -> None:
        match = rule.match
        for k, tid in enumerate(match.tenants or ()):
            if tid not in tenants:
                self._problem(
                    doc, (*path, "match", "tenants", k), f"unknown tenant {tid!r}{_known(tenants)}"
                )
        for k, code in enumerate(match.client_countries or ()):
            self._country(doc, (*path, "match", "client_countries", k), code)
        for k, jid in enumerate(match.client_jurisdictions or ()):
            where: FieldPath = (*path, "match", "client_jurisdictions", k)
            self._jurisdiction_ref(doc, where, jid, jurisdictions)
        for k, rid in enumerate(rule.regions):
            self._region_ref(doc, (*path, "regions", k), rid, regions)
        for k, jid in enumerate(rule.jurisdictions):
            self._jurisdiction_ref(doc, (*path, "jurisdictions", k), jid, jurisdictions)
        for k, code in enumerate(rule.countries):
            self._country(doc, (*path, "countries", k), code)

    # ------------------------------------------------------------------ routing profiles

    def _routing(self) -> tuple[dict[str, PluginSpec], dict[str, Profile]]:
        plugin_seen: dict[str, tuple[LoadedDocument, FieldPath]] = {}
        profile_seen: dict[str, tuple[LoadedDocument, FieldPath]] = {}
        plugins: dict[str, PluginSpec] = {}
        profiles: dict[str, Profile] = {}
        docs = self._of(RoutingProfilesDocument)
        for doc, pdoc in docs:
            for i, plugin in enumerate(pdoc.spec.plugins):
                where: FieldPath = ("spec", "plugins", i, "name" if plugin.name else "type")
                if self._unique(plugin_seen, doc, where, "plugin", plugin.plugin_name):
                    plugins[plugin.plugin_name] = plugin
        for doc, pdoc in docs:
            for i, profile in enumerate(pdoc.spec.profiles):
                path: FieldPath = ("spec", "profiles", i)
                if self._unique(profile_seen, doc, (*path, "name"), "profile", profile.name):
                    profiles[profile.name] = profile
                refs: list[tuple[FieldPath, str]] = [
                    ((*path, "filters", k), ref) for k, ref in enumerate(profile.filters)
                ]
                refs += [
                    ((*path, "scorers", k, "ref"), s.ref) for k, s in enumerate(profile.scorers)
                ]
                refs.append(((*path, "picker"), profile.picker))
                if profile.cost_model is not None:
                    refs.append(((*path, "cost_model"), profile.cost_model))
                for ref_path, ref in refs:
                    if ref not in plugins:
                        self._problem(doc, ref_path, f"unknown plugin {ref!r}{_known(plugins)}")
        return plugins, profiles


def _known(names: Iterable[str]) -> str:
    listed = sorted(names)
    if not listed:
        return " (none are defined)"
    shown = ", ".join(listed[:12]) + (", …" if len(listed) > 12 else "")
    return f" (known: {shown})"


def _regions(rule: CompiledRule) -> str:
    return "{" + ", ".join(sorted(rule.regions)) + "}"
