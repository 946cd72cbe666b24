"""``gtm up``: a whole multi-region deployment on one machine, and ``gtm load``.

Part of the composition root (:mod:`gtmctl`): these modules wire the tiers, the GPU
emulator and the core together, which only :mod:`gtmctl` may do. Below them in the
import layers (pyproject.toml) are the simulator, the tiers, the emulator and the core;
above them the game-day runner (:mod:`chaos`, which drives a deployment through
:mod:`gtmctl.up.control`) and the ``gtm`` command table (:mod:`gtmctl.cli`).

* :mod:`gtmctl.up.config` — ``gtm up``'s options, validated once;
* :mod:`gtmctl.up.fleet` — what every mode shares: policies, the topology resolved against
  them, seeding the store, waiting until the deployment answers;
* :mod:`gtmctl.up.inprocess` — every tier and emulated GPU in one asyncio loop (default);
* :mod:`gtmctl.up.processes` — every tier its own OS process against etcd (``--processes``);
* :mod:`gtmctl.up.status` — the live status page and ``/api/v1/fleet``;
* :mod:`gtmctl.up.banner` — what ``gtm up`` prints once the deployment answers;
* :mod:`gtmctl.up.clients` — the client cities of ``gtm load`` and their geo map;
* :mod:`gtmctl.up.cli` — the ``gtm up`` and ``gtm load`` commands; the load generator
  itself is :mod:`gtmctl.load`.
"""
