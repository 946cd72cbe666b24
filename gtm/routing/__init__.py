"""The routing framework every tier uses: filter → score → pick (ARCHITECTURE §3).

Contracts are in :mod:`gtm.routing.framework`, the runner in :mod:`gtm.routing.profile`,
configuration in :mod:`gtm.routing.registry`, the shared TTFT cost currency in
:mod:`gtm.routing.cost`; see ``gtm/routing/README.md``.
"""

from gtm.routing.framework import (
    Candidate,
    CostModel,
    ExtensionPoint,
    Filter,
    FilterResult,
    Picker,
    RngFactory,
    Scored,
    Scorer,
    better,
    partition,
    request_rng,
    uniform_index,
)
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.profile import (
    DEFAULT_PLUGIN_TIMING_EVERY,
    NO_CANDIDATES_OFFERED,
    Choice,
    Profile,
    WeightedScorer,
)
from gtm.routing.registry import (
    PluginRegistry,
    PluginSpec,
    PluginType,
    ProfilePlugins,
    ProfileSpec,
    ScorerRef,
    default_registry,
    load_profile_spec,
)

__all__ = [
    "DEFAULT_PLUGIN_TIMING_EVERY",
    "NO_CANDIDATES_OFFERED",
    "Candidate",
    "Choice",
    "CostModel",
    "ExtensionPoint",
    "Filter",
    "FilterResult",
    "Picker",
    "PluginRegistry",
    "PluginSpec",
    "PluginType",
    "Profile",
    "ProfilePlugins",
    "ProfileSpec",
    "RngFactory",
    "RoutingMetrics",
    "Scored",
    "Scorer",
    "ScorerRef",
    "WeightedScorer",
    "better",
    "default_registry",
    "load_profile_spec",
    "partition",
    "request_rng",
    "uniform_index",
]
