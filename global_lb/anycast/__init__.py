"""The anycast front door: announcements that follow health and residency.

* :mod:`global_lb.anycast.policy` — sans-io: per prefix, announce / announce-draining /
  withdraw, from one snapshot of the region's signals;
* :mod:`global_lb.anycast.speaker` — the BGP speakers gtm drives (ExaBGP's process API,
  BIRD 2's control socket) behind one protocol;
* :mod:`global_lb.anycast.controller` — gathers the signals, applies the plan, withdraws
  on SIGTERM; ``gtm anycast`` (:mod:`global_lb.anycast.cli`).
"""
