"""Zone routing profiles: the plugin registry, the built-in profiles, and building them.

Profiles are :class:`gtm.routing.registry.ProfileSpec` configuration, as at every tier::

    name: default
    plugins:
      - {type: healthy-filter}
      - {type: serves-model-filter}
      - {type: fits-filter}
      - {type: canary-filter}
      - {type: ttft-cost, name: ttft, parameters: {scale_ms: 2000}}
      - {type: kv-cache-utilization-scorer, name: kv-cache}
      - {type: max-score-picker}
    profile:
      filters: [healthy-filter, serves-model-filter, fits-filter, canary-filter]
      scorers: [{ref: ttft, weight: 1}, {ref: kv-cache, weight: 1}]
      picker: max-score-picker
      cost_model: ttft

:func:`zone_registry` holds the zone's plugin types (a :class:`PluginRegistry` of its
own: the zone's pickers work on arrays, so they cannot be the generic ones registered
under the same type names by :func:`gtm.routing.registry.default_registry`).
:data:`BUILTIN_PROFILES` are the default, ``ttft-only`` (the default before KV-cache
room: predicted TTFT alone) and every baseline of issue 5, for side-by-side runs
(``gtm zone --profile NAME``, ``bench/zone_quality.py``). Every profile carries the
``ttft-cost`` cost model, so each decision reports its predicted TTFT whatever chose it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gtm.errors import PluginError
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.registry import PluginRegistry, ProfileSpec, load_profile_spec
from zone_agent.pipeline import (
    GpuCostModel,
    GpuFilter,
    GpuPicker,
    GpuScorer,
    WeightedGpuScorer,
    ZoneProfile,
)
from zone_agent.plugins import (
    canary,
    consistent_hash,
    dynamo_cost,
    fits,
    healthy,
    kv_cache_utilization_scorer,
    least_connections,
    least_pending_tokens,
    max_score,
    power_of_two,
    prefix_cache_scorer,
    queue_scorer,
    random_pick,
    round_robin,
    serves_model,
    sglang_cache_aware,
    ttft_cost,
    weighted_round_robin,
)

DEFAULT_PROFILE = "default"


def zone_registry() -> PluginRegistry:
    """A fresh registry with every zone plugin type."""
    registry = PluginRegistry()
    registry.register(healthy.TYPE_NAME, healthy.Params, healthy.HealthyFilter)
    registry.register(serves_model.TYPE_NAME, serves_model.Params, serves_model.ServesModelFilter)
    registry.register(fits.TYPE_NAME, fits.Params, fits.FitsFilter)
    registry.register(canary.TYPE_NAME, canary.Params, canary.CanaryFilter)
    registry.register(ttft_cost.TYPE_NAME, ttft_cost.Params, ttft_cost.TtftCost)
    registry.register(max_score.TYPE_NAME, max_score.Params, max_score.MaxScorePicker)
    registry.register(power_of_two.TYPE_NAME, power_of_two.Params, power_of_two.PowerOfTwoPicker)
    registry.register(random_pick.TYPE_NAME, random_pick.Params, random_pick.RandomPicker)
    registry.register(round_robin.TYPE_NAME, round_robin.Params, round_robin.RoundRobin)
    registry.register(
        least_connections.TYPE_NAME, least_connections.Params, least_connections.LeastConnections
    )
    registry.register(
        weighted_round_robin.TYPE_NAME,
        weighted_round_robin.Params,
        weighted_round_robin.WeightedRoundRobin,
    )
    registry.register(
        least_pending_tokens.TYPE_NAME,
        least_pending_tokens.Params,
        least_pending_tokens.LeastPendingTokens,
    )
    registry.register(
        consistent_hash.TYPE_NAME, consistent_hash.Params, consistent_hash.ConsistentHash
    )
    registry.register(
        sglang_cache_aware.TYPE_NAME, sglang_cache_aware.Params, sglang_cache_aware.SglangCacheAware
    )
    registry.register(
        prefix_cache_scorer.TYPE_NAME,
        prefix_cache_scorer.Params,
        prefix_cache_scorer.PrefixCacheScorer,
    )
    registry.register(queue_scorer.TYPE_NAME, queue_scorer.Params, queue_scorer.QueueScorer)
    registry.register(
        kv_cache_utilization_scorer.TYPE_NAME,
        kv_cache_utilization_scorer.Params,
        kv_cache_utilization_scorer.KvCacheUtilizationScorer,
    )
    registry.register(dynamo_cost.TYPE_NAME, dynamo_cost.Params, dynamo_cost.DynamoCost)
    return registry


# ---------------------------------------------------------------------------- built-ins

_FILTERS = ["healthy-filter", "serves-model-filter", "fits-filter"]
_FILTER_PLUGINS: list[dict[str, Any]] = [{"type": t} for t in _FILTERS]
_TTFT: dict[str, Any] = {"type": "ttft-cost", "name": "ttft"}


def _baseline(
    name: str,
    scorers: list[tuple[dict[str, Any], float]],
    picker: dict[str, Any] | None = None,
) -> dict[str, Any]:
    picker = picker or {"type": "max-score-picker"}
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


#: The default blends the TTFT score with KV-cache room. The TTFT cost prices the
#: prefill (queue, this prompt, cache credit) but not the decode the request joins: a
#: GPU with the prompt's prefix cached and a long-context batch wins it, and every
#: sequence there decodes slower. llm-d's default scheduler weighs KV-cache utilisation
#: next to prefix and queue for this reason. At weight 1 with the TTFT scale at 250 ms
#: (`gtm bench routing --gpus 120 --load 0.85`, Mooncake conversations, seed 0) TPOT
#: over 100 ms fell from 217 to 87 requests of 4,088 and goodput rose 59.3 → 61.9 req/s
#: (seed 1: 61.2 → 62.9); weight 2 lengthened the TTFT tail (p99 3.78 s).
#:
#: The TTFT scale is the goodput SLO's TTFT bound (2 s): a GPU predicted a whole SLO
#: later scores 1/e of the best. At 250 ms, TTFT differences far inside the SLO
#: outweighed KV room, so a zone piled its work on its fastest GPUs (H100s 99 % busy,
#: L40S 25 %, L4 idle) and their queues broke the SLO; at 1,000 GPUs goodput was 1.10×
#: least connections'. At 2,000 ms: 1.23× (seed 1: 1.22×), 1.24×/1.23× at 120 GPUs;
#: 1,000 ms gave 1.22×/1.20×, 3,000 ms 1.23× at 1,000 GPUs with no better tail.
DEFAULT_TTFT_SCALE_MS = 2_000.0

_DEFAULT: dict[str, Any] = {
    "name": DEFAULT_PROFILE,
    "plugins": [
        *_FILTER_PLUGINS,
        {"type": "canary-filter"},
        {**_TTFT, "parameters": {"scale_ms": DEFAULT_TTFT_SCALE_MS}},
        {"type": "kv-cache-utilization-scorer", "name": "kv-cache"},
        {"type": "max-score-picker"},
    ],
    "profile": {
        "filters": [*_FILTERS, "canary-filter"],
        "scorers": [{"ref": "ttft", "weight": 1.0}, {"ref": "kv-cache", "weight": 1.0}],
        "picker": "max-score-picker",
        "cost_model": "ttft",
    },
}

#: The default before the KV-cache room scorer: predicted TTFT alone (for side-by-side
#: runs: ``gtm zone --profile ttft-only``, and the simulator's ``gtm-ttft-only``).
_TTFT_ONLY: dict[str, Any] = {
    "name": "ttft-only",
    "plugins": [*_FILTER_PLUGINS, {"type": "canary-filter"}, _TTFT, {"type": "max-score-picker"}],
    "profile": {
        "filters": [*_FILTERS, "canary-filter"],
        "scorers": [{"ref": "ttft", "weight": 1.0}],
        "picker": "max-score-picker",
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
                _TTFT_ONLY,
                _baseline("round-robin", [({"type": "round-robin"}, 1.0)]),
                _baseline("random", [], {"type": "random-picker"}),
                _baseline("least-connections", [({"type": "least-connections"}, 1.0)]),
                _baseline("weighted-round-robin", [({"type": "weighted-round-robin"}, 1.0)]),
                _baseline("least-pending-tokens", [({"type": "least-pending-tokens"}, 1.0)]),
                _baseline(
                    "power-of-two",
                    [({"type": "least-connections"}, 1.0)],
                    {"type": "power-of-two-picker"},
                ),
                _baseline("consistent-hash", [({"type": "consistent-hash"}, 1.0)]),
                _baseline(
                    "consistent-hash-bounded",
                    [
                        (
                            {
                                "type": "consistent-hash",
                                "parameters": {"bounded_load_epsilon": 0.25},
                            },
                            1.0,
                        )
                    ],
                ),
                _baseline("sglang-cache-aware", [({"type": "sglang-cache-aware"}, 1.0)]),
                _baseline(
                    "llm-d-blend",
                    [
                        ({"type": "prefix-cache-scorer"}, 3.0),
                        ({"type": "queue-scorer"}, 2.0),
                        ({"type": "kv-cache-utilization-scorer"}, 2.0),
                    ],
                ),
                _baseline("dynamo-cost", [({"type": "dynamo-cost"}, 1.0)]),
            )
        )
    }
)


def build_zone_profile(
    spec: ProfileSpec,
    registry: PluginRegistry | None = None,
    *,
    metrics: RoutingMetrics | None = None,
) -> ZoneProfile:
    """Build a profile from configuration; PluginError names what is wrong."""
    registry = registry or zone_registry()
    plugins: dict[str, object] = {}
    for i, plugin_spec in enumerate(spec.plugins):
        name = plugin_spec.plugin_name
        if name in plugins:
            raise PluginError(f"plugins[{i}] {name!r}: duplicate plugin name")
        plugins[name] = registry.build_plugin(plugin_spec, where=f"plugins[{i}]")
    body = spec.profile

    def resolve(ref: str, field: str, kind: type, what: str) -> Any:
        plugin = plugins.get(ref)
        if plugin is None:
            raise PluginError(
                f"{field}: unknown plugin {ref!r} (declared: {', '.join(plugins) or 'none'})"
            )
        if not isinstance(plugin, kind):
            raise PluginError(f"{field}: plugin {ref!r} ({type(plugin).__name__}) is not a {what}")
        return plugin

    filters = [
        resolve(r, f"profile.filters[{i}]", GpuFilter, "filter") for i, r in enumerate(body.filters)
    ]
    scorers = [
        WeightedGpuScorer(
            resolve(s.ref, f"profile.scorers[{i}].ref", GpuScorer, "scorer"), s.weight
        )
        for i, s in enumerate(body.scorers)
    ]
    picker_ref = body.picker
    if isinstance(picker_ref, tuple):
        if len(picker_ref) != 1:
            raise PluginError("profile.picker: a profile has exactly one picker")
        picker_ref = picker_ref[0]
    if not picker_ref:
        raise PluginError("profile.picker: missing; a profile has exactly one picker")
    picker = resolve(picker_ref, "profile.picker", GpuPicker, "picker")
    cost = None
    if body.cost_model is not None:
        cost = resolve(body.cost_model, "profile.cost_model", GpuCostModel, "cost model")
    try:
        return ZoneProfile(spec.name, filters, scorers, picker, cost_model=cost, metrics=metrics)
    except PluginError as exc:
        raise PluginError(f"profile {spec.name!r}: {exc}") from exc


def builtin_profile(name: str, *, metrics: RoutingMetrics | None = None) -> ZoneProfile:
    """One of :data:`BUILTIN_PROFILES` by name; PluginError lists the known names."""
    spec = BUILTIN_PROFILES.get(name)
    if spec is None:
        raise PluginError(f"unknown zone profile {name!r}; built-in: {', '.join(BUILTIN_PROFILES)}")
    return build_zone_profile(spec, metrics=metrics)
