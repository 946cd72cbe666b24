"""``gtm load``: replay a real trace through a deployment's front door.

Open loop, as production traffic is: each request of the trace is sent at its own
arrival time (divided by ``--rate-scale``), whatever happened to the earlier ones — a
closed loop would slow down exactly when the deployment does and hide it. Every request
is a streamed chat completion of the trace's input size (a generated prompt; Mooncake's
shared prefixes become shared prompt text, so prefix caches see them) asking for the
trace's output size (``ignore_eos``, as vLLM benchmarks do). The traces ship with gtm
(:mod:`gtm.data`); ``--trace synthetic`` draws one from a model fitted on the Azure
conversation trace instead (:mod:`fleetsim.synthetic`, seeded by ``--seed``).

With ``--clients-from cities`` each request comes from a city drawn by population
(:mod:`gtmctl.up.clients`), its address in ``X-Forwarded-For``; ``gtm up``'s front door
trusts loopback proxies and places those addresses with its geo map.

Measured per request: the status (and the refusal's code), the time to the first
content token (TTFT), the region that served it and whether it was spilled there
(``x-gtm-region``, ``x-gtm-spilled-from``).

A stream that breaks after its first byte is a failure with a reason of its own
(:class:`StreamBreak`), counted apart in the summary (``cut_streams``): an error event
in OpenAI's shape instead of ``[DONE]`` (``stream-error:<code>``, how gtm tells a
streaming client its answer was cut), a connection that broke mid-body
(``cut-stream``), or a body that ended without ``[DONE]`` (``truncated-stream``). The
body is read to its end after ``[DONE]`` (the chunked terminator), so the connection
is reused and the front door never sees its client leave before its response ended.

The game-day runner (:mod:`chaos.traffic`) sends its traffic with this module's request
builder and tally, so a drill's requests and figures are ``gtm load``'s; that is why this
module sits below :mod:`chaos` in the import layers, and the ``gtm load`` command itself
(:mod:`gtmctl.up.cli`) imports it only when run.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TextIO

import aiohttp
from pydantic import Field

from fleetsim.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceRequest
from gtm.clock import Clock
from gtm.errors import ConfigError
from gtm.metrics import new_registry
from gtm.models import Frozen
from gtm.stats import percentile
from gtm.tasks import TaskSupervisor
from gtmctl.up.clients import ClientSampler, bundled_cities

#: Token overhead of one user message plus the reply priming (gtm.tokens: 3 + 3, and
#: the role token): a prompt of N tokens carries N - 7 tokens of text.
CHAT_OVERHEAD_TOKENS = 7
#: Words of the generated prompts: 4-letter lower-case "words" are one token each
#: under gtm.tokens' approximation (a word with its leading space, ≤ 6 characters).
VOCABULARY_SIZE = 2048


class ClientsFrom(StrEnum):
    CITIES = "cities"
    LOOPBACK = "loopback"


class LoadConfig(Frozen):
    url: str = Field(default="http://127.0.0.1:8080", pattern=r"^https?://")
    api_key: str = "gtm-load-test"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    rate_scale: float = Field(default=1.0, gt=0.0, le=1000.0)
    duration_s: float = Field(default=60.0, gt=0.0, le=86_400.0)
    clients_from: ClientsFrom = ClientsFrom.CITIES
    seed: int = 0
    #: Requests in flight beyond this are not sent (counted as "client-overload").
    max_in_flight: int = Field(default=1024, ge=1)
    #: Longest prompt sent: long-context traces (Mooncake p99 85k tokens) are capped
    #: to what every example model's KV cache holds on the smallest GPU.
    max_input_tokens: int = Field(default=16_384, ge=8)
    max_output_tokens: int = Field(default=4096, ge=1)
    timeout_s: float = Field(default=300.0, gt=0.0)


# ---------------------------------------------------------------------------- prompts


class PromptMaker:
    """Deterministic prompt text of a given token count; equal prefix hashes give equal
    text (512-token blocks), anything else is unique per request."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self._words = [" " + "".join(rng.choices(letters, k=4)) for _ in range(VOCABULARY_SIZE)]
        self._rng = rng
        self._blocks: dict[int, str] = {}

    def _block(self, block_hash: int) -> str:
        block = self._blocks.get(block_hash)
        if block is None:
            rng = random.Random(block_hash)
            block = "".join(rng.choices(self._words, k=MOONCAKE_BLOCK_TOKENS))
            self._blocks[block_hash] = block
        return block

    def prompt(self, tokens: int, prefix_hashes: Sequence[int] = ()) -> str:
        """About ``tokens`` tokens of text (as a chat message's content)."""
        wanted = max(1, tokens - CHAT_OVERHEAD_TOKENS)
        full_blocks = min(len(prefix_hashes), wanted // MOONCAKE_BLOCK_TOKENS)
        parts = [self._block(h) for h in prefix_hashes[:full_blocks]]
        rest = wanted - full_blocks * MOONCAKE_BLOCK_TOKENS
        parts.append("".join(self._rng.choices(self._words, k=rest)))
        return "".join(parts).lstrip()


# ---------------------------------------------------------------------------- results


class StreamBreak(StrEnum):
    """How a stream that had begun (status 200, headers in) failed: the reason's prefix."""

    #: An error event (``data: {"error": …}``) came instead of ``[DONE]``.
    ERROR_EVENT = "stream-error"
    #: The connection broke mid-body (reset, a short body, no last chunk).
    CUT = "cut-stream"
    #: The body ended cleanly but without ``[DONE]``.
    TRUNCATED = "truncated-stream"


def is_stream_break(reason: str) -> bool:
    """Whether a failure's reason is a stream that broke after its first byte."""
    return reason.split(":", 1)[0] in _BREAK_REASONS


_BREAK_REASONS = frozenset(b.value for b in StreamBreak)


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    status: int
    #: A refusal's or failure's code ("" when it succeeded).
    reason: str = ""
    ttft_s: float | None = None
    latency_s: float = 0.0
    region: str = ""
    spilled_from: str = ""
    city: str = ""


@dataclass(slots=True)
class Tally:
    """Outcomes so far, and what the summary reports."""

    scheduled: int = 0
    sent: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)

    @property
    def done(self) -> int:
        return len(self.outcomes)

    @property
    def succeeded(self) -> int:
        return sum(1 for o in self.outcomes if o.ok)

    def summary(self) -> dict[str, Any]:
        done = self.outcomes
        ok = [o for o in done if o.ok]
        ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
        latencies = [o.latency_s for o in ok]
        regions = Counter(o.region for o in ok if o.region)
        spills = Counter(f"{o.spilled_from.split(',')[0]}→{o.region}" for o in ok if o.spilled_from)
        refusals = Counter(o.reason for o in done if not o.ok)
        cut = Counter(
            o.reason.split(":", 1)[0] for o in done if not o.ok and is_stream_break(o.reason)
        )

        def ms(value: float) -> float | None:
            return None if math.isnan(value) else round(1000.0 * value, 1)

        return {
            "requests": len(done),
            "succeeded": len(ok),
            "failed": len(done) - len(ok),
            "success_ratio": (len(ok) / len(done)) if done else None,
            "ttft_ms": {"p50": ms(percentile(ttfts, 0.5)), "p99": ms(percentile(ttfts, 0.99))},
            "latency_ms": {
                "p50": ms(percentile(latencies, 0.5)),
                "p99": ms(percentile(latencies, 0.99)),
            },
            "region_share": {
                r: round(n / len(ok), 4) for r, n in sorted(regions.items(), key=lambda kv: -kv[1])
            },
            "spills": dict(spills.most_common()),
            "spilled": sum(spills.values()),
            "refusals": dict(refusals.most_common()),
            "cut_streams": sum(cut.values()),
            "cut_stream_kinds": dict(cut.most_common()),
        }


# ---------------------------------------------------------------------------- one request


async def _error_reason(response: aiohttp.ClientResponse) -> str:
    try:
        body = await response.json(content_type=None)
        code = body["error"].get("code") or body["error"].get("type")
        return f"http-{response.status}:{code}" if code else f"http-{response.status}"
    except (ValueError, KeyError, TypeError, AttributeError, aiohttp.ClientError):
        return f"http-{response.status}"


@dataclass(slots=True)
class StreamRead:
    """What a streamed body showed so far (filled in as it is read)."""

    ttft_s: float | None = None
    #: ``data: [DONE]`` arrived: the answer is whole.
    done: bool = False
    #: The code (else type) of an error event, when one came.
    error: str | None = None

    def reason(self) -> str:
        """The failure's reason once the body ended cleanly ("" when it succeeded)."""
        if self.error is not None:
            kind = StreamBreak.ERROR_EVENT.value
            return f"{kind}:{self.error}" if self.error else kind
        return "" if self.done else StreamBreak.TRUNCATED.value


def _error_code(data: bytes) -> str | None:
    """The code of an OpenAI error event's payload (``""`` without one), else None."""
    try:
        event = json.loads(data)
    except ValueError:
        return None
    error = event.get("error") if isinstance(event, dict) else None
    if not isinstance(error, dict):
        return None
    code = error.get("code") or error.get("type") or ""
    return str(code)


async def read_stream(response: aiohttp.ClientResponse, started: float, read: StreamRead) -> None:
    """Read an SSE body to its end into ``read`` (raises the client's error when the
    connection breaks). Every line is checked for an error event; the first content
    token's time is the TTFT."""
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            read.done = True
            continue
        if b'"error"' in data and read.error is None:
            read.error = _error_code(data)
            if read.error is not None:
                continue
        if read.ttft_s is None:
            try:
                chunk = json.loads(data)
            except ValueError:
                continue  # a malformed event: the stream's end says whether it failed
            choices = (chunk.get("choices") or []) if isinstance(chunk, dict) else []
            if choices and (choices[0].get("delta") or {}).get("content"):
                read.ttft_s = time.monotonic() - started


async def send_one(
    session: aiohttp.ClientSession,
    config: LoadConfig,
    body: dict[str, Any],
    headers: dict[str, str],
    city: str,
) -> Outcome:
    started = time.monotonic()
    read = StreamRead()
    try:
        async with session.post(
            f"{config.url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            region = response.headers.get("x-gtm-region", "")
            spilled = response.headers.get("x-gtm-spilled-from", "")
            if response.status != 200:
                reason = await _error_reason(response)
                return Outcome(False, response.status, reason, None, time.monotonic() - started,
                               region, spilled, city)  # fmt: skip
            try:
                await read_stream(response, started, read)
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                if not read.done or read.error is not None:
                    # Broke after the first byte: a cut stream, whatever the library says.
                    latency = time.monotonic() - started
                    reason = f"{StreamBreak.CUT.value}:{type(exc).__name__}"
                    return Outcome(False, 200, reason, read.ttft_s, latency, region, spilled, city)
                # After [DONE] the answer is whole; only the chunked terminator was lost.
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Outcome(False, 0, type(exc).__name__, None, time.monotonic() - started, "", "", city)
    latency = time.monotonic() - started
    reason = read.reason()
    if reason:
        return Outcome(False, 200, reason, read.ttft_s, latency, region, spilled, city)
    return Outcome(True, 200, "", read.ttft_s, latency, region, spilled, city)


# ---------------------------------------------------------------------------- the run


class LoadRun:
    """Replays ``requests`` (already windowed) against the front door."""

    def __init__(
        self,
        config: LoadConfig,
        requests: Sequence[TraceRequest],
        *,
        clock: Clock,
        progress: Callable[[Tally, float], None] | None = None,
    ) -> None:
        self.config = config
        self._requests = requests
        self._clock = clock
        self._progress = progress
        self._prompts = PromptMaker(config.seed)
        self._sampler = (
            ClientSampler(bundled_cities(), random.Random(config.seed))
            if config.clients_from is ClientsFrom.CITIES
            else None
        )
        self._supervisor = TaskSupervisor(registry=new_registry(), clock=clock, component="load")
        self.tally = Tally(scheduled=len(requests))
        self._in_flight = 0
        self._all_done = asyncio.Event()

    def body(self, request: TraceRequest) -> dict[str, Any]:
        tokens = min(request.input_tokens, self.config.max_input_tokens)
        prompt = self._prompts.prompt(tokens, request.prefix_hashes)
        return {
            "model": self.config.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max(1, min(request.output_tokens, self.config.max_output_tokens)),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def headers(self) -> tuple[dict[str, str], str]:
        headers = {"Authorization": f"Bearer {self.config.api_key}"}
        if self._sampler is None:
            return headers, ""
        client = self._sampler.sample()
        headers["X-Forwarded-For"] = str(client.address)
        return headers, f"{client.city.name}, {client.city.country}"

    async def run(self) -> Tally:
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.config.max_in_flight)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await self._preflight(session)
            progress = self._supervisor.run_loop("progress", self._report, interval=0.5)
            try:
                await self._dispatch(session)
                if self.tally.done < self.tally.scheduled:
                    await self._all_done.wait()
            finally:
                progress.cancel()
                await self._supervisor.aclose()
        self._report_now()
        return self.tally

    async def _preflight(self, session: aiohttp.ClientSession) -> None:
        """Fail at once, clearly, when nothing answers at the front door's address."""
        url = f"{self.config.url}/healthz"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=5.0)):
                return
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConfigError(
                f"no front door answers at {self.config.url} ({type(exc).__name__}); "
                "is `gtm up` running? (--url names another one)"
            ) from None

    async def _dispatch(self, session: aiohttp.ClientSession) -> None:
        start = self._clock.monotonic()
        scale = self.config.rate_scale
        for index, request in enumerate(self._requests):
            delay = start + request.at_s / scale - self._clock.monotonic()
            if delay > 0:
                await self._clock.sleep(delay)
            if self._in_flight >= self.config.max_in_flight:
                self._record(Outcome(False, 0, "client-overload"))
                continue
            headers, city = self.headers()
            self._in_flight += 1
            self.tally.sent += 1
            body = self.body(request)
            self._supervisor.spawn(f"request-{index}", self._one(session, body, headers, city))

    async def _one(
        self,
        session: aiohttp.ClientSession,
        body: dict[str, Any],
        headers: dict[str, str],
        city: str,
    ) -> None:
        try:
            outcome = await send_one(session, self.config, body, headers, city)
        finally:
            self._in_flight -= 1
        self._record(outcome)

    def _record(self, outcome: Outcome) -> None:
        self.tally.add(outcome)
        if self.tally.done >= self.tally.scheduled:
            self._all_done.set()

    async def _report(self) -> None:
        self._report_now()

    def _report_now(self) -> None:
        if self._progress is not None:
            self._progress(self.tally, self._clock.monotonic())


# ---------------------------------------------------------------------------- printing


class ProgressBar:
    """One line redrawn in place on a terminal; a line every 10 s otherwise."""

    def __init__(self, stream: TextIO, started: float, duration_s: float, width: int = 30) -> None:
        self._stream = stream
        self._started = started
        self._duration = duration_s
        self._width = width
        self._tty = stream.isatty()
        self._last_line = -math.inf

    def __call__(self, tally: Tally, now: float) -> None:
        elapsed = now - self._started
        share = min(1.0, elapsed / self._duration) if self._duration > 0 else 1.0
        filled = int(share * self._width)
        ttfts = [o.ttft_s for o in tally.outcomes[-200:] if o.ok and o.ttft_s is not None]
        p50 = percentile(ttfts, 0.5)
        in_flight = tally.sent - tally.done + _overloaded(tally)
        text = (
            f"[{'#' * filled}{'-' * (self._width - filled)}] {elapsed:5.0f}/{self._duration:.0f} s"
            f"  sent {tally.sent}/{tally.scheduled}  ok {tally.succeeded}"
            f"  failed {tally.done - tally.succeeded}  in flight {in_flight}"
            + ("" if math.isnan(p50) else f"  TTFT p50 {1000 * p50:.0f} ms")
        )
        if self._tty:
            self._stream.write("\r" + text.ljust(110))
            self._stream.flush()
        elif elapsed - self._last_line >= 10.0:
            self._stream.write(text + "\n")
            self._last_line = elapsed

    def finish(self) -> None:
        if self._tty:
            self._stream.write("\n")


def _overloaded(tally: Tally) -> int:
    return sum(1 for o in tally.outcomes if o.reason == "client-overload")


def render_summary(summary: dict[str, Any], header: str) -> str:
    def ms(value: float | None) -> str:
        return "–" if value is None else f"{value:.0f} ms"

    ratio = summary["success_ratio"]
    lines = [
        header,
        f"  requests   {summary['requests']} sent, {summary['succeeded']} succeeded"
        + ("" if ratio is None else f" ({100 * ratio:.2f} %)")
        + f", {summary['failed']} failed",
        f"  TTFT       p50 {ms(summary['ttft_ms']['p50'])}, p99 {ms(summary['ttft_ms']['p99'])}"
        f"   (whole request p50 {ms(summary['latency_ms']['p50'])},"
        f" p99 {ms(summary['latency_ms']['p99'])})",
        "  regions    "
        + (", ".join(f"{r} {100 * s:.1f} %" for r, s in summary["region_share"].items()) or "none"),
        f"  spills     {summary['spilled']}"
        + (
            " (" + ", ".join(f"{k} {n}" for k, n in summary["spills"].items()) + ")"
            if summary["spills"]
            else ""
        ),
        "  refusals   " + (", ".join(f"{k} {n}" for k, n in summary["refusals"].items()) or "none"),
    ]
    kinds = summary.get("cut_stream_kinds") or {}
    if kinds:
        lines.append(
            f"  cut        {summary['cut_streams']} streams broke after the first byte ("
            + ", ".join(f"{k} {n}" for k, n in kinds.items())
            + ")"
        )
    return "\n".join(lines)


def describe(trace: Trace, config: LoadConfig, window: Sequence[TraceRequest]) -> str:
    rate = len(window) / config.duration_s
    return (
        f"gtm load: {trace.kind.value} ({trace.rate_per_s:.2f} req/s native) × "
        f"{config.rate_scale:g} for {config.duration_s:g} s = {len(window)} requests "
        f"({rate:.2f} req/s), clients from {config.clients_from.value}, model {config.model}, "
        f"→ {config.url}"
    )


def run_load(
    config: LoadConfig, trace: Trace, *, clock: Clock, out: TextIO = sys.stderr
) -> dict[str, Any]:
    """Run and print; return the summary (also for ``--json``)."""
    window = trace.window(config.duration_s, config.rate_scale)
    out.write(describe(trace, config, window) + "\n")
    bar = ProgressBar(out, clock.monotonic(), config.duration_s)
    run = LoadRun(config, window, clock=clock, progress=bar)
    interrupted = False
    try:
        asyncio.run(run.run())
    except KeyboardInterrupt:
        # asyncio.run has cancelled the run (and the requests in flight) by now; what
        # finished before Ctrl-C is still worth a summary.
        interrupted = True
    bar.finish()
    summary = run.tally.summary()
    summary["interrupted"] = interrupted
    return summary
