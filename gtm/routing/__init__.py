"""The routing framework every tier uses: filter → score → pick (ARCHITECTURE §3).

Contracts are in :mod:`gtm.routing.framework`, the one runner in
:mod:`gtm.routing.runner`, configuration in :mod:`gtm.routing.registry`, the policy
files as the profile's source in :mod:`gtm.routing.source`, the shared TTFT cost
currency in :mod:`gtm.routing.cost`; see ``gtm/routing/README.md``.
"""

from gtm.routing.framework import (
    Batch,
    Capability,
    CostModel,
    ExtensionPoint,
    Filter,
    Picker,
    Plugin,
    Removal,
    RngFactory,
    Scorer,
    capabilities_of,
    removal_where,
    request_rng,
    uniform_index,
)
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.registry import (
    VOCABULARY_ALIASES,
    PluginRegistry,
    PluginSpec,
    PluginType,
    ProfilePlugins,
    ProfileSpec,
    ScorerRef,
    default_registry,
    load_profile_spec,
)
from gtm.routing.runner import (
    DEFAULT_PLUGIN_TIMING_EVERY,
    NO_CANDIDATES_OFFERED,
    FastPath,
    Match,
    Outcome,
    Runner,
    Stage,
    Step,
    Weighted,
)
from gtm.routing.source import ProfileSource, policy_profile_spec

__all__ = [
    "DEFAULT_PLUGIN_TIMING_EVERY",
    "NO_CANDIDATES_OFFERED",
    "VOCABULARY_ALIASES",
    "Batch",
    "Capability",
    "CostModel",
    "ExtensionPoint",
    "FastPath",
    "Filter",
    "Match",
    "Outcome",
    "Picker",
    "Plugin",
    "PluginRegistry",
    "PluginSpec",
    "PluginType",
    "ProfilePlugins",
    "ProfileSource",
    "ProfileSpec",
    "Removal",
    "RngFactory",
    "RoutingMetrics",
    "Runner",
    "Scorer",
    "ScorerRef",
    "Stage",
    "Step",
    "Weighted",
    "capabilities_of",
    "default_registry",
    "load_profile_spec",
    "policy_profile_spec",
    "removal_where",
    "request_rng",
    "uniform_index",
]
