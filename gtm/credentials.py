"""Credentials that stop at a tier: which request headers carry a client's secret.

A tenant's API key authenticates the tenant to gtm, not to a GPU worker. The tiers
that authenticate tenants (the front door and the regional LB, each from
``Authorization: Bearer <key>``, :mod:`gtm.inbound`) pass it on only to a tier that
authenticates it again: the front door to a regional LB, a regional LB to a peer
region it spills to. Towards a zone agent nothing needs it — the zone places by model
and load, never by tenant — so the regional LB drops it there, and the zone agent
drops whatever a client sent it directly and speaks to each worker with the worker's
own key (:mod:`zone_agent.credentials`). A worker therefore never sees (nor logs) a
tenant's key, and a vLLM started with ``--api-key`` accepts the zone's requests.

:data:`CLIENT_CREDENTIALS` is every header an OpenAI-compatible client sends its key
in: ``Authorization`` (the OpenAI SDKs), ``api-key`` (Azure OpenAI's SDK),
``x-api-key`` (Anthropic-style clients), and ``Proxy-Authorization`` (already
hop-by-hop: :data:`gtm.relay.HOP_BY_HOP`). gtm reads only the first; the others are
dropped all the same, as a key sent in them is a secret too.
"""

from __future__ import annotations

#: Request headers that carry a client's credential (lower case).
CLIENT_CREDENTIALS: frozenset[str] = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key"}
)

#: The header a worker's key travels in, as vLLM's ``--api-key`` expects it.
WORKER_AUTHORIZATION = "Authorization"

__all__ = ["CLIENT_CREDENTIALS", "WORKER_AUTHORIZATION"]
