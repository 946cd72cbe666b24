"""The ``x-gtm-*`` headers: the one list of what the tiers tell each other and clients.

A tier that sets a header and the tier that reads it name it from here, so the contract
between the front door, the regional LBs and the zone agents cannot drift apart. Each
tier's ``request.py`` says which of them it reads or sets, and parses their values.
Header names are case-insensitive on the wire; they are written in lower case here.

**The trust boundary** (one rule, for every tier; SECURITY.md has the table): a request
header whose name starts with ``x-gtm-`` is a tier's assertion and is believed only when
the request proves it comes from a gtm tier (:mod:`gtm.trust`: a fresh ``x-gtm-tier-auth``
signature over these headers, made with the key the tiers share). From anyone else —
a client at the front door, or a client that reached a regional LB or a zone directly —
every such header is dropped (:func:`from_untrusted`), except :data:`CLIENT_REQUESTS`:
what a client may ask for (its data class, a lower priority, canary GPUs in or out, a
model version), which the first tier validates and bounds.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The client's request id, echoed on the response (not an ``x-gtm-`` header, but read
#: and set by every tier alike).
REQUEST_ID = "x-request-id"

# ---------------------------------------------------------------- towards the tiers below

#: Tiers crossed so far: the front door sends 1, each spill between regions adds one.
HOPS = "x-gtm-hops"
#: Comma-separated regions a request was spilled from (no ping-pong between peers).
SPILLED_FROM = "x-gtm-spilled-from"
#: The client's ISO 3166-1 alpha-2 country as the tier that located it found it (a
#: client's own value is dropped), for the next tier's residency check.
CLIENT_COUNTRY = "x-gtm-client-country"
#: How that tier learnt the location (:class:`gtm.trust.LocationOrigin`); absent with a
#: country from an older front door.
LOCATION_SOURCE = "x-gtm-location-source"
#: ``v1;<issuer>;<unix ms>;<hex HMAC-SHA256>``: the sending tier's signature over the
#: request id, the time and every other ``x-gtm-`` request header (:mod:`gtm.trust`).
TIER_AUTH = "x-gtm-tier-auth"
#: The request's data class (residency), default ``default``.
DATA_CLASS = "x-gtm-data-class"
#: ``interactive`` | ``batch`` | ``best-effort``: may lower the tenant's class, never raise it.
PRIORITY = "x-gtm-priority"
#: The tiers' shared key itself, as regional LBs before ``x-gtm-tier-auth`` sent it on a
#: spill (still accepted as proof of a tier; never sent any more).
PEER_TOKEN = "x-gtm-peer-token"
#: Force canary GPUs in (``always``) or out (``never``), or let the canary rule decide.
CANARY = "x-gtm-canary"
#: Only GPUs serving this version of the model (their ``version`` label) may take it.
VERSION = "x-gtm-version"

# ---------------------------------------------------------------- back towards the client

#: The decision's id, in both directions.
DECISION_ID = "x-gtm-decision-id"
#: Where the request was served: the region, the zone and the GPU.
REGION = "x-gtm-region"
ZONE = "x-gtm-zone"
GPU = "x-gtm-gpu"

# ---------------------------------------------------------------- the trust boundary

#: Every ``x-gtm-`` request header starts so; only a tier may set one (but see below).
PREFIX = "x-gtm-"
#: What a client may ask for itself: its data class (which of its tenant's residency
#: rules apply), a priority (lowers the tenant's class, never raises it), canary GPUs
#: in or out, a model version. Validated and bounded by the tier that admits it.
CLIENT_REQUESTS: frozenset[str] = frozenset({DATA_CLASS, PRIORITY, CANARY, VERSION})
#: The assertions a tier makes to the next one: believed only from a proven tier.
TIER_ONLY: tuple[str, ...] = (
    HOPS,
    SPILLED_FROM,
    CLIENT_COUNTRY,
    LOCATION_SOURCE,
    PEER_TOKEN,
    TIER_AUTH,
    DECISION_ID,
)


def is_tier_only(name: str) -> bool:
    """Whether request header ``name`` is a tier's assertion (any ``x-gtm-`` header but
    :data:`CLIENT_REQUESTS`, including ones this version does not know)."""
    lowered = name.lower()
    return lowered.startswith(PREFIX) and lowered not in CLIENT_REQUESTS


def from_untrusted(names: Iterable[str]) -> frozenset[str]:
    """The headers among ``names`` to drop from a sender that is not a proven tier
    (lower case)."""
    return frozenset(n.lower() for n in names if is_tier_only(n))
