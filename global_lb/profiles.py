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

Both follow the policy in force (:func:`follow`, on the core's
:class:`~gtm.routing.ProfileSource`): a policy generation applied while ``gtm global``
runs swaps its profiles in (weights, plugins, picker) with the first view built on it; a
profile that cannot be built is logged and counted, and the previous one stays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from global_lb.batch import GlobalCap, RegionBatch
from global_lb.plugins import global_registry, residency
from global_lb.profile_names import DNS_PROFILE_NAME as DNS_PROFILE_NAME
from global_lb.profile_names import NEAREST_PROFILE_NAME as NEAREST_PROFILE_NAME
from global_lb.profile_names import REQUEST_PROFILE_NAME as REQUEST_PROFILE_NAME
from gtm.errors import ConfigError, PluginError
from gtm.models import Tier
from gtm.policy_store import ActivePolicy
from gtm.routing import (
    PluginRegistry,
    ProfileSource,
    ProfileSpec,
    RoutingMetrics,
    Runner,
    capabilities_of,
    policy_profile_spec,
)

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

#: The nearest region residency allows: the round trip alone decides (``rtt-scorer``),
#: no load, no predicted TTFT — the cross-region rule of the simulator's zone-agent
#: baselines, so that a live comparison (``gtm up --policy-profile``) runs them as the
#: simulator does.
NEAREST_REQUEST_PROFILE: Mapping[str, Any] = {
    "name": NEAREST_PROFILE_NAME,
    "plugins": [
        *(p for p in _PLUGINS if p["name"] in ("residency", "health", "model")),
        {"type": "rtt-scorer", "name": "rtt"},
        {"type": "max-score-picker", "name": "max-score"},
    ],
    "profile": {
        "filters": ["residency", "health", "model"],
        "scorers": [{"ref": "rtt", "weight": 1.0}],
        "picker": "max-score",
    },
}

#: The request profiles ``gtm global --profile`` knows without a policy set defining
#: them (a policy set's profile of the same name comes first).
BUILTIN_REQUEST_PROFILES: Mapping[str, Mapping[str, Any]] = {
    REQUEST_PROFILE_NAME: DEFAULT_REQUEST_PROFILE,
    NEAREST_PROFILE_NAME: NEAREST_REQUEST_PROFILE,
}


def request_default(name: str) -> Mapping[str, Any]:
    """The built-in request profile ``name`` (the default for any other name: the policy
    set may define it)."""
    return BUILTIN_REQUEST_PROFILES.get(name, DEFAULT_REQUEST_PROFILE)


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

#: Plugins are timed on one decision in this many unless the profile says otherwise. A
#: timed decision runs the plugins one by one (no fast path, so each histogram times its
#: plugin); the runner's old default of one in 16 would put those slower decisions inside
#: the front door's per-request p99, one in 4,096 keeps them out of it.
PLUGIN_TIMING_EVERY = 4096

#: A built global profile: the core runner over the tier's batches.
RegionProfile = Runner[RegionBatch]


def profile_spec(policy: ActivePolicy | None, name: str, default: Mapping[str, Any]) -> ProfileSpec:
    """The policy set's global profile ``name`` if it defines one, else ``default``."""
    spec = policy_profile_spec(policy, Tier.GLOBAL, name, default)
    require_residency(spec)
    return spec


def follow(
    name: str, default: Mapping[str, Any], metrics: RoutingMetrics | None
) -> Callable[[ActivePolicy], tuple[RegionProfile, ProfileSpec]]:
    """What builds the profile ``name`` (else ``default``) of a policy in force: a
    router's ``follow`` (global_lb.router.GlobalRouter), on the core's
    :class:`~gtm.routing.ProfileSource` (a profile that fails to build is logged and
    counted, and the last good one stays)."""
    registry = global_registry()

    def checked(spec: ProfileSpec) -> ProfileSpec:
        require_residency(spec)
        return spec

    source = ProfileSource(
        Tier.GLOBAL,
        name,
        default,
        lambda spec: build(registry, spec, metrics),
        metrics=metrics,
        adjust=checked,
    )

    def current(policy: ActivePolicy) -> tuple[RegionProfile, ProfileSpec]:
        profile = source.update(policy)
        return profile, source.spec

    return current


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
    """The runner of ``spec`` (with the registry's fast paths where its plugins have
    the capabilities); refused unless a filter enforces residency."""
    if "plugin_timing_every" not in spec.model_fields_set:
        spec = spec.model_copy(update={"plugin_timing_every": PLUGIN_TIMING_EVERY})
    try:
        profile: RegionProfile = registry.build(spec, tier=Tier.GLOBAL, metrics=metrics)
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    if not any(GlobalCap.RESIDENCY in capabilities_of(f) for f in profile.filters):
        raise ConfigError(
            f"routing profile {spec.name!r}: a global-tier profile must run a "
            f"{residency.TYPE_NAME!r} filter (residency fails closed)"
        )
    return profile
