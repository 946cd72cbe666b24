"""From an OpenAI request (body + headers) to the facts the regional tier decides on.

The body is read as every tier reads it (:func:`gtm.openai_request.read_prompt`: prompt
sizes counted with :mod:`gtm.tokens`, the estimator the emulated workers charge with),
so the quota charged on admission is close to what the worker reports.

Prefix fingerprints must agree with the zone agents' ``prefix_sketch``: they hash
256-byte blocks of the same prompt text, prefix-chained with BLAKE2b (the zone agent's
``zone_agent/prefix.py``; the tiers cannot import each other, so
``tests/unit/regional_lb/test_request.py`` checks the two agree). The zone sketch only
holds each prompt's leading blocks; :data:`HASHED_BLOCKS` are hashed here (the LB's
placement memory looks deeper).

Inter-tier headers (all optional; the tier-only ones are read only from a proven tier,
:mod:`regional_lb.location`)::

    x-gtm-hops             regional hops so far (the global front door sends 1)
    x-gtm-spilled-from     comma-separated regions the request was spilled from
    x-gtm-client-country   ISO 3166-1 alpha-2 country of the client (the tier that located it)
    x-gtm-location-source  how that tier located it (geoip, trusted-proxy-xff, ...)
    x-gtm-decision-id      the front door's decision id (this tier's audit records reuse it)
    x-gtm-tier-auth        the sending tier's signature (gtm.trust)
    x-gtm-data-class       the request's data class (residency), default "default"
    x-gtm-priority         interactive | batch | best-effort (at most the tenant's class)
    x-request-id           the client's request id, echoed
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from gtm import headers as gtm_headers
from gtm import inbound, openai_request
from gtm.fingerprint import TEXT_BLOCK_BYTES, text_block_hashes
from gtm.models import Priority
from gtm.openai_errors import BadRequest
from gtm.openai_request import read_prompt
from gtm.routing.placement import FINGERPRINT_BLOCKS
from policies.types import is_country_code, is_identifier

# The inter-tier headers this tier reads or sets (their one list: gtm.headers).
HEADER_HOPS = gtm_headers.HOPS
HEADER_SPILLED_FROM = gtm_headers.SPILLED_FROM
HEADER_CLIENT_COUNTRY = gtm_headers.CLIENT_COUNTRY
HEADER_DATA_CLASS = gtm_headers.DATA_CLASS
HEADER_PRIORITY = gtm_headers.PRIORITY
HEADER_REQUEST_ID = gtm_headers.REQUEST_ID
HEADER_REGION = gtm_headers.REGION
HEADER_ZONE = gtm_headers.ZONE
HEADER_DECISION = gtm_headers.DECISION_ID
HEADER_PEER_TOKEN = gtm_headers.PEER_TOKEN
HEADER_LOCATION_SOURCE = gtm_headers.LOCATION_SOURCE
HEADER_TIER_AUTH = gtm_headers.TIER_AUTH

#: Bytes of prompt text per prefix block, as the zone agent hashes them.
BLOCK_BYTES = TEXT_BLOCK_BYTES
#: Leading blocks the zone agents put in their sketches (two) and a margin.
SKETCH_BLOCKS = 8
#: Leading blocks hashed: the sketches' and deeper, so the LB's placement memory
#: (:mod:`gtm.routing.placement`) tells apart conversations sharing a system prompt.
HASHED_BLOCKS = max(SKETCH_BLOCKS, FINGERPRINT_BLOCKS)


class Endpoint(StrEnum):
    CHAT = openai_request.CHAT
    COMPLETION = openai_request.COMPLETIONS
    EMBEDDING = openai_request.EMBEDDINGS


@dataclass(frozen=True, slots=True)
class BodyFacts:
    """What the decision needs from a body. Holds no prompt text."""

    model: str
    input_tokens: int
    #: ``max_tokens`` / ``max_completion_tokens`` × choices, when given.
    max_output_tokens: int | None
    stream: bool
    prefix_hashes: tuple[int, ...] = ()
    tokens_per_block: float = 0.0


@dataclass(frozen=True, slots=True)
class HopInfo:
    """Where the request has been: regional hops and the regions it was spilled from."""

    hops: int = 0
    spilled_from: tuple[str, ...] = ()


def body_facts(body: Mapping[str, object], endpoint: Endpoint) -> BodyFacts:
    """Check the body's parameters as OpenAI does and read what the decision needs
    (:func:`gtm.openai_request.read_prompt`); the worker checks what only it knows (the
    model's context, extra sampling parameters)."""
    read = read_prompt(body, endpoint.value)
    first_tokens = read.token_counts[0]
    data = read.fingerprint_text.encode("utf-8", "surrogatepass")
    hashes = (
        text_block_hashes(data, limit=HASHED_BLOCKS) if endpoint is not Endpoint.EMBEDDING else ()
    )
    output = read.max_output_tokens
    return BodyFacts(
        model=read.model,
        input_tokens=sum(read.token_counts),
        max_output_tokens=None if output is None else output * read.choices,
        stream=read.stream,
        prefix_hashes=hashes,
        tokens_per_block=first_tokens * BLOCK_BYTES / len(data) if data else 0.0,
    )


# ---------------------------------------------------------------------------- headers


def request_id(headers: Mapping[str, str]) -> str:
    """The client's ``x-request-id`` when sane, else a new one (:mod:`gtm.inbound`)."""
    return inbound.request_id(headers)


def hop_info(headers: Mapping[str, str]) -> HopInfo:
    """Hops and spill chain from the headers; malformed values are a 400."""
    raw_hops = headers.get(HEADER_HOPS, "0").strip() or "0"
    if not raw_hops.isdigit() or len(raw_hops) > 3:
        raise BadRequest(f"{HEADER_HOPS} must be a small non-negative integer", param=HEADER_HOPS)
    chain = tuple(p.strip() for p in headers.get(HEADER_SPILLED_FROM, "").split(",") if p.strip())
    if len(chain) > 16 or not all(is_identifier(region) for region in chain):
        raise BadRequest(
            f"{HEADER_SPILLED_FROM} must be a comma-separated list of region ids",
            param=HEADER_SPILLED_FROM,
        )
    return HopInfo(int(raw_hops), chain)


def client_country(headers: Mapping[str, str]) -> str | None:
    value = headers.get(HEADER_CLIENT_COUNTRY, "").strip().upper()
    if not value:
        return None
    if not is_country_code(value):
        raise BadRequest(
            f"{HEADER_CLIENT_COUNTRY} must be an ISO 3166-1 alpha-2 code",
            param=HEADER_CLIENT_COUNTRY,
        )
    return value


def decision_id(headers: Mapping[str, str]) -> str | None:
    """The upstream tier's decision id when it is a sane token, else ``None``."""
    value = headers.get(HEADER_DECISION, "").strip()
    return value if _DECISION_ID.match(value) else None


_DECISION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def data_class(headers: Mapping[str, str]) -> str:
    value = headers.get(HEADER_DATA_CLASS, "default").strip() or "default"
    if not is_identifier(value):
        raise BadRequest(f"{HEADER_DATA_CLASS} must be a lowercase id", param=HEADER_DATA_CLASS)
    return value


def priority(headers: Mapping[str, str], tenant_class: Priority) -> Priority:
    """The request's band: the header may lower the tenant's class, never raise it."""
    value = headers.get(HEADER_PRIORITY, "").strip().lower()
    if not value:
        return tenant_class
    try:
        asked = Priority(value)
    except ValueError:
        choices = ", ".join(p.value for p in Priority)
        raise BadRequest(
            f"{HEADER_PRIORITY} must be one of {choices}", param=HEADER_PRIORITY
        ) from None
    return asked if asked.rank >= tenant_class.rank else tenant_class
