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

Profiles are data (``gtm/data/profiles/*.yaml``, format in :mod:`gtm.profile_files`)
------------------------------------------------------------------------------------
The roofline above is how the *shipped* files were written (``python -m
gtm.profile_files --write gtm/data/profiles`` regenerates them; a test pins that the
files equal the derivation, and that the pairs of the former built-in table are
unchanged to the bit). At run time :func:`get_profile` reads the files, not the
derivation, so an operator's file (``gtm zone --profiles DIR``) is the same kind of
thing as a shipped one and overrides it. :class:`ProfileCatalog` is one immutable set
of profiles with where each came from (:class:`ProfileSource`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping
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


class ProfileSource(StrEnum):
    """Where the profile a worker is priced by comes from."""

    SHIPPED = "shipped"  # a file shipped with gtm (gtm/data/profiles)
    FILE = "file"  # an operator's file (--profiles)
    CALIBRATED = "calibrated"  # scaled to what the worker's own metrics measure
    PRIOR = "prior"  # unknown pair, not enough measurements yet: a conservative stand-in


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
    nvlink: bool  # an NVLink-class GPU-to-GPU link (NVLink, AMD Infinity Fabric)
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
    #: Parameters one token passes through (mixture-of-experts: the routed experts
    #: only); 0 means all of ``params`` (a dense model). Compute scales with these,
    #: weight reads with all of ``params`` (a batch touches every expert).
    active_params: float = 0.0

    @property
    def compute_params(self) -> float:
        return self.active_params or self.params


# Sources: NVIDIA datasheets — H100 Tensor Core GPU (SXM5: 80 GB HBM3, 3.35 TB/s,
# BF16 1,979 TFLOPS with sparsity → 989 dense); H200 (141 GB HBM3e, 4.8 TB/s, 989 dense);
# A100 (80 GB HBM2e 2,039 GB/s; 40 GB HBM2 1,555 GB/s; BF16 312 TFLOPS dense); L40S
# (48 GB GDDR6, 864 GB/s, BF16 362 TFLOPS dense / 733 sparse, PCIe); L4 (24 GB GDDR6,
# 300 GB/s, BF16 121 TFLOPS dense / 242 sparse, PCIe); V100 SXM2 32 GB (900 GB/s,
# FP16 tensor 125 TFLOPS, no BF16). HGX B200 (8 GPUs: 1,440 GB HBM3e, 64 TB/s, FP16/BF16
# 36 PFLOPS with sparsity → per GPU 180 GB, 8 TB/s, 2,250 TFLOPS dense). AMD Instinct
# MI300X datasheet (192 GB HBM3, 5.3 TB/s, BF16 1,307.4 TFLOPS dense, Infinity Fabric).
# Prefill MFU of the two newest is an assumption: B200 as Hopper (0.33; no public vLLM
# MFU figures yet); MI300X 0.25, so that its achieved BF16 rate is about an H100's, as
# public GEMM benchmarks of the two found despite MI300X's higher peak (SemiAnalysis,
# "MI300X vs H100 vs H200 Benchmark Part 1: Training", 2024-12).
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
            GpuSpec("B200", 180 * GB, 8.0e12, 2250e12, True, 0.33, 1024, 8192),
            GpuSpec("MI300X", 192 * GB, 5.3e12, 1307.4e12, True, 0.25, 1024, 8192),
        )
    }
)

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
BGE_LARGE = "BAAI/bge-large-en-v1.5"
QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
QWEN_72B = "Qwen/Qwen2.5-72B-Instruct"
MIXTRAL_8X7B = "mistralai/Mixtral-8x7B-Instruct-v0.1"
R1_DISTILL_LLAMA_8B = "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"
R1_DISTILL_QWEN_32B = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"

# Sources: the models' config.json on Hugging Face. Llama 3.1 8B: 8.03 B parameters,
# 32 layers, 32 heads, 8 KV heads (GQA), head_dim 128, 131,072-token context.
# Llama 3.1 70B: 70.6 B, 80 layers, 64 heads, 8 KV heads, head_dim 128, 131,072.
# bge-large-en-v1.5: 335 M (BERT-large), 24 layers, 16 heads × 64, 512 tokens, 1,024-d.
# Qwen2.5-7B: 7.62 B, 28 layers, 28 heads, 4 KV heads, head_dim 128, 32,768 (without
# YaRN). Qwen2.5-72B: 72.7 B, 80 layers, 64 heads, 8 KV heads, 128, 32,768.
# Mixtral-8x7B: 46.7 B of which 12.9 B active per token (2 of 8 experts; Mistral AI's
# announcement), 32 layers, 32 heads, 8 KV heads, 128, 32,768.
# DeepSeek-R1-Distill-Llama-8B is Llama-3.1-8B's architecture; R1-Distill-Qwen-32B is
# Qwen2.5-32B's (32.8 B, 64 layers, 40 heads, 8 KV heads, 128, 131,072).
# DeepSeek-V3/R1 themselves (671 B, FP8 weights, multi-head latent attention) are not
# shipped: the roofline models neither FP8 weights nor MLA's compressed KV cache, and a
# guessed profile would be priced as if measured. Supply a file, or let calibration do.
MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        m.name: m
        for m in (
            ModelSpec(LLAMA_8B, ModelKind.GENERATE, 8.03e9, 32, 32, 8, 128, 131_072),
            ModelSpec(LLAMA_70B, ModelKind.GENERATE, 70.6e9, 80, 64, 8, 128, 131_072),
            ModelSpec(BGE_LARGE, ModelKind.EMBED, 335e6, 24, 16, 16, 64, 512, embedding_dim=1024),
            ModelSpec(QWEN_7B, ModelKind.GENERATE, 7.62e9, 28, 28, 4, 128, 32_768),
            ModelSpec(QWEN_72B, ModelKind.GENERATE, 72.7e9, 80, 64, 8, 128, 32_768),
            ModelSpec(
                MIXTRAL_8X7B,
                ModelKind.GENERATE,
                46.7e9,
                32,
                32,
                8,
                128,
                32_768,
                active_params=12.9e9,
            ),
            ModelSpec(R1_DISTILL_LLAMA_8B, ModelKind.GENERATE, 8.03e9, 32, 32, 8, 128, 131_072),
            ModelSpec(R1_DISTILL_QWEN_32B, ModelKind.GENERATE, 32.8e9, 64, 40, 8, 128, 131_072),
        )
    }
)

#: Encoders are small and run short sequences, so they use the GPU less well than a
#: decoder's prefill does. Assumption: half the GPU's prefill MFU.
ENCODER_MFU_FACTOR = 0.5

#: Tensor-parallel degree per (GPU, model): the smallest power of two (up to
#: :data:`MAX_TENSOR_PARALLEL`) whose usable memory holds the BF16 weights with at least
#: this fraction left for the KV cache. The threshold is the one that reproduces the
#: degrees commonly deployed for Llama-3.1-70B (2×H200, 4×H100/A100-80GB/L40S,
#: 8×A100-40GB/L4/V100), which the former hand-written table held.
MIN_KV_FRACTION = 0.05
MAX_TENSOR_PARALLEL = 8


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

    def prefill_interference_s(self, tokens: int) -> float:
        """What prefilling ``tokens`` (one prompt's computed part) adds to the passes it
        shares with decoding sequences: its passes' time less what each of them costs a
        decode step anyway (the fixed overhead and the weight read). A short prompt rides
        along in the memory-bound step for free; a long one's chunks are compute."""
        if tokens <= 0:
            return 0.0
        passes = math.ceil(tokens / self.max_num_batched_tokens)
        shared = passes * (self.step_overhead_s + self.weight_read_s)
        return max(0.0, self.prefill_time_s(tokens) - shared)

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
        prefill_tokens_per_s=flops / (2 * model.compute_params),
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


def _usable_bytes(gpu: GpuSpec) -> float:
    return gpu.memory_bytes * GPU_MEMORY_UTILIZATION - ACTIVATION_RESERVE_BYTES


def tensor_parallel_for(gpu: GpuSpec, model: ModelSpec) -> int | None:
    """The degree a worker of ``gpu`` runs ``model`` at (None: not even 8 GPUs hold it)."""
    weight_bytes = model.params * model.bytes_per_param
    tp = 1
    while tp <= MAX_TENSOR_PARALLEL:
        usable = tp * _usable_bytes(gpu)
        if usable - weight_bytes >= MIN_KV_FRACTION * usable:
            return tp
        tp *= 2
    return None


def derive_profile(gpu: GpuSpec, model: ModelSpec, tp: int | None = None) -> GpuProfile:
    """The roofline profile of ``model`` on ``gpu`` (at ``tp``, default: the usual degree)."""
    degree = tp if tp is not None else tensor_parallel_for(gpu, model)
    if degree is None:
        raise ValueError(f"{model.name} does not fit on {MAX_TENSOR_PARALLEL}×{gpu.name}")
    return _derive(gpu, model, degree)


def roofline_profiles() -> Iterator[GpuProfile]:
    """Every (GPU, model) pair of :data:`GPUS` × :data:`MODELS` that fits: what the
    shipped files hold (``python -m gtm.profile_files --write`` writes them from this)."""
    for gpu in GPUS.values():
        for model in MODELS.values():
            tp = tensor_parallel_for(gpu, model)
            if tp is not None:
                yield _derive(gpu, model, tp)


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    """One profile and where it came from (``origin``: the file, for messages)."""

    profile: GpuProfile
    source: ProfileSource
    origin: str


def _key(gpu_type: str, model: str) -> tuple[str, str]:
    return gpu_type.strip().casefold(), model


class ProfileCatalog:
    """An immutable set of profiles by (GPU type, model); GPU types match case-insensitively.

    Build one from files with :func:`gtm.profile_files.load_catalog`; :func:`shipped`
    is the one gtm ships; :meth:`overlaid` puts an operator's files over it.
    """

    __slots__ = ("_entries", "_gpus", "_models")

    def __init__(self, entries: Iterable[ProfileEntry] = ()) -> None:
        table = {_key(e.profile.gpu_type, e.profile.model): e for e in entries}
        self._entries: Mapping[tuple[str, str], ProfileEntry] = MappingProxyType(table)
        self._gpus: Mapping[str, str] = MappingProxyType(
            {key[0]: e.profile.gpu_type for key, e in table.items()}
        )
        self._models = tuple(sorted({e.profile.model for e in table.values()}))

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[ProfileEntry]:
        return iter(self._entries.values())

    def overlaid(self, other: ProfileCatalog) -> ProfileCatalog:
        """This catalog with ``other``'s entries replacing (or adding to) its own."""
        return ProfileCatalog([*self._entries.values(), *other._entries.values()])

    def entry(self, gpu_type: str, model: str) -> ProfileEntry | None:
        return self._entries.get(_key(gpu_type, model))

    def canonical_gpu_type(self, gpu_type: str) -> str:
        name = self._gpus.get(gpu_type.strip().casefold())
        if name is None:
            known = ", ".join(self.gpu_types())
            raise UnknownProfile(f"unknown GPU type {gpu_type!r}; known: {known}")
        return name

    def get(self, gpu_type: str, model: str) -> GpuProfile:
        """The profile; :class:`UnknownProfile` (listing what exists) if there is none."""
        found = self._entries.get(_key(gpu_type, model))
        if found is not None:
            return found.profile
        gpu = self.canonical_gpu_type(gpu_type)
        raise UnknownProfile(
            f"no profile for model {model!r} on {gpu}; known models: {', '.join(self._models)}"
        )

    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted(self._gpus.values()))

    def model_names(self) -> tuple[str, ...]:
        return self._models

    def profiles(self) -> Mapping[tuple[str, str], GpuProfile]:
        """Every profile by (GPU type as spelled, model)."""
        return MappingProxyType(
            {(e.profile.gpu_type, e.profile.model): e.profile for e in self._entries.values()}
        )


@functools.cache
def shipped() -> ProfileCatalog:
    """The profiles shipped with gtm (``gtm/data/profiles``), read once."""
    from gtm.profile_files import load_catalog, shipped_dir  # the file format needs us

    return load_catalog([shipped_dir()], source=ProfileSource.SHIPPED)


def canonical_gpu_type(gpu_type: str) -> str:
    """The shipped files' spelling of a GPU type (lookup is case-insensitive)."""
    return shipped().canonical_gpu_type(gpu_type)


def get_profile(gpu_type: str, model: str) -> GpuProfile:
    """The shipped profile of ``model`` on ``gpu_type``; :class:`UnknownProfile` if none."""
    return shipped().get(gpu_type, model)


def gpu_types() -> tuple[str, ...]:
    return shipped().gpu_types()


def model_names() -> tuple[str, ...]:
    return shipped().model_names()


def __getattr__(name: str) -> Mapping[tuple[str, str], GpuProfile]:
    # ``PROFILES`` (the former built-in table) is the shipped files' content, read lazily
    # so that importing this module reads no file.
    if name == "PROFILES":
        return shipped().profiles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
