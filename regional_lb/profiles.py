"""The regional tier's zone-choice profile: built-in default, or the policy set's.

The profile named ``regional-default`` (or ``--profile``) of the policy set's
RoutingProfiles is used when it exists, else :data:`DEFAULT_PROFILE` — the same plugins
and weights as ``policies/examples/routing-profiles.yaml`` (a test holds them equal).
Either way ``saturation-filter`` is run last (appended when the profile lacks it), so
"every zone is full" is a refusal naming that filter: the trigger for spillover and the
fair queue. :func:`profile_source` follows the policy in force (hot reload, the last
good profile kept when a new one fails: :class:`gtm.routing.ProfileSource`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gtm.errors import ConfigError, PluginError
from gtm.models import Tier
from gtm.policy_store import ActivePolicy
from gtm.routing import (
    PluginRegistry,
    PluginSpec,
    ProfileSource,
    ProfileSpec,
    RoutingMetrics,
    Runner,
    default_registry,
    policy_profile_spec,
)
from regional_lb.plugins import health, kv_cache, load, model, prefix, residency, saturation, ttft
from regional_lb.view import ZoneBatch

PROFILE_NAME = "regional-default"
SATURATION = "saturation"

DEFAULT_PROFILE: Mapping[str, Any] = {
    "name": PROFILE_NAME,
    "plugins": [
        {"type": residency.TYPE_NAME, "name": "residency"},
        {"type": health.TYPE_NAME, "name": "health"},
        {"type": model.TYPE_NAME, "name": "model"},
        {"type": ttft.TYPE_NAME, "name": "ttft"},
        {"type": prefix.TYPE_NAME, "name": "prefix-affinity"},
        {"type": "max-score-picker", "name": "max-score"},
        {"type": ttft.COST_MODEL_TYPE_NAME, "name": "ttft-cost"},
    ],
    "profile": {
        "filters": ["residency", "health", "model"],
        # TTFT carries the decision; prefix affinity (0.3) pulls toward a zone that
        # has the prompt's prefix hot (the example policy's weights).
        "scorers": [{"ref": "ttft", "weight": 1.0}, {"ref": "prefix-affinity", "weight": 0.3}],
        "picker": "max-score",
        "cost_model": "ttft-cost",
    },
}

ZoneProfile = Runner[ZoneBatch]


def regional_registry() -> PluginRegistry:
    """The generic plugins plus the regional tier's, under the one vocabulary's names
    (the old names as deprecated aliases)."""
    registry = default_registry()
    registry.register(residency.TYPE_NAME, residency.Params, residency.ResidencyFilter)
    registry.register(health.TYPE_NAME, health.Params, health.HealthFilter)
    registry.register(model.TYPE_NAME, model.Params, model.ModelFilter)
    registry.register(saturation.TYPE_NAME, saturation.Params, saturation.SaturationFilter)
    registry.register(ttft.TYPE_NAME, ttft.Params, ttft.TtftScorer)
    registry.register(ttft.COST_MODEL_TYPE_NAME, ttft.Params, ttft.TtftScorer)
    registry.register(prefix.TYPE_NAME, prefix.Params, prefix.PrefixAffinityScorer)
    registry.register(load.TYPE_NAME, load.Params, load.LoadScorer)
    registry.register(kv_cache.TYPE_NAME, kv_cache.Params, kv_cache.KvCacheScorer)
    registry.register_vocabulary_aliases()
    return registry


def profile_spec(policy: ActivePolicy | None, name: str = PROFILE_NAME) -> ProfileSpec:
    """The policy set's regional profile ``name`` if it has one, else the default; with
    the saturation filter last."""
    return with_saturation_last(policy_profile_spec(policy, Tier.REGIONAL, name, DEFAULT_PROFILE))


def with_saturation_last(spec: ProfileSpec) -> ProfileSpec:
    types = {p.plugin_name: p.type for p in spec.plugins}
    filters = [f for f in spec.profile.filters if types.get(f) != saturation.TYPE_NAME]
    plugins = tuple(spec.plugins)
    name = next((n for n, t in types.items() if t == saturation.TYPE_NAME), None)
    if name is None:
        name = SATURATION
        plugins = (*plugins, PluginSpec(type=saturation.TYPE_NAME, name=name))
    body = spec.profile.model_copy(update={"filters": (*filters, name)})
    return spec.model_copy(update={"plugins": plugins, "profile": body})


def build(
    spec: ProfileSpec,
    *,
    registry: PluginRegistry | None = None,
    metrics: RoutingMetrics | None = None,
) -> ZoneProfile:
    try:
        profile: ZoneProfile = (registry or regional_registry()).build(
            spec, tier=Tier.REGIONAL, metrics=metrics
        )
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    return profile


def profile_source(
    name: str = PROFILE_NAME,
    *,
    metrics: RoutingMetrics | None = None,
    policy: ActivePolicy | None = None,
) -> ProfileSource[ZoneProfile]:
    """The regional profile ``name``, following the policy in force."""
    registry = regional_registry()
    return ProfileSource(
        Tier.REGIONAL,
        name,
        DEFAULT_PROFILE,
        lambda spec: build(spec, registry=registry, metrics=metrics),
        metrics=metrics,
        adjust=with_saturation_last,
        policy=policy,
    )
