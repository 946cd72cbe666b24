"""The emulator's pass-level engine behind the analytic GPU's interface.

:class:`PassGpu` runs :class:`gpusim.engine.Engine` — the scheduler the live emulated
workers run (chunked prefill under a token budget, preemption, 16-token KV blocks and
their prefix cache, warm-up) — one simulator event per forward pass, where
:class:`~fleetsim.gpu.FastGpu` jumps analytically between arrivals and completions.
It is far too slow for fleet-scale runs; it exists to measure how much the analytic
model alone moves the simulator's figures on a small scenario
(the "pass-level GPUs" column and ``--terms`` of ``bench/sim_fidelity.py``), with
everything else (routing, arrivals, summaries) unchanged. :func:`use_pass_level`
swaps it into a constructed :class:`~fleetsim.simulator.Simulator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetsim.gpu import PREFIX_BLOCK_TOKENS, GpuEvents, Job
from gpusim.engine import Engine, EngineConfig, EngineRequest, StepResult
from gpusim.perfmodel import Degradation
from gtm.gpu_profiles import GpuProfile

if TYPE_CHECKING:
    from fleetsim.simulator import Simulator


class PassGpu:
    """One worker as the emulator runs it, stepped pass by pass (duck-types FastGpu)."""

    def __init__(
        self,
        gpu_id: str,
        profile: GpuProfile,
        *,
        warm_up: bool = False,
        prefix_block_tokens: int = PREFIX_BLOCK_TOKENS,
    ) -> None:
        self.gpu_id = gpu_id
        self.profile = profile
        self.block_size = profile.block_size
        self.capacity_blocks = profile.num_gpu_blocks
        self.prefix_block_tokens = prefix_block_tokens
        self.cache_capacity = max(
            1, profile.num_gpu_blocks * profile.block_size // prefix_block_tokens
        )
        degradation = Degradation() if warm_up else Degradation(warmup_passes=0)
        self.engine = Engine(profile, EngineConfig(degradation=degradation))
        self.version = 0
        self.busy_s = 0.0
        self.t = 0.0
        self.slowdown = 1.0
        self.max_used_blocks = 0
        self._jobs: dict[str, Job] = {}
        self._pass: StepResult | None = None

    # ------------------------------------------------------------------ FastGpu's state

    @property
    def waiting(self) -> int:
        return self.engine.num_waiting

    @property
    def prefill(self) -> int:
        """Requests admitted but without a first token (truthiness is what callers use)."""
        return sum(1 for j in self._jobs.values() if j.admitted_at >= 0 and j.first_token_at < 0)

    @property
    def hit_tokens(self) -> int:
        return self.engine.pool.hit_tokens

    @property
    def queried_tokens(self) -> int:
        return self.engine.pool.query_tokens

    @property
    def used_blocks(self) -> int:
        return self.engine.pool.num_blocks - self.engine.pool.num_free

    def scrape(self) -> tuple[int, int, int]:
        """(running, waiting, KV blocks in use), as :meth:`FastGpu.scrape`."""
        return self.engine.num_running, self.engine.num_waiting, self.used_blocks

    def fits(self, job: Job) -> bool:
        return job.input_tokens + job.output_tokens <= self.profile.max_model_len

    def idle(self) -> bool:
        return self._pass is None and not self.engine.has_work

    # ------------------------------------------------------------------ time

    def advance(self, now: float) -> None:
        """Busy time up to ``now``: a pass in flight counts (passes end at events)."""
        if now <= self.t:
            return
        if self._pass is not None:
            self.busy_s += min(now, self._pass.end) - max(self.t, self._pass.start)
        self.t = now

    def next_event_at(self) -> float | None:
        return None if self._pass is None else self._pass.end

    # ------------------------------------------------------------------ events

    def add(self, job: Job, now: float) -> GpuEvents:
        self.advance(now)
        job.arrived_at = now
        out = GpuEvents()
        if not self.fits(job):
            out.rejected.append(job)
            return out
        self._jobs[str(job.index)] = job
        self.engine.add(
            EngineRequest(str(job.index), job.input_tokens, job.output_tokens, self._hashes(job)),
            now,
        )
        if self._pass is None:
            self._start(now)
        self.version += 1
        return out

    def on_event(self, now: float) -> GpuEvents:
        self.advance(now)
        out = GpuEvents()
        done = self._pass
        if done is None or done.end > now + 1e-12:
            self.version += 1
            return out
        self._pass = None
        for token in done.tokens:
            job = self._jobs[token.request_id]
            if token.position == 0:
                job.first_token_at = done.end
                out.first_tokens.append(job)
        for finished in done.finished:
            job = self._jobs.pop(finished.request_id)
            job.finished_at = done.end
            job.cached_tokens = finished.cached_tokens
            out.finished.append(job)
        self._start(now)
        self.version += 1
        return out

    def expire(self, now: float) -> GpuEvents:
        """Abort requests whose client gave up before their first token."""
        self.advance(now)
        out = GpuEvents()
        for key, job in list(self._jobs.items()):
            if job.deadline <= now and job.first_token_at < 0:
                self.engine.abort(key, now)
                del self._jobs[key]
                out.expired.append(job)
        if out.expired:
            self.version += 1
        return out

    def _start(self, now: float) -> None:
        step = self.engine.step(now)
        if step is None:
            return
        self._pass = step
        for seq_id in self.engine.running_ids():
            job = self._jobs[seq_id]
            if job.admitted_at < 0:
                job.admitted_at = step.start
        self.max_used_blocks = max(self.max_used_blocks, self.used_blocks)

    def _hashes(self, job: Job) -> tuple[int, ...]:
        """The 16-token block hashes of the prompt: each 512-token prefix block stands
        for its 32 sub-blocks (as the live prompt text shares them), full blocks only."""
        per = self.prefix_block_tokens // self.block_size
        full = job.input_tokens // self.prefix_block_tokens
        return tuple(h * per + k for h in job.prefix_hashes[:full] for k in range(per))


def use_pass_level(sim: Simulator, *, warm_up: bool = False) -> None:
    """Replace every analytic GPU of a constructed (not yet run) simulator by a
    :class:`PassGpu` of the same id and profile."""
    for pool in sim.pools.values():
        for gpu_id, gpu in list(pool.gpus.items()):
            pool.gpus[gpu_id] = PassGpu(gpu_id, gpu.profile, warm_up=warm_up)  # type: ignore[assignment]
    sim.gpu_list = [g for p in sim.pools.values() for g in p.gpus.values()]
    sim.gpu_pos = {id(g): i for i, g in enumerate(sim.gpu_list)}


__all__ = ["PassGpu", "use_pass_level"]
