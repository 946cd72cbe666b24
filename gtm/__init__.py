"""gtm — a multi-region global traffic manager for AI-inference GPU fleets.

This package is the shared core: typed records (:mod:`gtm.models`), the routing
framework (:mod:`gtm.routing`), the state store (:mod:`gtm.state`), the clock, metrics
helpers and the exception tree. It imports nothing of ours but :mod:`policies`: no
tier, no worker, no simulator. The composition root that wires them together is the
package above them all, :mod:`gtmctl` (the ``gtm`` command).
"""

from gtm._version import __version__

__all__ = ["__version__"]
