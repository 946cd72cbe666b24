"""The zone agent's routing plugins, one per module (see ``zone_agent.profiles``).

Filters: ``healthy-filter``, ``serves-model-filter``, ``fits-filter``, ``canary-filter``.
Scorer and cost model: ``ttft-cost`` (the default). Pickers: ``max-score-picker``,
``power-of-two-picker``, ``random-picker``. Baselines, for side-by-side runs:
``round-robin``, ``least-connections``, ``weighted-round-robin``, ``least-pending-tokens``,
``consistent-hash``, ``sglang-cache-aware``, ``prefix-cache-scorer`` +
``queue-scorer`` + ``kv-cache-utilization-scorer`` (llm-d's blend), ``dynamo-cost``.
"""
