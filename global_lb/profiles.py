"""The global tier's routing profiles: built-in defaults, or the policy set's.

Two profiles run at the global tier:

* the **request** profile (HTTP front door, ``POST /v1/route``, ``gtm route``): the
  policy set's global-tier profile named ``global-default`` (or ``--profile``) if it has
  one, else :data:`DEFAULT_REQUEST_PROFILE`;
* the **DNS** profile: the policy set's ``global-dns`` if present, else
  :data:`DEFAULT_DNS_PROFILE` — the same without the model filter, since a DNS query
  names no model.

Every global profile must run ``residency-filter``: a profile without it could answer
outside the residency-allowed set, so building one is refused (fail closed).

Both follow the policy in force (:func:`follow`): a policy generation applied while
``gtm global`` runs swaps its profiles in (weights, plugins, picker) with the first
view built on it; a profile that cannot be built is logged and the previous one stays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from global_lb.plugins import global_registry, residency
from global_lb.view import RegionState, RequestContext
from gtm.errors import ConfigError, PluginError
from gtm.models import Tier
from gtm.policy_store import ActivePolicy
from gtm.routing import PluginRegistry, Profile, ProfileSpec, RoutingMetrics, load_profile_spec

REQUEST_PROFILE_NAME = "global-default"
DNS_PROFILE_NAME = "global-dns"

_PLUGINS: tuple[Mapping[str, Any], ...] = (
    {"type": "residency-filter", "name": "residency"},
    {"type": "health-filter", "name": "health"},
    {"type": "model-filter", "name": "model"},
    {"type": "ttft-scorer", "name": "ttft"},
    {"type": "load-scorer", "name": "load"},
    {"type": "headroom-spread-picker", "name": "spread"},
)

#: RTT + TTFT carry the decision; headroom (weight 0.2) breaks near-ties toward the
#: emptier region (the weights of policies/examples/routing-profiles.yaml).
DEFAULT_REQUEST_PROFILE: Mapping[str, Any] = {
    "name": REQUEST_PROFILE_NAME,
    "plugins": list(_PLUGINS),
    "profile": {
        "filters": ["residency", "health", "model"],
        "scorers": [{"ref": "ttft", "weight": 1.0}, {"ref": "load", "weight": 0.2}],
        "picker": "spread",
        "cost_model": "ttft",
    },
}

DEFAULT_DNS_PROFILE: Mapping[str, Any] = {
    "name": DNS_PROFILE_NAME,
    "plugins": [p for p in _PLUGINS if p["name"] != "model"],
    "profile": {
        "filters": ["residency", "health"],
        "scorers": [{"ref": "ttft", "weight": 1.0}, {"ref": "load", "weight": 0.2}],
        "picker": "spread",
        "cost_model": "ttft",
    },
}

RegionProfile = Profile[RegionState, RequestContext]


def profile_spec(policy: ActivePolicy | None, name: str, default: Mapping[str, Any]) -> ProfileSpec:
    """The policy set's global profile ``name`` if it defines one, else ``default``."""
    data: Mapping[str, Any] = default
    if policy is not None:
        found = policy.policy_set.profiles.get(name)
        if found is not None:
            if found.tier.value != Tier.GLOBAL.value:
                raise ConfigError(f"routing profile {name!r} is for tier {found.tier.value!r}")
            data = policy.policy_set.profile_config(name)
    try:
        spec = load_profile_spec(dict(data))
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    require_residency(spec)
    return spec


def follow(
    name: str, default: Mapping[str, Any], metrics: RoutingMetrics | None
) -> Callable[[ActivePolicy], tuple[RegionProfile, ProfileSpec]]:
    """What builds the profile ``name`` (else ``default``) of a policy in force: a
    router's ``follow`` (global_lb.router.GlobalRouter)."""
    registry = global_registry()

    def source(policy: ActivePolicy) -> tuple[RegionProfile, ProfileSpec]:
        spec = profile_spec(policy, name, default)
        return build(registry, spec, metrics), spec

    return source


def require_residency(spec: ProfileSpec) -> None:
    """Refuse a global profile that does not run ``residency-filter``."""
    types = {p.plugin_name: p.type for p in spec.plugins}
    if not any(types.get(ref) == residency.TYPE_NAME for ref in spec.profile.filters):
        raise ConfigError(
            f"routing profile {spec.name!r}: a global-tier profile must run a "
            f"{residency.TYPE_NAME!r} filter (residency fails closed)"
        )


def build(
    registry: PluginRegistry, spec: ProfileSpec, metrics: RoutingMetrics | None
) -> RegionProfile:
    try:
        profile: RegionProfile = registry.build_profile(spec, tier=Tier.GLOBAL, metrics=metrics)
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    return profile
