"""Performance profiles of one worker (a GPU, or a tensor-parallel group) serving one model.

Every tier prices requests with these profiles (ARCHITECTURE §2: predicted TTFT =
queued uncached prefill tokens / prefill rate + ...), and the emulator and fleet
simulator (``fleetsim``) run their continuous-batching model on them, so the routers'
estimate and the emulated reality come from the same numbers.

How the figures are derived (a roofline model of one forward pass)
    Datasheet figures per GPU (:class:`GpuSpec`: HBM bandwidth, dense BF16 tensor
    TFLOPS, memory) and per model (:class:`ModelSpec`: parameters, layers, KV heads,
    head size, context) give, for a worker of ``tp`` GPUs:

    * weight read per pass  = weight bytes / (tp · bandwidth · η_mem)
    * KV read per context token = KV bytes per token / (tp · bandwidth · η_mem)
    * compute per new token = 2 · params FLOPs / (tp · peak FLOPS · MFU · η_tp)
    * attention compute per (query, key) pair = 4 · layers · heads · head_dim FLOPs, same rate
    * a forward pass takes ``overhead + max(memory time, compute time)``.

    Decode is bandwidth-bound (a batch-1 step ≈ weight bytes / bandwidth; each sequence
    adds its KV read), prefill is compute-bound (≈ 2 · params FLOPs per token / (MFU ·
    peak)); ``prefill_tokens_per_s`` is the marginal compute-bound rate.

Sanity check against the seeds (A100 ≈ 1.7× V100, H100 ≈ 2× A100): the seeds' ratios
are what the datasheets give for the resource that binds. Batch-1 decode is
bandwidth-bound, and A100-40GB/V100 = 1,555/900 = 1.73×; prefill is compute-bound, and
with the MFU assumptions below H100/A100 = 1.9×. Where the datasheets disagree with the
seeds we keep the datasheets and say so: A100/V100 prefill is 2.7× (312 vs 125 TFLOPS,
and V100 has no FlashAttention-2), H100/A100-80GB decode is 1.64× (3.35 vs 2.04 TB/s).
``tests/unit/gtm/test_gpu_profiles.py`` pins these ratios.

Models a single GPU cannot hold run as a tensor-parallel group: for
``meta-llama/Llama-3.1-70B-Instruct`` (141 GB of BF16 weights) a "GPU" in gtm is a
worker of :attr:`GpuProfile.tensor_parallel` GPUs (2×H200, 4×H100/A100-80GB/L40S,
8×A100-40GB/L4/V100), as vLLM runs it with ``--tensor-parallel-size``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from gtm.errors import GtmError

GIB = 1024**3
GB = 1e9

#: vLLM's KV-cache block size (``--block-size``, default 16 tokens on CUDA).
BLOCK_SIZE = 16

#: vLLM reserves this fraction of GPU memory for weights + activations + KV cache
#: (``--gpu-memory-utilization`` default 0.9, vLLM engine arguments docs).
GPU_MEMORY_UTILIZATION = 0.9

#: Peak activation / CUDA-graph memory vLLM's profiling run reserves per GPU before
#: sizing the KV cache. Assumption: 2 GiB (typical of the "model weights took X GiB;
#: non_torch memory ...; PyTorch activation peak memory ..." lines in vLLM's startup log
#: for 8B–70B models at the default batch sizes).
ACTIVATION_RESERVE_BYTES = 2 * GIB

#: Fixed per-forward-pass cost: scheduler, input preparation, sampling, kernel launches
#: that CUDA graphs do not hide. Assumption: 2 ms (vLLM V1 design blog, 2025-01-27,
#: reports CPU overheads of this order after its rework).
STEP_OVERHEAD_S = 0.002

#: Fraction of peak HBM/GDDR bandwidth that decode GEMV + paged-attention kernels reach.
#: Assumption: 0.8 (memory-bound kernels typically sustain 75–85 % of datasheet bandwidth).
MEMORY_EFFICIENCY = 0.8

#: Tensor-parallel scaling efficiency of compute (all-reduce after attention and MLP).
#: Assumption: 0.9 over NVLink, 0.75 over PCIe (L40S, L4 have no NVLink).
TP_EFFICIENCY_NVLINK = 0.9
TP_EFFICIENCY_PCIE = 0.75

#: Cold start = engine initialisation (CUDA context, profiling run, CUDA-graph capture,
#: torch.compile) + reading the weights. Assumptions: 20 s for generative models (vLLM
#: logs typically show 10–30 s of init/compile/capture), 5 s for small encoders, and
#: 2 GB/s of weight loading per GPU (local NVMe, safetensors).
ENGINE_INIT_S = 20.0
ENCODER_INIT_S = 5.0
WEIGHT_LOAD_BYTES_PER_S = 2 * GB


class ModelKind(StrEnum):
    GENERATE = "generate"  # decoder: prefill then token-by-token decode
    EMBED = "embed"  # encoder: one prefill pass, no decode, no prefix caching


class UnknownProfile(GtmError, KeyError):
    """No profile for this (GPU type, model) pair; the message lists what exists."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Datasheet figures of one GPU (SXM variants unless stated)."""

    name: str
    memory_bytes: float
    bandwidth_bytes_per_s: float
    bf16_flops: float  # dense (no 2:4 sparsity); FP16 for V100, which has no BF16
    nvlink: bool
    #: Model FLOPs utilisation reached in prefill. Assumptions inside the 30–60 % range
    #: usual for dense-transformer prefill: lower on Hopper, whose BF16 peak is the
    #: hardest to reach (the FlashAttention-3 paper, Shah et al. 2024, reports that
    #: FlashAttention-2 reaches only 35 % of H100 peak), 0.55 on A100; the H100 value is
    #: set so that H100 ≈ 2× A100 in prefill, as the seeds say.
    prefill_mfu: float
    #: vLLM's default ``max_num_seqs`` / ``max_num_batched_tokens`` for the OpenAI
    #: server: 1024 / 8192 on GPUs with ≥ 70 GiB that are not A100, else 256 / 2048
    #: (vllm/engine/arg_utils.py, ``get_batch_defaults``).
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture figures of one model (from its Hugging Face ``config.json``)."""

    name: str
    kind: ModelKind
    params: float
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    max_context: int
    bytes_per_param: int = 2  # BF16/FP16
    embedding_dim: int = 0  # for embedding models


# Sources: NVIDIA datasheets — H100 Tensor Core GPU (SXM5: 80 GB HBM3, 3.35 TB/s,
# BF16 1,979 TFLOPS with sparsity → 989 dense); H200 (141 GB HBM3e, 4.8 TB/s, 989 dense);
# A100 (80 GB HBM2e 2,039 GB/s; 40 GB HBM2 1,555 GB/s; BF16 312 TFLOPS dense); L40S
# (48 GB GDDR6, 864 GB/s, BF16 362 TFLOPS dense / 733 sparse, PCIe); L4 (24 GB GDDR6,
# 300 GB/s, BF16 121 TFLOPS dense / 242 sparse, PCIe); V100 SXM2 32 GB (900 GB/s,
# FP16 tensor 125 TFLOPS, no BF16).
GPUS: Mapping[str, GpuSpec] = MappingProxyType(
    {
        g.name: g
        for g in (
            GpuSpec("H100", 80 * GB, 3.35e12, 989e12, True, 0.33, 1024, 8192),
            GpuSpec("H200", 141 * GB, 4.8e12, 989e12, True, 0.33, 1024, 8192),
            GpuSpec("A100-80GB", 80 * GB, 2.039e12, 312e12, True, 0.55, 256, 2048),
            GpuSpec("A100-40GB", 40 * GB, 1.555e12, 312e12, True, 0.55, 256, 2048),
            GpuSpec("L40S", 48 * GB, 0.864e12, 362e12, False, 0.45, 256, 2048),
            GpuSpec("L4", 24 * GB, 0.300e12, 121e12, False, 0.45, 256, 2048),
            GpuSpec("V100", 32 * GB, 0.900e12, 125e12, True, 0.50, 256, 2048),
        )
    }
)

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
BGE_LARGE = "BAAI/bge-large-en-v1.5"

# Sources: the models' config.json on Hugging Face. Llama 3.1 8B: 8.03 B parameters,
# 32 layers, 32 heads, 8 KV heads (GQA), head_dim 128, 131,072-token context.
# Llama 3.1 70B: 70.6 B, 80 layers, 64 heads, 8 KV heads, head_dim 128, 131,072.
# bge-large-en-v1.5: 335 M (BERT-large), 24 layers, 16 heads × 64, 512 tokens, 1,024-d.
MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        m.name: m
        for m in (
            ModelSpec(LLAMA_8B, ModelKind.GENERATE, 8.03e9, 32, 32, 8, 128, 131_072),
            ModelSpec(LLAMA_70B, ModelKind.GENERATE, 70.6e9, 80, 64, 8, 128, 131_072),
            ModelSpec(BGE_LARGE, ModelKind.EMBED, 335e6, 24, 16, 16, 64, 512, embedding_dim=1024),
        )
    }
)

#: Encoders are small and run short sequences, so they use the GPU less well than a
#: decoder's prefill does. Assumption: half the GPU's prefill MFU.
ENCODER_MFU_FACTOR = 0.5

#: Tensor-parallel degree per (GPU, model): the smallest power of two whose memory
#: holds the BF16 weights with room for a useful KV cache (as commonly deployed).
_TP_70B: Mapping[str, int] = MappingProxyType(
    {"H200": 2, "H100": 4, "A100-80GB": 4, "L40S": 4, "A100-40GB": 8, "L4": 8, "V100": 8}
)


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """What one worker of ``tensor_parallel`` × ``gpu_type`` does with ``model``.

    Times are seconds, rates per second, sizes bytes. :meth:`forward_time_s` is the
    cost of one forward pass; the rest is derived from it.
    """

    gpu_type: str
    model: str
    kind: ModelKind
    tensor_parallel: int
    #: Marginal prefill throughput (compute-bound), tokens/s: the rate routers divide by.
    prefill_tokens_per_s: float
    #: Weight read per forward pass (the memory-bound floor of a decode step), s.
    weight_read_s: float
    #: KV read per context token attended to in a pass, s.
    kv_read_s_per_token: float
    #: Compute per (query token, key token) attention pair, s.
    attention_s_per_pair: float
    step_overhead_s: float
    kv_bytes_per_token: int
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    cold_start_s: float
    prefix_caching: bool
    embedding_dim: int = 0

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def forward_time_s(
        self, *, new_tokens: int, context_tokens: int, attention_pairs: int = 0
    ) -> float:
        """Duration of one forward pass.

        ``new_tokens``: tokens computed (prefill chunk tokens + one per decoding sequence);
        ``context_tokens``: KV-cache tokens read (each scheduled sequence's context);
        ``attention_pairs``: (query, key) pairs of attention over all new tokens.
        """
        if new_tokens <= 0:
            return 0.0
        memory = self.weight_read_s + context_tokens * self.kv_read_s_per_token
        compute = (
            new_tokens / self.prefill_tokens_per_s + attention_pairs * self.attention_s_per_pair
        )
        return self.step_overhead_s + max(memory, compute)

    def decode_step_s(self, batch: int, context_per_seq: float) -> float:
        """One decode step of ``batch`` sequences of ``context_per_seq`` tokens each."""
        ctx = int(batch * context_per_seq)
        return self.forward_time_s(
            new_tokens=batch, context_tokens=ctx, attention_pairs=ctx + batch
        )

    def decode_tokens_per_s(self, batch: int, context_per_seq: float) -> float:
        """Output tokens/s of a pure decode batch."""
        if batch <= 0:
            return 0.0
        return batch / self.decode_step_s(batch, context_per_seq)

    def prefill_time_s(self, tokens: int) -> float:
        """Time to prefill ``tokens`` alone, in chunks of ``max_num_batched_tokens``."""
        remaining, done, total = tokens, 0, 0.0
        while remaining > 0:
            chunk = min(remaining, self.max_num_batched_tokens)
            pairs = chunk * done + chunk * (chunk + 1) // 2
            total += self.forward_time_s(
                new_tokens=chunk, context_tokens=done, attention_pairs=pairs
            )
            done += chunk
            remaining -= chunk
        return total


def _derive(gpu: GpuSpec, model: ModelSpec, tp: int) -> GpuProfile:
    bandwidth = tp * gpu.bandwidth_bytes_per_s * MEMORY_EFFICIENCY
    tp_eff = 1.0 if tp == 1 else (TP_EFFICIENCY_NVLINK if gpu.nvlink else TP_EFFICIENCY_PCIE)
    mfu = gpu.prefill_mfu * (ENCODER_MFU_FACTOR if model.kind is ModelKind.EMBED else 1.0)
    flops = tp * gpu.bf16_flops * mfu * tp_eff
    weight_bytes = model.params * model.bytes_per_param
    kv_bytes_per_token = 2 * model.layers * model.kv_heads * model.head_dim * model.bytes_per_param
    usable = tp * (gpu.memory_bytes * GPU_MEMORY_UTILIZATION - ACTIVATION_RESERVE_BYTES)
    kv_bytes = usable - weight_bytes
    if kv_bytes <= 0:
        raise ValueError(f"{model.name} does not fit on {tp}×{gpu.name}")
    num_blocks = int(kv_bytes // (kv_bytes_per_token * BLOCK_SIZE))
    init = ENCODER_INIT_S if model.kind is ModelKind.EMBED else ENGINE_INIT_S
    batched = max(
        gpu.max_num_batched_tokens, model.max_context if model.kind is ModelKind.EMBED else 0
    )
    return GpuProfile(
        gpu_type=gpu.name,
        model=model.name,
        kind=model.kind,
        tensor_parallel=tp,
        prefill_tokens_per_s=flops / (2 * model.params),
        weight_read_s=weight_bytes / bandwidth,
        kv_read_s_per_token=kv_bytes_per_token / bandwidth,
        attention_s_per_pair=4 * model.layers * model.attention_heads * model.head_dim / flops,
        step_overhead_s=STEP_OVERHEAD_S,
        kv_bytes_per_token=kv_bytes_per_token,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=num_blocks,
        max_num_seqs=gpu.max_num_seqs,
        max_num_batched_tokens=batched,
        max_model_len=min(model.max_context, num_blocks * BLOCK_SIZE),
        cold_start_s=init + weight_bytes / (tp * WEIGHT_LOAD_BYTES_PER_S),
        prefix_caching=model.kind is ModelKind.GENERATE,
        embedding_dim=model.embedding_dim,
    )


def _tensor_parallel(gpu: str, model: str) -> int:
    return _TP_70B[gpu] if model == LLAMA_70B else 1


PROFILES: Mapping[tuple[str, str], GpuProfile] = MappingProxyType(
    {
        (g.name, m.name): _derive(g, m, _tensor_parallel(g.name, m.name))
        for g in GPUS.values()
        for m in MODELS.values()
    }
)

_GPU_BY_FOLDED_NAME: Mapping[str, str] = MappingProxyType({name.casefold(): name for name in GPUS})


def canonical_gpu_type(gpu_type: str) -> str:
    """The table's spelling of a GPU type (lookup is case-insensitive)."""
    name = _GPU_BY_FOLDED_NAME.get(gpu_type.strip().casefold())
    if name is None:
        raise UnknownProfile(f"unknown GPU type {gpu_type!r}; known: {', '.join(sorted(GPUS))}")
    return name


def get_profile(gpu_type: str, model: str) -> GpuProfile:
    """The profile of ``model`` on ``gpu_type``; :class:`UnknownProfile` if there is none."""
    gpu = canonical_gpu_type(gpu_type)
    profile = PROFILES.get((gpu, model))
    if profile is None:
        raise UnknownProfile(
            f"no profile for model {model!r} on {gpu}; known models: {', '.join(sorted(MODELS))}"
        )
    return profile


def gpu_types() -> tuple[str, ...]:
    return tuple(sorted(GPUS))


def model_names() -> tuple[str, ...]:
    return tuple(sorted(MODELS))


def saturated_tokens_per_s(profile: GpuProfile, prompt_tokens: int, output_tokens: int) -> float:
    """Total (prompt + output) tokens/s of a worker kept full of identical requests.

    Steady-state estimate for a full batch (``max_num_seqs`` sequences, or as many as
    the KV cache holds): every request costs its prefill plus ``output_tokens`` decode
    steps shared with the rest of the batch. Used to compare GPU types on one number.
    """
    if profile.kind is ModelKind.EMBED or output_tokens <= 0:
        return prompt_tokens / profile.prefill_time_s(prompt_tokens) if prompt_tokens else 0.0
    per_seq_blocks = math.ceil((prompt_tokens + output_tokens) / profile.block_size)
    batch = max(1, min(profile.max_num_seqs, profile.num_gpu_blocks // per_seq_blocks))
    step = profile.decode_step_s(batch, prompt_tokens + output_tokens / 2)
    per_request_s = profile.prefill_time_s(prompt_tokens) + output_tokens * step / batch
    return (prompt_tokens + output_tokens) / per_request_s
