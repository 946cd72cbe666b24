"""gtm — a multi-region global traffic manager for AI-inference GPU fleets.

This package is the shared core: typed records (:mod:`gtm.models`), the routing
framework (:mod:`gtm.routing`), the state store (:mod:`gtm.state`), the clock, metrics
helpers and the exception tree. It imports no tier; :mod:`gtm.cli` is the one
composition root that wires tiers together.
"""

from gtm._version import __version__

__all__ = ["__version__"]
