from __future__ import annotations

import dataclasses

import pytest

from gtm.errors import GtmError
from gtm.gpu_profiles import (
    BGE_LARGE,
    GPUS,
    LLAMA_8B,
    LLAMA_70B,
    MIXTRAL_8X7B,
    MODELS,
    PROFILES,
    STEP_OVERHEAD_S,
    GpuProfile,
    ModelKind,
    UnknownProfile,
    canonical_gpu_type,
    derive_profile,
    get_profile,
    gpu_types,
    model_names,
    saturated_tokens_per_s,
    tensor_parallel_for,
)

REQUIRED_GPUS = {"H100", "H200", "A100-80GB", "A100-40GB", "L40S", "L4", "V100"}


def test_every_required_gpu_has_every_model() -> None:
    assert set(gpu_types()) >= REQUIRED_GPUS
    assert {LLAMA_8B, LLAMA_70B, BGE_LARGE} <= set(model_names())
    for gpu in REQUIRED_GPUS:
        for model in MODELS:
            profile = get_profile(gpu, model)
            assert profile.gpu_type == gpu
            assert profile.model == model
            assert profile.num_gpu_blocks > 0
            assert profile.prefill_tokens_per_s > 0
            assert profile.max_model_len <= profile.kv_capacity_tokens
    assert len(PROFILES) == len(GPUS) * len(MODELS)


def test_lookup_is_case_insensitive_and_unknown_pairs_fail_clearly() -> None:
    assert canonical_gpu_type(" h100 ") == "H100"
    assert get_profile("a100-80gb", LLAMA_8B) is PROFILES[("A100-80GB", LLAMA_8B)]
    with pytest.raises(UnknownProfile, match="unknown GPU type 'TPU-v5'; known: A100-40GB"):
        get_profile("TPU-v5", LLAMA_8B)
    with pytest.raises(UnknownProfile, match="no profile for model 'gpt-x' on H100") as info:
        get_profile("H100", "gpt-x")
    assert isinstance(info.value, GtmError)
    assert isinstance(info.value, KeyError)


def test_profiles_are_frozen() -> None:
    profile = get_profile("H100", LLAMA_8B)
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.num_gpu_blocks = 1  # type: ignore[misc]


def _ratio(a: GpuProfile, b: GpuProfile, attr: str) -> float:
    value: float = getattr(a, attr) / getattr(b, attr)
    return value


def test_seed_ratios_hold_where_the_datasheets_agree() -> None:
    h100, a100 = get_profile("H100", LLAMA_8B), get_profile("A100-80GB", LLAMA_8B)
    a100_40, v100 = get_profile("A100-40GB", LLAMA_8B), get_profile("V100", LLAMA_8B)
    # Seeds: H100 ≈ 2× A100 (prefill, compute-bound).
    assert _ratio(h100, a100, "prefill_tokens_per_s") == pytest.approx(2.0, rel=0.1)
    # Seeds: A100 ≈ 1.7× V100 (batch-1 decode, bandwidth-bound: 1555 / 900 GB/s).
    decode = v100.decode_step_s(1, 1024) / a100_40.decode_step_s(1, 1024)
    assert decode == pytest.approx(1.7, rel=0.1)
    # Where physics disagrees, the datasheets win: H100/A100-80GB decode ≈ 3.35/2.04.
    assert a100.weight_read_s / h100.weight_read_s == pytest.approx(3.35 / 2.039, rel=1e-6)
    # And the blended saturated throughput stays between the two resources' ratios.
    blended = saturated_tokens_per_s(h100, 1024, 256) / saturated_tokens_per_s(a100, 1024, 256)
    assert 1.6 <= blended <= 2.5


def test_llama_8b_kv_geometry_matches_its_config() -> None:
    profile = get_profile("H100", LLAMA_8B)
    # 2 (K and V) × 32 layers × 8 KV heads × 128 dims × 2 bytes = 128 KiB per token.
    assert profile.kv_bytes_per_token == 131_072
    assert profile.block_size == 16
    # (80 GB × 0.9 − 2 GiB − 16.06 GB of weights) / 2 MiB per block.
    assert 25_000 <= profile.num_gpu_blocks <= 26_500
    assert profile.tensor_parallel == 1
    assert profile.max_num_seqs == 1024
    assert profile.max_num_batched_tokens == 8192
    assert get_profile("A100-80GB", LLAMA_8B).max_num_seqs == 256


def test_70b_runs_on_tensor_parallel_groups_that_hold_it() -> None:
    weights = MODELS[LLAMA_70B].params * 2
    for gpu in REQUIRED_GPUS:
        profile = get_profile(gpu, LLAMA_70B)
        assert profile.tensor_parallel >= 2, gpu  # no single GPU holds 141 GB
        assert profile.tensor_parallel * GPUS[gpu].memory_bytes > weights
    assert get_profile("H200", LLAMA_70B).tensor_parallel == 2
    assert get_profile("L4", LLAMA_70B).tensor_parallel == 8


def test_embedding_profile_has_no_prefix_cache_and_a_short_context() -> None:
    profile = get_profile("L4", BGE_LARGE)
    assert profile.kind is ModelKind.EMBED
    assert not profile.prefix_caching
    assert profile.max_model_len == 512
    assert profile.embedding_dim == 1024
    assert profile.max_num_batched_tokens >= 512


def test_forward_time_is_a_roofline() -> None:
    profile = get_profile("A100-80GB", LLAMA_8B)
    assert profile.forward_time_s(new_tokens=0, context_tokens=0) == 0.0
    # Batch-1 decode is memory-bound: weights read + KV read + overhead.
    one = profile.forward_time_s(new_tokens=1, context_tokens=1000, attention_pairs=1001)
    assert one == pytest.approx(
        STEP_OVERHEAD_S + profile.weight_read_s + 1000 * profile.kv_read_s_per_token
    )
    # A big prefill chunk is compute-bound at the profile's prefill rate.
    chunk = profile.forward_time_s(new_tokens=2048, context_tokens=0)
    assert chunk == pytest.approx(STEP_OVERHEAD_S + 2048 / profile.prefill_tokens_per_s)
    # Larger batches take longer per pass but deliver more tokens per second.
    assert profile.decode_step_s(64, 500) > profile.decode_step_s(8, 500)
    assert profile.decode_tokens_per_s(64, 500) > profile.decode_tokens_per_s(8, 500)
    assert profile.decode_tokens_per_s(0, 500) == 0.0


def test_prefill_time_chunks_long_prompts() -> None:
    profile = get_profile("A100-80GB", LLAMA_8B)
    assert profile.prefill_time_s(0) == 0.0
    one_chunk = profile.prefill_time_s(profile.max_num_batched_tokens)
    two_chunks = profile.prefill_time_s(2 * profile.max_num_batched_tokens)
    assert two_chunks > 2 * one_chunk  # the second chunk attends to the first


def test_cold_start_grows_with_weights_per_gpu() -> None:
    assert get_profile("H100", LLAMA_70B).cold_start_s > get_profile("H100", LLAMA_8B).cold_start_s
    assert get_profile("H100", BGE_LARGE).cold_start_s < 10.0


def test_saturated_throughput_of_an_embedding_model_is_its_prefill_rate() -> None:
    profile = get_profile("H100", BGE_LARGE)
    rate = saturated_tokens_per_s(profile, 512, 0)
    assert 0 < rate <= profile.prefill_tokens_per_s
    assert saturated_tokens_per_s(profile, 0, 0) == 0.0


def test_the_tensor_parallel_rule_reproduces_the_deployed_70b_degrees() -> None:
    expected = {"H200": 2, "H100": 4, "A100-80GB": 4, "L40S": 4, "A100-40GB": 8, "L4": 8}
    expected["V100"] = 8
    for gpu, tp in expected.items():
        assert tensor_parallel_for(GPUS[gpu], MODELS[LLAMA_70B]) == tp, gpu
        assert tensor_parallel_for(GPUS[gpu], MODELS[LLAMA_8B]) == 1, gpu


def test_a_mixture_of_experts_computes_with_its_active_parameters() -> None:
    mixtral = get_profile("H100", MIXTRAL_8X7B)
    dense = derive_profile(GPUS["H100"], dataclasses.replace(MODELS[MIXTRAL_8X7B], active_params=0))
    # Prefill compute follows the 12.9 B active parameters, weight reads all 46.7 B.
    assert mixtral.prefill_tokens_per_s / dense.prefill_tokens_per_s == pytest.approx(46.7 / 12.9)
    assert mixtral.weight_read_s == dense.weight_read_s


def test_newer_gpus_rank_by_their_datasheets() -> None:
    b200, h100 = get_profile("B200", LLAMA_8B), get_profile("H100", LLAMA_8B)
    mi300x = get_profile("MI300X", LLAMA_8B)
    assert b200.prefill_tokens_per_s == pytest.approx(h100.prefill_tokens_per_s * 2250 / 989)
    assert h100.weight_read_s / b200.weight_read_s == pytest.approx(8.0 / 3.35)
    # MI300X: about an H100's achieved prefill (assumption), 5.3 TB/s decode.
    assert mi300x.prefill_tokens_per_s == pytest.approx(h100.prefill_tokens_per_s, rel=0.02)
    assert h100.weight_read_s / mi300x.weight_read_s == pytest.approx(5.3 / 3.35)


def test_prefill_interference_is_the_prompts_compute_beyond_a_decode_step() -> None:
    """What a prompt's chunks add to the passes they share with decoding sequences."""
    p = get_profile("H100", LLAMA_8B)
    assert p.prefill_interference_s(0) == 0.0
    # A short prompt rides in the memory-bound step: it adds (almost) nothing.
    assert p.prefill_interference_s(8) < 0.05 * p.decode_step_s(1, 0)
    # A long one adds its passes less what each costs a decode step anyway.
    n = 3 * p.max_num_batched_tokens
    shared = 3 * (p.step_overhead_s + p.weight_read_s)
    assert p.prefill_interference_s(n) == pytest.approx(p.prefill_time_s(n) - shared)
    assert p.prefill_interference_s(n) > 0.5 * p.prefill_time_s(n)
