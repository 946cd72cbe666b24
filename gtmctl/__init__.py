"""gtmctl — the ``gtm`` command and what it runs on one machine: the composition root.

This package sits above everything else (ARCHITECTURE §10): it is the only place that
wires the tiers, the GPU emulator and the simulator together, so the core (:mod:`gtm`)
imports no tier and no tier imports another.

* :mod:`gtmctl.cli` — the ``gtm`` command: every subcommand, each loaded lazily from the
  package that owns it (``gtm global`` from :mod:`global_lb`, ``gtm chaos`` from
  :mod:`chaos`, …); ``python -m gtmctl`` runs it too;
* :mod:`gtmctl.up` — ``gtm up``: a whole multi-region deployment on one machine, in one
  process or one process per tier, with its status page and control API;
* :mod:`gtmctl.load` — ``gtm load``'s load generator: a real trace replayed through the
  front door by clients spread over the world.

Layers inside: the game-day runner (:mod:`chaos`) drives ``gtm up`` deployments through
the control API of :mod:`gtmctl.up.control` and sends traffic with :mod:`gtmctl.load`,
so those two sit below :mod:`chaos`, and only the command table (:mod:`gtmctl.cli`,
which names ``gtm chaos``) sits above it. pyproject.toml's import contract checks this.
"""
