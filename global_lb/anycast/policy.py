"""Which anycast prefixes a region announces, and how: the announcement policy.

gtm does not speak BGP; a speaker (ExaBGP or BIRD, :mod:`global_lb.anycast.speaker`)
does. This module decides, per prefix, what the speaker should say, from one immutable
snapshot of the region's signals (:class:`RegionSignals`). It is sans-io: a synchronous
function, no clock read, no awaits — the controller (:mod:`global_lb.anycast.controller`)
gathers the signals, the tests feed them directly.

The rules, first match wins (:func:`decide`):

1. **Residency.** A prefix bound to a jurisdiction (``eu.api``'s own prefix) is announced
   only by a region inside that jurisdiction — a region is in every jurisdiction that
   contains its country, plus its own label (:func:`global_lb.view.jurisdiction_members`).
   Outside it the prefix is withdrawn whatever else holds, draining included: a client
   of a residency-bound name must never be carried to a region outside its jurisdiction.
2. **Stopping.** A controller that is stopping (SIGTERM) withdraws everything.
3. **Service health.** A prefix is announced only while the local service behind it (the
   front door, the DNS server) answers its readiness check.
4. **Can the names be served.** A prefix whose names no region can serve (no available
   region in its jurisdiction, or none at all) is withdrawn, so clients fail over to a
   region whose view says otherwise. This check reads the last fleet view; when the state
   store is unreachable that view is stale and the check is skipped — **static
   stability**: the tiers keep serving on their last snapshot through an etcd outage, and
   so does the announcement. An etcd outage alone never withdraws a route.
5. **Drain.** A drained region first announces *draining* — the route stays, made less
   preferred (AS-path prepend, or a lower local preference on iBGP) — so clients move to
   the next region at the speed of a BGP update while the drained one stays the last
   resort; after ``grace_s`` it withdraws. ``behaviour=withdraw`` withdraws at once.
6. Otherwise: announce.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Service(StrEnum):
    """The local service an anycast prefix fronts."""

    FRONT_DOOR = "front-door"
    DNS = "dns"


class Announcement(StrEnum):
    """What the speaker says about one prefix."""

    ANNOUNCE = "announce"
    DRAINING = "draining"  # announced, made less preferred
    WITHDRAW = "withdraw"


class DrainBehaviour(StrEnum):
    """How a drained region leaves the anycast set."""

    PREPEND = "prepend"  # AS-path prepend (eBGP neighbours), then withdraw after the grace
    LOCAL_PREF = "local-pref"  # lower local preference (iBGP neighbours), then withdraw
    WITHDRAW = "withdraw"  # withdraw at once


@dataclass(frozen=True, slots=True)
class AnycastPrefix:
    """One anycast prefix: the service behind it and, for a residency-bound name, the
    jurisdiction that alone may announce it."""

    network: IPNetwork
    service: Service = Service.FRONT_DOOR
    jurisdiction: str | None = None

    @classmethod
    def parse(cls, text: str) -> AnycastPrefix:
        """``PREFIX[,service=front-door|dns][,jurisdiction=ID]``, e.g.
        ``203.0.113.0/24,jurisdiction=eu`` or ``2001:db8:53::/48,service=dns``."""
        head, *options = (part.strip() for part in text.split(","))
        try:
            network = ipaddress.ip_network(head, strict=True)
        except ValueError as exc:
            raise ValueError(f"{head!r} is not a network prefix: {exc}") from None
        service, jurisdiction = Service.FRONT_DOOR, None
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or not value:
                raise ValueError(f"{option!r}: expected key=value (service, jurisdiction)")
            if key == "service":
                service = Service(value)
            elif key == "jurisdiction":
                jurisdiction = value
            else:
                raise ValueError(f"{key!r}: unknown prefix option (service, jurisdiction)")
        return cls(network, service, jurisdiction)

    def __str__(self) -> str:
        return str(self.network)


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    """The drain behaviour (``gtm anycast --drain``) and its parameters."""

    behaviour: DrainBehaviour = DrainBehaviour.PREPEND
    #: Seconds a drained region stays announced-draining before it withdraws; ``None``:
    #: until undrained (the drained region stays the last resort).
    grace_s: float | None = 60.0
    #: Extra copies of the local AS a draining route carries (``prepend``).
    prepend: int = 3
    #: Local preference of a draining route (``local-pref``; BGP's default is 100).
    local_pref: int = 50


@dataclass(frozen=True, slots=True)
class RegionSignals:
    """One snapshot of what the announcement depends on, for the region this runs in."""

    region: str
    #: Every jurisdiction the region is in (its country's ones plus its label).
    jurisdictions: frozenset[str]
    #: The local services that answer their readiness check now.
    ready: frozenset[Service]
    #: The region is drained (``gtm drain region``, or the controller's drain file).
    draining: bool = False
    #: Seconds since the drain began (``None`` when not draining or unknown).
    drain_age_s: float | None = None
    #: The state store answered the last read; ``False``: the view below is stale.
    store_reachable: bool = True
    #: Jurisdictions with at least one available region in the last fleet view, and
    #: whether any region at all is available; ``None``: no view yet (not checked).
    servable: frozenset[str] | None = None
    any_available: bool = True
    #: The controller is stopping (SIGTERM): withdraw everything.
    stopping: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    prefix: AnycastPrefix
    announcement: Announcement
    #: Why, in a few words (logged on every transition).
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The decisions for every prefix, in the order configured."""

    decisions: tuple[Decision, ...]
    by_prefix: Mapping[IPNetwork, Decision] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_prefix", {d.prefix.network: d for d in self.decisions})

    def announced(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.announcement is not Announcement.WITHDRAW)


def decide_one(prefix: AnycastPrefix, signals: RegionSignals, drain: DrainPolicy) -> Decision:
    """The decision for one prefix (the rules of the module docstring, in order)."""
    if prefix.jurisdiction is not None and prefix.jurisdiction not in signals.jurisdictions:
        return Decision(
            prefix, Announcement.WITHDRAW, f"outside jurisdiction {prefix.jurisdiction}"
        )
    if signals.stopping:
        return Decision(prefix, Announcement.WITHDRAW, "stopping")
    if prefix.service not in signals.ready:
        return Decision(prefix, Announcement.WITHDRAW, f"{prefix.service} not ready")
    if signals.store_reachable and signals.servable is not None:
        if prefix.jurisdiction is not None and prefix.jurisdiction not in signals.servable:
            return Decision(
                prefix, Announcement.WITHDRAW, f"no available region in {prefix.jurisdiction}"
            )
        if prefix.jurisdiction is None and not signals.any_available:
            return Decision(prefix, Announcement.WITHDRAW, "no available region")
    if signals.draining:
        return _drained(prefix, signals, drain)
    reason = "ready" if signals.store_reachable else "ready (store unreachable: static stability)"
    return Decision(prefix, Announcement.ANNOUNCE, reason)


def _drained(prefix: AnycastPrefix, signals: RegionSignals, drain: DrainPolicy) -> Decision:
    if drain.behaviour is DrainBehaviour.WITHDRAW:
        return Decision(prefix, Announcement.WITHDRAW, "drained")
    age = signals.drain_age_s or 0.0
    if drain.grace_s is not None and age >= drain.grace_s:
        return Decision(prefix, Announcement.WITHDRAW, f"drained for {drain.grace_s:g} s")
    return Decision(prefix, Announcement.DRAINING, f"draining ({drain.behaviour})")


def decide(prefixes: Iterable[AnycastPrefix], signals: RegionSignals, drain: DrainPolicy) -> Plan:
    """The decision for every prefix."""
    return Plan(tuple(decide_one(p, signals, drain) for p in prefixes))
