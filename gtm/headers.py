"""The ``x-gtm-*`` headers: the one list of what the tiers tell each other and clients.

A tier that sets a header and the tier that reads it name it from here, so the contract
between the front door, the regional LBs and the zone agents cannot drift apart. Each
tier's ``request.py`` says which of them it reads or sets, and parses their values.
Header names are case-insensitive on the wire; they are written in lower case here.
"""

from __future__ import annotations

#: The client's request id, echoed on the response (not an ``x-gtm-`` header, but read
#: and set by every tier alike).
REQUEST_ID = "x-request-id"

# ---------------------------------------------------------------- towards the tiers below

#: Tiers crossed so far: the front door sends 1, each spill between regions adds one.
HOPS = "x-gtm-hops"
#: Comma-separated regions a request was spilled from (no ping-pong between peers).
SPILLED_FROM = "x-gtm-spilled-from"
#: The client's ISO 3166-1 alpha-2 country as the front door located it (a client's own
#: value is dropped there), for the regional LB's residency check on spillover.
CLIENT_COUNTRY = "x-gtm-client-country"
#: The request's data class (residency), default ``default``.
DATA_CLASS = "x-gtm-data-class"
#: ``interactive`` | ``batch`` | ``best-effort``: may lower the tenant's class, never raise it.
PRIORITY = "x-gtm-priority"
#: The regional LBs' shared secret: a spilled request that carries it is not charged twice.
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
