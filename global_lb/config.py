"""What the global tier is configured with: :class:`GlobalConfig` (``gtm global``) and
the front door's part of it, :class:`FrontDoorConfig`."""

from __future__ import annotations

import ipaddress

from pydantic import Field, PositiveFloat, SecretStr

from global_lb import profiles
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.zone import ZoneConfig
from global_lb.geo import DEFAULT_RELOAD_INTERVAL_S, AssumedLocation
from global_lb.health import HealthCheckConfig
from gtm.audit_anchor import DEFAULT_INTERVAL_S as DEFAULT_ANCHOR_INTERVAL_S
from gtm.http_limits import HttpLimits
from gtm.models import Frozen

DEFAULT_DNS_LISTEN = "127.0.0.1:5353"
DEFAULT_HTTP_LISTEN = "127.0.0.1:8080"


class FrontDoorConfig(Frozen):
    #: Proxies whose X-Forwarded-For is believed (e.g. the anycast load balancers).
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    #: Attempts per request, first included (ARCHITECTURE §6: at most 3).
    max_attempts: int = Field(default=3, ge=1, le=3)
    #: Connecting to a regional LB: a live one on the same network answers in ms.
    connect_timeout: float = Field(default=2.0, gt=0.0, le=60.0)
    #: Until the response headers (the region queues and prefills before answering).
    first_byte_timeout: float = Field(default=120.0, gt=0.0, le=3600.0)
    #: Longest gap between two chunks of a streamed answer.
    read_timeout: float = Field(default=300.0, gt=0.0, le=3600.0)
    max_body_bytes: int = Field(default=32 << 20, ge=1024, le=1 << 30)
    #: Header/body/JSON-depth limits, slow-client timeouts, per-client concurrency.
    limits: HttpLimits = HttpLimits()
    #: More hops than this is a loop between tiers (global → regional → zone is 3).
    max_hops: int = Field(default=4, ge=1, le=16)
    #: The key the tiers share (``--peer-token``, :mod:`gtm.trust`): each forward is
    #: signed with it, so regional LBs believe the client location the front door found.
    peer_token: SecretStr | None = None
    #: Send a prompt back to the region its prefix was just sent to, while that region
    #: may take it (:class:`global_lb.plugins.affinity.RegionMemory`). Off: every request
    #: is decided afresh (``gtm global --no-affinity``, for side-by-side comparisons).
    affinity: bool = True


class GlobalConfig(Frozen):
    """Everything ``gtm global`` is configured with."""

    dns_listen: str | None = DEFAULT_DNS_LISTEN  # None: no DNS server
    http_listen: str | None = DEFAULT_HTTP_LISTEN  # None: no front door
    state: str = "memory"
    policies: tuple[str, ...] = ()  # empty: the examples shipped with gtm
    geoip_db: str | None = None  # None: the bundled (stale) GeoLite2-City
    #: Look at ``geoip_db`` for a new version this often, s (0: never; gtm.geo
    #: ReloadingDatabase).
    geoip_reload_interval_s: float = Field(default=DEFAULT_RELOAD_INTERVAL_S, ge=0.0, le=86_400.0)
    geo_map: str | None = None
    unknown_location: AssumedLocation = AssumedLocation()
    topology: str | None = None
    audit_dir: str | None = None
    #: At most this long between an audit record and the chain's anchor in the store
    #: (gtm.audit_anchor: what a cut tail can take unseen).
    audit_anchor_interval_s: PositiveFloat = DEFAULT_ANCHOR_INTERVAL_S
    profile: str = profiles.REQUEST_PROFILE_NAME
    zone: ZoneConfig = ZoneConfig()
    rrl: RrlConfig = RrlConfig()
    health: HealthCheckConfig = HealthCheckConfig()
    front_door: FrontDoorConfig = FrontDoorConfig()
    #: Treat a region without a published summary as down (once regional LBs publish).
    require_summaries: bool = False
    reuse_port: bool = False
    #: DNS processes sharing the DNS port with SO_REUSEPORT (this one included).
    dns_workers: int = Field(default=1, ge=1, le=64)
    decision_cache: int = Field(default=65_536, ge=0)
