"""Zone routing profiles: the plugin registry, the built-in profiles, and building them.

Profiles are :class:`gtm.routing.registry.ProfileSpec` configuration, as at every tier,
built by the core registry into the core runner (:class:`~zone_agent.router.
ZoneProfile` wraps it with the zone's layout)::

    name: default
    plugins:
      - {type: health-filter, name: health}
      - {type: model-filter, name: model}
      - {type: fits-filter, name: fits}
      - {type: canary-filter, name: canary}
      - {type: ttft-scorer, name: zone-ttft, parameters: {scale_ms: 2000}}
      - {type: kv-cache-scorer, name: kv-cache}
      - {type: max-score-picker, name: max-score}
    profile:
      filters: [health, model, fits, canary]
      scorers: [{ref: zone-ttft, weight: 1}, {ref: kv-cache, weight: 1}]
      picker: max-score
      cost_model: zone-ttft

:func:`zone_registry` holds the core's generic plugins (its columnar pickers), the zone's
plugin types, their names before the one vocabulary as aliases (:data:`ZONE_ALIASES` and
the core's), and the zone's fast paths. :data:`BUILTIN_PROFILES` are the default,
``ttft-only`` (the default before KV-cache room: predicted TTFT alone) and every
baseline of issue 5, for side-by-side runs (``gtm zone --profile NAME``,
``bench/zone_quality.py``). Every profile carries the ``ttft-scorer`` cost model, so
each decision reports its predicted TTFT whatever chose it.

The agent follows the policy files: :func:`profile_source` builds the policy set's
routing profile ``zone-<NAME>`` (``zone-default`` for the default) when it has one, else
the built-in ``NAME``, and rebuilds it when the policy changes
(:class:`gtm.routing.ProfileSource`: the last good profile stays when a new one fails).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from gtm.errors import PluginError
from gtm.models import Tier
from gtm.policy_store import ActivePolicy
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.registry import (
    PluginRegistry,
    ProfileSpec,
    default_registry,
    load_profile_spec,
)
from gtm.routing.source import ProfileSource
from gtm.slo import TTFT_SLO_MS
from zone_agent.fastpaths import FAST_PATHS
from zone_agent.plugins import (
    canary_filter,
    consistent_hash_picker,
    dynamo_cost_scorer,
    fits_filter,
    health_filter,
    kv_cache_scorer,
    least_connections_scorer,
    least_pending_tokens_scorer,
    model_filter,
    prefix_affinity_scorer,
    queue_scorer,
    round_robin_picker,
    sglang_cache_aware_picker,
    slo_picker,
    ttft_scorer,
    weighted_round_robin_picker,
)
from zone_agent.profile_names import DEFAULT_PROFILE as DEFAULT_PROFILE
from zone_agent.router import ZoneProfile

#: The zone's plugin types under their names before the one vocabulary (the core's
#: aliases — healthy-filter, serves-model-filter, ttft-cost, kv-cache-utilization-scorer,
#: prefix-cache-scorer, random — are registered too).
ZONE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "round-robin": round_robin_picker.TYPE_NAME,
        "weighted-round-robin": weighted_round_robin_picker.TYPE_NAME,
        "consistent-hash": consistent_hash_picker.TYPE_NAME,
        "sglang-cache-aware": sglang_cache_aware_picker.TYPE_NAME,
        "least-connections": least_connections_scorer.TYPE_NAME,
        "least-pending-tokens": least_pending_tokens_scorer.TYPE_NAME,
        "dynamo-cost": dynamo_cost_scorer.TYPE_NAME,
    }
)


def zone_registry() -> PluginRegistry:
    """A fresh registry with the core's generic plugins, every zone plugin type, their
    old names as aliases, and the zone's fast paths."""
    registry = default_registry()
    for module, plugin in (
        (health_filter, health_filter.HealthFilter),
        (model_filter, model_filter.ModelFilter),
        (fits_filter, fits_filter.FitsFilter),
        (canary_filter, canary_filter.CanaryFilter),
        (ttft_scorer, ttft_scorer.TtftScorer),
        (kv_cache_scorer, kv_cache_scorer.KvCacheScorer),
        (prefix_affinity_scorer, prefix_affinity_scorer.PrefixAffinityScorer),
        (queue_scorer, queue_scorer.QueueScorer),
        (least_connections_scorer, least_connections_scorer.LeastConnectionsScorer),
        (least_pending_tokens_scorer, least_pending_tokens_scorer.LeastPendingTokensScorer),
        (dynamo_cost_scorer, dynamo_cost_scorer.DynamoCostScorer),
        (round_robin_picker, round_robin_picker.RoundRobinPicker),
        (weighted_round_robin_picker, weighted_round_robin_picker.WeightedRoundRobinPicker),
        (consistent_hash_picker, consistent_hash_picker.ConsistentHashPicker),
        (sglang_cache_aware_picker, sglang_cache_aware_picker.SglangCacheAwarePicker),
        (slo_picker, slo_picker.SloPicker),
    ):
        registry.register(module.TYPE_NAME, module.Params, plugin)
    registry.register_vocabulary_aliases()
    for old, new in ZONE_ALIASES.items():
        registry.register_alias(old, new)
    for path in FAST_PATHS:
        registry.register_fast_path(path)
    return registry


# ---------------------------------------------------------------------------- built-ins

_FILTER_PLUGINS: list[dict[str, Any]] = [
    {"type": "health-filter", "name": "health"},
    {"type": "model-filter", "name": "model"},
    {"type": "fits-filter", "name": "fits"},
]
_FILTERS = [p["name"] for p in _FILTER_PLUGINS]
_CANARY: dict[str, Any] = {"type": "canary-filter", "name": "canary"}
_MAX_SCORE: dict[str, Any] = {"type": "max-score-picker", "name": "max-score"}
_TTFT: dict[str, Any] = {"type": "ttft-scorer", "name": "ttft"}


def _baseline(
    name: str,
    scorers: list[tuple[dict[str, Any], float]],
    picker: dict[str, Any] | None = None,
) -> dict[str, Any]:
    picker = picker or _MAX_SCORE
    plugins = [*_FILTER_PLUGINS, *(s for s, _ in scorers), picker]
    if not any(p.get("name") == "ttft" for p in plugins):
        plugins.append(_TTFT)
    return {
        "name": name,
        "plugins": plugins,
        "profile": {
            "filters": _FILTERS,
            "scorers": [{"ref": s.get("name", s["type"]), "weight": w} for s, w in scorers],
            "picker": picker.get("name", picker["type"]),
            "cost_model": "ttft",
        },
    }


#: The default blends the TTFT score with KV-cache room: the TTFT cost prices the prefill
#: (queue, this prompt, cache credit) but not the decode the request joins, which
#: KV-cache room stands for (as in llm-d's default scheduler). The TTFT scale is the
#: goodput SLO's TTFT bound, so a GPU predicted a whole SLO later scores 1/e of the best;
#: a scale far inside the SLO piled a zone's work on its fastest GPUs (CHANGELOG).
DEFAULT_TTFT_SCALE_MS = TTFT_SLO_MS

#: The default, as ``zone-default`` in ``policies/examples/routing-profiles.yaml`` (its
#: plugin names are that file's; a test holds the two equal).
_DEFAULT: dict[str, Any] = {
    "name": DEFAULT_PROFILE,
    "plugins": [
        *_FILTER_PLUGINS,
        _CANARY,
        {
            "type": "ttft-scorer",
            "name": "zone-ttft",
            "parameters": {"scale_ms": DEFAULT_TTFT_SCALE_MS},
        },
        {"type": "kv-cache-scorer", "name": "kv-cache"},
        _MAX_SCORE,
    ],
    "profile": {
        "filters": [*_FILTERS, "canary"],
        "scorers": [{"ref": "zone-ttft", "weight": 1.0}, {"ref": "kv-cache", "weight": 1.0}],
        "picker": "max-score",
        "cost_model": "zone-ttft",
    },
}

#: The default's plugins under ``slo-picker``: when every GPU is predicted later than the
#: TTFT SLO because of its queue, the request goes where the lateness already is, so the
#: other GPUs drain (goodput at the SLO rises, the tail grows to ``late_cap_ms``). As
#: ``zone-goodput`` in ``policies/examples/routing-profiles.yaml`` (a test holds the two
#: equal).
_GOODPUT: dict[str, Any] = {
    **_DEFAULT,
    "name": "goodput",
    "plugins": [
        *_DEFAULT["plugins"][:-1],
        {
            "type": "slo-picker",
            "name": "slo",
            "parameters": {"ttft_slo_ms": DEFAULT_TTFT_SCALE_MS, "late_cap_ms": 10_000.0},
        },
    ],
    "profile": {**_DEFAULT["profile"], "picker": "slo"},
}

#: The default before the KV-cache room scorer: predicted TTFT alone (for side-by-side
#: runs: ``gtm zone --profile ttft-only``, and the simulator's ``gtm-ttft-only``).
_TTFT_ONLY: dict[str, Any] = {
    "name": "ttft-only",
    "plugins": [*_FILTER_PLUGINS, _CANARY, _TTFT, _MAX_SCORE],
    "profile": {
        "filters": [*_FILTERS, "canary"],
        "scorers": [{"ref": "ttft", "weight": 1.0}],
        "picker": "max-score",
        "cost_model": "ttft",
    },
}

BUILTIN_PROFILES: Mapping[str, ProfileSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            load_profile_spec(data)
            for data in (
                _DEFAULT,
                _GOODPUT,
                _TTFT_ONLY,
                _baseline("round-robin", [], {"type": "round-robin-picker"}),
                _baseline("random", [], {"type": "random-picker"}),
                _baseline("least-connections", [({"type": "least-connections-scorer"}, 1.0)]),
                _baseline("weighted-round-robin", [], {"type": "weighted-round-robin-picker"}),
                _baseline("least-pending-tokens", [({"type": "least-pending-tokens-scorer"}, 1.0)]),
                _baseline(
                    "power-of-two",
                    [({"type": "least-connections-scorer"}, 1.0)],
                    {"type": "power-of-two-picker"},
                ),
                _baseline("consistent-hash", [], {"type": "consistent-hash-picker"}),
                _baseline(
                    "consistent-hash-bounded",
                    [],
                    {
                        "type": "consistent-hash-picker",
                        "parameters": {"bounded_load_epsilon": 0.25},
                    },
                ),
                _baseline("sglang-cache-aware", [], {"type": "sglang-cache-aware-picker"}),
                _baseline(
                    "llm-d-blend",
                    [
                        ({"type": "prefix-affinity-scorer"}, 3.0),
                        ({"type": "queue-scorer"}, 2.0),
                        ({"type": "kv-cache-scorer"}, 2.0),
                    ],
                ),
                _baseline("dynamo-cost", [({"type": "dynamo-cost-scorer"}, 1.0)]),
            )
        )
    }
)


def build_zone_profile(
    spec: ProfileSpec,
    registry: PluginRegistry | None = None,
    *,
    metrics: RoutingMetrics | None = None,
    fast_paths: bool = True,
) -> ZoneProfile:
    """Build a profile from configuration; PluginError names what is wrong."""
    registry = registry or zone_registry()
    runner = registry.build(spec, tier=Tier.ZONE, metrics=metrics, fast_paths=fast_paths)
    return ZoneProfile(runner)


def builtin_profile(name: str, *, metrics: RoutingMetrics | None = None) -> ZoneProfile:
    """One of :data:`BUILTIN_PROFILES` by name; PluginError lists the known names."""
    spec = BUILTIN_PROFILES.get(name)
    if spec is None:
        raise PluginError(f"unknown zone profile {name!r}; built-in: {', '.join(BUILTIN_PROFILES)}")
    return build_zone_profile(spec, metrics=metrics)


def policy_profile_name(name: str) -> str:
    """The name the policy files give the built-in profile ``name``."""
    return f"zone-{name}"


def profile_source(
    name: str = DEFAULT_PROFILE,
    *,
    metrics: RoutingMetrics | None = None,
    policy: ActivePolicy | None = None,
    check: Callable[[ZoneProfile], None] | None = None,
) -> ProfileSource[ZoneProfile]:
    """The zone's profile following the policy in force: the policy set's
    ``zone-<name>`` when it has one, else the built-in ``name``. ``check`` (raising a
    GtmError) refuses a built profile the agent cannot run, as a profile that does not
    build is: the one in force stays, logged and counted (flow control's
    :func:`zone_agent.flow.check_profile`)."""
    default = BUILTIN_PROFILES.get(name)
    if default is None:
        raise PluginError(f"unknown zone profile {name!r}; built-in: {', '.join(BUILTIN_PROFILES)}")
    registry = zone_registry()

    def build(spec: ProfileSpec) -> ZoneProfile:
        profile = build_zone_profile(spec, registry, metrics=metrics)
        if check is not None:
            check(profile)
        return profile

    return ProfileSource(
        Tier.ZONE, policy_profile_name(name), default, build, metrics=metrics, policy=policy
    )
