"""A continuous-batching model of one worker serving one model, steppable on any clock.

The engine is sans-io and synchronous. A driver adds requests and calls
:meth:`Engine.step` whenever the previous forward pass has ended; each call schedules
one forward pass the way vLLM V1's scheduler does, and returns its duration and what it
produced. The live emulator (:mod:`gpusim.driver`) sleeps that duration (scaled by
``--speedup``) before delivering the tokens; the discrete-event fleet simulator jumps
its virtual clock instead. The engine itself has no randomness unless step jitter is
asked for, and then draws it from its own seeded generator, so a run is a pure
function of (profile, configuration, seed, arrivals).

Scheduling (after vllm/v1/core/sched/scheduler.py):

* one token budget per pass (``max_num_batched_tokens``), shared by every sequence;
* running sequences first, in admission order: a decoding sequence needs 1 token, one
  in (chunked) prefill needs the rest of its prompt, cut to the budget left;
* if the KV cache cannot hold a running sequence's new tokens, the most recently
  admitted running sequence is preempted *by recompute*: its blocks are freed and it
  goes back to the front of the waiting queue, to prefill prompt + generated tokens
  again later (its prompt blocks may still be in the prefix cache);
* then, if nothing was preempted in this pass, waiting requests are admitted in FCFS
  order while sequences (``max_num_seqs``), budget and KV blocks allow; admission looks
  up the prompt's cached prefix first (cached blocks skip prefill; at least the last
  prompt token is always recomputed, as in vLLM).

A sequence whose prefill completes in a pass samples its first token in that same
pass; a decoding sequence emits one token per pass.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import NamedTuple

from gpusim.perfmodel import Degradation
from gpusim.prefix_cache import BlockPool
from gtm.errors import GtmError
from gtm.gpu_profiles import GpuProfile


class EngineError(GtmError):
    """A request the engine cannot take (the message says why)."""


class RequestTooLong(EngineError):
    """Prompt plus requested output exceeds the worker's maximum context."""


class DuplicateRequest(EngineError):
    """A request id that is already in the engine."""


class FinishReason(StrEnum):
    LENGTH = "length"  # produced its target number of tokens
    ABORTED = "aborted"


class EngineState(StrEnum):
    LOADING = "loading"
    READY = "ready"


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """A request as the engine sees it: sizes and prefix hashes, never text."""

    request_id: str
    prompt_tokens: int
    #: Tokens to generate; 0 means prefill only (an embedding request).
    output_tokens: int
    #: Prefix-chained hashes of the prompt's full blocks (``gtm.tokens.block_hashes``).
    block_hashes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise EngineError("a request needs at least one prompt token")
        if self.output_tokens < 0:
            raise EngineError("output_tokens cannot be negative")


class TokenOutput(NamedTuple):
    """One token produced by a pass: the ``position``-th (0-based) output token of a request.

    A named tuple rather than a dataclass: a busy pass creates hundreds of them, and
    tuples are immutable and the cheapest record Python builds.
    """

    request_id: str
    position: int
    finished: bool


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that left the engine, with its timings (engine time, seconds)."""

    request_id: str
    reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    arrival: float
    scheduled_at: float | None
    first_token_at: float | None
    finished_at: float
    preemptions: int

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    @property
    def e2e(self) -> float:
        return self.finished_at - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.scheduled_at is None else self.scheduled_at - self.arrival


@dataclass(frozen=True, slots=True)
class StepResult:
    """One forward pass: when it ran, what it computed, what it produced."""

    start: float
    end: float
    sequences: int
    prefill_tokens: int
    decode_tokens: int
    tokens: tuple[TokenOutput, ...]
    finished: tuple[FinishedRequest, ...]
    preempted: tuple[str, ...]
    #: Inter-token latencies of the decode tokens of this pass (end − previous token).
    inter_token_latencies: tuple[float, ...]
    #: Time to first token of the requests whose first token this pass produced.
    first_token_latencies: tuple[float, ...] = ()

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's load, for metrics and routing summaries."""

    state: EngineState
    running: int
    waiting: int
    kv_usage: float
    kv_blocks_total: int
    kv_blocks_free: int
    #: Prompt tokens still to prefill across waiting and running requests, minus what
    #: their cached prefixes already cover for running ones (waiting: not yet looked up).
    pending_prefill_tokens: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    requests_finished_total: int
    passes_total: int
    #: Blocks registered under a prefix hash (cached, in use or evictable): at most
    #: ``kv_blocks_total``, reached once the cache has filled.
    prefix_cache_blocks: int = 0


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Knobs on top of a profile."""

    degradation: Degradation = field(default_factory=Degradation)
    #: Relative standard deviation of pass durations (0: exact, deterministic).
    step_jitter: float = 0.0
    seed: int = 0


@dataclass(slots=True, eq=False)
class _Seq:
    req: EngineRequest
    arrival: float
    num_computed: int = 0
    outputs: int = 0
    blocks: list[int] = field(default_factory=list)
    registered: int = 0  # prompt blocks published to the prefix cache
    cached_tokens: int = 0  # prefix hits at first admission
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float = 0.0
    preemptions: int = 0
    queried: bool = False
    #: prompt + generated tokens (kept as a field: it is read in every pass)
    num_tokens: int = 0


#: One sequence's share of a pass: (sequence, new tokens, context tokens before the pass).
_Plan = tuple["_Seq", int, int]


class Engine:
    """One worker (GPU or tensor-parallel group) running one model."""

    def __init__(
        self,
        profile: GpuProfile,
        config: EngineConfig | None = None,
        *,
        loaded: bool = True,
        now: float = 0.0,
    ) -> None:
        self.profile = profile
        self.config = config or EngineConfig()
        self._rng = random.Random(self.config.seed)
        self.degradation = self.config.degradation
        self.pool = BlockPool(profile.num_gpu_blocks, enable_caching=profile.prefix_caching)
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._by_id: dict[str, _Seq] = {}
        self._ready_at = now if loaded else now + profile.cold_start_s
        self._busy_until = now
        self._passes_since_load = 0
        self._passes_total = 0
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._preemptions_total = 0
        self._finished_total = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready_at(self) -> float:
        """Engine time at which the model is loaded (cold start ends)."""
        return self._ready_at

    def is_ready(self, now: float) -> bool:
        return now >= self._ready_at

    def load(self, now: float) -> None:
        """Start (re)loading the model: cold start, then a fresh warm-up. Keeps requests."""
        self._ready_at = now + self.profile.cold_start_s
        self._passes_since_load = 0
        for seq in reversed(self._running):  # the KV cache does not survive a reload
            self._preempt(seq)
        self._running.clear()
        self.pool.reset()

    def set_degradation(self, degradation: Degradation) -> None:
        self.degradation = degradation

    def set_thermal_throttle(self, on: bool) -> None:
        self.degradation = replace(self.degradation, thermal_throttle=on)

    # ------------------------------------------------------------------ requests

    def check(self, prompt_tokens: int, output_tokens: int) -> None:
        """Raise :class:`RequestTooLong` if the request can never fit this worker."""
        total = prompt_tokens + max(output_tokens, 0)
        if total > self.profile.max_model_len:
            raise RequestTooLong(
                f"this model's maximum context length is {self.profile.max_model_len} tokens; "
                f"the request needs {total} ({prompt_tokens} in the prompt, "
                f"{output_tokens} for the output)"
            )

    def add(self, request: EngineRequest, now: float) -> None:
        """Queue a request that arrived at ``now``."""
        if request.request_id in self._by_id:
            raise DuplicateRequest(f"request {request.request_id!r} is already in the engine")
        self.check(request.prompt_tokens, request.output_tokens)
        seq = _Seq(req=request, arrival=now, last_token_at=now, num_tokens=request.prompt_tokens)
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: str, now: float) -> FinishedRequest | None:
        """Remove a request (client went away); ``None`` if it is not in the engine."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return None
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        return self._finish(seq, now, FinishReason.ABORTED)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def next_step_at(self, now: float) -> float | None:
        """When the next pass can start (``None``: idle until a request arrives)."""
        if not self.has_work:
            return None
        return max(now, self._ready_at, self._busy_until)

    # ------------------------------------------------------------------ stepping

    def step(self, now: float) -> StepResult | None:
        """Schedule and run one forward pass starting at ``now`` (or when possible).

        Returns ``None`` when there is nothing to do or the model is still loading
        (see :meth:`next_step_at`). The engine's state moves to the end of the pass at
        once; the caller delivers the result at ``result.end``.
        """
        start = max(now, self._busy_until)
        if not self._running and self._waiting:
            # An idle GPU starts no earlier than the first request it can run.
            start = max(start, self._waiting[0].arrival)
        if not self.has_work or start < self._ready_at:
            return None
        budget = self.profile.max_num_batched_tokens
        plans: list[_Plan] = []
        preempted: list[str] = []
        budget = self._schedule_running(plans, preempted, budget)
        # Like vLLM, admit nobody in a pass that had to preempt — unless the pass would
        # otherwise be empty (the preempted sequences then re-enter at once).
        if not preempted or not plans:
            self._schedule_waiting(plans, budget, start)
        if not plans:
            return None
        duration = self._duration(plans)
        end = start + duration
        self._busy_until = end
        self._passes_since_load += 1
        self._passes_total += 1
        return self._complete(plans, start, end, tuple(preempted))

    def _schedule_running(self, plans: list[_Plan], preempted: list[str], budget: int) -> int:
        index = 0
        bs = self.profile.block_size
        running = self._running
        while index < len(running) and budget > 0:
            seq = running[index]
            computed = seq.num_computed
            new_tokens = seq.num_tokens - computed
            if new_tokens > budget:
                new_tokens = budget
            scheduled = True
            while True:
                needed = (computed + new_tokens + bs - 1) // bs - len(seq.blocks)
                if needed <= 0:
                    break
                blocks = self.pool.allocate(needed)
                if blocks is not None:
                    seq.blocks.extend(blocks)
                    break
                victim = self._running.pop()
                self._preempt(victim)
                preempted.append(victim.req.request_id)
                if victim is seq:
                    scheduled = False
                    break
            if not scheduled:
                break
            plans.append((seq, new_tokens, computed))
            budget -= new_tokens
            index += 1
        return budget

    def _schedule_waiting(self, plans: list[_Plan], budget: int, now: float) -> None:
        bs = self.profile.block_size
        while self._waiting and budget > 0 and len(self._running) < self.profile.max_num_seqs:
            seq = self._waiting[0]
            if seq.arrival > now:
                return  # a pass that starts before a request arrived cannot include it
            # Always recompute at least the last token (vLLM: max cache hit = n − 1).
            hit_blocks = self.pool.lookup(seq.req.block_hashes, (seq.num_tokens - 1) // bs)
            computed = len(hit_blocks) * bs
            new_tokens = min(seq.num_tokens - computed, budget)
            fresh = math.ceil((computed + new_tokens) / bs) - len(hit_blocks)
            if fresh + self.pool.evictable_among(hit_blocks) > self.pool.num_free:
                return  # FCFS: the head waits, and so does everyone behind it
            self.pool.touch(hit_blocks)
            allocated = self.pool.allocate(fresh)
            if allocated is None:  # cannot happen after the check above
                self.pool.release(hit_blocks)
                return
            self._waiting.popleft()
            seq.blocks = [*hit_blocks, *allocated]
            seq.num_computed = computed
            if not seq.queried:
                seq.queried = True
                seq.cached_tokens = computed
                if self.profile.prefix_caching:
                    self.pool.record_query(seq.req.prompt_tokens, computed)
            if seq.scheduled_at is None:
                seq.scheduled_at = now
            self._running.append(seq)
            plans.append((seq, new_tokens, computed))
            budget -= new_tokens

    def _preempt(self, seq: _Seq) -> None:
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.registered = 0
        seq.num_computed = 0
        seq.preemptions += 1
        self._preemptions_total += 1
        self._waiting.appendleft(seq)

    def _duration(self, plans: list[_Plan]) -> float:
        new_tokens = context = pairs = 0
        for _, new, ctx in plans:
            new_tokens += new
            context += ctx
            pairs += new * ctx + new * (new + 1) // 2
        base = self.profile.forward_time_s(
            new_tokens=new_tokens, context_tokens=context, attention_pairs=pairs
        )
        factor = self.degradation.factor(self._passes_since_load)
        if self.config.step_jitter > 0:
            factor *= max(0.5, self._rng.gauss(1.0, self.config.step_jitter))
        return base * factor

    def _complete(
        self, plans: list[_Plan], start: float, end: float, preempted: tuple[str, ...]
    ) -> StepResult:
        tokens: list[TokenOutput] = []
        finished: list[FinishedRequest] = []
        itls: list[float] = []
        ttfts: list[float] = []
        prefill = decode = 0
        bs = self.profile.block_size
        for seq, new_tokens, _ in plans:
            in_prefill = seq.outputs == 0 or seq.num_computed < seq.num_tokens - 1
            if in_prefill:
                prefill += new_tokens
            else:
                decode += new_tokens
            seq.num_computed += new_tokens
            if seq.registered < len(seq.req.block_hashes):
                self._register_blocks(seq, bs)
            if seq.num_computed < seq.num_tokens:
                continue  # chunked prefill: more to come
            if seq.outputs == 0 and seq.first_token_at is None:
                self._prompt_tokens_total += seq.req.prompt_tokens
            if seq.req.output_tokens == 0:
                finished.append(self._finish_running(seq, end))
                continue
            if seq.outputs > 0:
                itls.append(end - seq.last_token_at)
            seq.outputs += 1
            seq.num_tokens += 1
            seq.last_token_at = end
            if seq.first_token_at is None:
                seq.first_token_at = end
                ttfts.append(end - seq.arrival)
            done = seq.outputs >= seq.req.output_tokens
            tokens.append(TokenOutput(seq.req.request_id, seq.outputs - 1, done))
            if done:
                finished.append(self._finish_running(seq, end))
        self._generation_tokens_total += len(tokens)
        return StepResult(
            start=start,
            end=end,
            sequences=len(plans),
            prefill_tokens=prefill,
            decode_tokens=decode,
            tokens=tuple(tokens),
            finished=tuple(finished),
            preempted=preempted,
            inter_token_latencies=tuple(itls),
            first_token_latencies=tuple(ttfts),
        )

    def _register_blocks(self, seq: _Seq, bs: int) -> None:
        hashes = seq.req.block_hashes
        full = min(seq.num_computed // bs, len(hashes))
        while seq.registered < full:
            self.pool.register(seq.blocks[seq.registered], hashes[seq.registered])
            seq.registered += 1

    def _finish_running(self, seq: _Seq, now: float) -> FinishedRequest:
        self._running.remove(seq)
        return self._finish(seq, now, FinishReason.LENGTH)

    def _finish(self, seq: _Seq, now: float, reason: FinishReason) -> FinishedRequest:
        self.pool.release(seq.blocks)
        seq.blocks = []
        del self._by_id[seq.req.request_id]
        self._finished_total += 1
        return FinishedRequest(
            request_id=seq.req.request_id,
            reason=reason,
            prompt_tokens=seq.req.prompt_tokens,
            cached_tokens=seq.cached_tokens,
            output_tokens=seq.outputs,
            arrival=seq.arrival,
            scheduled_at=seq.scheduled_at,
            first_token_at=seq.first_token_at,
            finished_at=now,
            preemptions=seq.preemptions,
        )

    # ------------------------------------------------------------------ observation

    def stats(self, now: float | None = None) -> EngineStats:
        state = EngineState.READY if now is None or self.is_ready(now) else EngineState.LOADING
        pending = sum(s.num_tokens for s in self._waiting)
        for seq in self._running:
            left = seq.num_tokens - seq.num_computed
            if seq.outputs == 0 or left > 1:  # still (re)computing its prompt
                pending += left
        return EngineStats(
            state=state,
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage=self.pool.usage(),
            kv_blocks_total=self.pool.num_blocks,
            kv_blocks_free=self.pool.num_free,
            pending_prefill_tokens=pending,
            prefix_cache_queries=self.pool.query_tokens,
            prefix_cache_hits=self.pool.hit_tokens,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            preemptions_total=self._preemptions_total,
            requests_finished_total=self._finished_total,
            passes_total=self._passes_total,
            prefix_cache_blocks=self.pool.num_cached,
        )

    def running_ids(self) -> Iterator[str]:
        return (s.req.request_id for s in self._running)

    def waiting_ids(self) -> Iterator[str]:
        return (s.req.request_id for s in self._waiting)
