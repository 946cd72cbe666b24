"""Wiring of one zone agent: inventory, scraping, health, view, proxy, APIs, summary.

:class:`ZoneAgent` owns every moving part of a zone and runs the periodic work under a
:class:`~gtm.tasks.TaskSupervisor`:

* **inventory**: the static ``--worker`` list plus, with a state store, the GPU records
  registered (under leases) for this zone, followed through a
  :class:`~gtm.state.snapshot.SnapshotWatcher`; operator drains of the GPU, the zone or
  the region take GPUs out;
* **scrape** every ``scrape_interval_s``: every worker's ``/metrics`` at once, each with
  a timeout; a scrape also counts as a health check; then the view is rebuilt; sooner
  (``admission.rescrape_s`` after the last) when flow control holds requests on other
  clients' queued work that scrape saw;
* **active checks** every ``health.check_interval_s``: ``GET /health``;
* **zone summary** every ``summary_interval_s`` under a lease (with a store).

The view is replaced by one reference assignment after each round (and at once when a
GPU is ejected), so a decision always reads one consistent view without locks.

HTTP (handlers in :mod:`zone_agent.api`, the data path's hooks in
:mod:`zone_agent.proxy`): the OpenAI endpoints, ``POST /v1/assign``, ``GET /v1/models``,
``/healthz``, ``/readyz``, ``/metrics``; served by :class:`gtm.serve.HttpServer`. With
``--http-server lean`` (the default) the OpenAI endpoints are the lean server's
(:mod:`gtm.http1`), with the access line, span, limits and error answers the aiohttp
application applies (the same objects); everything else is aiohttp's. Every
error a client can cause is answered in OpenAI's shape; an unexpected one is a 500 in
that shape, never a crash.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import operator
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from gtm import access, tracing
from gtm.clock import Clock, SystemClock
from gtm.http1 import LeanFront
from gtm.http_limits import LIMITS_KEY, limited_app
from gtm.models import DrainTarget, GpuWorker, Tier
from gtm.openai_errors import error_middleware
from gtm.policy_store import PolicyWatcher
from gtm.profile_files import operator_catalog
from gtm.serve import HttpServer, HttpServerKind
from gtm.state import keys
from gtm.state.publisher import LeasedPublisher
from gtm.state.snapshot import SnapshotWatcher
from gtm.state.store import StateStore
from gtm.tasks import TaskSupervisor, Turns, Wake, each, until
from gtm.tls import TlsMaterial, client_session_options, connector_ssl
from gtm.tracing import OFF, Tracing
from zone_agent.accounting import Accounting, SlotLoad
from zone_agent.api import AssignApi, OpenAiApi, ServiceApi
from zone_agent.calibration import Calibrator, PrefillCounters, decode_window, prefill_counters
from zone_agent.config import ZoneConfig
from zone_agent.credentials import RELOAD_INTERVAL_S, WorkerKeys
from zone_agent.flow import AdmissionMode, FlowControl, check_profile
from zone_agent.health import HealthTracker, probe
from zone_agent.metrics import ZoneMetrics
from zone_agent.profiles import profile_source
from zone_agent.prompt_sizes import PromptSizes
from zone_agent.proxy import DataPath, ProxySettings
from zone_agent.request import Ids
from zone_agent.router import ZoneProfile
from zone_agent.scrape import GpuMetrics, Parser, ScrapeError, scrape
from zone_agent.summary import build_summary
from zone_agent.upstream import UpstreamPool
from zone_agent.view import (
    BUILD_STEP,
    GpuState,
    ViewBuilder,
    ViewSettings,
    ZoneView,
    trusted,
)

if TYPE_CHECKING:
    from zone_agent.kv_events import ZoneKVEvents

log = logging.getLogger(__name__)

#: How long start-up waits for the state store's first listing before serving anyway (s).
STORE_WAIT_S = 5.0

#: Connections a scrape round may hold to one worker: one scrape at a time per worker
#: (a round's and an early one may meet).
SCRAPES_PER_WORKER = 2
#: Scrapes a round keeps in flight at once. Their answers are taken in as they arrive,
#: and answers that arrive together are taken in within one loop iteration: unbounded,
#: a thousand workers held the loop for ~50–60 ms at a time (``bench/scrape_round.py``).
#: A round of N workers answering in L s lasts about N / 64 × L (1,000 workers at 5 ms:
#: ~80 ms, within the 250 ms interval).
SCRAPES_IN_FLIGHT = 64
#: Health checks a check round keeps in flight at once (as scrapes, for the same reason).
CHECKS_IN_FLIGHT = 64
#: Answers taken in per loop iteration (:class:`gtm.tasks.Turns`): ~150 µs each at a
#: vLLM's 23 KB /metrics, so about half a millisecond of the loop at a time.
SCRAPE_TURNS = 4


@dataclass(eq=False)
class _Round:
    """The workers a scrape round waits for; ``done`` once all of them answered."""

    waiting: set[str]
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def answered(self, gpu_id: str) -> None:
        self.waiting.discard(gpu_id)
        if not self.waiting:
            self.done.set()


class ZoneAgent:
    """One zone's agent: ``await start()`` then ``await stop()`` (or ``async with``)."""

    def __init__(
        self,
        config: ZoneConfig,
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        store: StateStore | None = None,
        profile: ZoneProfile | None = None,
        tls: TlsMaterial | None = None,
        plain_workers: bool = False,
        tracing: Tracing = OFF,
    ) -> None:
        self.config = config
        #: The agent's tracer: a span per request, passed on to the worker (off by default).
        self.tracing = tracing
        #: mTLS: serve only TLS; dial workers with our certificate, expecting gpu/*
        #: identities, and refuse http:// workers unless ``plain_workers`` (a vLLM
        #: without TLS) says they are allowed.
        self._tls = tls
        self._plain_workers = plain_workers
        self._clock = clock or SystemClock()
        self._registry = registry
        self._store = store
        self.accounting = Accounting()
        self.health = HealthTracker(config.health)
        #: Each worker's profile: the operator's files over the shipped ones, calibrated
        #: online from its own metrics (ConfigError here for a bad profile file).
        self.calibrator = Calibrator(operator_catalog(config.gpu_profiles))
        self._builder = ViewBuilder(
            config.zone,
            config.region,
            ViewSettings(stale_after_s=config.stale_after_s),
            pricing=self.calibrator.priced,
        )
        self._static = {w.id: w.record(config.zone, config.region) for w in config.workers}
        #: Each worker's own API key (the zone's key is read here: ConfigError if it
        #: cannot be); the data path looks the header up per request.
        self.worker_keys = WorkerKeys(
            config.worker_keys,
            static={w.id: w.api_key_from for w in config.workers if w.api_key_from is not None},
        )
        self._workers: dict[str, GpuWorker] = dict(self._static)
        self._drained: frozenset[str] = frozenset()
        self._scraped: dict[str, GpuMetrics] = {}
        self._own_at_scrape: dict[str, SlotLoad] = {}
        #: What another client's waiting request weighs at each worker (measured).
        self.prompt_sizes = PromptSizes()
        self._view = self._builder.build((), self.accounting, self._clock.monotonic())
        #: Rebuilds begun so far, and the number of the one whose view is in force: a
        #: sliced rebuild yields to one begun after it that finished first.
        self._rebuilds = 0
        self._shown = 0
        #: Each GPU's ``gtm_zone_blind_views_total`` increment (a labelled child costs a
        #: lock per ``labels()``); bounded by the GPUs the zone has had.
        self._blind_counted: dict[str, Callable[[], None]] = {}
        #: The GPUs of replaced views, let go a slice per loop iteration (:meth:`_retire`).
        self._retired: list[GpuState] = []
        self.metrics = ZoneMetrics(registry, lambda: self._view, self._clock)
        # The routing profile follows the policy files (zone-<profile>), else the built-in.
        # Under flow control, a policy's profile that predicts no TTFT is refused (the
        # one in force stays, logged and counted), as one that does not build is.
        flow_on = config.admission.mode is AdmissionMode.SLO
        self._profiles = profile_source(
            config.profile, metrics=self.metrics.routing, check=check_profile if flow_on else None
        )
        self._profile = profile or self._profiles.current
        self._policies = (
            PolicyWatcher(store, clock=self._clock, registry=registry)
            if store is not None and profile is None
            else None
        )
        self._supervisor = TaskSupervisor(registry=registry, clock=self._clock, component="zone")
        #: The zone's flow control (--admission slo; zone_agent.flow). ConfigError here
        #: when the profile predicts no TTFT.
        self.flow: FlowControl | None = None
        #: Brings the next scrape forward (flow control asks; zone_agent.flow), of the
        #: workers in ``_early``; ``_last_round``: when every worker was last scraped.
        self._scrape_wake: Wake | None = None
        self._early: set[str] = set()
        #: The scrapes' queue and its runners (:meth:`_scrape`): the workers queued or
        #: being scraped, the runners going, and the rounds waiting for answers.
        self._scraping: set[str] = set()
        self._scrape_queue: deque[GpuWorker] = deque()
        self._runners = 0
        self._runner_count = 0
        self._rounds: list[_Round] = []
        self._scrape_turns = Turns(SCRAPE_TURNS)
        self._last_round = -math.inf
        if flow_on:
            self._scrape_wake = Wake(
                config.admission.rescrape_s, count=self.metrics.scrapes_early.inc
            )
            self.flow = FlowControl(
                config.admission,
                view=functools.partial(operator.attrgetter("_view"), self),
                profile=functools.partial(operator.attrgetter("_profile"), self),
                clock=self._clock,
                registry=registry,
                rescrape=self._rescrape,
            )
        #: The workers' KV events (--kv-events): what each GPU evicted, read by the prefix
        #: indexes in place of the agent's guess (zone_agent.kv_events).
        self.kv_events: ZoneKVEvents | None = None
        if config.kv_events is not None:
            from zone_agent.kv_events import ZoneKVEvents  # ZeroMQ only when asked for

            self.kv_events = ZoneKVEvents(
                config.kv_events, supervisor=self._supervisor, registry=registry
            )
            self.accounting.prefix, self.accounting.answered = self.kv_events.indexes()
        self._watcher = (
            SnapshotWatcher(store, clock=self._clock, registry=registry, component="zone")
            if store is not None
            else None
        )
        self._publisher = (
            LeasedPublisher(
                store,
                keys.zone_summary(config.region, config.zone),
                ttl_s=max(3.0, 3 * config.summary_interval_s),
                what="zone summary",
            )
            if store is not None
            else None
        )
        self._upstream: UpstreamPool | None = None
        self._scrapes: UpstreamPool | None = None
        self._probes: aiohttp.ClientSession | None = None
        self._server: HttpServer | None = None
        self._snapshot_revision = -1
        self.url = ""
        self.port = 0

    # ------------------------------------------------------------------ reading

    @property
    def view(self) -> ZoneView:
        return self._view

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    @property
    def profile(self) -> ZoneProfile:
        return self._profile

    def set_profile(self, profile: ZoneProfile) -> None:
        """Switch the routing profile (takes effect with the next decision).

        Raises:
            ConfigError: flow control is on and ``profile`` predicts no TTFT.
        """
        if self.flow is not None:
            check_profile(profile)
        self._profile = profile

    @property
    def publisher(self) -> LeasedPublisher | None:
        return self._publisher

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Open the pools, take a first look at the fleet, listen; return the base URL."""
        cfg = self.config
        client_ssl = self._tls.client_context() if self._tls is not None else None
        refuse_plain = {} if self._plain_workers else client_session_options(client_ssl)
        # The data path's own lean client (zone_agent/upstream.py, behind gtm.relay);
        # the scrapes have one of their own (below); health checks keep aiohttp's.
        self._upstream = UpstreamPool(
            ssl_context=client_ssl,
            refuse_plain=client_ssl is not None and not self._plain_workers,
            connect_timeout_s=cfg.connect_timeout_s,
            read_timeout_s=cfg.upstream_timeout_s,
            per_worker=cfg.pool_per_worker,
        )
        # The scrapes' own pool (a busy data path never holds one back); the health
        # checks keep aiohttp's client.
        self._scrapes = UpstreamPool(
            ssl_context=client_ssl,
            refuse_plain=client_ssl is not None and not self._plain_workers,
            connect_timeout_s=cfg.connect_timeout_s,
            read_timeout_s=cfg.scrape_timeout_s,
            per_worker=SCRAPES_PER_WORKER,
        )
        self._probes = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=4, ssl=connector_ssl(client_ssl)
            ),
            timeout=aiohttp.ClientTimeout(
                total=max(cfg.scrape_timeout_s, cfg.health.check_timeout_s)
            ),
            **refuse_plain,
        )
        if self._tls is not None:
            self._supervisor.spawn("tls-reload", self._tls.run())
        if self._policies is not None:
            self._supervisor.spawn("policy-watch", self._policies.run())
            self._supervisor.spawn("policy-follow", self._follow_policies(self._policies))
        if self._watcher is not None:
            self._supervisor.spawn("snapshot", self._watcher.run())
            try:
                await asyncio.wait_for(self._watcher.wait_ready(), STORE_WAIT_S)
            except TimeoutError:
                # Static stability: a store that is down must not stop the agent from
                # serving its static workers; registered ones join when it answers.
                log.warning("state store not answering; starting with static workers only")
        self._sync_inventory()
        if self.worker_keys.enabled:
            self._supervisor.run_loop("worker-keys", self._reload_keys, interval=RELOAD_INTERVAL_S)
        # The first look waits for every worker (a dead one: up to its scrape timeout).
        await asyncio.gather(self.check_round(), self.scrape_round(whole=True))
        self._supervisor.run_loop(
            "scrape", self._scrape_step, interval=cfg.scrape_interval_s, wake=self._scrape_wake
        )
        self._supervisor.run_loop(
            "health-checks", self.check_round, interval=cfg.health.check_interval_s
        )
        if self._publisher is not None:
            self._supervisor.run_loop(
                "summary", self.publish_summary, interval=cfg.summary_interval_s
            )
        server_ssl = self._tls.server_context() if self._tls is not None else None
        app, lean = self._build_app()
        front = lean() if cfg.http_server is HttpServerKind.LEAN else None
        self._server = HttpServer(app, cfg.host, cfg.port, ssl_context=server_ssl, lean=front)
        bound = await self._server.start()
        self.port = bound.port
        self.url = bound.url
        log.info(
            "zone agent %s/%s listening on %s (http server: %s)",
            cfg.region,
            cfg.zone,
            self.url,
            cfg.http_server,
        )
        return self.url

    async def _follow_policies(self, watcher: PolicyWatcher) -> None:
        """Rebuild the routing profile on every policy generation (the last good one
        stays when a new one does not build: gtm.routing.ProfileSource)."""
        generation = 0
        while True:
            active = await watcher.wait_for_generation(generation + 1)
            generation = active.generation
            self._profile = self._profiles.update(active)

    async def stop(self) -> None:
        """Stop listening (in-flight requests get a grace period), stop the loops,
        withdraw the summary, close the pools."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await self._supervisor.aclose()
        if self.kv_events is not None:
            self.kv_events.close()
        if self._publisher is not None:
            await self._publisher.withdraw()
        if self._upstream is not None:
            await self._upstream.close()
        if self._scrapes is not None:
            await self._scrapes.close()
        if self._probes is not None:
            await self._probes.close()
        self._upstream = self._scrapes = self._probes = None

    async def __aenter__(self) -> ZoneAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ inventory

    def _sync_inventory(self) -> None:
        """Static workers plus this zone's registered ones; drains from the snapshot."""
        workers = dict(self._static)
        drained: set[str] = set()
        if self._watcher is not None:
            snapshot = self._watcher.current
            self._snapshot_revision = snapshot.revision
            cfg = self.config
            for worker in snapshot.gpus_by_zone.get(cfg.zone, ()):
                if worker.region_id == cfg.region:
                    workers.setdefault(worker.id, worker)
            zone_drained = snapshot.is_drained(DrainTarget.ZONE, cfg.zone) or snapshot.is_drained(
                DrainTarget.REGION, cfg.region
            )
            drained = {
                gid for gid in workers if zone_drained or snapshot.is_drained(DrainTarget.GPU, gid)
            }
        gone = set(self._workers) - set(workers)
        if gone:
            self.accounting.forget_prefixes(gone)
            for gid in gone:
                self._scraped.pop(gid, None)
                self._own_at_scrape.pop(gid, None)
            self.prompt_sizes.forget(workers)
        self._workers = workers
        self._drained = frozenset(drained)
        self.health.sync(workers, self._clock.monotonic())
        self.worker_keys.update(workers.values())
        if self.kv_events is not None:
            self.kv_events.sync(workers.values(), self.accounting.slot)

    async def _reload_keys(self) -> None:
        self.worker_keys.reload()  # a few stat calls; a changed file is read again

    def rebuild(self) -> ZoneView:
        """A fresh view from everything known now, made at once and swapped in."""
        self._rebuilds += 1
        number, steps = self._rebuilds, self._rebuild_steps(BUILD_STEP)
        started = time.perf_counter()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                view, blind = done.value
                return self._commit(view, blind, time.perf_counter() - started, number)

    async def _rebuild_sliced(self) -> None:
        """:meth:`rebuild` a slice per loop iteration (``BUILD_STEP`` GPUs each): a
        thousand GPUs take ~12 ms, which in one go would hold every request the agent
        is relaying. The view is still swapped in whole. If a rebuild begun after this
        one (at once, for an ejection; or sliced, for a health change) swapped its view
        in meanwhile, this one is dropped: that view read every GPU later than this one
        did."""
        self._rebuilds += 1
        number, steps = self._rebuilds, self._rebuild_steps(BUILD_STEP)
        held = 0.0
        while True:
            started = time.perf_counter()
            try:
                next(steps)
            except StopIteration as done:
                held += time.perf_counter() - started
                if number > self._shown:
                    view, blind = done.value
                    self._commit(view, blind, held, number)
                return
            held += time.perf_counter() - started
            await asyncio.sleep(0)

    def _rebuild_steps(self, step: int) -> Generator[None, None, tuple[ZoneView, list[str]]]:
        """The view's slices; at the end the view, and the GPUs whose last scrape it
        distrusts (missing, or older than ``stale_after_s``)."""
        now = self._clock.monotonic()
        slowdowns = self.health.slowdowns(now)
        settings = self._builder.settings
        states = []
        blind = []
        # (A copy: the inventory may change between slices.)
        for count, (gid, worker) in enumerate(list(self._workers.items()), 1):
            scraped = self._scraped.get(gid)
            if not trusted(scraped, now, settings):
                blind.append(gid)
            states.append(
                GpuState(
                    worker=worker,
                    slot=self.accounting.slot(gid),
                    metrics=scraped,
                    own_at_scrape=self._own_at_scrape.get(gid, SlotLoad()),
                    prompt_tokens=self.prompt_sizes.of(gid),
                    health=self.health.status(gid, now, slowdowns.get(gid, 1.0)),
                    drained=gid in self._drained,
                )
            )
            if count % step == 0:
                yield
        view = yield from self._builder.steps(states, self.accounting, now, step)
        return view, blind

    def _commit(self, view: ZoneView, blind: list[str], held_s: float, number: int) -> ZoneView:
        self._retire(self._view)
        self._view = view
        self._shown = number
        self.metrics.view_build.observe(held_s)
        counted = self._blind_counted
        for gid in blind:
            inc = counted.get(gid)
            if inc is None:
                inc = counted[gid] = self.metrics.blind_views.labels(gid).inc
            inc()
        if self.flow is not None:
            self.flow.poke()  # a new picture (scrapes, health) may make room
        return view

    def _retire(self, view: ZoneView) -> None:
        """Let the replaced view's GPUs go ``BUILD_STEP`` per loop iteration: freeing a
        thousand GPUs' states and the scrapes they hold at once took ~2.5 ms of the loop
        (``bench/scrape_round.py``). Outside a running loop, at once."""
        if not view.gpus:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if not self._retired:  # (else a release is already on its way)
            loop.call_soon(self._release_retired, loop)
        self._retired.extend(view.gpus)

    def _release_retired(self, loop: asyncio.AbstractEventLoop) -> None:
        del self._retired[-BUILD_STEP:]
        if self._retired:
            loop.call_soon(self._release_retired, loop)

    def on_ejection(self, gpu_id: str) -> None:
        """A GPU was ejected: take it out of the view at once, before the next request
        is placed. Only its entry is made again (:meth:`ViewBuilder.with_gpu`): a whole
        rebuild held the loop for every GPU of the zone, once per ejection, and a rack
        failing ejects its GPUs one after another. The next scrape round rebuilds the
        view whole; a rebuild begun before this swap is dropped when it ends (it read
        the GPU's health before the ejection)."""
        view = self._view
        old = view.gpu(gpu_id)
        if old is None:
            return  # not in the view: no request goes there anyway
        started = time.perf_counter()
        now = self._clock.monotonic()
        ejected = replace(old, health=self.health.status(gpu_id, now, old.health.slowdown))
        try:
            patched = self._builder.with_gpu(view, ejected)
        except (KeyError, ValueError):  # (not for a state made from the view's own)
            log.exception("could not take GPU %s out of the view alone: rebuilding it", gpu_id)
            self.rebuild()
            return
        self._rebuilds += 1
        self._commit(patched, [], time.perf_counter() - started, self._rebuilds)

    # ------------------------------------------------------------------ loops

    async def scrape_round(self, *, whole: bool = False) -> None:
        """Scrape every worker once (concurrently), then rebuild the view: once all
        answered or ``scrape_interval_s`` after the round began (see :meth:`_scrape`);
        ``whole``: once all answered, also the scrapes an earlier round left going."""
        self._early.clear()
        self._last_round = self._clock.monotonic()
        await self._scrape(None, whole=whole)

    async def _scrape_step(self) -> None:
        """The scrape loop's step: every worker when the interval is up; before it (flow
        control asked), only the workers it asked for (a zone of a thousand GPUs is not
        scraped whole twenty times a second because one holds others' requests)."""
        if self._clock.monotonic() >= self._last_round + self.config.scrape_interval_s:
            await self.scrape_round()
        elif self._early:
            asked, self._early = self._early, set()
            await self._scrape(asked)
        # (Else a round ran since the last step, as at start: nothing to do yet.)

    def _rescrape(self, gpu_ids: frozenset[str]) -> None:
        """Flow control holds requests on other clients' work seen at ``gpu_ids``."""
        self._early |= gpu_ids
        if self._scrape_wake is not None:
            self._scrape_wake.ask()

    async def _scrape(self, only: set[str] | None, *, whole: bool = False) -> None:
        """Scrape the workers (``only`` these, when given), then rebuild the view.

        One worker's scrape never waits for another's (as in Prometheus, which runs a
        scrape loop per target: ``scrape/scrape.go``):
        - The workers go to a queue that ``SCRAPES_IN_FLIGHT`` runners share, each
          answer is taken in as it arrives (:meth:`_take_scrape`), a few per loop
          iteration (:data:`SCRAPE_TURNS`).
        - The view is rebuilt once every worker answered, or ``scrape_interval_s`` after
          the round began, whichever is first. A worker that has not answered by then
          (one black-holed worker answers nothing for ``scrape_timeout_s``) keeps its
          scrape going and is taken in when it ends, and a later round does not scrape
          it again meanwhile. Waiting for it held every round, and so every GPU's
          numbers, to the scrape timeout: a whole zone distrusted for one dead GPU.
        - A worker whose scrape is still going (an earlier round's, or an early one's)
          is waited for as the others are, and not scraped a second time.
        - ``whole``: no deadline; wait for every answer (start-up, :meth:`refresh`).
        """
        if self._watcher is not None and self._watcher.current.revision != self._snapshot_revision:
            self._sync_inventory()
        pool = self._scrapes
        if pool is None:
            return
        covered = [w for w in self._workers.values() if only is None or w.id in only]
        # A worker whose scrape is still going is waited for, not scraped twice.
        waiting = {w.id for w in covered}
        workers = [w for w in covered if w.id not in self._scraping]
        if waiting:
            self._scraping.update(w.id for w in workers)
            self._scrape_queue.extend(workers)
            for _ in range(min(SCRAPES_IN_FLIGHT - self._runners, len(self._scrape_queue))):
                self._runners += 1
                self._runner_count += 1
                self._supervisor.spawn(f"scrape-{self._runner_count}", self._scrape_runner(pool))
            round_ = _Round(waiting)
            self._rounds.append(round_)
            try:
                if whole:
                    await round_.done.wait()
                else:
                    await until(round_.done, self._clock, self.config.scrape_interval_s)
            finally:
                self._rounds.remove(round_)
            if only is None:
                self.metrics.scrape_rounds.labels(
                    "answered" if round_.done.is_set() else "interval"
                ).inc()
        if only is None:
            self.calibrator.forget(set(self._workers))
        await self._rebuild_sliced()

    async def _scrape_runner(self, pool: UpstreamPool) -> None:
        """Scrape the queued workers one after another until none is left."""
        try:
            while self._scrape_queue:
                worker = self._scrape_queue.popleft()
                try:
                    await self._scrape_one(pool, worker)
                finally:
                    self._scraping.discard(worker.id)
                    for round_ in self._rounds:
                        round_.answered(worker.id)
        finally:
            self._runners -= 1

    async def _scrape_one(self, pool: UpstreamPool, worker: GpuWorker) -> None:
        """One worker's scrape, taken in at once; never raises (a failure is counted)."""
        try:
            result = await scrape(
                pool,
                worker.url,
                clock=self._clock,
                timeout_s=self.config.scrape_timeout_s,
                default_model=worker.models[0] if len(worker.models) == 1 else "",
                turns=self._scrape_turns,
            )
        except ScrapeError:
            failed = True
        except Exception:  # a bug, not the worker's answer: one worker's, logged
            log.error("scraping %s failed unexpectedly", worker.id, exc_info=True)
            failed = True
        else:
            failed = False
        if worker.id not in self._workers:
            return  # it left the inventory while its scrape was going
        if failed:
            self._scrape_failed(worker.id)
            return
        try:
            self._take_scrape(worker, result)
        except Exception:  # a bug: logged; the runner goes on with the next worker
            log.error("taking in %s's scrape failed unexpectedly", worker.id, exc_info=True)

    def _scrape_failed(self, gpu_id: str) -> None:
        self.metrics.scrape_failures.labels(gpu_id).inc()
        self.health.observe_check(gpu_id, False, self._clock.monotonic())

    def _take_scrape(self, worker: GpuWorker, result: GpuMetrics) -> None:
        """A worker's fresh numbers: calibration, prompt sizes, decode health, and the
        agent's own charges at this moment (its share of what the worker reported)."""
        now = self._clock.monotonic()
        if result.parsed_by is not Parser.READER:
            self._reference_parse(worker.id, result)
        own = self.accounting.at(worker.id)
        self._observe_decode(worker, result, own, now)
        for model, current in result.models.items():
            name = model or (worker.models or ("",))[0]
            self.calibrator.observe(worker.id, worker.gpu_type, name, current, now)
            self.prompt_sizes.observe(worker.id, model, prefill_counters(current), now)
        self._scraped[worker.id] = result
        self._own_at_scrape[worker.id] = own
        self.health.observe_check(worker.id, True, now)

    def _reference_parse(self, gpu_id: str, metrics: GpuMetrics) -> None:
        """The fast /metrics reader stepped aside: counted, and logged when it starts."""
        self.metrics.scrape_reference_parses.labels(gpu_id).inc()
        previous = self._scraped.get(gpu_id)
        if previous is None or previous.parsed_by is Parser.READER:
            log.warning("%s: /metrics read by the reference parser (%s)", gpu_id, metrics.aside)

    def _observe_decode(
        self, worker: GpuWorker, metrics: GpuMetrics, own: SlotLoad, now: float
    ) -> None:
        """``own``: the agent's charges on the worker as its numbers arrived."""
        previous = self._scraped.get(worker.id)
        if previous is None:
            return
        was = self._own_at_scrape.get(worker.id, SlotLoad())
        for model, current in metrics.models.items():
            before = previous.models.get(model)
            if before is None or current.kv_usage is None:
                continue  # no KV usage: no context length to price a step
            # Regressions are judged against the pair's own profile; a pair without one
            # is priced by calibration, which follows it, so there is nothing to judge by.
            entry = self.calibrator.catalog.entry(
                worker.gpu_type, model or (worker.models or ("",))[0]
            )
            if entry is None:
                continue
            # The engine's requests less the agent's own still awaiting a first token:
            # the sequences decoding (other clients' prefills, if any, are not known).
            decoding = (
                before.running + before.waiting - was.prefilling,
                current.running + current.waiting - own.prefilling,
            )
            prefilled = PrefillCounters(
                own.prefilled - was.prefilled, 0.0, own.prefilled_tokens - was.prefilled_tokens
            )
            window = decode_window(
                entry.profile, before, current, decoding=decoding, prefilled=prefilled
            )
            if window is None:
                continue
            self.health.observe_decode(
                worker.id,
                window.seconds / window.tokens,
                window.expected_s / window.tokens,
                window.tokens,
                now,
                settled=own.prefilling == 0,
            )

    async def refresh(self) -> ZoneView:
        """Catch up with the store (if any), then scrape every worker: a view that
        reflects everything written to the store before this call."""
        if self._watcher is not None and self._store is not None:
            await self._watcher.wait_for_revision(await self._store.current_revision())
        await self.scrape_round(whole=True)
        return self._view

    async def check_round(self) -> None:
        """Active health checks of every worker (``CHECKS_IN_FLIGHT`` at a time); the view
        is rebuilt as soon as one changed state, not once the round ends: a round lasts
        as long as its slowest check (a black-holed worker's: the check timeout), and a
        GPU that went down meanwhile would stay in the view that long. Changes seen
        while a rebuild is going are covered by one more, not one each."""
        session = self._probes
        if session is None:
            return
        timeout = self.config.health.check_timeout_s
        changes = covered = 0
        rebuilding = False

        async def check(worker: GpuWorker) -> None:
            nonlocal changes, covered, rebuilding
            ok = await probe(session, worker.url, timeout)
            if not self.health.observe_check(worker.id, ok, self._clock.monotonic()):
                return
            changes += 1
            if rebuilding:
                return  # the rebuild going on, or the one after it, reads this change
            rebuilding = True
            try:
                while covered < changes:
                    covered = changes
                    await self._rebuild_sliced()
            finally:
                rebuilding = False

        await each(list(self._workers.values()), check, at_once=CHECKS_IN_FLIGHT)

    async def publish_summary(self) -> None:
        if self._publisher is not None:
            await self._publisher.publish(build_summary(self._view, self._clock.wall()))

    # ------------------------------------------------------------------ HTTP

    def build_app(self) -> web.Application:
        """The agent's aiohttp application (every endpoint)."""
        return self._build_app()[0]

    def _build_app(self) -> tuple[web.Application, Callable[[], LeanFront]]:
        """The application, and how to make the lean front of its OpenAI endpoints
        (sharing its limits, error answers, counts, access log and spans)."""
        requests = functools.cache(
            lambda route, status: self.metrics.requests.labels(route, str(status))
        )

        def count(route: str, status: int) -> None:
            # A cached child per (route, status): .labels() locks and allocates.
            requests(route, status).inc()

        app = limited_app(
            self.config.limits,
            client_max_size=self.config.max_body_bytes,
            middlewares=[error_middleware("zone agent", count)],
        )
        path = DataPath(
            ProxySettings(
                self.config.zone,
                self.config.max_attempts,
                self.config.trace_top,
                first_byte_floor_s=self.config.first_byte_floor_s,
                first_byte_ttft_factor=self.config.first_byte_ttft_factor,
                first_byte_cap_s=self.config.upstream_timeout_s,
                affinity=self.config.affinity,
            ),
            # The current view and profile, read per request without a Python frame.
            view=functools.partial(operator.attrgetter("_view"), self),
            profile=functools.partial(operator.attrgetter("_profile"), self),
            accounting=self.accounting,
            health=self.health,
            on_ejection=self.on_ejection,
            # The pool while the agent runs, None otherwise (ZoneRelay.open refuses).
            session=functools.partial(operator.attrgetter("_upstream"), self),
            metrics=self.metrics,
            clock=self._clock,
            new_id=Ids().new,
            worker_auth=self.worker_keys.header,
            on_sent=None if self.kv_events is None else self.kv_events.sent,
            flow=self.flow,
        )
        openai = OpenAiApi(path)
        openai.routes(app)
        AssignApi(
            zone_id=self.config.zone,
            region_id=self.config.region,
            view=lambda: self._view,
            profile=lambda: self._profile,
            accounting=self.accounting,
            metrics=self.metrics,
            clock=self._clock,
            hold_s=self.config.assign_hold_s,
            trace_top=self.config.trace_top,
            affinity=self.config.affinity,
            on_sent=None if self.kv_events is None else self.kv_events.sent,
        ).routes(app)
        ServiceApi(lambda: self._view, self._registry).routes(app)
        lines = access.install(
            app,
            Tier.ZONE,
            region=self.config.region,
            zone=self.config.zone,
            registry=self._registry,
        )
        spans = tracing.install(
            app, Tier.ZONE, self.tracing, region=self.config.region, zone=self.config.zone
        )

        def lean() -> LeanFront:
            return LeanFront(
                openai.lean_routes(),
                tier=Tier.ZONE,
                limits=app[LIMITS_KEY],
                service="zone agent",
                count=count,
                registry=self._registry,
                access=lines,
                spans=spans,
            )

        return app, lean
