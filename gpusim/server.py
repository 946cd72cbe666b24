"""``gtm gpu-sim``: an OpenAI-compatible worker that behaves like vLLM on a given GPU.

Endpoints
    ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE streaming or not,
    ``usage`` filled, ``stream_options.include_usage``), ``POST /v1/embeddings``,
    ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (vLLM or SGLang names), and the
    admin ``/admin/faults`` (GET/POST/DELETE) and ``/admin/lag`` (GET/DELETE): loopback
    clients only, or bearer tokens with ``--admin-token-file`` (:mod:`gtm.admin_auth`).
    With ``--api-key`` (vLLM's; :mod:`gpusim.auth`) ``/v1/*`` needs that key, as on a
    vLLM; ``--access-log-file`` writes uvicorn's access lines.

Each served model has its own :class:`~gpusim.engine.Engine` (performance model of
the GPU type) run in real time by an :class:`~gpusim.driver.EngineDriver`; several
``--model`` options therefore behave like separate GPUs behind one address (they do not
share capacity), which keeps each model's figures equal to its profile. A request
is tokenized with :mod:`gtm.tokens` (the routers' estimator), queued in the engine,
and its tokens are streamed as the engine's forward passes produce them. Text and
embeddings are deterministic per ``--seed`` (:mod:`gpusim.textgen`).

Bad input never crashes the server: every handler turns a problem into an OpenAI error
(malformed JSON or body → 400, unknown model → 404, context too long → 400, waiting
queue full → 429, stopping → 503).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from gpusim import openai_api as api
from gpusim.auth import WorkerAuth
from gpusim.config import GpuSimConfig, build_profile
from gpusim.driver import EngineDriver, Notifier, RequestStream
from gpusim.engine import Engine, EngineConfig, EngineError, EngineRequest, RequestTooLong
from gpusim.faults import CRASH_EXIT_STATUS, FaultInjector, Faults
from gpusim.lagprobe import LagProbe
from gpusim.metrics import EngineMetrics, ModelSnapshot
from gpusim.peer_api import PeerApi
from gpusim.perfmodel import Degradation
from gpusim.registration import WorkerRegistration
from gpusim.textgen import Completion, embedding
from gtm.admin_auth import AdminGuard, admin_middleware, path_prefix
from gtm.clock import Clock, SystemClock
from gtm.gpu_profiles import ModelKind
from gtm.http_limits import limited_app
from gtm.kv_events import endpoint_labels
from gtm.loopstats import register_loop_tasks
from gtm.models import GpuWorker, WorkerState
from gtm.openai_errors import error_middleware
from gtm.serve import HttpServer
from gtm.state.store import StateStore
from gtm.tasks import TaskSupervisor
from gtm.tls import TlsMaterial
from gtm.tokens import (
    PromptError,
    block_hashes,
    encode_chat_ids,
    encode_text_ids,
    parse_chat_messages,
)

if TYPE_CHECKING:
    from gpusim.kv_events import KVEventPublisher, KVEventRecorder

log = logging.getLogger(__name__)

#: Largest request body accepted (a 128k-token prompt is ~0.5 MB of text; JSON of token
#: ids is larger). aiohttp's default is 1 MiB.
MAX_BODY_BYTES = 16 * 1024 * 1024

M = TypeVar("M", bound=BaseModel)


@dataclass(slots=True, eq=False)
class _Choice:
    """One generated choice of an HTTP request: its engine stream and its text."""

    stream: RequestStream
    completion: Completion
    prompt_tokens: int
    prompt_index: int
    sent: int = 0
    closed: bool = False


#: Above this many bytes waiting in a socket's send buffer, tokens stop taking the
#: direct path and the handler writes them with flow control (aiohttp's own limit).
DIRECT_WRITE_LIMIT = 0x10000


class _DirectSink:
    """Writes one choice's next token straight to the socket, as an HTTP/1.1 chunk.

    Called by the engine driver when a token is produced. Declines (returns False, and
    the handler is woken instead) when the client is slow, the connection is closing,
    the handler has a backlog to write first, or a stream-cut fault is armed.
    """

    __slots__ = ("_choice", "_faults", "_index", "_renderer", "_transport")

    def __init__(
        self,
        transport: asyncio.BaseTransport,
        renderer: api.ChunkRenderer,
        choice: _Choice,
        index: int,
        faults: FaultInjector,
    ) -> None:
        self._transport = transport
        self._renderer = renderer
        self._choice = choice
        self._index = index
        self._faults = faults

    def __call__(self, stream: RequestStream) -> bool:
        transport = self._transport
        choice = self._choice
        if (
            not isinstance(transport, asyncio.WriteTransport)
            or transport.is_closing()
            or transport.get_write_buffer_size() > DIRECT_WRITE_LIMIT
            or choice.sent != stream.produced - 1
            or self._faults.faults.stop_stream_after is not None
        ):
            return False
        text = choice.completion.next_token()
        data = self._renderer.token(self._index, text, choice.sent == 0).encode()
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        choice.sent += 1
        return True


class GpuSimServer:
    """The emulated worker: ``await start()`` then ``await stop()`` (or ``async with``)."""

    def __init__(
        self,
        config: GpuSimConfig,
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        store: StateStore | None = None,
        exit_fn: Callable[[int], None] = os._exit,
        admin: AdminGuard | None = None,
        tls: TlsMaterial | None = None,
        auth: WorkerAuth | None = None,
    ) -> None:
        self.config = config
        #: vLLM's --api-key on /v1/* and the opt-in access log (gpusim.auth).
        self._auth = auth or WorkerAuth()
        #: mTLS: serve only TLS and require a zone agent's (or ops) certificate.
        self._tls = tls
        self._clock = clock or SystemClock()
        # Without a token file the admin API trusts loopback clients only.
        self._admin = admin or AdminGuard(tokens=None, clock=self._clock)
        self._registry = registry
        self._store = store
        self._exit = exit_fn
        self._supervisor = TaskSupervisor(registry=registry, clock=self._clock, component="gpu-sim")
        self._metrics = EngineMetrics(registry, config.metrics_flavor, self._snapshots)
        self._faults = FaultInjector(config.seed)
        self._lag = LagProbe(registry, interval=config.lag_probe_interval_s)
        register_loop_tasks(registry)
        degradation = Degradation(warmup_passes=config.warmup_passes)
        self._drivers: dict[str, EngineDriver] = {}
        #: vLLM's KV-event publisher (--kv-events-config), one stream for the worker.
        self._kv_events: KVEventPublisher | None = None
        if config.kv_events is not None and config.kv_events.publishing:
            # Imported only when publishing: a worker without events never loads ZeroMQ.
            from gpusim.kv_events import KVEventPublisher

            self._kv_events = KVEventPublisher(config.kv_events, registry=registry)
        self._kv_recorders: dict[str, KVEventRecorder] = {}
        for index, model in enumerate(dict.fromkeys(config.models)):
            profile = build_profile(config, model)
            engine_config = EngineConfig(
                degradation=degradation, step_jitter=config.step_jitter, seed=config.seed + index
            )
            engine = Engine(profile, engine_config, loaded=not config.cold_start)
            if self._kv_events is not None:
                recorder = self._kv_events.recorder(profile.block_size)
                engine.pool.listener = self._kv_recorders[model] = recorder
            self._drivers[model] = EngineDriver(
                model, engine, clock=self._clock, speedup=config.speedup, metrics=self._metrics
            )
        self._http = Counter(
            "gtm_gpusim_http_requests",
            "HTTP requests answered by the emulated worker.",
            ["endpoint", "status"],
            registry=registry,
        )
        self._faults_injected = Counter(
            "gtm_gpusim_faults_injected",
            "Requests affected by an injected fault.",
            ["fault"],
            registry=registry,
        )
        self._unhang = asyncio.Event()
        self._stopping = False
        self._server: HttpServer | None = None
        self._registration: WorkerRegistration | None = None
        self._created = int(time.time())
        self.port = 0
        self.url = ""

    # ------------------------------------------------------------------ lifecycle

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._drivers)

    def driver(self, model: str) -> EngineDriver:
        return self._drivers[model]

    @property
    def faults(self) -> Faults:
        return self._faults.faults

    @property
    def registration(self) -> WorkerRegistration | None:
        return self._registration

    @property
    def kv_events(self) -> KVEventPublisher | None:
        """The KV-event publisher (``--kv-events-config``), if events are enabled."""
        return self._kv_events

    def _snapshots(self) -> Iterable[ModelSnapshot]:
        return [driver.snapshot() for driver in self._drivers.values()]

    def build_app(self) -> web.Application:
        app = limited_app(
            self.config.limits,
            client_max_size=MAX_BODY_BYTES,
            middlewares=[
                *self._auth.outer(),
                error_middleware("GPU emulator", self._count),
                self._black_hole,
                *self._auth.inner(),
                admin_middleware(self._admin, path_prefix("/admin/")),
            ],
        )
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/health", self._health)  # vLLM's name
        app.router.add_get("/readyz", self._health)  # ready = every model loaded
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics_endpoint)
        # What sglang-router and vllm-router poll (load, server/model info, render, KV
        # event sources): gpusim.peer_api.
        PeerApi(self._drivers, kv_events=self._kv_events, read_body=self._body).add_routes(app)
        app.router.add_route("*", "/admin/faults", self._admin_faults)
        app.router.add_route("*", "/admin/lag", self._admin_lag)
        return app

    async def start(self) -> str:
        """Listen, start the engines, register; return the base URL."""
        server_ssl = self._tls.server_context() if self._tls is not None else None
        self._server = HttpServer(
            self.build_app(), self.config.host, self.config.port, ssl_context=server_ssl
        )
        bound = await self._server.start()
        self.port = bound.port
        self.url = bound.url
        if self._kv_events is not None:
            self._kv_events.open()
            self._supervisor.spawn("kv-events", self._kv_events.run())
            self._supervisor.spawn("kv-events-replay", self._kv_events.serve_replay())
        if self._tls is not None:
            self._supervisor.spawn("tls-reload", self._tls.run())
        for model, driver in self._drivers.items():
            self._supervisor.spawn(f"engine:{model}", driver.run())
        self._supervisor.spawn("lag-probe", self._lag.run())
        if self._store is not None:
            self._registration = WorkerRegistration(
                self._store,
                self.worker_record,
                supervisor=self._supervisor,
                ttl=self.config.lease_ttl_s,
            )
            self._registration.start()
        return self.url

    async def stop(self) -> None:
        """Deregister, end in-flight requests, stop listening, stop the engines."""
        self._stopping = True
        self._unhang.set()
        if self._registration is not None:
            await self._registration.stop()
        for driver in self._drivers.values():
            driver.abort_all()
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await self._supervisor.aclose()
        self._auth.close()
        if self._kv_events is not None:
            self._kv_events.close()

    async def __aenter__(self) -> GpuSimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def worker_id(self) -> str:
        if self.config.worker_id:
            return self.config.worker_id
        return f"sim-{self.config.gpu_type.lower().replace('_', '-')}-{self.port}"

    def worker_record(self) -> GpuWorker:
        now = self._drivers[next(iter(self._drivers))].now()
        loading = any(not d.engine.is_ready(now) for d in self._drivers.values())
        return GpuWorker(
            id=self.worker_id(),
            zone_id=self.config.zone,
            region_id=self.config.region,
            url=self.config.advertise_url or self.url,
            gpu_type=self.config.gpu_type,
            models=self.models,
            state=WorkerState.STARTING if loading else WorkerState.READY,
            labels=(
                ("emulator", "gtm-gpu-sim"),
                ("metrics-flavor", self.config.metrics_flavor.value),
                *self._kv_event_labels(),
            ),
        )

    def _kv_event_labels(self) -> tuple[tuple[str, str], ...]:
        """Where a zone agent dials this worker's KV events (none without a publisher)."""
        config = self.config.kv_events
        if config is None:
            return ()
        host = urlsplit(self.config.advertise_url or self.url).hostname or ""
        return endpoint_labels(config, host)

    # ------------------------------------------------------------------ plumbing

    def _count(self, route: str, status: int) -> None:
        self._http.labels(route, str(status)).inc()

    async def _body(self, request: web.Request, model: type[M]) -> M:
        try:
            raw = await request.read()
            data = json.loads(raw)
        except web.HTTPRequestEntityTooLarge:
            raise api.ApiError(413, f"request body is larger than {MAX_BODY_BYTES} bytes") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise api.ApiError(
                400, f"request body is not valid JSON: {exc}", code="invalid_json"
            ) from None
        except RecursionError:
            raise api.ApiError(
                400, "request body is nested too deeply", code="invalid_json"
            ) from None
        if not isinstance(data, dict):
            raise api.ApiError(400, "request body must be a JSON object", code="invalid_json")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise api.validation_error(exc) from None

    def _served(self, model: str, kind: ModelKind) -> EngineDriver:
        driver = self._drivers.get(model)
        if driver is None:
            raise api.ApiError(
                404,
                f"The model `{model}` does not exist. Served here: {', '.join(self.models)}.",
                type=api.ErrorType.NOT_FOUND,
                param="model",
                code="model_not_found",
            )
        if driver.engine.profile.kind is not kind:
            what = "embeddings" if kind is ModelKind.EMBED else "completions"
            raise api.ApiError(400, f"The model `{model}` does not support {what}.", param="model")
        return driver

    @web.middleware
    async def _black_hole(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """``black_hole``: every request but the fault endpoints' waits, unanswered, until
        the fault is cleared (or the worker stops)."""
        if self._faults.faults.black_hole and not request.path.startswith("/admin/"):
            self._faults_injected.labels("black_hole").inc()
            await self._held(lambda faults: faults.black_hole)
        return await handler(request)

    async def _held(self, holds: Callable[[Faults], bool]) -> None:
        """Wait while ``holds`` of the faults in force is true; 503 if the worker stops
        meanwhile (what a held request then gets)."""
        while holds(self._faults.faults) and not self._stopping:
            self._unhang.clear()
            await self._unhang.wait()
        if self._stopping:
            raise api.ApiError(503, "the worker is shutting down", type=api.ErrorType.UNAVAILABLE)

    async def _admit(self) -> None:
        """Shutdown and injected faults, before a request is processed."""
        if self._stopping:
            raise api.ApiError(503, "the worker is shutting down", type=api.ErrorType.UNAVAILABLE)
        faults = self._faults.faults
        if faults.hang:
            self._faults_injected.labels("hang").inc()
            await self._held(lambda faults: faults.hang)
        if faults.added_latency_ms > 0:
            self._faults_injected.labels("latency").inc()
            await self._clock.sleep(faults.added_latency_ms / 1000.0)
        if self._faults.should_fail():
            self._faults_injected.labels("error").inc()
            status = self._faults.faults.error_status
            kind = api.ErrorType.RATE_LIMIT if status == 429 else api.ErrorType.SERVER
            raise api.ApiError(
                status, f"injected fault: HTTP {status}", type=kind, code="injected_fault"
            )

    def _check_queue(self, driver: EngineDriver, count: int) -> None:
        if driver.engine.num_waiting + count > self.config.max_queue:
            raise api.ApiError(
                429,
                f"the worker's waiting queue is full ({self.config.max_queue} requests); "
                "retry later",
                type=api.ErrorType.RATE_LIMIT,
                code="queue_full",
            )

    # ------------------------------------------------------------------ inference

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, api.ChatCompletionRequest)
        await self._admit()
        driver = self._served(body.model, ModelKind.GENERATE)
        try:
            messages = parse_chat_messages(body.messages)
        except PromptError as exc:
            raise api.ApiError(400, str(exc), param="messages") from None
        prompts: list[Sequence[int]] = [encode_chat_ids(messages)]
        return await self._generate(request, driver, api.Kind.CHAT, body, prompts, "messages")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, api.CompletionRequest)
        await self._admit()
        driver = self._served(body.model, ModelKind.GENERATE)
        items = api.prompt_items(body.prompt, "prompt")
        prompts: list[Sequence[int]] = [
            encode_text_ids(item) if isinstance(item, str) else item for item in items
        ]
        if body.stream and len(prompts) * body.n > api.MAX_CHOICES:
            raise api.ApiError(400, f"at most {api.MAX_CHOICES} streamed choices", param="prompt")
        return await self._generate(request, driver, api.Kind.COMPLETION, body, prompts, "prompt")

    def _plan(
        self,
        driver: EngineDriver,
        body: api.ChatCompletionRequest | api.CompletionRequest,
        prompts: Sequence[Sequence[int]],
        param: str,
    ) -> list[tuple[EngineRequest, Completion, str, int]]:
        """An engine request, its completion, its finish reason and prompt index for
        every choice of every prompt."""
        profile = driver.engine.profile
        plans: list[tuple[EngineRequest, Completion, str, int]] = []
        for prompt_index, prompt in enumerate(prompts):
            hashes = block_hashes(prompt, profile.block_size) if profile.prefix_caching else ()
            recorder = self._kv_recorders.get(driver.model)
            if recorder is not None:
                recorder.note_prompt(prompt, hashes)
            for choice_index in range(body.n):
                completion = Completion(self.config.seed, prompt, choice_index)
                output, reason = _output_plan(
                    body, completion, len(prompt), profile.max_model_len, param
                )
                engine_request = EngineRequest(uuid.uuid4().hex, len(prompt), output, hashes)
                plans.append((engine_request, completion, reason, prompt_index))
        return plans

    async def _generate(
        self,
        request: web.Request,
        driver: EngineDriver,
        kind: api.Kind,
        body: api.ChatCompletionRequest | api.CompletionRequest,
        prompts: list[Sequence[int]],
        param: str,
    ) -> web.StreamResponse:
        """Plan and run the request; empties ``prompts`` once planned.

        A prompt's token ids (an ``array("I")`` for text, an int object each when the
        body gave ids) are the largest thing a request holds, and nothing needs them
        past planning: the engine requests keep lengths and block hashes. Kept for a
        whole stream, they set how much of the allocators a worker holds at its
        busiest, and not all of it is given back: its memory crept up at every new peak
        of streams in flight.
        """
        plans = self._plan(driver, body, prompts, param)
        prompts.clear()
        self._check_queue(driver, len(plans))
        notifier = Notifier()
        choices: list[_Choice] = []
        try:
            for engine_request, completion, reason, prompt_index in plans:
                try:
                    stream = driver.submit(engine_request, notifier, reason)
                except RequestTooLong as exc:
                    raise api.ApiError(
                        400, str(exc), param=param, code="context_length_exceeded"
                    ) from None
                choices.append(
                    _Choice(stream, completion, engine_request.prompt_tokens, prompt_index)
                )
            if body.stream:
                try:
                    return await self._stream(request, kind, body, choices, notifier)
                except ConnectionError:  # the client went away mid-stream: nothing to answer
                    return _drop_connection(request, web.StreamResponse())
            return await self._complete(kind, body, choices, notifier)
        finally:
            for choice in choices:
                if choice.stream.finished is None:
                    driver.abort(choice.stream.request_id)

    async def _complete(
        self,
        kind: api.Kind,
        body: api.ChatCompletionRequest | api.CompletionRequest,
        choices: list[_Choice],
        notifier: Notifier,
    ) -> web.Response:
        while not all(c.stream.finished is not None for c in choices):
            await notifier.wait()
        if any(c.stream.aborted for c in choices):
            raise api.ApiError(
                503, "the request was aborted (worker stopping)", type=api.ErrorType.UNAVAILABLE
            )
        rendered = [
            (c.completion.take(c.stream.produced), c.stream.api_finish_reason) for c in choices
        ]
        response = api.completion_body(
            kind,
            response_id=_response_id(kind),
            created=self._created,
            model=body.model,
            choices=rendered,
            usage_body=_usage(choices),
        )
        return web.json_response(response)

    async def _stream(
        self,
        request: web.Request,
        kind: api.Kind,
        body: api.ChatCompletionRequest | api.CompletionRequest,
        choices: list[_Choice],
        notifier: Notifier,
    ) -> web.StreamResponse:
        """Stream tokens as SSE; after the first write, tokens go straight to the socket.

        The first chunk goes out through aiohttp (with the headers). From then on each
        choice's :class:`_DirectSink` writes a token's chunk to the transport from the
        engine driver's delivery, without waking this handler — one wake-up per request
        instead of one per token. This handler wakes only to finish the stream, or to
        catch up when the direct path declines (slow client, stream-cut fault).
        """
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        renderer = api.ChunkRenderer(
            kind,
            response_id=_response_id(kind),
            created=self._created,
            model=body.model,
            include_usage=body.include_usage,
        )
        direct = False
        while True:
            cut = self._faults.faults.stop_stream_after
            total_sent = sum(c.sent for c in choices)
            parts: list[str] = []
            for index, choice in enumerate(choices):
                while choice.sent < choice.stream.produced and (cut is None or total_sent < cut):
                    text = choice.completion.next_token()
                    parts.append(renderer.token(index, text, choice.sent == 0))
                    choice.sent += 1
                    total_sent += 1
                finished = choice.stream.finished
                if (
                    finished is not None
                    and not choice.closed
                    and choice.sent == choice.stream.produced
                ):
                    choice.closed = True
                    if not choice.stream.aborted:
                        parts.append(renderer.finish(index, choice.stream.api_finish_reason))
            if parts:
                await response.write("".join(parts).encode())
            if cut is not None and total_sent >= cut:
                self._faults_injected.labels("stop-stream").inc()
                return _drop_connection(request, response)
            if all(c.closed for c in choices):
                break
            if not direct and total_sent and request.transport is not None:
                direct = True
                for index, choice in enumerate(choices):
                    choice.stream.on_token = _DirectSink(
                        request.transport, renderer, choice, index, self._faults
                    )
            await notifier.wait()
        if any(c.stream.aborted for c in choices):
            return _drop_connection(request, response)
        tail = renderer.usage(_usage(choices)) if body.include_usage else ""
        await response.write((tail + api.DONE).encode())
        await response.write_eof()
        return response

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, api.EmbeddingRequest)
        await self._admit()
        driver = self._served(body.model, ModelKind.EMBED)
        profile = driver.engine.profile
        items = api.prompt_items(body.input, "input")
        prompts = [encode_text_ids(item) if isinstance(item, str) else item for item in items]
        dimensions = body.dimensions or profile.embedding_dim
        if dimensions > profile.embedding_dim:
            raise api.ApiError(
                400, f"dimensions must be at most {profile.embedding_dim}", param="dimensions"
            )
        self._check_queue(driver, len(prompts))
        notifier = Notifier()
        streams: list[RequestStream] = []
        try:
            for prompt in prompts:
                if len(prompt) > profile.max_model_len:
                    raise api.ApiError(
                        400,
                        f"this model's maximum context length is {profile.max_model_len} tokens; "
                        f"an input has {len(prompt)}",
                        param="input",
                        code="context_length_exceeded",
                    )
                streams.append(
                    driver.submit(EngineRequest(uuid.uuid4().hex, len(prompt), 0), notifier, "stop")
                )
            while not all(stream.finished is not None for stream in streams):
                await notifier.wait()
        finally:
            for stream in streams:
                if stream.finished is None:
                    driver.abort(stream.request_id)
        if any(stream.aborted for stream in streams):
            raise api.ApiError(
                503, "the request was aborted (worker stopping)", type=api.ErrorType.UNAVAILABLE
            )
        data = [
            api.embedding_item(
                i, embedding(self.config.seed, prompt, dimensions), body.encoding_format
            )
            for i, prompt in enumerate(prompts)
        ]
        tokens = sum(len(p) for p in prompts)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    # ------------------------------------------------------------------ the rest

    async def _list_models(self, request: web.Request) -> web.Response:
        data = [
            {
                "id": model,
                "object": "model",
                "created": self._created,
                "owned_by": "gtm-gpu-sim",
                "root": model,
                "max_model_len": driver.engine.profile.max_model_len,
            }
            for model, driver in self._drivers.items()
        ]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        if self._stopping:
            return web.json_response({"status": "stopping"}, status=503)
        loading = [m for m, d in self._drivers.items() if not d.engine.is_ready(d.now())]
        if loading:
            return web.json_response({"status": "loading", "models": loading}, status=503)
        return web.json_response({"status": "ok", "models": list(self._drivers)})

    async def _healthz(self, request: web.Request) -> web.Response:
        """Liveness: the process answers (a loading model is not a reason to restart it)."""
        if self._stopping:
            return web.json_response({"status": "stopping"}, status=503)
        return web.json_response({"status": "ok"})

    async def _metrics_endpoint(self, request: web.Request) -> web.Response:
        payload = generate_latest(self._registry)
        response = web.Response(body=payload)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def _admin_faults(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return web.json_response(self._faults.faults.model_dump())
        if request.method == "DELETE":
            faults = self._faults.clear()
        elif request.method == "POST":
            changes = await self._body(request, Faults)
            faults = self._faults.update(changes, set(changes.model_fields_set))
        else:
            raise api.ApiError(405, f"method {request.method} is not allowed on /admin/faults")
        self._apply_engine_faults(faults)
        if self._kv_events is not None:
            self._kv_events.silence(faults.black_hole)
        self._unhang.set()
        if faults.crash:
            return await self._crash(request, faults)
        return web.json_response(faults.model_dump())

    def _apply_engine_faults(self, faults: Faults) -> None:
        for driver in self._drivers.values():
            degradation = replace(
                driver.engine.degradation,
                slowdown=faults.slowdown,
                thermal_throttle=faults.thermal_throttle,
            )
            driver.engine.set_degradation(degradation)

    async def _crash(self, request: web.Request, faults: Faults) -> web.StreamResponse:
        log.error("injected crash: exiting with status %d", CRASH_EXIT_STATUS)
        response = web.json_response(faults.model_dump())
        await response.prepare(request)
        await response.write_eof()
        self._exit(CRASH_EXIT_STATUS)
        return response

    async def _admin_lag(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self._lag.reset()
        elif request.method != "GET":
            raise api.ApiError(405, f"method {request.method} is not allowed on /admin/lag")
        payload: dict[str, Any] = {"event_loop_lag": self._lag.stats().as_json()}
        payload["in_flight"] = {m: d.in_flight for m, d in self._drivers.items()}
        return web.json_response(payload)


# ---------------------------------------------------------------------------- helpers


def _response_id(kind: api.Kind) -> str:
    return ("chatcmpl-" if kind is api.Kind.CHAT else "cmpl-") + uuid.uuid4().hex


def _drop_connection(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """End a stream abnormally: no terminating chunk and no ``[DONE]``, the socket is reset."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    return response


def _output_plan(
    body: api.ChatCompletionRequest | api.CompletionRequest,
    completion: Completion,
    prompt_tokens: int,
    max_model_len: int,
    param: str,
) -> tuple[int, str]:
    """How many tokens to generate and the finish reason the API will report."""
    limit = body.output_limit
    if limit is None:
        limit = max_model_len - prompt_tokens
        if limit < 1:
            raise api.ApiError(
                400,
                f"this model's maximum context length is {max_model_len} tokens; the prompt "
                f"has {prompt_tokens}",
                param=param,
                code="context_length_exceeded",
            )
    elif prompt_tokens + limit > max_model_len:
        raise api.ApiError(
            400,
            f"this model's maximum context length is {max_model_len} tokens; the request "
            f"needs {prompt_tokens + limit} ({prompt_tokens} in the prompt, "
            f"{limit} for the output)",
            param=param,
            code="context_length_exceeded",
        )
    if body.ignore_eos or completion.natural_length > limit:
        return limit, "length"
    return completion.natural_length, "stop"


def _usage(choices: Sequence[_Choice]) -> dict[str, Any]:
    """Usage of a response: each prompt once (its ``n`` choices share it, as at OpenAI)."""
    prompt = cached = 0
    seen: set[int] = set()
    for choice in choices:
        if choice.prompt_index in seen:
            continue
        seen.add(choice.prompt_index)
        prompt += choice.prompt_tokens
        finished = choice.stream.finished
        cached += finished.cached_tokens if finished is not None else 0
    completion = sum(choice.stream.produced for choice in choices)
    return api.usage(prompt, completion, cached)


__all__ = ["EngineError", "GpuSimConfig", "GpuSimServer", "build_profile"]
