"""The zone agent's routing plugins, one per module named after its type
(``<concept>-<filter|scorer|picker>``; see ``zone_agent.profiles``).

Filters: ``health-filter``, ``model-filter``, ``fits-filter``, ``canary-filter``.
Scorer and cost model: ``ttft-scorer`` (the default, with ``kv-cache-scorer``). Pickers
are the core's (:mod:`gtm.routing.pickers`: ``max-score-picker``,
``power-of-two-picker``, ``random-picker``, ``weighted-random-picker``), and
``slo-picker`` (the ``goodput`` profile's: placement for goodput at a TTFT SLO). Baselines, for
side-by-side runs: ``round-robin-picker``, ``weighted-round-robin-picker``,
``consistent-hash-picker``, ``sglang-cache-aware-picker``, ``least-connections-scorer``,
``least-pending-tokens-scorer``, ``dynamo-cost-scorer``, and llm-d's blend of
``prefix-affinity-scorer`` + ``queue-scorer`` + ``kv-cache-scorer``. The names before
this vocabulary are accepted as aliases (:data:`zone_agent.profiles.ZONE_ALIASES`).
"""
