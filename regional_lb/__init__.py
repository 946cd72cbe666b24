"""Regional tier: tenant quotas, fair queueing, zone choice and spillover within residency.

The sans-io cores (synchronous, no I/O, time passed in) and the I/O edges around them:

* :mod:`~regional_lb.quota` — per-tenant token buckets (requests, input/output/weighted
  tokens per minute, concurrency); :mod:`~regional_lb.leases` — Doorman-style capacity
  leases in the state store that share a tenant's budget between replicas;
* :mod:`~regional_lb.fairqueue` — VTC fair queueing within priority bands, TTL, bounds;
* :mod:`~regional_lb.view` / :mod:`~regional_lb.plugins` / :mod:`~regional_lb.profiles`
  — zone choice with the routing framework by predicted TTFT; :mod:`~regional_lb.priority`
  — Envoy overprovisioning and panic; :mod:`~regional_lb.spill` — peers within the
  residency-allowed set; :mod:`~regional_lb.router` — the decision for one request;
* :mod:`~regional_lb.summary` — the region summary for the global tier;
* the tier template (CONTRIBUTING.md): :mod:`~regional_lb.app` (wiring, lifecycle),
  :mod:`~regional_lb.api` (handlers), :mod:`~regional_lb.config`,
  :mod:`~regional_lb.errors`, :mod:`~regional_lb.request`, :mod:`~regional_lb.metrics`,
  :mod:`~regional_lb.cli` (``gtm regional``); and the tier's own
  :mod:`~regional_lb.admission` (API key, residency, quota), :mod:`~regional_lb.dispatch`
  (the fair queue's waiting room), :mod:`~regional_lb.proxy` (its hooks into
  :mod:`gtm.relay`).

See ``regional_lb/README.md``.
"""

from regional_lb.app import RegionalService, RegionalSettings, serving
from regional_lb.fairqueue import FairQueue, QueueSettings, jain_index
from regional_lb.leases import CapacityLeases, LeaseSettings, QuotaLeaseRecord, fair_shares
from regional_lb.quota import Cost, Grant, QuotaLimiter, QuotaSettings, Rejection, Ticket, Usage
from regional_lb.router import Inputs, RegionalDecision, RegionalRouter, Route, RouterSettings
from regional_lb.summary import build_summary
from regional_lb.view import RegionalView, ViewBuilder, ViewSettings

__all__ = [
    "CapacityLeases",
    "Cost",
    "FairQueue",
    "Grant",
    "Inputs",
    "LeaseSettings",
    "QueueSettings",
    "QuotaLeaseRecord",
    "QuotaLimiter",
    "QuotaSettings",
    "RegionalDecision",
    "RegionalRouter",
    "RegionalService",
    "RegionalSettings",
    "RegionalView",
    "Rejection",
    "Route",
    "RouterSettings",
    "Ticket",
    "Usage",
    "ViewBuilder",
    "ViewSettings",
    "build_summary",
    "fair_shares",
    "jain_index",
    "serving",
]
