"""The load of a game day: ``gtm load``'s trace replay through the front door, in several
tenant streams, with rate multipliers over time and client retries, plus a DNS poller.

Requests are built and sent by :mod:`gtmctl.load` (its prompts, its client sampler, its
``send_one``); what this module adds is what a chaos run needs to judge failover:

* **when** each request was sent and finished (on the run's clock), so a probe can ask
  what happened in a window;
* **client retries** per the documented policy (ARCHITECTURE §6; Google SRE "Handling
  Overload": at most 3 attempts, and only for failures that are safe to retry — a
  connection error or 502/503/504 before any byte; a started stream is never retried);
* **rate multipliers** (flash crowd, overload): trace time runs ``factor`` times faster
  from ``at_s`` on, so a factor 3 means three times the arrivals, same trace;
* **DNS answers** for chosen names, polled over UDP at a fixed interval.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
import dns.asyncquery
import dns.exception
import dns.message
import dns.rcode
import dns.rdatatype
from pydantic import Field, model_validator

from chaos.journal import DnsRecord, Journal, RequestRecord
from fleetsim.traces import Trace, TraceKind, TraceRequest
from gtm import headers as gtm_headers
from gtm.clock import Clock
from gtm.errors import ConfigError
from gtm.models import Frozen, Identifier
from gtm.tasks import TaskSupervisor
from gtmctl.load import ClientsFrom, LoadConfig, LoadRun, Outcome, send_one


class Stream(Frozen):
    """One tenant's share of the load."""

    label: str = Field(default="default", min_length=1, max_length=40)
    api_key: str = Field(default="gtm-load-test", min_length=1)
    share: float = Field(default=1.0, gt=0.0)
    #: Send straight to this region's LB instead of the front door: a client whose
    #: resolver GeoDNS sent there (``<region>.api``, or an answer it cached).
    region: Identifier | None = None


class Multiplier(Frozen):
    """From ``at_s`` (s after the load starts) on, arrivals come ``factor`` times faster."""

    at_s: float = Field(ge=0.0)
    factor: float = Field(gt=0.0, le=100.0)


class RetryPolicy(Frozen):
    """The client's retry policy (ARCHITECTURE §6: ≤ 3 attempts; SRE book: retry only
    what is safe, with backoff)."""

    attempts: int = Field(default=3, ge=1, le=10)
    #: Retried statuses: 0 = no HTTP answer (connection refused/reset, timeout).
    statuses: tuple[int, ...] = (0, 502, 503, 504)
    backoff_s: float = Field(default=0.1, ge=0.0, le=10.0)


class LoadSpec(Frozen):
    trace: TraceKind = TraceKind.AZURE_CONV
    #: Native trace rate × this (before multipliers).
    rate_scale: float = Field(default=1.0, gt=0.0, le=1000.0)
    duration_s: float = Field(gt=0.0, le=86_400.0)
    clients_from: ClientsFrom = ClientsFrom.CITIES
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    streams: tuple[Stream, ...] = (Stream(),)
    multipliers: tuple[Multiplier, ...] = ()
    retry: RetryPolicy = RetryPolicy()
    #: Caps keep a short run's requests short (the emulator runs --speedup × faster).
    max_input_tokens: int = Field(default=4096, ge=8)
    max_output_tokens: int = Field(default=128, ge=1)
    #: A request (one attempt) that takes longer fails with a timeout.
    timeout_s: float = Field(default=30.0, gt=0.0)
    max_in_flight: int = Field(default=512, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> LoadSpec:
        labels = [s.label for s in self.streams]
        if len(set(labels)) != len(labels):
            raise ValueError(f"stream labels must be unique, got {labels}")
        at = [m.at_s for m in self.multipliers]
        if at != sorted(at):
            raise ValueError("multipliers must be in order of at_s")
        return self


class DnsSpec(Frozen):
    """Names whose answers the run records (and the DNS probes audit)."""

    names: tuple[str, ...] = ()
    interval_s: float = Field(default=0.25, gt=0.0, le=60.0)


# ---------------------------------------------------------------------------- schedule


@dataclass(frozen=True, slots=True)
class Planned:
    send_at: float
    request: TraceRequest
    stream: Stream


def trace_time(multipliers: Sequence[Multiplier], rate_scale: float, t: float) -> float:
    """Trace seconds consumed after ``t`` run seconds (rate × piecewise factor)."""
    edges = [(0.0, 1.0), *((m.at_s, m.factor) for m in multipliers)]
    total = 0.0
    for index, (start, factor) in enumerate(edges):
        end = edges[index + 1][0] if index + 1 < len(edges) else float("inf")
        if t <= start:
            break
        total += (min(t, end) - start) * factor
    return total * rate_scale


def run_time(multipliers: Sequence[Multiplier], rate_scale: float, tau: float) -> float:
    """Inverse of :func:`trace_time`: when the trace's second ``tau`` is sent."""
    edges = [(0.0, 1.0), *((m.at_s, m.factor) for m in multipliers)]
    consumed = 0.0
    for index, (start, factor) in enumerate(edges):
        end = edges[index + 1][0] if index + 1 < len(edges) else float("inf")
        span = (end - start) * factor * rate_scale
        if tau <= consumed + span:
            return start + (tau - consumed) / (factor * rate_scale)
        consumed += span
    raise AssertionError("unreachable: the last segment is unbounded")


def plan(spec: LoadSpec, trace: Trace) -> list[Planned]:
    """Every request of the run: when it is sent, and by which stream (drawn by share,
    seeded)."""
    first = trace.requests[0].at_s if trace.requests else 0.0
    limit = trace_time(spec.multipliers, spec.rate_scale, spec.duration_s)
    rng = random.Random(spec.seed)
    total = sum(s.share for s in spec.streams)
    cumulative: list[float] = []
    running = 0.0
    for stream in spec.streams:
        running += stream.share / total
        cumulative.append(running)
    planned = []
    for request in trace.requests:
        tau = request.at_s - first
        if tau >= limit:
            break
        index = min(bisect.bisect_left(cumulative, rng.random()), len(spec.streams) - 1)
        send_at = run_time(spec.multipliers, spec.rate_scale, tau)
        planned.append(Planned(send_at, request, spec.streams[index]))
    return planned


# ---------------------------------------------------------------------------- sending


@dataclass(slots=True)
class Served:
    """Where an attempt was served, from the answer's ``x-gtm-zone``/``x-gtm-gpu``."""

    zone: str = ""
    gpu: str = ""


#: The attempt being sent in this task (each request has its own task). ``send_one``
#: (gtm load's) reads the region itself; the zone and GPU come through aiohttp's
#: request-end trace, which runs in the sending task, so it finds this attempt here.
_SERVED: contextvars.ContextVar[Served | None] = contextvars.ContextVar(
    "chaos_served", default=None
)


async def _record_served(
    _session: aiohttp.ClientSession,
    _context: object,
    params: aiohttp.TraceRequestEndParams,
) -> None:
    served = _SERVED.get()
    if served is not None:
        served.zone = params.response.headers.get(gtm_headers.ZONE, "")
        served.gpu = params.response.headers.get(gtm_headers.GPU, "")


def served_trace() -> aiohttp.TraceConfig:
    """The trace that fills in :class:`Served` for the attempt in flight."""
    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(_record_served)
    return trace


class Traffic:
    """Sends the planned requests through the front door and records each in the
    journal (sent/finished on ``clock``, run time = clock − ``t0``)."""

    def __init__(
        self,
        spec: LoadSpec,
        planned: Sequence[Planned],
        url: str,
        journal: Journal,
        *,
        clock: Clock,
        t0: float,
        supervisor: TaskSupervisor,
        region_urls: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self._planned = planned
        self._journal = journal
        self._clock = clock
        self._t0 = t0
        self._supervisor = supervisor
        self._config = LoadConfig(
            url=url,
            model=spec.model,
            clients_from=spec.clients_from,
            seed=spec.seed,
            max_in_flight=spec.max_in_flight,
            max_input_tokens=spec.max_input_tokens,
            max_output_tokens=spec.max_output_tokens,
            timeout_s=spec.timeout_s,
            duration_s=spec.duration_s,
        )
        urls = region_urls or {}
        missing = sorted({s.region for s in spec.streams if s.region} - set(urls))
        if missing:
            raise ConfigError(
                f"load streams name regions {missing}; the deployment has {sorted(urls)}"
            )
        #: Streams sent straight to a regional LB: that region's copy of the config.
        self._direct = {
            s.region: self._config.model_copy(update={"url": urls[s.region].rstrip("/")})
            for s in spec.streams
            if s.region
        }
        # gtm load's request builder: prompts with shared prefixes, clients by city.
        self._builder = LoadRun(self._config, (), clock=clock)
        self._rng = random.Random(spec.seed + 1)
        self.in_flight = 0
        self.sent = 0
        self._done = asyncio.Event()

    def now(self) -> float:
        return self._clock.monotonic() - self._t0

    def url_for(self, stream: Stream) -> str:
        """Where ``stream``'s requests go: the front door, or its region's LB."""
        return self._direct[stream.region].url if stream.region else self._config.url

    async def run(self) -> None:
        """Send everything on schedule, then wait for the last answer."""
        timeout = aiohttp.ClientTimeout(total=self.spec.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.spec.max_in_flight)
        async with aiohttp.ClientSession(
            timeout=timeout, connector=connector, trace_configs=[served_trace()]
        ) as session:
            for index, item in enumerate(self._planned):
                delay = item.send_at - self.now()
                if delay > 0:
                    await self._clock.sleep(delay)
                if self.in_flight >= self.spec.max_in_flight:
                    now = self.now()
                    self._journal.requests.append(
                        RequestRecord(
                            now, now, False, 0, "client-overload", stream=item.stream.label
                        )
                    )
                    continue
                self.in_flight += 1
                self._done.clear()
                self.sent += 1
                self._supervisor.spawn(f"request-{index}", self._one(session, item))
            if self.in_flight:
                await self._done.wait()

    async def _one(self, session: aiohttp.ClientSession, item: Planned) -> None:
        try:
            record = await self._attempts(session, item)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._done.set()
        self._journal.requests.append(record)

    async def _attempts(self, session: aiohttp.ClientSession, item: Planned) -> RequestRecord:
        sent_at = self.now()
        body = self._builder.body(item.request)
        headers, _city = self._builder.headers()
        headers["Authorization"] = f"Bearer {item.stream.api_key}"
        policy = self.spec.retry
        failed_regions: list[str] = []
        outcome: Outcome | None = None
        served = Served()
        attempt = 0
        for attempt in range(1, policy.attempts + 1):
            config = self._direct[item.stream.region] if item.stream.region else self._config
            served = Served()
            _SERVED.set(served)
            outcome = await send_one(session, config, body, headers, "")
            if outcome.ok or outcome.status not in policy.statuses:
                break
            failed_regions.append(outcome.region)
            if attempt < policy.attempts and policy.backoff_s:
                # Full jitter (gtm.tasks.Backoff's reasoning): retries of many clients
                # that failed together do not arrive together.
                await self._clock.sleep(self._rng.uniform(0.0, policy.backoff_s * attempt))
        assert outcome is not None
        return RequestRecord(
            sent_at=sent_at,
            done_at=self.now(),
            ok=outcome.ok,
            status=outcome.status,
            reason=outcome.reason,
            ttft_s=outcome.ttft_s,
            region=outcome.region,
            spilled_from=outcome.spilled_from,
            zone=served.zone,
            gpu=served.gpu,
            attempts=attempt,
            stream=item.stream.label,
            failed_regions=tuple(failed_regions[: attempt - 1] if outcome.ok else failed_regions),
        )


# ---------------------------------------------------------------------------- DNS


class DnsPoller:
    """Asks the deployment's DNS server for each name every ``interval_s``; records the
    answers with the regions their addresses belong to."""

    def __init__(
        self,
        spec: DnsSpec,
        server: tuple[str, int],
        region_of: Mapping[str, str],
        journal: Journal,
        *,
        clock: Clock,
        t0: float,
    ) -> None:
        self.spec = spec
        self._host, self._port = server
        self._region_of = region_of
        self._journal = journal
        self._clock = clock
        self._t0 = t0

    async def poll_once(self) -> None:
        for name in self.spec.names:
            self._journal.dns.append(await self.ask(name))

    async def ask(self, name: str) -> DnsRecord:
        at = self._clock.monotonic() - self._t0
        query = dns.message.make_query(name, dns.rdatatype.A)
        try:
            answer = await dns.asyncquery.udp(query, self._host, timeout=1.0, port=self._port)
        except (dns.exception.DNSException, OSError) as exc:
            return DnsRecord(at, name, f"ERROR:{type(exc).__name__}", ())
        addresses = sorted(
            rr.to_text()
            for rrset in answer.answer
            if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA)
            for rr in rrset
        )
        regions = tuple(sorted({self._region_of.get(a, a) for a in addresses}))
        return DnsRecord(at, name, dns.rcode.to_text(answer.rcode()), regions, tuple(addresses))
