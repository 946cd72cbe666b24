from __future__ import annotations

import pytest

from zone_agent.health import HealthConfig, HealthTracker, Outcome

CFG = HealthConfig(
    rise=2,
    fall=3,
    consecutive_failures=3,
    base_ejection_s=10.0,
    max_ejection_s=100.0,
    max_ejected_fraction=0.5,
    slow_start_s=10.0,
    slow_start_min_weight=0.1,
)


def tracker(*ids: str, now: float = 0.0) -> HealthTracker:
    health = HealthTracker(CFG)
    health.sync(ids, now)
    for gid in ids:
        health.observe_check(gid, True, now)
    return health


def test_unchecked_gpu_is_not_eligible() -> None:
    health = HealthTracker(CFG)
    health.sync(["a"], 0.0)
    status = health.status("a", 0.0)
    assert not status.eligible
    assert status.reason == "not checked yet"


@pytest.mark.parametrize(
    ("checks", "up"),
    [
        ([True], True),
        ([False], False),
        ([True, False, False], True),  # fall = 3
        ([True, False, False, False], False),
        ([True, False, False, False, True], False),  # rise = 2
        ([True, False, False, False, True, True], True),
    ],
)
def test_rise_and_fall(checks: list[bool], up: bool) -> None:
    health = HealthTracker(CFG)
    for t, ok in enumerate(checks):
        health.observe_check("a", ok, float(t))
    assert health.status("a", 100.0).eligible is up


def test_consecutive_failures_eject_and_ejections_grow() -> None:
    health = tracker("a", "b", "c", "d")
    assert not health.record("a", Outcome.ERROR_5XX, 1.0)
    assert not health.record("a", Outcome.TIMEOUT, 1.0)
    assert health.record("a", Outcome.RESET, 1.0)
    assert not health.status("a", 5.0).eligible
    assert "ejected" in (health.status("a", 5.0).reason or "")
    # After base_ejection_s: half-open, one trial.
    status = health.status("a", 11.5)
    assert status.eligible
    assert status.half_open
    # A failing trial ejects again at once, for twice as long.
    assert health.record("a", Outcome.CONNECT, 12.0)
    assert health.ejected_until("a") == pytest.approx(32.0)
    assert health.next_expiry(12.0) == pytest.approx(32.0)


def test_missed_first_byte_deadlines_in_a_row_eject_sooner() -> None:
    """Two timeouts in a row eject (a black-holed GPU), before consecutive_failures."""
    health = tracker("a", "b", "c", "d")
    assert not health.record("a", Outcome.TIMEOUT, 1.0)
    assert health.record("a", Outcome.TIMEOUT, 1.5)
    assert not health.status("a", 2.0).eligible


def test_a_timeout_streak_is_broken_by_other_outcomes() -> None:
    health = tracker("a", "b", "c", "d")
    assert not health.record("a", Outcome.TIMEOUT, 1.0)
    assert not health.record("a", Outcome.SUCCESS, 1.1)
    assert not health.record("a", Outcome.TIMEOUT, 1.2)
    assert not health.record("b", Outcome.TIMEOUT, 1.3)
    assert not health.record("b", Outcome.ERROR_5XX, 1.4)  # streak of timeouts broken
    assert health.status("b", 1.5).eligible


def test_success_resets_the_streak_and_closes_half_open() -> None:
    health = tracker("a", "b")
    health.record("a", Outcome.ERROR_5XX, 1.0)
    health.record("a", Outcome.ERROR_5XX, 1.0)
    health.record("a", Outcome.SUCCESS, 1.0)
    assert not health.record("a", Outcome.ERROR_5XX, 1.0)
    for _ in range(2):
        health.record("a", Outcome.ERROR_5XX, 2.0)
    assert health.status("a", 12.5).half_open
    health.record("a", Outcome.SUCCESS, 13.0)
    assert not health.status("a", 13.0).half_open


def test_at_most_a_fraction_of_the_zone_is_ejected_but_always_one() -> None:
    health = tracker("a", "b", "c", "d")
    ejected = [any(health.record(g, Outcome.ERROR_5XX, 1.0) for _ in range(3)) for g in "abcd"]
    assert ejected == [True, True, False, False]  # 50 % of 4
    lone_cfg = HealthConfig(consecutive_failures=1, max_ejected_fraction=0.0)
    lone = HealthTracker(lone_cfg)
    lone.observe_check("x", True, 0.0)
    assert lone.record("x", Outcome.ERROR_5XX, 1.0)  # "at least one", as Envoy


def test_ejection_count_decays_after_quiet_time() -> None:
    health = tracker("a", "b")
    for t in (1.0, 20.0):
        for _ in range(3):
            health.record("a", Outcome.ERROR_5XX, t)
        health.status("a", t + 15.0)
    assert health.ejected_until("a") == pytest.approx(40.0)  # second ejection: 2 × 10 s
    health.status("a", 41.0)
    for _ in range(3):
        health.record("a", Outcome.ERROR_5XX, 500.0)
    assert health.ejected_until("a") == pytest.approx(510.0)  # decayed back to 1 × 10 s


def test_slow_start_ramps_linearly_from_the_minimum_weight() -> None:
    health = tracker("a")
    assert health.status("a", 0.0).weight == pytest.approx(0.1)
    assert health.status("a", 5.0).weight == pytest.approx(0.5)
    assert health.status("a", 20.0).weight == 1.0
    assert health.status("a", 5.0).ramp == pytest.approx(0.5)  # the weight is all ramp


def test_slow_start_restarts_after_coming_back_up() -> None:
    health = tracker("a")
    for t in (30.0, 31.0, 32.0):
        health.observe_check("a", False, t)
    health.observe_check("a", True, 40.0)
    health.observe_check("a", True, 41.0)
    assert health.status("a", 46.0).weight == pytest.approx(0.5)


def test_throughput_regression_is_measured_against_the_zone_median() -> None:
    health = tracker("a", "b", "c", now=-100.0)
    for _ in range(5):
        health.observe_decode("a", 0.010, 0.010, 100, 0.0)
        health.observe_decode("b", 0.0101, 0.010, 100, 0.0)
        health.observe_decode("c", 0.0125, 0.010, 100, 0.0)  # thermal throttle: 25 % slower
    slow = health.slowdowns(0.0)
    assert slow["c"] == pytest.approx(1.2376, rel=1e-3)
    throttled = health.status("c", 0.0, slow["c"])
    assert throttled.weight == pytest.approx(1 / slow["c"])
    assert throttled.ramp == 1.0  # a slower GPU, not a ramp: SLO predictions keep it
    normal = health.status("a", 0.0, slow["a"])
    assert normal.weight == 1.0


def test_too_few_tokens_in_too_little_time_do_not_count() -> None:
    health = tracker("a")
    few = CFG.regression_min_tokens - 1
    health.observe_decode("a", 0.001, 0.01, few, 0.0)  # 15 ms of decode: noise
    health.observe_decode("a", 1.0, 0.0, 100, 0.0)
    assert health.slowdowns(0.0) == {}


def test_a_few_slow_tokens_count() -> None:
    """A GPU 100x slower emits a handful of tokens per scrape: those are the ones to see."""
    health = tracker("a")
    health.observe_decode("a", 0.05, 0.01, 4, 0.0)  # 0.2 s of decode in 4 tokens
    assert health.slowdowns(0.0) == {"a": 1.0}  # measured (alone: its own median)


def solo_gpu_slows_down(factor: float) -> HealthTracker:
    """A GPU alone in its zone: 20 healthy windows, then ``factor`` times slower."""
    health = tracker("a")
    for t in range(20):
        health.observe_decode("a", 0.010, 0.010, 100, float(t))
    for t in range(20, 25):
        health.observe_decode("a", 0.010 * factor, 0.010, 100, float(t))
    return health


def test_a_gpu_alone_in_its_zone_is_measured_against_its_own_best() -> None:
    health = solo_gpu_slows_down(100.0)
    slow = health.slowdowns(24.0)["a"]
    assert slow > 50.0
    assert health.status("a", 24.0, slow).weight == pytest.approx(1 / slow)


def test_a_mild_drift_against_its_own_best_is_not_a_slowdown() -> None:
    """Its own history is a coarse reference (batch mix, host load): 2x is not enough."""
    health = solo_gpu_slows_down(2.0)
    assert health.slowdowns(24.0)["a"] == 1.0


def test_a_whole_zone_slowing_down_is_seen() -> None:
    health = tracker("a", "b")
    for t in range(10):
        for gid in ("a", "b"):
            health.observe_decode(gid, 0.010, 0.010, 100, float(t))
    for t in range(10, 15):
        for gid in ("a", "b"):
            health.observe_decode(gid, 0.200, 0.010, 100, float(t))
    slow = health.slowdowns(14.0)
    assert slow["a"] > 10.0
    assert slow["b"] > 10.0


def test_a_slow_estimate_without_traffic_decays_so_the_gpu_is_tried_again() -> None:
    health = solo_gpu_slows_down(100.0)
    last = 24.0
    assert health.slowdowns(last + CFG.regression_stale_s)["a"] > 50.0
    later = last + CFG.regression_stale_s + 10 * CFG.regression_recovery_s
    assert health.slowdowns(later)["a"] == 1.0
    # Measured again, still slow: seen at once.
    health.observe_decode("a", 1.0, 0.010, 100, later)
    assert health.slowdowns(later)["a"] > 20.0


def test_the_best_is_forgotten_after_its_window() -> None:
    health = solo_gpu_slows_down(100.0)
    late = 24.0 + CFG.regression_window_s + 1.0
    health.observe_decode("a", 1.0, 0.010, 100, late)
    assert health.slowdowns(late)["a"] == 1.0  # a new normal after the window


def test_sync_forgets_removed_gpus() -> None:
    health = tracker("a", "b")
    health.sync(["b"], 1.0)
    assert health.status("a", 1.0).reason == "not checked yet"


def test_a_recovered_gpu_is_taken_back_in_one_window() -> None:
    health = solo_gpu_slows_down(100.0)
    health.observe_decode("a", 0.010, 0.010, 100, 25.0)
    assert health.slowdowns(25.0)["a"] == 1.0


def test_windows_add_up_until_no_prompt_is_half_prefilled() -> None:
    """A sample cut while a prompt prefills holds its slow passes without their cause."""
    health = tracker("a")
    health.observe_decode("a", 0.010, 0.010, 100, 0.0)  # quiet: its best is 1.0
    health.observe_decode("a", 0.080, 0.010, 20, 1.0, settled=False)  # chunks, uncounted
    health.observe_decode("a", 0.080, 0.010, 20, 2.0, settled=False)
    assert health.slowdowns(2.0) == {"a": 1.0}  # not closed: nothing judged yet
    # The prompt's first token: its passes are priced; the whole span reads normal.
    health.observe_decode("a", 0.010, 0.150, 20, 2.5, settled=True)
    assert health.slowdowns(2.5) == {"a": 1.0}


def test_a_forced_sample_counts_only_when_grossly_slow() -> None:
    health = tracker("a")
    health.observe_decode("a", 0.010, 0.010, 100, 0.0)
    span = CFG.regression_span_s
    # Never settled, 5x slow: within what cut-off prompts do; no news, and no best.
    health.observe_decode("a", 0.050, 0.010, 100, 1.0, settled=False)
    health.observe_decode("a", 0.050, 0.010, 100, 1.0 + span, settled=False)
    assert health.slowdowns(1.0 + span) == {"a": 1.0}
    # A GPU failing grey under load (100x) is seen without a settled moment.
    health.observe_decode("a", 1.0, 0.010, 100, 2.0 + span, settled=False)
    health.observe_decode("a", 1.0, 0.010, 100, 2.0 + 2 * span, settled=False)
    assert health.slowdowns(2.0 + 2 * span)["a"] > CFG.regression_self_factor


def test_a_forced_sample_never_sets_the_best() -> None:
    """A forced sample read fast by error would make every later normal one look slow."""
    health = tracker("a")
    health.observe_decode("a", 0.010, 0.010, 100, 0.0)
    health.observe_decode("a", 0.001, 0.010, 100, CFG.regression_span_s, settled=False)
    health.observe_decode("a", 0.010, 0.010, 100, CFG.regression_span_s + 1)
    assert health.slowdowns(CFG.regression_span_s + 1) == {"a": 1.0}
