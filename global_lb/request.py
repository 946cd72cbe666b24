"""What the front door reads from an OpenAI-compatible request: model, size, headers.

Only what region choice needs: the model, the prompt's size in tokens and the output
budget (read as every tier reads a body, :func:`gtm.openai_request.read_prompt`), the
prompt's leading prefix fingerprints (for the front door's placement memory), the
data class and the hop count. The body itself is forwarded untouched.

Inter-tier headers the front door reads or sets::

    x-gtm-hops             tiers crossed so far (a loop past the limit is a 508)
    x-gtm-data-class       the request's data class (residency), default "default"
    x-gtm-client-country   the client's country as located here (a client's own dropped)
    x-gtm-region           the region that served the request (the regional LB's own)
    x-gtm-decision-id      the decision's id, in both directions
"""

from __future__ import annotations

from dataclasses import dataclass

from global_lb.errors import BadRequest
from gtm import headers as gtm_headers
from gtm import openai_request
from gtm.fingerprint import TEXT_BLOCK_BYTES, text_block_hashes
from gtm.openai_errors import ApiError
from gtm.openai_request import parse_json_body, read_prompt
from gtm.routing.placement import FINGERPRINT_BLOCKS
from policies.types import is_identifier

# The inter-tier headers the front door reads or sets (their one list: gtm.headers).
HOPS_HEADER = gtm_headers.HOPS
REGION_HEADER = gtm_headers.REGION
DECISION_HEADER = gtm_headers.DECISION_ID
DATA_CLASS_HEADER = gtm_headers.DATA_CLASS
#: Set only by the front door: a client's own value is dropped, or a client could claim
#: a country whose rules suit it.
CLIENT_COUNTRY_HEADER = gtm_headers.CLIENT_COUNTRY
FORWARDED_FOR_HEADER = "X-Forwarded-For"


#: Endpoints the front door forwards (ARCHITECTURE §6).
CHAT = openai_request.CHAT
COMPLETIONS = openai_request.COMPLETIONS
EMBEDDINGS = openai_request.EMBEDDINGS


@dataclass(frozen=True, slots=True)
class RequestFacts:
    model: str
    input_tokens: int
    max_output_tokens: int
    stream: bool
    #: The first prompt's leading block hashes (:mod:`gtm.fingerprint`, the tiers' one
    #: fingerprint), at most :data:`gtm.routing.placement.FINGERPRINT_BLOCKS`.
    prefix_hashes: tuple[int, ...] = ()
    #: Prompt tokens per block of that prompt's text (0 without text).
    tokens_per_block: float = 0.0


def parse_body(path: str, body: bytes) -> RequestFacts:
    """What region choice needs from a body, read and checked as every tier reads it
    (:func:`gtm.openai_request.read_prompt`); a malformed one is a :class:`BadRequest`
    naming the parameter as OpenAI would."""
    try:
        read = read_prompt(parse_json_body(body), path)
    except ApiError as exc:
        raise BadRequest(exc.message, param=exc.param, code=exc.code) from None
    data = read.fingerprint_text.encode("utf-8", "surrogatepass")
    embedding = path.rstrip("/").endswith(EMBEDDINGS)
    return RequestFacts(
        read.model,
        sum(read.token_counts),
        read.max_output_tokens or 0,
        read.stream,
        () if embedding else text_block_hashes(data, limit=FINGERPRINT_BLOCKS),
        read.token_counts[0] * TEXT_BLOCK_BYTES / len(data) if data else 0.0,
    )


def check_data_class(value: str) -> None:
    """A data class header must be a lowercase id (400 otherwise)."""
    if not is_identifier(value):
        raise BadRequest(
            f"{DATA_CLASS_HEADER} must be a lowercase id, got {value!r}", param=DATA_CLASS_HEADER
        )


def hops(value: str | None) -> int:
    """The hop count of ``x-gtm-hops`` (absent or garbled: 0)."""
    if value is None:
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        return 0
