"""The global tier's routing plugins, one per module, and the registry that holds them.

==========================  =====================================================
type                        what
==========================  =====================================================
``residency-filter``        regions residency allows (policies engine) — mandatory
``health-filter``           healthy and not drained
``model-filter``            serves the requested model
``ttft-scorer``             predicted TTFT: RTT + queueing + own prefill (also
``ttft-cost-model``         the cost model, under its own type name)
``load-scorer``             headroom for the model
``tenant-affinity-scorer``  bounded-load rendezvous home region per tenant
``rtt-scorer``              the client's round trip alone (the nearest region)
``headroom-spread-picker``  best region; spread by headroom near saturation/failover
==========================  =====================================================

The generic pickers (``max-score-picker``…) and ``allow-list-filter`` come from
:func:`gtm.routing.default_registry`; the earlier names ``healthy-filter``,
``serves-model-filter`` and ``ttft-cost`` stay accepted as deprecated aliases. Each
plugin class declares what it offers the tier's fast paths as typed capabilities
(:class:`global_lb.batch.GlobalCap`), and its per-view work as ``prepare(view)``.
"""

from __future__ import annotations

from global_lb.plugins import affinity, health, load, model, residency, rtt, spread, ttft
from gtm.routing import PluginRegistry, default_registry


def global_registry() -> PluginRegistry:
    """A fresh registry: the built-ins, every global-tier plugin type (and the names
    they had before the one vocabulary, as aliases), and the tier's fast paths."""
    from global_lb.pipeline import register_fast_paths  # it imports these plugins

    registry = default_registry()
    registry.register(residency.TYPE_NAME, residency.Params, residency.ResidencyFilter)
    registry.register(health.TYPE_NAME, health.Params, health.HealthFilter)
    registry.register(model.TYPE_NAME, model.Params, model.ModelFilter)
    registry.register(ttft.TYPE_NAME, ttft.Params, ttft.TtftScorer)
    registry.register(ttft.COST_MODEL_TYPE_NAME, ttft.Params, ttft.TtftScorer)
    registry.register(load.TYPE_NAME, load.Params, load.LoadScorer)
    registry.register(affinity.TYPE_NAME, affinity.Params, affinity.TenantAffinityScorer)
    registry.register(rtt.TYPE_NAME, rtt.Params, rtt.RttScorer)
    registry.register(spread.TYPE_NAME, spread.Params, spread.HeadroomSpreadPicker)
    registry.register_vocabulary_aliases()
    register_fast_paths(registry)
    return registry


__all__ = ["global_registry"]
