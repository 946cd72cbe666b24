"""The names of the global tier's built-in routing profiles, in a module that imports
nothing: ``gtm up`` puts them on the front door's command line (``--profile``) without
loading the tier, whose profiles (:mod:`global_lb.profiles`, which re-exports these
names) bring the routing plugins and numpy."""

from __future__ import annotations

#: The front door's HTTP profile (RTT + predicted TTFT + headroom).
REQUEST_PROFILE_NAME = "global-default"
#: The DNS answers' profile.
DNS_PROFILE_NAME = "global-dns"
#: The nearest region residency allows, by round trip alone (the simulator's zone-agent
#: baselines' cross-region rule).
NEAREST_PROFILE_NAME = "global-nearest"
