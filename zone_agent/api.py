"""The zone agent's HTTP handlers: the OpenAI endpoints, ``/v1/assign``, ``/v1/models``,
``/healthz``, ``/readyz`` and ``/metrics``.

**OpenAI endpoints** (:class:`OpenAiApi`): read and count the request
(:mod:`zone_agent.request`), then carry it with the zone's relay
(:class:`zone_agent.proxy.ZoneRelay`: decide, charge, forward, retry before the first
byte, stream back). The same handler serves them on aiohttp's server
(:meth:`OpenAiApi.routes`) and on the lean one (:meth:`OpenAiApi.lean_routes`,
:mod:`gtm.http1`); only how the body arrives and the response leaves differ.

**The decision API**, ``POST /v1/assign`` (:class:`AssignApi`), lets another data plane
carry the bytes while the agent decides (nginx ``auth_request``, an Envoy ext-proc or
ext-authz filter). Two forms:

* a JSON body — the OpenAI request itself; the endpoint comes from ``?endpoint=chat``
  (``completion``, ``embedding``) or is inferred from the body (``messages`` → chat,
  ``prompt`` → completion, ``input`` → embedding);
* no body (what ``auth_request`` sends): headers ``x-gtm-model`` and
  ``x-gtm-input-tokens`` (a prompt of that many tokens, no prefix information).

The answer is ``200`` with the chosen GPU (``gpu``, ``url``), ``zone``, ``region``,
``decision_id``, ``predicted_ttft_ms`` and the decision ``trace`` — and the same in
headers ``x-gtm-gpu``, ``x-gtm-upstream`` (``host:port``, for ``proxy_pass
http://$upstream``), ``x-gtm-zone``, ``x-gtm-decision-id``. Errors are the proxy's (400,
404, 503 with ``Retry-After``). The choice is charged to its GPU for ``assign_hold_s``
(the agent never sees such a request end), so a burst between two scrapes still spreads.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import CollectorRegistry

from gtm import access, inbound
from gtm.clock import Clock
from gtm.http1 import Request, Route
from gtm.inbound import Scope
from gtm.models import decision_adapter
from gtm.openai_request import parse_json_body
from gtm.relay import AiohttpDownstream, Downstream
from gtm.serve import add_service_routes
from zone_agent.accounting import Accounting
from zone_agent.errors import BadRequest
from zone_agent.metrics import ZoneMetrics
from zone_agent.proxy import DataPath, ZoneRelay, charge, decide_or_refuse
from zone_agent.request import (
    HEADER_DECISION,
    HEADER_GPU,
    HEADER_VERSION,
    HEADER_ZONE,
    Endpoint,
    Ids,
    ZoneRequest,
    canary,
    request_id,
    zone_request,
)
from zone_agent.router import ZoneProfile
from zone_agent.view import ZoneView

_IDS = Ids()


def zone_facts(
    headers: Mapping[str, str], raw: bytes, endpoint: Endpoint, accounting: Accounting
) -> ZoneRequest:
    """The decision facts of a request's body; ApiError (400) when the body is bad."""
    body = parse_json_body(raw)
    return zone_request(
        body,
        endpoint,
        request_id=request_id(headers, _IDS),
        seq=accounting.next_seq(),
        version=headers.get(HEADER_VERSION) or None,
        canary=canary(headers),
    )


class OpenAiApi:
    """The OpenAI endpoints of a zone agent: each request relayed to a GPU."""

    def __init__(self, path: DataPath) -> None:
        self._path = path

    def routes(self, app: web.Application) -> None:
        for endpoint in Endpoint:
            app.router.add_post(endpoint.path, self._handler(endpoint))

    def lean_routes(self) -> list[Route]:
        """The same endpoints for the lean server (:mod:`gtm.http1`)."""
        return [
            Route("POST", endpoint.path, partial(self._lean, endpoint)) for endpoint in Endpoint
        ]

    def _handler(
        self, endpoint: Endpoint
    ) -> Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.handle(request, endpoint)

        return handle

    def _lean(self, endpoint: Endpoint, request: Request, client: Downstream) -> Awaitable[None]:
        """The lean server's handler (``endpoint`` bound by ``partial``, not a closure):
        :meth:`relay`'s awaitable, with no coroutine of its own around it."""
        return self.relay(request, client, endpoint, request.body, time.perf_counter())

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """aiohttp's handler: the body read (bounded), relayed through aiohttp."""
        started = time.perf_counter()
        raw = await inbound.read_body(request)
        client = AiohttpDownstream(request)
        await self.relay(request, client, endpoint, raw, started)
        return client.result()

    def relay(
        self, request: Scope, client: Downstream, endpoint: Endpoint, raw: bytes, started: float
    ) -> Awaitable[None]:
        """One request whose body was read: count it, tell the access line; the relay to
        a GPU through ``client`` (either server's) to await. ApiError for the client's
        errors, raised at once (a handler raises it as it would from the await)."""
        facts = zone_facts(request.headers, raw, endpoint, self._path.accounting)
        access.tell(
            request,
            model=facts.model,
            tokens_in=facts.input_tokens,
            tokens_out=facts.max_output_tokens,
            tokens_source=access.TokenSource.ESTIMATE,
        )
        return ZoneRelay(request, client, self._path, raw, facts, started).run()


class ServiceApi:
    """``/healthz``, ``/readyz`` (a GPU can take requests), ``/metrics``."""

    def __init__(self, view: Callable[[], ZoneView], registry: CollectorRegistry) -> None:
        self._view = view
        self._registry = registry

    def routes(self, app: web.Application) -> None:
        add_service_routes(app, registry=self._registry, readyz=self.readyz)

    async def readyz(self, request: web.Request) -> web.Response:
        view = self._view()
        available = view.available_count()
        body: Mapping[str, object] = {
            "zone": view.zone_id,
            "gpus": len(view.gpus),
            "available_gpus": available,
            "models": list(view.models),
        }
        return web.json_response(body, status=200 if available else 503)


HEADER_UPSTREAM = "x-gtm-upstream"
HEADER_MODEL = "x-gtm-model"
HEADER_INPUT_TOKENS = "x-gtm-input-tokens"

#: Largest prompt the header form accepts (tokens): beyond any model's context.
MAX_HEADER_TOKENS = 10_000_000


def _endpoint(query: Mapping[str, str], body: Mapping[str, object]) -> Endpoint:
    named = query.get("endpoint")
    if named is not None:
        try:
            return Endpoint(named)
        except ValueError:
            raise BadRequest(
                f"endpoint must be one of {', '.join(e.value for e in Endpoint)}",
                param="endpoint",
            ) from None
    if "prompt" in body:
        return Endpoint.COMPLETION
    if "input" in body and "messages" not in body:
        return Endpoint.EMBEDDING
    return Endpoint.CHAT


def _from_headers(request: web.Request, seq: int) -> ZoneRequest:
    model = request.headers.get(HEADER_MODEL, "")
    raw_tokens = request.headers.get(HEADER_INPUT_TOKENS, "0")
    if not model:
        raise BadRequest(
            f"send an OpenAI request body, or the {HEADER_MODEL} header", param="model"
        )
    try:
        tokens = int(raw_tokens)
    except ValueError:
        tokens = -1
    if not 0 <= tokens <= MAX_HEADER_TOKENS:
        raise BadRequest(f"{HEADER_INPUT_TOKENS} must be an integer in [0, {MAX_HEADER_TOKENS}]")
    return ZoneRequest(
        request_id=request_id(request.headers, _IDS),
        model=model,
        endpoint=Endpoint.CHAT,
        input_tokens=tokens,
        max_prompt_tokens=tokens,
        seq=seq,
        version=request.headers.get(HEADER_VERSION) or None,
        canary=canary(request.headers),
    )


class AssignApi:
    def __init__(
        self,
        *,
        zone_id: str,
        region_id: str,
        view: Callable[[], ZoneView],
        profile: Callable[[], ZoneProfile],
        accounting: Accounting,
        metrics: ZoneMetrics,
        clock: Clock,
        hold_s: float,
        trace_top: int,
        affinity: bool = True,
        on_sent: Callable[[bytes, ZoneRequest, int], None] | None = None,
    ) -> None:
        self._affinity = affinity
        #: As the data path's (zone_agent.proxy.DataPath.on_sent): the prompt assigned.
        self._on_sent = on_sent
        self._zone = zone_id
        self._region = region_id
        self._view = view
        self._profile = profile
        self._acc = accounting
        self._metrics = metrics
        self._clock = clock
        self._hold = hold_s
        self._top = trace_top

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/assign", self.assign)
        app.router.add_get("/v1/models", self.models)

    async def assign(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        raw = await request.read()
        seq = self._acc.next_seq()
        if raw.strip():
            body = parse_json_body(raw)
            facts = zone_request(
                body,
                _endpoint(request.query, body),
                request_id=request_id(request.headers, _IDS),
                seq=seq,
                version=request.headers.get(HEADER_VERSION) or None,
                canary=canary(request.headers),
            )
        else:
            facts = _from_headers(request, seq)
        now = self._clock.monotonic()
        self._acc.expire(now)
        decision = decide_or_refuse(
            self._profile(), facts, self._view(), frozenset(), affinity=self._affinity
        )
        self._acc.hold(charge(self._acc, decision), now + self._hold)
        if self._on_sent is not None and raw.strip():
            index, i = decision.model_index, decision.choice
            self._on_sent(raw, facts, int(index.block_size[i]))
        self._metrics.assignments.labels(decision.gpu_id, decision.profile).inc()
        self._metrics.decision.observe(time.perf_counter() - started)
        decision_id = uuid.uuid4().hex
        url = decision.gpu.worker.url
        parts = urlsplit(url)
        upstream = parts.netloc or url
        payload: dict[str, Any] = {
            "gpu": decision.gpu_id,
            "url": url,
            "zone": self._zone,
            "region": self._region,
            "decision_id": decision_id,
            "request_id": facts.request_id,
            "predicted_ttft_ms": decision.predicted_ttft_ms,
            "uncached_tokens": decision.uncached_tokens,
            "decision": decision_adapter.dump_python(decision.to_decision(self._top), mode="json"),
        }
        headers = {
            HEADER_GPU: decision.gpu_id,
            HEADER_UPSTREAM: upstream,
            HEADER_ZONE: self._zone,
            HEADER_DECISION: decision_id,
        }
        return web.json_response(payload, headers=headers)

    async def models(self, request: web.Request) -> web.Response:
        view = self._view()
        data = [
            {
                "id": model,
                "object": "model",
                "created": 0,
                "owned_by": "gtm",
                "max_model_len": int(index.max_model_len.max()),
                "gpus": len(index.ids),
                "available_gpus": int(index.available.sum()),
            }
            for model, index in view.by_model.items()
        ]
        return web.json_response({"object": "list", "data": data})
