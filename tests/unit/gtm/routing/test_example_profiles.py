"""Every example routing profile builds with its tier's registry, and each tier's
example ``<tier>-default`` is that tier's built-in default (ARCHITECTURE: every tier
reads its profile from the policy files; the shipped examples must be what runs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from global_lb.plugins import global_registry
from global_lb.profiles import DEFAULT_REQUEST_PROFILE
from gtm.models import Tier
from gtm.routing import PluginRegistry, ProfileSpec, load_profile_spec
from policies.loader import examples_path, load_paths
from regional_lb.profiles import DEFAULT_PROFILE, regional_registry
from zone_agent.profiles import BUILTIN_PROFILES, zone_registry

TIERS: Mapping[str, tuple[Callable[[], PluginRegistry], Callable[[], Any]]] = {
    Tier.GLOBAL.value: (global_registry, lambda: DEFAULT_REQUEST_PROFILE),
    Tier.REGIONAL.value: (regional_registry, lambda: DEFAULT_PROFILE),
    Tier.ZONE.value: (zone_registry, lambda: BUILTIN_PROFILES["default"]),
}

EXAMPLES = load_paths([examples_path() / "routing-profiles.yaml"])


def _spec(data: Any) -> ProfileSpec:
    return data if isinstance(data, ProfileSpec) else load_profile_spec(dict(data))


def _canonical(spec: ProfileSpec, registry: PluginRegistry) -> tuple[object, ...]:
    """What a profile runs, whatever its plugins are called: each slot's plugin type
    (aliases followed, two names of one type alike) and parameters, and the weights."""
    plugins = {p.plugin_name: p for p in spec.plugins}

    def of(name: str) -> tuple[object, object]:
        plugin = plugins[name]
        kind = registry.plugin_type(plugin.type)
        return kind.factory, kind.params.model_validate(dict(plugin.parameters))

    body = spec.profile
    picker = body.picker if isinstance(body.picker, str) else body.picker[0]  # type: ignore[index]
    return (
        tuple(of(f) for f in body.filters),
        tuple((of(s.ref), s.weight) for s in body.scorers),
        of(picker),
        None if body.cost_model is None else of(body.cost_model),
    )


@pytest.mark.parametrize("name", sorted(EXAMPLES.profiles))
def test_every_example_profile_builds_with_its_tiers_registry(name: str) -> None:
    tier = EXAMPLES.profiles[name].tier.value
    registry = TIERS[tier][0]()
    spec = load_profile_spec(EXAMPLES.profile_config(name))
    built = registry.build(spec, tier=Tier(tier))
    assert built.name == name


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_the_example_default_is_the_tiers_built_in_default(tier: str) -> None:
    registry_of, default = TIERS[tier]
    registry = registry_of()
    example = load_profile_spec(EXAMPLES.profile_config(f"{tier}-default"))
    assert _canonical(example, registry) == _canonical(_spec(default()), registry)
