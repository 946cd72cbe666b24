"""An analytic continuous-batching GPU: advanced between events, not per forward pass.

:class:`gpusim.engine.Engine` schedules every forward pass the way vLLM does; a large
fleet runs far too many passes per simulated second for the simulator's speed target
(simulated requests per wall second). Here a GPU
changes state only when a request arrives, finishes its prefill or finishes decoding,
and between two such events everything moves at constant rates:

* **prefill** (FIFO, head first, chunked): while prompt tokens are waiting, each pass
  carries the running batch's decode tokens plus ``max_num_batched_tokens − decoding``
  prompt tokens; the pass takes ``overhead + max(weight read + KV read, new tokens /
  prefill rate)`` (the roofline of :meth:`gtm.gpu_profiles.GpuProfile.forward_time_s`);
* **decode**: every running sequence emits one token per pass; with no prompt waiting a
  pass is :meth:`~gtm.gpu_profiles.GpuProfile.decode_step_s` of the batch;
* a global pass counter ``D`` advances by ``dt / pass time``; a sequence admitted to
  decoding at ``D₀`` with ``n`` tokens to go finishes when ``D = D₀ + n`` (a heap), and
  the batch's total context is ``Σ prompt + n·D − Σ D₀`` — O(1) per event;
* **KV cache**: admission (FCFS, ≤ ``max_num_seqs``) reserves blocks for the prompt and
  the whole output (no preemption: a conservative reading of vLLM's allocate-as-you-go,
  which preempts instead); the invariant ``used ≤ capacity`` holds by construction
  and is checked by the tests;
* **prefix cache**: an LRU of prefix-block hashes the size of the KV cache; a prompt's
  leading cached blocks skip prefill (at least one token is always computed).

``tests/unit/fleetsim/test_gpu.py`` checks TTFT and end-to-end times against the
pass-level engine on small cases (agreement within the tolerance stated there).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from gpusim.perfmodel import Degradation
from gtm.gpu_profiles import GpuProfile

#: Prompt tokens one prefix hash stands for by default (Mooncake's block).
PREFIX_BLOCK_TOKENS = 512
_EPS = 1e-9
#: While a GPU warms up its pass time falls with every pass; it is re-evaluated every
#: this many passes (at the step's midpoint), so a 64-pass warm-up costs 16 extra events.
WARMUP_STEP_PASSES = 4.0


@dataclass(slots=True, eq=False)
class Job:
    """One request on one GPU (mutable; owned by that GPU)."""

    index: int
    input_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] = ()
    arrived_at: float = 0.0
    remaining: float = 0.0
    blocks: int = 0
    cached_tokens: int = 0
    admitted_at: float = -1.0
    first_token_at: float = -1.0
    finished_at: float = -1.0
    d_start: float = 0.0
    #: The client gives up if the first token has not come by then (absolute sim s).
    deadline: float = math.inf


@dataclass(slots=True)
class GpuEvents:
    """What one event on a GPU produced."""

    first_tokens: list[Job] = field(default_factory=list)
    finished: list[Job] = field(default_factory=list)
    rejected: list[Job] = field(default_factory=list)
    #: Jobs whose client gave up before they were admitted (deadline passed).
    expired: list[Job] = field(default_factory=list)


class FastGpu:
    """One worker's batch, advanced analytically (see the module docstring)."""

    __slots__ = (
        "_admit_at",
        "_dec_heap",
        "_seq",
        "_warm_from",
        "_warm_next",
        "_warmup",
        "block_size",
        "busy_s",
        "cache",
        "cache_capacity",
        "capacity_blocks",
        "dec_count",
        "dec_input",
        "dec_start",
        "gpu_id",
        "hit_tokens",
        "max_used_blocks",
        "passes",
        "pending",
        "prefill",
        "prefix_block_tokens",
        "profile",
        "queried_tokens",
        "slowdown",
        "t",
        "used_blocks",
        "version",
        "waiting",
        "warm_factor",
    )

    def __init__(
        self, gpu_id: str, profile: GpuProfile, *, prefix_block_tokens: int = PREFIX_BLOCK_TOKENS
    ) -> None:
        self.gpu_id = gpu_id
        self.profile = profile
        self.block_size = profile.block_size
        self.capacity_blocks = profile.num_gpu_blocks
        self.prefix_block_tokens = prefix_block_tokens
        self.cache_capacity = max(
            1, profile.num_gpu_blocks * profile.block_size // prefix_block_tokens
        )
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.used_blocks = 0
        self.max_used_blocks = 0
        self.waiting: deque[Job] = deque()
        #: Prompt tokens still to prefill over every admitted request.
        self.pending = 0.0
        self.prefill: deque[Job] = deque()
        self._dec_heap: list[tuple[float, int, Job]] = []
        self._seq = 0
        self.dec_count = 0
        self.dec_input = 0.0
        self.dec_start = 0.0
        self.passes = 0.0
        self.t = 0.0
        self.busy_s = 0.0
        self.version = 0
        self.hit_tokens = 0
        self.queried_tokens = 0
        #: Every pass takes this many times longer (a degraded GPU: thermal throttling,
        #: a bad NVLink, a noisy neighbour); 1.0 is the profile's speed.
        self.slowdown = 1.0
        #: The emulator's warm-up (:class:`gpusim.perfmodel.Degradation`): the first
        #: passes after a model load run slower. 1.0 (warm) unless :meth:`start_warm_up`.
        self.warm_factor = 1.0
        self._warmup = Degradation()
        self._warm_from = self._warm_next = 0.0
        #: A request that arrives while a pass runs joins the batch at the next pass
        #: boundary (the engine schedules whole passes): this boundary, or −inf.
        self._admit_at = -math.inf

    # ------------------------------------------------------------------ state

    @property
    def running(self) -> int:
        return len(self.prefill) + self.dec_count

    def fits(self, job: Job) -> bool:
        return self._blocks_for(job) <= self.capacity_blocks

    def scrape(self) -> tuple[int, int, int]:
        """(running, waiting, KV blocks in use) as the worker's ``/metrics`` shows them
        (these change only at events, so no :meth:`advance` is needed first)."""
        return len(self.prefill) + self.dec_count, len(self.waiting), self.used_blocks

    def _blocks_for(self, job: Job) -> int:
        return math.ceil((job.input_tokens + job.output_tokens) / self.block_size)

    def _context(self) -> float:
        return self.dec_input + self.dec_count * self.passes - self.dec_start

    def _pass_time(self) -> tuple[float, float]:
        """(seconds per pass, prompt tokens prefilled per pass) in the current state."""
        # Runs several times per event: builtins min/max and helper calls are inlined
        # (same arithmetic, same association, so the same floats).
        prof = self.profile
        dec = self.dec_count
        context = self.dec_input + dec * self.passes - self.dec_start
        memory = prof.weight_read_s + context * prof.kv_read_s_per_token
        # Attention: each decoding sequence attends to its context; a prefill chunk's
        # tokens attend, on average, to half the prompt (causal) — the pairs term of
        # forward_time_s.
        pairs = context + dec
        if self.prefill:
            head = self.prefill[0]
            # The pass packs the queue's prompts FIFO up to the token budget (vLLM V1).
            chunk: float = prof.max_num_batched_tokens - dec
            if self.pending < chunk:
                chunk = self.pending
            if chunk < 1.0:
                chunk = 1.0
            pairs += chunk * (head.cached_tokens + head.input_tokens) / 2.0
            compute = (chunk + dec) / prof.prefill_tokens_per_s
            compute += pairs * prof.attention_s_per_pair
            slow = self.slowdown * self.warm_factor
            return (prof.step_overhead_s + (compute if compute > memory else memory)) * slow, chunk
        compute = dec / prof.prefill_tokens_per_s + pairs * prof.attention_s_per_pair
        step = prof.step_overhead_s + (compute if compute > memory else memory)
        return step * self.slowdown * self.warm_factor, 0.0

    def idle(self) -> bool:
        return not self.prefill and self.dec_count == 0

    # ------------------------------------------------------------------ time

    def advance(self, now: float) -> None:
        dt = now - self.t
        if dt <= 0.0:
            return
        self.t = now
        if not self.prefill and self.dec_count == 0:
            return
        self.busy_s += dt
        if self.warm_factor != 1.0:
            dt = self._advance_warming(dt)
            if dt <= 0.0:
                return
        tau, chunk = self._pass_time()
        self.passes += dt / tau
        if chunk:
            done = dt * chunk / tau
            self.prefill[0].remaining -= done
            left = self.pending - done
            self.pending = left if left > 0.0 else 0.0

    def start_warm_up(self, degradation: Degradation | None = None) -> None:
        """From now on the GPU runs the emulator's warm-up: the model was just loaded,
        the first ``warmup_passes`` passes are slower (as :class:`gpusim.engine.Engine`
        runs them on a worker that starts)."""
        self._warmup = degradation or Degradation()
        self._warm_from = self.passes
        self._warm_next = self.passes
        self._next_warm_step()
        self.version += 1

    def _next_warm_step(self) -> None:
        done = self.passes - self._warm_from
        if done >= self._warmup.warmup_passes - _EPS:
            self.warm_factor = 1.0
            return
        self._warm_next = self.passes + WARMUP_STEP_PASSES
        self.warm_factor = self._warmup.warmup_factor(int(done + WARMUP_STEP_PASSES / 2))

    def _advance_warming(self, dt: float) -> float:
        """Advance ``dt`` s of passes while warming up; the time left once warm."""
        while dt > 0.0 and self.warm_factor != 1.0:
            tau, chunk = self._pass_time()
            step = min(dt, max(0.0, self._warm_next - self.passes) * tau)
            self.passes += step / tau
            if chunk:
                done = step * chunk / tau
                self.prefill[0].remaining -= done
                self.pending = max(0.0, self.pending - done)
            dt -= step
            if self.passes >= self._warm_next - 1e-9:
                self.passes = max(self.passes, self._warm_next)
                self._next_warm_step()
        return dt

    def next_event_at(self) -> float | None:
        if not self.prefill and self.dec_count == 0:
            return None
        tau, chunk = self._pass_time()
        t = self.t
        best = math.inf
        # Once per event: min/max inlined (same values: ties keep the earlier one).
        if chunk:
            remaining = self.prefill[0].remaining
            best = t + (remaining if remaining > 0.0 else 0.0) * tau / chunk
        if self._dec_heap:
            ahead = self._dec_heap[0][0] - self.passes
            at = t + (ahead if ahead > 0.0 else 0.0) * tau
            if at < best:
                best = at
        if self.warm_factor != 1.0:  # the pass time changes there
            ahead = self._warm_next - self.passes
            at = t + (ahead if ahead > 0.0 else 0.0) * tau
            if at < best:
                best = at
        if self._admit_at > t and self.waiting and self._admit_at < best:
            best = self._admit_at
        return best

    # ------------------------------------------------------------------ events

    def add(self, job: Job, now: float) -> GpuEvents:
        """A request arrives at this GPU."""
        self.advance(now)
        job.arrived_at = now
        self.waiting.append(job)
        out = GpuEvents()
        if self.idle():
            self._admit(now, out)  # an idle engine starts a pass for it at once
        elif self._admit_at <= now:
            # Busy: it waits for the pass in progress to end, on average half a pass
            # (arrivals fall uniformly within passes; the pass time is constant until
            # the next event). Later arrivals before then join at the same boundary.
            self._admit_at = now + 0.5 * self._pass_time()[0]
            self.version += 1
        return out

    def on_event(self, now: float) -> GpuEvents:
        """The time :meth:`next_event_at` announced has come (or any later time)."""
        self.advance(now)
        out = GpuEvents()
        while self.prefill and self.prefill[0].remaining <= _EPS * max(
            1.0, self.prefill[0].input_tokens
        ):
            job = self.prefill.popleft()
            # The head's overshoot went to the next prompt in the same passes.
            if self.prefill:
                self.prefill[0].remaining += job.remaining
            job.remaining = 0.0
            job.first_token_at = now
            out.first_tokens.append(job)
            if job.output_tokens <= 1:
                self._finish(job, now, out)
            else:
                job.d_start = self.passes
                self.dec_count += 1
                self.dec_input += job.input_tokens
                self.dec_start += self.passes
                self._seq += 1
                heapq.heappush(
                    self._dec_heap, (self.passes + job.output_tokens - 1, self._seq, job)
                )
        heap = self._dec_heap
        while heap and heap[0][0] <= self.passes + 1e-6:
            job = heapq.heappop(heap)[2]
            self.dec_count -= 1
            self.dec_input -= job.input_tokens
            self.dec_start -= job.d_start
            self._finish(job, now, out)
        if self.dec_count == 0:
            # Keep the running sums exact (no float drift across an idle period).
            self.dec_input = self.dec_start = 0.0
        self._admit_at = -math.inf  # a pass boundary: whoever waits joins now
        self._admit(now, out)
        return out

    def expire(self, now: float) -> GpuEvents:
        """Drop jobs whose client gave up (deadline passed) before their first token:
        waiting ones, and admitted ones still in prefill (vLLM aborts them and frees
        their blocks)."""
        self.advance(now)
        out = GpuEvents()
        if any(job.deadline <= now for job in self.waiting):
            keep: deque[Job] = deque()
            for job in self.waiting:
                (out.expired if job.deadline <= now else keep).append(job)
            self.waiting = keep
        if any(job.deadline <= now for job in self.prefill):
            still: deque[Job] = deque()
            for job in self.prefill:
                if job.deadline <= now:
                    self.pending = max(0.0, self.pending - max(0.0, job.remaining))
                    self.used_blocks -= job.blocks
                    out.expired.append(job)
                else:
                    still.append(job)
            self.prefill = still
        if out.expired:
            self._admit(now, out)
        return out

    def crash(self, now: float) -> list[Job]:
        """The GPU dies: every job on it is lost; it stays empty (and idle) afterwards."""
        self.advance(now)
        lost = [*self.waiting, *self.prefill, *(entry[2] for entry in self._dec_heap)]
        self.waiting.clear()
        self.prefill.clear()
        self._dec_heap.clear()
        self.pending = 0.0
        self.dec_count = 0
        self.dec_input = self.dec_start = 0.0
        self.used_blocks = 0
        self.version += 1
        return lost

    def _finish(self, job: Job, now: float, out: GpuEvents) -> None:
        job.finished_at = now
        self.used_blocks -= job.blocks
        out.finished.append(job)

    def _admit(self, now: float, out: GpuEvents) -> None:
        limit = self.profile.max_num_seqs
        waiting = self.waiting
        while waiting and len(self.prefill) + self.dec_count < limit:
            job = waiting[0]
            need = math.ceil((job.input_tokens + job.output_tokens) / self.block_size)
            if need > self.capacity_blocks:
                waiting.popleft()
                out.rejected.append(job)
                continue
            if self.used_blocks + need > self.capacity_blocks:
                break
            waiting.popleft()
            job.blocks = need
            self.used_blocks += need
            if self.used_blocks > self.max_used_blocks:
                self.max_used_blocks = self.used_blocks
            job.cached_tokens = self._lookup(job)
            job.remaining = float(job.input_tokens - job.cached_tokens)
            self.pending += job.remaining
            job.admitted_at = now
            self.prefill.append(job)
        self.version += 1

    def _lookup(self, job: Job) -> int:
        """Leading cached prefix tokens of ``job`` (then its blocks become most recent)."""
        cache = self.cache
        matched = 0
        for h in job.prefix_hashes:
            if h not in cache:
                break
            matched += 1
        for h in job.prefix_hashes:
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
        while len(cache) > self.cache_capacity:
            cache.popitem(last=False)
        hit = min(matched * self.prefix_block_tokens, job.input_tokens - 1)
        self.queried_tokens += job.input_tokens
        self.hit_tokens += max(0, hit)
        return max(0, hit)
