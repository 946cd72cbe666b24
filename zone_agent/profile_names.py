"""The name of the zone agent's default routing profile, in a module that imports
nothing: ``gtm up`` compares a policy's zone profile with it without loading the tier,
whose profiles (:mod:`zone_agent.profiles`, which re-exports the name) bring the
routing plugins and numpy."""

from __future__ import annotations

DEFAULT_PROFILE = "default"
