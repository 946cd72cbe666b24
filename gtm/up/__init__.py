"""``gtm up``: a whole multi-region deployment on one machine, and ``gtm load``.

Part of the CLI composition root (with :mod:`gtm.cli`): these modules wire the tiers
together, so the import-layer contract lets ``gtm.up`` import them (pyproject.toml).
Nothing else in :mod:`gtm` imports ``gtm.up``.

* :mod:`gtm.up.config` — ``gtm up``'s options, validated once;
* :mod:`gtm.up.fleet` — what every mode shares: policies, the topology resolved against
  them, seeding the store, waiting until the deployment answers;
* :mod:`gtm.up.inprocess` — every tier and emulated GPU in one asyncio loop (default);
* :mod:`gtm.up.processes` — every tier its own OS process against etcd (``--processes``);
* :mod:`gtm.up.status` — the live status page and ``/api/v1/fleet``;
* :mod:`gtm.up.banner` — what ``gtm up`` prints once the deployment answers;
* :mod:`gtm.up.clients` — the client cities of ``gtm load`` and their geo map;
* :mod:`gtm.up.load` — ``gtm load``, the trace-replaying load generator.
"""
