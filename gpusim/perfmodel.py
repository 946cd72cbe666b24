"""Degradations of a worker's speed, and closed-form predictions from a profile.

The forward-pass cost itself is :meth:`gtm.gpu_profiles.GpuProfile.forward_time_s`;
this module says how much slower a pass runs on a worker that is throttling, still
warming up, or slowed by an injected fault, and predicts what a saturated worker
should deliver (the benchmark checks the emulator against that prediction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gtm.gpu_profiles import GpuProfile

#: Thermal throttling costs 20 % of throughput (issue 3; NVIDIA's clock-event reasons
#: "HW Thermal Slowdown" / "SW Thermal Slowdown" cut SM clocks by roughly that much).
THERMAL_THROTTLE_THROUGHPUT = 0.8

#: The first passes after a model load run slower: CUDA-graph capture for new batch
#: shapes, allocator growth, autotuning. The issue asks for 50–100 passes; we use 64,
#: starting 2× slower and recovering linearly (assumption).
WARMUP_PASSES = 64
WARMUP_INITIAL_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class Degradation:
    """How a worker's forward passes are slowed down (all factors multiply duration)."""

    thermal_throttle: bool = False
    #: Extra slowdown (an injected "slow" fault): 1.0 = normal, 2.0 = half speed.
    slowdown: float = 1.0
    warmup_passes: int = WARMUP_PASSES
    warmup_initial_factor: float = WARMUP_INITIAL_FACTOR

    def __post_init__(self) -> None:
        if not (self.slowdown >= 1.0 and math.isfinite(self.slowdown)):
            raise ValueError("slowdown must be a finite factor ≥ 1")
        if self.warmup_passes < 0 or self.warmup_initial_factor < 1.0:
            raise ValueError("warm-up needs passes ≥ 0 and an initial factor ≥ 1")

    def warmup_factor(self, pass_index: int) -> float:
        """Duration factor of pass ``pass_index`` (0-based) since the model was loaded."""
        if pass_index >= self.warmup_passes:
            return 1.0
        remaining = 1.0 - pass_index / self.warmup_passes
        return 1.0 + (self.warmup_initial_factor - 1.0) * remaining

    def factor(self, pass_index: int) -> float:
        throttle = 1.0 / THERMAL_THROTTLE_THROUGHPUT if self.thermal_throttle else 1.0
        return self.slowdown * throttle * self.warmup_factor(pass_index)


@dataclass(frozen=True, slots=True)
class SaturationPrediction:
    """Steady state of a worker kept full of identical requests."""

    batch: int
    step_s: float  # average forward-pass duration
    output_tokens_per_s: float
    requests_per_s: float


def predict_saturation(
    profile: GpuProfile, prompt_tokens: int, output_tokens: int, *, max_batch: int | None = None
) -> SaturationPrediction:
    """Output tokens/s of a worker whose batch stays full of (prompt, output) requests.

    In steady state every forward pass carries ``batch`` sequences; each sequence emits
    one token per pass, so a request lives ``output_tokens`` passes and on average
    ``batch / output_tokens`` requests start per pass, each bringing its uncached
    prompt as prefill tokens (assumes the prompt fits one chunk). Context averages
    ``prompt + output / 2``. Pass duration comes from the profile's roofline.
    """
    if output_tokens < 1 or prompt_tokens < 1:
        raise ValueError("prediction needs at least one prompt and one output token")
    per_seq_blocks = math.ceil((prompt_tokens + output_tokens) / profile.block_size)
    batch = min(
        profile.max_num_seqs if max_batch is None else max_batch,
        profile.num_gpu_blocks // per_seq_blocks,
    )
    batch = max(1, batch)
    starts = batch / output_tokens  # requests entering prefill per pass
    prefill = starts * prompt_tokens
    decoding = batch - starts
    context = batch * (prompt_tokens + output_tokens / 2)
    pairs = prefill * (prompt_tokens + 1) / 2 + context
    new_tokens = max(1, round(prefill + decoding))
    step = profile.forward_time_s(
        new_tokens=new_tokens, context_tokens=int(context), attention_pairs=int(pairs)
    )
    return SaturationPrediction(
        batch=batch,
        step_s=step,
        output_tokens_per_s=batch / step,
        requests_per_s=starts / step,
    )
