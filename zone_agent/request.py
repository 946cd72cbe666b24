"""From an OpenAI request to the facts a GPU decision needs (:class:`ZoneRequest`).

The body is read as every tier reads it (:func:`gtm.openai_request.read_prompt`: prompt
sizes counted with :mod:`gtm.tokens`, the estimator the emulated workers charge
requests with, so the agent's "prompt too long" answer agrees with the worker's).
Prefix fingerprints hash the prompt text (:mod:`zone_agent.prefix`). Bad input becomes a
:class:`~zone_agent.errors.BadRequest` naming the parameter as OpenAI would
(:mod:`gtm.openai_params`); nothing here raises anything else on any JSON value.

Headers the zone agent reads or sets::

    x-request-id       the client's request id (kept when sane, else a new one), echoed
    x-gtm-version      the model version asked for (canary routing)
    x-gtm-canary       auto | always | never: canary GPUs by the rule, forced in or out
    x-gtm-zone, x-gtm-gpu, x-gtm-decision-id   where the request went (responses)
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import NamedTuple

from gtm import headers as gtm_headers
from gtm import inbound, openai_request
from gtm.openai_errors import BadRequest
from gtm.openai_request import read_prompt
from zone_agent.prefix import BLOCK_BYTES, consistent_hash_key, text_block_hashes

# The inter-tier headers the zone reads or sets (their one list: gtm.headers).
HEADER_ZONE = gtm_headers.ZONE
HEADER_GPU = gtm_headers.GPU
HEADER_DECISION = gtm_headers.DECISION_ID
HEADER_REQUEST_ID = gtm_headers.REQUEST_ID
HEADER_VERSION = gtm_headers.VERSION
HEADER_CANARY = gtm_headers.CANARY


class Endpoint(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"

    @property
    def path(self) -> str:
        return _PATHS[self]


_PATHS = {
    Endpoint.CHAT: openai_request.CHAT,
    Endpoint.COMPLETION: openai_request.COMPLETIONS,
    Endpoint.EMBEDDING: openai_request.EMBEDDINGS,
}


class CanaryChoice(StrEnum):
    """``x-gtm-canary``: let the canary rule decide, or force canary GPUs in or out."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class ZoneRequest(NamedTuple):
    """One request as the GPU decision sees it. Holds no prompt text.

    Immutable and typed as a frozen dataclass; a named tuple because one is built for
    every request, and a frozen dataclass sets each of its fields through
    ``object.__setattr__`` (several times the cost). Copy with changes: ``_replace``."""

    request_id: str
    model: str
    endpoint: Endpoint
    #: Prompt tokens over all prompts of the request (each prompt once).
    input_tokens: int
    #: The longest single prompt: what the context-length check is about.
    max_prompt_tokens: int
    #: ``max_tokens`` / ``max_completion_tokens`` when given (None: up to the context).
    max_output_tokens: int | None = None
    #: Prompts in the request (a completions ``prompt`` may hold several).
    prompts: int = 1
    #: Sequences the request starts (prompts × ``n``).
    sequences: int = 1
    #: Prefix-chained hashes of the first prompt's text blocks.
    prefix_hashes: tuple[int, ...] = ()
    #: Prompt tokens one prefix block stands for (of the first prompt).
    tokens_per_block: float = 0.0
    #: MD5 of the prompt's first 256 characters (consistent-hash baselines).
    hash_key: int = 0
    stream: bool = False
    #: Arrival number at this agent (round-robin baselines count with it).
    seq: int = 0
    #: ``x-gtm-version``: only GPUs labelled with this version.
    version: str | None = None
    canary: CanaryChoice = CanaryChoice.AUTO

    @property
    def output_tokens_or_one(self) -> int:
        return 1 if self.max_output_tokens is None else self.max_output_tokens


def zone_request(
    body: Mapping[str, object],
    endpoint: Endpoint,
    *,
    request_id: str,
    seq: int = 0,
    version: str | None = None,
    canary: CanaryChoice = CanaryChoice.AUTO,
) -> ZoneRequest:
    """Check ``body``'s parameters as OpenAI does and read what the decision needs
    (:func:`gtm.openai_request.read_prompt`); the worker checks what only it knows (the
    model's context, extra sampling parameters)."""
    read = read_prompt(body, _PATHS[endpoint])  # endpoint.path, without the property's call
    counts = read.token_counts
    prompts = len(counts)
    text = read.fingerprint_text
    data = text.encode("utf-8", "surrogatepass")
    # The tuple made directly, in the fields' order (the named tuple's ``__new__`` is a
    # Python function around this same call; every field is given).
    return _new_tuple(
        ZoneRequest,
        (
            request_id,
            read.model,
            endpoint,
            sum(counts),  # input_tokens
            max(counts),  # max_prompt_tokens
            read.max_output_tokens,
            prompts,
            prompts * read.choices,  # sequences
            text_block_hashes(data) if endpoint is not Endpoint.EMBEDDING else (),
            counts[0] * BLOCK_BYTES / len(data) if data else 0.0,  # tokens_per_block
            consistent_hash_key(text),
            read.stream,
            seq,
            version,
            canary,
        ),
    )


_new_tuple = tuple.__new__

# ---------------------------------------------------------------------------- headers


class Ids:
    """Unique ids for requests and decisions: a random 64-bit prefix per process and a
    counter (32 hex digits, as ``uuid4().hex``). ``uuid4`` costs a ``getrandom`` system
    call and an object per id, twice per proxied request."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16]
        #: A new id: the prefix and the counter's next value in 16 hex digits, made by
        #: C calls alone (``map`` of a ``%`` format over the counter: no Python frame per
        #: id, and ``%`` is the cheapest of the formats here).
        self.new: Callable[[], str] = map(
            f"{self._prefix}%016x".__mod__, itertools.count(1)
        ).__next__


def request_id(headers: Mapping[str, str], ids: Ids) -> str:
    """The client's ``x-request-id`` when sane (:mod:`gtm.inbound`), else ``ids.new()``."""
    rid = inbound.client_request_id(headers)
    return ids.new() if rid is None else rid


def canary(headers: Mapping[str, str]) -> CanaryChoice:
    """``x-gtm-canary`` (absent: auto); anything else is a 400."""
    raw = headers.get(HEADER_CANARY)
    if raw is None:
        return CanaryChoice.AUTO
    try:
        return CanaryChoice(raw.strip().lower())
    except ValueError:
        raise BadRequest(
            f"{HEADER_CANARY} must be one of {', '.join(c.value for c in CanaryChoice)}",
            param=HEADER_CANARY,
        ) from None


def first_prompt(prompt: object) -> str | tuple[int, ...] | None:
    """A completion body's ``prompt`` as an engine takes its first one: the text, or the
    token ids (a token array, or the first of a list of texts or arrays); None for what
    is neither. The KV-event readers tokenize it each their own way."""
    if isinstance(prompt, list) and prompt:
        if all(type(x) is int for x in prompt):
            return tuple(prompt)
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(type(x) is int for x in prompt):
        return tuple(prompt)
    return None
