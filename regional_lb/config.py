"""What one regional LB replica is configured with (:class:`RegionalSettings`).

Each part's own settings live beside the part (quota, leases, queue, router, proxy,
view); this gathers them with what belongs to the replica as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gtm.audit_anchor import DEFAULT_INTERVAL_S as DEFAULT_ANCHOR_INTERVAL_S
from gtm.geo import IPNetwork
from gtm.http_limits import HttpLimits
from regional_lb.fairqueue import QueueSettings
from regional_lb.leases import LeaseSettings
from regional_lb.profiles import PROFILE_NAME
from regional_lb.proxy import ProxySettings
from regional_lb.quota import QuotaSettings
from regional_lb.router import RouterSettings
from regional_lb.view import ViewSettings


@dataclass(frozen=True, slots=True)
class RegionalSettings:
    """Everything one regional LB replica is configured with."""

    region: str
    replica_id: str
    #: Where peers and the global tier reach this replica (published in the summary).
    advertise_url: str | None = None
    quota: QuotaSettings = field(default_factory=QuotaSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    proxy: ProxySettings = field(default_factory=ProxySettings)
    view: ViewSettings = field(default_factory=ViewSettings)
    profile_name: str = PROFILE_NAME
    #: Send a prompt back to the zone its prefix was just sent to, while that zone can
    #: take it, and keep it here when the split draws it for a peer
    #: (:class:`regional_lb.plugins.prefix.ZoneMemory`). Off: every request is placed
    #: afresh (``gtm regional --no-affinity``, for side-by-side comparisons).
    affinity: bool = True
    summary_interval_s: float = 1.0
    #: At most this long between an audit record and the chain's anchor in the store
    #: (gtm.audit_anchor: what a cut tail can take unseen).
    audit_anchor_interval_s: float = DEFAULT_ANCHOR_INTERVAL_S
    #: How often queued requests are expired and re-offered to zones, s.
    queue_tick_s: float = 0.05
    #: The key the tiers share (:mod:`gtm.trust`): requests signed with it by the front
    #: door or a peer region carry x-gtm- headers this replica believes (the client's
    #: location among them; a spilled request is not charged again), and this replica
    #: signs its spills with it. ``None``: no sender is a proven tier — every client is
    #: located here and spilled requests are charged again (the safe default).
    peer_token: str | None = None
    #: Networks whose X-Forwarded-For is believed when locating a client (load
    #: balancers in front of this replica, the front door): the front door's rule.
    trusted_proxies: tuple[IPNetwork, ...] = ()
    #: ``x-gtm-hops`` above this is a loop (508); spills themselves stop at
    #: ``router.spill.max_hops``.
    loop_hops: int = 4
    max_body_bytes: int = 16 << 20
    #: Header/body/JSON-depth limits, slow-client timeouts, per-client concurrency.
    limits: HttpLimits = field(default_factory=HttpLimits)
