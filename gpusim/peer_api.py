"""What the routers operators run ask a worker, answered from the emulated engine.

``sglang-router`` (SGLang's model gateway) and ``vllm-router`` read more than
``/health`` and ``/metrics`` from their workers; a worker that does not answer leaves
a policy without its load signal, and a side-by-side benchmark would then compare gtm
with a crippled peer (issue 26). These endpoints give them what a real engine gives,
from the same engine state ``/metrics`` reports:

``GET /get_load``
    SGLang's load report, one entry per data-parallel rank (here: per served model):
    ``dp_rank``, ``num_reqs`` (running + waiting), ``num_waiting_reqs``, ``num_tokens``
    (tokens held in KV by running requests plus the prompt tokens still to prefill).
    sglang-router's ``power_of_two`` polls it (its load monitor, every 30 s by default)
    and compares the ``num_tokens`` sums; vllm-router's ``power_of_two`` polls the same
    path but reads an object's ``load`` field, which no current engine returns (vLLM
    has no ``/get_load``), so it falls back to its own in-flight counts, as in front
    of real vLLM workers.
``GET /server_info``, ``GET /get_server_info``
    SGLang's server arguments (``model_path``, ``tp_size``, ``dp_size``, ``page_size``,
    ``max_total_num_tokens``, ``max_running_requests``, ``context_length``, ...), with
    vLLM's ``kv_block_size`` beside them: sglang-router reads it when a worker joins,
    vllm-router's ``kv_aware`` reads the block size from it.
``GET /model_info``, ``GET /get_model_info``
    SGLang's model description (``model_path``, ``is_generation``, ...), read by
    sglang-router when a worker joins.
``POST /v1/completions/render``
    vLLM's renderer: the prompt's token ids (:mod:`gtm.tokens`, the tokenizer the
    engine charges with and hashes prefix blocks of) as a list of ``GenerateRequest``
    objects. vllm-router's ``cache_aware`` and ``kv_aware`` ask *every* worker to render
    every text prompt before they choose one (0.1.17: ``prepare_http_token_inputs`` in
    ``src/backend/preprocess.rs``, up to 8 at once, waiting at most 1 s,
    ``src/routers/http/router.rs`` line 1581) and match prefixes on token ids; a worker
    that does not answer in time leaves the policy without tokens for it. So this is
    the emulator's busiest peer path — one render per worker per request — and, as in
    vLLM, where the API-server process renders beside (not in) the engine-core process,
    the tokenizing runs in a renderer process of the worker's own (:class:`Renderer`,
    started at the first render), so a long prompt's render does not hold the event
    loop that drives the emulated GPU.
``GET /kv_event_sources``
    vLLM's KV-event discovery: the ZMQ endpoints of ``--kv-events-config``'s publisher
    (:mod:`gpusim.kv_events`), a wildcard host replaced by the address the caller
    reached; an empty list when events are off. vllm-router's ``kv_aware`` subscribes
    to what it lists.

Every endpoint answers whatever the worker's metrics flavour: each peer asks only
for what its engine would serve, and extra paths cost nothing to the others.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpusim import openai_api as api
from gpusim.driver import EngineDriver
from gpusim.engine import EngineStats
from gpusim.render import Renderer
from gtm._version import __version__
from gtm.gpu_profiles import GpuProfile

if TYPE_CHECKING:  # zmq is imported only when KV events are on
    from gpusim.kv_events import KVEventPublisher

#: The paths :class:`PeerApi` serves (GET unless noted), for documentation and tests.
PATHS = (
    "/get_load",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/v1/completions/render",  # POST
    "/kv_event_sources",
)


def held_tokens(stats: EngineStats, profile: GpuProfile) -> int:
    """SGLang's ``num_tokens``: tokens in KV blocks in use, plus prompt tokens still to
    prefill (queued work the blocks do not show yet)."""
    used_blocks = max(0, stats.kv_blocks_total - stats.kv_blocks_free)
    return used_blocks * profile.block_size + stats.pending_prefill_tokens


class PeerApi:
    """The peer routers' endpoints over a worker's engines (``drivers``, by model)."""

    def __init__(
        self,
        drivers: Mapping[str, EngineDriver],
        *,
        kv_events: KVEventPublisher | None,
        read_body: Callable[[web.Request, type[api.CompletionRequest]], Awaitable[Any]],
    ) -> None:
        self._drivers = drivers
        self._kv_events = kv_events
        self._read_body = read_body
        self._renderer = Renderer()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/get_load", self._get_load)
        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, self._server_info)
        for path in ("/model_info", "/get_model_info"):
            app.router.add_get(path, self._model_info)
        app.router.add_post("/v1/completions/render", self._render_completion)
        app.router.add_get("/kv_event_sources", self._kv_event_sources)
        app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        await self._renderer.close()

    def _first(self) -> EngineDriver:
        return next(iter(self._drivers.values()))

    async def _get_load(self, request: web.Request) -> web.Response:
        entries = []
        for rank, driver in enumerate(self._drivers.values()):
            stats = driver.engine.stats(driver.now())
            entries.append(
                {
                    "dp_rank": rank,
                    "num_reqs": stats.running + stats.waiting,
                    "num_waiting_reqs": stats.waiting,
                    "num_tokens": held_tokens(stats, driver.engine.profile),
                }
            )
        return web.json_response(entries)

    async def _server_info(self, request: web.Request) -> web.Response:
        driver = self._first()
        profile = driver.engine.profile
        stats = driver.engine.stats(driver.now())
        return web.json_response(
            {
                "model_path": driver.model,
                "served_model_name": driver.model,
                "tp_size": profile.tensor_parallel,
                "dp_size": len(self._drivers),
                "page_size": profile.block_size,
                "kv_block_size": profile.block_size,
                "effective_attention_block_size": profile.block_size,
                "max_total_num_tokens": profile.num_gpu_blocks * profile.block_size,
                "max_running_requests": profile.max_num_seqs,
                "chunked_prefill_size": profile.max_num_batched_tokens,
                "context_length": profile.max_model_len,
                "disable_radix_cache": not profile.prefix_caching,
                "internal_states": [
                    {"num_running_reqs": stats.running, "num_queue_reqs": stats.waiting}
                ],
                "version": f"gtm-gpu-sim {__version__}",
            }
        )

    async def _model_info(self, request: web.Request) -> web.Response:
        driver = self._first()
        return web.json_response(
            {
                "model_path": driver.model,
                "tokenizer_path": None,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "max_model_len": driver.engine.profile.max_model_len,
            }
        )

    async def _render_completion(self, request: web.Request) -> web.Response:
        body = await self._read_body(request, api.CompletionRequest)
        if body.model not in self._drivers:
            raise api.ApiError(404, f"The model `{body.model}` does not exist.", param="model")
        items = api.prompt_items(body.prompt, "prompt")
        texts = [item for item in items if isinstance(item, str)]
        rendered = iter(await self._renderer.token_ids_json(texts) if texts else [])
        parts = []
        for item in items:
            head = {
                "request_id": f"cmpl-{uuid.uuid4().hex}",
                "model": body.model,
                "sampling_params": {"max_tokens": body.max_tokens, "n": body.n},
            }
            ids = next(rendered) if isinstance(item, str) else json.dumps(item)
            # The ids' JSON is spliced in as the renderer wrote it (no list in this loop).
            parts.append(json.dumps(head)[:-1] + ', "token_ids": ' + ids + "}")
        return web.Response(text="[" + ",".join(parts) + "]", content_type="application/json")

    async def _kv_event_sources(self, request: web.Request) -> web.Response:
        publisher = self._kv_events
        if publisher is None:
            return web.json_response([])
        host = request.url.host or "127.0.0.1"
        return web.json_response(
            [
                {
                    "data_parallel_rank": 0,
                    "endpoint": reachable(publisher.endpoint, host),
                    "replay_endpoint": (
                        reachable(publisher.replay_endpoint, host)
                        if publisher.replay_endpoint
                        else None
                    ),
                    "topic": publisher.config.topic,
                }
            ]
        )


def reachable(endpoint: str, host: str) -> str:
    """``endpoint`` with a wildcard host (``*``, ``0.0.0.0``, ``[::]``) replaced by
    ``host``, the address the caller reached this worker on."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme != "tcp":
        return endpoint
    address, _, port = rest.rpartition(":")
    if address in ("*", "0.0.0.0", "[::]", "::"):
        shown = f"[{host}]" if ":" in host else host
        return f"tcp://{shown}:{port}"
    return endpoint
