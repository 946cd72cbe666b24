"""What another client's waiting request weighs (zone_agent.prompt_sizes): the prompt
tokens a worker computed per request lately, from its counters' growth."""

from __future__ import annotations

import pytest

from zone_agent.calibration import PrefillCounters
from zone_agent.prompt_sizes import PromptSizes, tokens_per_request


def counters(requests: float, tokens: float) -> PrefillCounters:
    return PrefillCounters(requests, 0.0, tokens)


def test_the_first_scrape_is_a_baseline_and_growth_is_measured() -> None:
    sizes = PromptSizes()
    sizes.observe("a", "m", counters(100, 1_000_000), 0.0)  # whatever came before us
    assert sizes.of("a") == {}
    sizes.observe("a", "m", counters(110, 1_000_150), 1.0)
    assert sizes.of("a") == {"m": 15.0}
    sizes.observe("a", "m", counters(110, 1_000_150), 2.0)  # nothing prefilled: unchanged
    assert sizes.of("a") == {"m": 15.0}
    assert sizes.of("b") == {}


def test_older_growth_weighs_less_as_the_mix_changes() -> None:
    sizes = PromptSizes(half_life_s=10.0)
    sizes.observe("a", "m", counters(0, 0), 0.0)
    sizes.observe("a", "m", counters(10, 150), 0.0)  # 10 requests of 15 tokens
    sizes.observe("a", "m", counters(20, 20_150), 10.0)  # 10 of 2,000, a half-life later
    # (5 × 15 + 10 × 2,000) / (5 + 10)
    assert sizes.of("a")["m"] == pytest.approx((75 + 20_000) / 15)


def test_an_engine_restart_starts_a_new_baseline() -> None:
    sizes = PromptSizes()
    sizes.observe("a", "m", counters(50, 5_000), 0.0)
    sizes.observe("a", "m", counters(60, 6_000), 1.0)
    assert sizes.of("a") == {"m": 100.0}
    sizes.observe("a", "m", counters(2, 40), 1.0)  # counters went down: restarted
    assert sizes.of("a") == {"m": 100.0}
    sizes.observe("a", "m", counters(4, 80), 1.0)  # measured again from there
    assert sizes.of("a")["m"] == pytest.approx((1_000 + 40) / 12)


def test_a_series_absent_is_at_zero() -> None:
    # Before its first request an engine has no histogram series: its first requests
    # are measured, not taken as the baseline.
    sizes = PromptSizes()
    sizes.observe("a", "m", None, 0.0)
    sizes.observe("a", "m", counters(4, 200), 1.0)
    assert sizes.of("a") == {"m": 50.0}
    sizes.observe("a", "m", None, 2.0)  # gone again (a restart): a new baseline
    assert sizes.of("a") == {"m": 50.0}
    sizes.observe("a", "m", counters(1, 50), 2.0)
    assert sizes.of("a")["m"] == pytest.approx(50.0)


def test_a_worker_that_leaves_is_forgotten() -> None:
    sizes = PromptSizes()
    for gpu_id in ("a", "b"):
        sizes.observe(gpu_id, "m", counters(0, 0), 0.0)
        sizes.observe(gpu_id, "m", counters(1, 7), 1.0)
    sizes.forget({"b"})
    assert sizes.of("a") == {}
    assert sizes.of("b") == {"m": 7.0}


def test_a_model_falls_back_to_the_unlabelled_series_then_to_the_default() -> None:
    assert tokens_per_request({"m": 5.0, "": 7.0}, "m", 1024.0) == 5.0
    assert tokens_per_request({"": 7.0}, "m", 1024.0) == 7.0
    assert tokens_per_request({"n": 5.0}, "m", 1024.0) == 1024.0


def test_the_half_life_is_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        PromptSizes(half_life_s=0.0)
