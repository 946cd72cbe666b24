from __future__ import annotations

import pytest

from gpusim.engine import Engine, EngineConfig, EngineRequest
from gpusim.perfmodel import THERMAL_THROTTLE_THROUGHPUT, Degradation, predict_saturation
from gtm.gpu_profiles import LLAMA_8B, get_profile


def test_degradation_factors_multiply() -> None:
    assert Degradation(warmup_passes=0).factor(0) == 1.0
    hot = Degradation(thermal_throttle=True, slowdown=2.0, warmup_passes=0)
    assert hot.factor(5) == pytest.approx(2.0 / THERMAL_THROTTLE_THROUGHPUT)
    warm = Degradation(warmup_passes=10, warmup_initial_factor=3.0)
    assert [warm.warmup_factor(i) for i in (0, 5, 10, 11)] == pytest.approx([3.0, 2.0, 1.0, 1.0])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"slowdown": 0.5},
        {"slowdown": float("inf")},
        {"warmup_passes": -1},
        {"warmup_initial_factor": 0.9},
    ],
)
def test_degradation_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="≥"):
        Degradation(**kwargs)  # type: ignore[arg-type]


def _simulate(gpu: str, prompt: int, output: int, concurrency: int) -> float:
    """Closed loop at virtual time: arrivals staggered one per pass, then steady state."""
    engine = Engine(
        get_profile(gpu, LLAMA_8B), EngineConfig(degradation=Degradation(warmup_passes=0))
    )
    now, started, tokens, window_start = 0.0, 0, 0, None
    while now < 40.0:
        if started < concurrency:
            engine.add(EngineRequest(f"r{started}", prompt, output), now)
            started += 1
        result = engine.step(now)
        assert result is not None
        now = result.end
        for _done in result.finished:
            engine.add(EngineRequest(f"r{started}", prompt, output), now)
            started += 1
        if now > 15.0:
            window_start = result.start if window_start is None else window_start
            tokens += len(result.tokens)
    assert window_start is not None
    return tokens / (now - window_start)


@pytest.mark.parametrize(("gpu", "prompt", "output"), [("A100-80GB", 512, 256), ("H100", 128, 256)])
def test_prediction_matches_the_engine_at_saturation(gpu: str, prompt: int, output: int) -> None:
    predicted = predict_saturation(get_profile(gpu, LLAMA_8B), prompt, output, max_batch=256)
    simulated = _simulate(gpu, prompt, output, 256)
    assert predicted.batch == 256
    assert simulated == pytest.approx(predicted.output_tokens_per_s, rel=0.03)
    assert predicted.requests_per_s == pytest.approx(predicted.output_tokens_per_s / output)


def test_prediction_is_kv_bound_when_the_cache_is_small() -> None:
    profile = get_profile("L4", LLAMA_8B)
    predicted = predict_saturation(profile, 2000, 1000)
    assert predicted.batch == profile.num_gpu_blocks // 188  # ceil(3000 / 16) blocks each
    with pytest.raises(ValueError, match="at least one"):
        predict_saturation(profile, 0, 10)
