"""Online calibration of worker profiles (sans-io): counters in, prices out."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from prometheus_client import CollectorRegistry

from gtm.clock import FakeClock
from gtm.gpu_profiles import LLAMA_8B, GpuProfile, ProfileSource, get_profile, shipped
from zone_agent.accounting import Accounting
from zone_agent.calibration import (
    DRIFT_THRESHOLD,
    MIN_REQUESTS,
    MIN_SAMPLES,
    Calibrator,
    PrefillCounters,
    decode_window,
    prefill_counters,
    prior_profile,
)
from zone_agent.metrics import ZoneMetrics
from zone_agent.scrape import ModelMetrics, parse_metrics
from zone_agent.view import GpuState, ViewBuilder

from .helpers import Gpu, state

H100 = get_profile("H100", LLAMA_8B)
PROMPT = 1500


@dataclasses.dataclass
class FakeWorker:
    """Cumulative vLLM-style counters of a worker running ``truth``, one request at a time."""

    truth: GpuProfile
    requests: int = 0
    seconds: float = 0.0
    tokens: int = 0
    itl_count: int = 0
    itl_sum: float = 0.0

    def serve(self, n: int, *, prompt: int = PROMPT, slowdown: float = 1.0) -> None:
        self.requests += n
        self.tokens += n * prompt
        # ``slowdown`` stretches what the hardware does, not the fixed per-pass overhead
        # (prompts here fit one pass).
        fixed = self.truth.step_overhead_s
        self.seconds += n * ((self.truth.prefill_time_s(prompt) - fixed) * slowdown + fixed)
        self.itl_count += n * 16
        self.itl_sum += n * 16 * ((self.truth.decode_step_s(1, 0) - fixed) * slowdown + fixed)

    def metrics(self) -> ModelMetrics:
        return ModelMetrics(
            prefill_time_sum=self.seconds,
            prefill_time_count=self.requests,
            computed_tokens_sum=self.tokens,
            itl_sum=self.itl_sum,
            itl_count=self.itl_count,
            kv_usage=0.0,
        )


def _run(cal: Calibrator, fake: FakeWorker, gpu_type: str, scrapes: int, per_scrape: int) -> None:
    for i in range(scrapes):
        fake.serve(per_scrape)
        cal.observe("gpu-0", gpu_type, LLAMA_8B, fake.metrics(), float(i))


def test_counters_per_engine() -> None:
    vllm = ModelMetrics(
        prefill_time_sum=2.0,
        prefill_time_count=4,
        computed_tokens_sum=900,
        prompt_tokens_sum=1000,
        prefix_hits=50,
    )
    # Computed tokens win over prompt less hits.
    assert prefill_counters(vllm) == PrefillCounters(4, 2.0, 900)
    older = dataclasses.replace(vllm, computed_tokens_sum=None)
    assert prefill_counters(older).tokens == 950  # type: ignore[union-attr]
    sglang = ModelMetrics(
        ttft_sum=3.0, ttft_count=5, queue_time_sum=1.0, prompt_tokens_sum=800, cached_tokens=300
    )
    # TTFT less queue time; prompt less cached tokens.
    assert prefill_counters(sglang) == PrefillCounters(5, 2.0, 500)
    assert prefill_counters(ModelMetrics(running=1)) is None
    assert prefill_counters(ModelMetrics(prefill_time_sum=1.0, prefill_time_count=1)) is None


def test_an_unknown_pair_is_priced_by_a_logged_prior_then_by_its_measurements(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    with caplog.at_level(logging.WARNING, logger="zone_agent.calibration"):
        first = cal.priced("gpu-0", "X1", LLAMA_8B, 0.0)
        cal.priced("gpu-0", "X1", LLAMA_8B, 0.0)
    assert first.source is ProfileSource.PRIOR
    assert first.profile == prior_profile(shipped(), "X1", LLAMA_8B).profile
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # once, not per rebuild
    for part in ("'X1'", LLAMA_8B, "--profiles"):
        assert part in warnings[0]
    # One request per scrape: the baseline, then a sample every MIN_REQUESTS requests.
    cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), 0.0)
    bound = MIN_SAMPLES * MIN_REQUESTS
    for n in range(1, bound + 1):
        fake.serve(1)
        cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), float(n))
        priced = cal.priced("gpu-0", "X1", LLAMA_8B, float(n))
        assert (priced.source is ProfileSource.CALIBRATED) == (n == bound), n
    assert priced.profile.gpu_type == "X1"
    assert priced.profile.prefill_tokens_per_s == pytest.approx(H100.prefill_tokens_per_s, rel=0.05)
    # Decode calibrated too: a batch-1 step as an H100's, not the slow prior's.
    assert priced.profile.decode_step_s(1, 0) == pytest.approx(H100.decode_step_s(1, 0), rel=0.05)


def test_too_few_requests_never_calibrate() -> None:
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), 0.0)
    _run(cal, fake, "X1", scrapes=20, per_scrape=1)  # two samples and 4 requests
    fake.serve(3)  # the third sample is still one request short
    cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), 30.0)
    assert cal.priced("gpu-0", "X1", LLAMA_8B, 30.0).source is ProfileSource.PRIOR
    fake.serve(1)
    cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), 31.0)
    assert cal.priced("gpu-0", "X1", LLAMA_8B, 31.0).source is ProfileSource.CALIBRATED


def test_a_series_that_appears_counts_from_zero() -> None:
    """vLLM writes a labelled histogram at its first observation: before, it is absent."""
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    cal.observe("gpu-0", "X1", LLAMA_8B, ModelMetrics(running=0), 0.0)
    fake.serve(MIN_REQUESTS)
    cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), 1.0)
    _run(cal, fake, "X1", scrapes=MIN_SAMPLES - 1, per_scrape=MIN_REQUESTS)
    assert cal.priced("gpu-0", "X1", LLAMA_8B, 9.0).source is ProfileSource.CALIBRATED


def test_a_counter_reset_is_a_new_baseline_not_a_sample() -> None:
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), 0.0)
    _run(cal, fake, "X1", scrapes=2, per_scrape=MIN_REQUESTS)  # two samples
    restarted = FakeWorker(H100)  # the engine restarted: every counter back near zero
    restarted.serve(MIN_REQUESTS, slowdown=50.0)  # and whatever it counted is not a delta
    cal.observe("gpu-0", "X1", LLAMA_8B, restarted.metrics(), 3.0)
    assert cal.priced("gpu-0", "X1", LLAMA_8B, 3.0).source is ProfileSource.PRIOR
    _run(cal, restarted, "X1", scrapes=1, per_scrape=MIN_REQUESTS)  # deltas from the restart
    priced = cal.priced("gpu-0", "X1", LLAMA_8B, 4.0)
    assert priced.source is ProfileSource.CALIBRATED
    assert priced.profile.prefill_tokens_per_s == pytest.approx(H100.prefill_tokens_per_s, rel=0.05)


@pytest.mark.parametrize(
    ("slowdown", "calibrated"),
    [(1.0, False), (1.15, False), (1 / (1 - DRIFT_THRESHOLD) + 0.1, True), (0.6, True)],
)
def test_a_known_worker_is_repriced_only_beyond_the_drift_threshold(
    slowdown: float, calibrated: bool
) -> None:
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    cal.observe("gpu-0", "H100", LLAMA_8B, fake.metrics(), 0.0)
    for i in range(1, MIN_SAMPLES + 1):
        fake.serve(MIN_REQUESTS, slowdown=slowdown)
        cal.observe("gpu-0", "H100", LLAMA_8B, fake.metrics(), float(i))
    priced = cal.priced("gpu-0", "H100", LLAMA_8B, 10.0)
    if not calibrated:
        assert priced.source is ProfileSource.SHIPPED
        assert priced.profile is H100
        return
    assert priced.source is ProfileSource.CALIBRATED
    assert priced.profile.gpu_type == "H100"
    assert priced.profile.prefill_tokens_per_s == pytest.approx(
        H100.prefill_tokens_per_s / slowdown, rel=0.01
    )


def test_short_prompts_measure_bandwidth_and_are_not_prefill_samples() -> None:
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), 0.0)
    for i in range(1, 10):
        fake.serve(MIN_REQUESTS, prompt=100)  # under the L4 prior's crossover
        cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), float(i))
    assert cal.priced("gpu-0", "X1", LLAMA_8B, 10.0).source is ProfileSource.PRIOR


def test_a_known_worker_is_measured_only_when_quiet() -> None:
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    busy = dataclasses.replace(fake.metrics(), running=40, waiting=3)
    cal.observe("gpu-0", "H100", LLAMA_8B, busy, 0.0)
    for i in range(1, 10):
        fake.serve(MIN_REQUESTS, slowdown=2.0)  # shared passes: looks twice as slow
        metrics = dataclasses.replace(fake.metrics(), running=40, waiting=3)
        cal.observe("gpu-0", "H100", LLAMA_8B, metrics, float(i))
    assert cal.priced("gpu-0", "H100", LLAMA_8B, 10.0).source is ProfileSource.SHIPPED
    # A prior has nothing better: the same busy intervals calibrate it.
    for i in range(10):
        fake.serve(MIN_REQUESTS)
        metrics = dataclasses.replace(fake.metrics(), running=40, waiting=3)
        cal.observe("gpu-1", "X1", LLAMA_8B, metrics, float(i))
    assert cal.priced("gpu-1", "X1", LLAMA_8B, 10.0).source is ProfileSource.CALIBRATED


def test_a_slow_decode_alone_does_not_reprice_a_known_worker() -> None:
    """That is the health tracker's throughput regression, against the same profile."""
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    cal.observe("gpu-0", "H100", LLAMA_8B, fake.metrics(), 0.0)
    for i in range(1, 2 * MIN_SAMPLES):
        fake.serve(MIN_REQUESTS)
        fake.itl_sum += 16 * MIN_REQUESTS * H100.decode_step_s(1, 0)  # decode twice as slow
        cal.observe("gpu-0", "H100", LLAMA_8B, fake.metrics(), float(i))
    assert cal.factors("gpu-0", "H100", LLAMA_8B, 9.0)[1] < 0.6
    assert cal.priced("gpu-0", "H100", LLAMA_8B, 9.0).source is ProfileSource.SHIPPED


def test_contention_does_not_drag_the_estimate_down() -> None:
    """Requests that shared their passes look slow; the quantile keeps the clean ones."""
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    cal.observe("gpu-0", "H100", LLAMA_8B, fake.metrics(), 0.0)
    for i, slowdown in enumerate([1.0, 2.5, 1.0, 3.0, 1.0, 1.0, 2.0, 1.0], start=1):
        fake.serve(MIN_REQUESTS, slowdown=slowdown)
        cal.observe("gpu-0", "H100", LLAMA_8B, fake.metrics(), float(i))
    assert cal.priced("gpu-0", "H100", LLAMA_8B, 9.0).source is ProfileSource.SHIPPED
    assert cal.factors("gpu-0", "H100", LLAMA_8B, 9.0)[0] == pytest.approx(1.0)


def test_old_samples_are_forgotten_and_gone_workers_dropped() -> None:
    cal = Calibrator(shipped())
    fake = FakeWorker(H100)
    cal.observe("gpu-0", "X1", LLAMA_8B, fake.metrics(), 0.0)
    _run(cal, fake, "X1", scrapes=MIN_SAMPLES, per_scrape=MIN_REQUESTS)
    assert cal.priced("gpu-0", "X1", LLAMA_8B, 5.0).source is ProfileSource.CALIBRATED
    assert cal.priced("gpu-0", "X1", LLAMA_8B, 5_000.0).source is ProfileSource.PRIOR
    cal.forget({"gpu-1"})
    assert cal.factors("gpu-0", "X1", LLAMA_8B, 5.0) == (1.0, 1.0)


async def test_the_view_prices_by_calibration_and_the_gauge_says_where_from() -> None:
    clock = FakeClock()
    cal = Calibrator(shipped())
    builder = ViewBuilder("zone-a", "region-1", pricing=cal.priced)
    acc = Accounting()
    states: list[GpuState] = [state(Gpu("known"), acc), state(Gpu("new", gpu_type="X1"), acc)]
    view = builder.build(states, acc, clock.monotonic())
    registry = CollectorRegistry()
    ZoneMetrics(registry, lambda: view, clock)

    def source(gpu: str, src: str) -> float | None:
        labels = {"gpu": gpu, "model": LLAMA_8B, "source": src}
        return registry.get_sample_value("gtm_zone_profile_source", labels)

    assert source("known", "shipped") == 1.0
    assert source("new", "prior") == 1.0
    assert source("new", "calibrated") is None
    index = view.by_model[LLAMA_8B]
    assert (
        index.raw_rate[1] == prior_profile(shipped(), "X1", LLAMA_8B).profile.prefill_tokens_per_s
    )

    fake = FakeWorker(H100)
    cal.observe("new", "X1", LLAMA_8B, fake.metrics(), clock.monotonic())
    for _ in range(MIN_SAMPLES):
        fake.serve(MIN_REQUESTS)
        await clock.advance(1.0)
        cal.observe("new", "X1", LLAMA_8B, fake.metrics(), clock.monotonic())
    view = builder.build(states, acc, clock.monotonic())
    assert source("new", "calibrated") == 1.0
    assert source("new", "prior") is None
    rate = registry.get_sample_value(
        "gtm_zone_profile_prefill_tokens_per_second", {"gpu": "new", "model": LLAMA_8B}
    )
    assert rate == pytest.approx(H100.prefill_tokens_per_s, rel=0.05)
    assert view.by_model[LLAMA_8B].raw_rate[1] == rate


SGLANG_TEXT = """\
sglang:num_running_reqs{model_name="m"} 0
sglang:num_queue_reqs{model_name="m"} 0
sglang:token_usage{model_name="m"} 0
sglang:time_to_first_token_seconds_sum{model_name="m"} %(ttft)s
sglang:time_to_first_token_seconds_count{model_name="m"} %(n)s
sglang:queue_time_seconds_sum{model_name="m"} %(queue)s
sglang:queue_time_seconds_count{model_name="m"} %(n)s
sglang:prompt_tokens_total{model_name="m"} %(prompt)s
sglang:cached_tokens_total{model_name="m",cache_source="device"} %(cached)s
sglang:cached_tokens_total{model_name="m",cache_source="host"} 999999
"""


def test_sglang_exposition_calibrates_through_the_scraper() -> None:
    cal = Calibrator(shipped())
    per = H100.prefill_time_s(PROMPT)
    for i in range(MIN_SAMPLES + 1):
        n = i * MIN_REQUESTS
        text = SGLANG_TEXT % {
            "ttft": n * (per + 0.5),
            "queue": n * 0.5,
            "n": n,
            "prompt": n * (PROMPT + 100),
            "cached": n * 100,
        }
        metrics = parse_metrics(text, scraped_at=float(i)).models["m"]
        cal.observe("gpu-0", "X1", "m", metrics, float(i))
    priced = cal.priced("gpu-0", "X1", "m", 9.0)
    assert priced.source is ProfileSource.CALIBRATED
    # An unknown model too: the prior is the slowest generative profile, scaled by how
    # much faster this worker prefilled than that prior would have.
    prior = prior_profile(shipped(), "X1", "m").profile
    fixed = prior.step_overhead_s  # one pass each, on both
    factor = (prior.prefill_time_s(PROMPT) - fixed) / (per - fixed)
    assert priced.profile.prefill_tokens_per_s == pytest.approx(prior.prefill_tokens_per_s * factor)


def _decoding(
    itl_count: float,
    itl_sum: float,
    running: float,
    prefill: tuple[float | None, float | None, float | None] = (None, None, None),
) -> ModelMetrics:
    """Inter-token latencies, and optionally (prefill seconds, requests, prompt tokens)."""
    seconds, requests, tokens = prefill
    return ModelMetrics(
        running=running,
        kv_usage=0.0,
        itl_count=itl_count,
        itl_sum=itl_sum,
        prefill_time_sum=seconds,
        prefill_time_count=requests,
        prompt_tokens_sum=tokens,
    )


def test_a_decode_window_prices_the_prompts_prefilled_in_it() -> None:
    step = H100.decode_step_s(4, 0.0)
    last, now = _decoding(0, 0.0, 4), _decoding(40, 2.0, 4)
    quiet = decode_window(H100, last, now)
    assert quiet is not None
    assert (quiet.tokens, quiet.seconds, quiet.interference_s) == (40, 2.0, 0.0)
    assert quiet.expected_s == pytest.approx(40 * step)
    # Two 5,000-token prompts answered in the window, three sequences decoding: each
    # of those waited through both prompts' chunks.
    told = decode_window(
        H100, last, now, decoding=(3, 3), prefilled=PrefillCounters(2, 0.0, 10_000)
    )
    assert told is not None
    assert told.interference_s == pytest.approx(2 * H100.prefill_interference_s(5_000) * 3)
    assert told.expected_s == pytest.approx(quiet.expected_s + told.interference_s)
    # A caller's guess is bounded: at least one sequence decoded, at most the running.
    low = decode_window(H100, last, now, decoding=(-2, 0), prefilled=PrefillCounters(1, 0, 5e3))
    high = decode_window(H100, last, now, decoding=(9, 9), prefilled=PrefillCounters(1, 0, 5e3))
    assert low is not None
    assert high is not None
    assert low.interference_s == pytest.approx(H100.prefill_interference_s(5_000))
    assert high.interference_s == pytest.approx(4 * H100.prefill_interference_s(5_000))


def test_a_decode_window_does_not_price_the_engines_late_prefill_counters() -> None:
    """vLLM counts a prompt's prefill when the request finishes, windows after its
    passes: only prompts the caller saw answered are priced."""
    last = _decoding(0, 0.0, 3, prefill=(1.0, 1, 1e3))
    now = _decoding(30, 3.0, 3, prefill=(2.0, 2, 9e3))
    window = decode_window(H100, last, now)
    assert window is not None
    assert window.interference_s == 0.0
    assert window.expected_s == pytest.approx(30 * H100.decode_step_s(3, 0.0))
    told = decode_window(H100, last, now, prefilled=PrefillCounters(1, 0.0, 8_000))
    assert told is not None  # 3 running less the one prefilling
    assert told.interference_s == pytest.approx(H100.prefill_interference_s(8_000) * 2)


@pytest.mark.parametrize(
    ("last", "now"),
    [
        (ModelMetrics(), _decoding(10, 1.0, 1)),  # no inter-token histogram before
        (_decoding(10, 1.0, 1), _decoding(10, 1.0, 1)),  # nothing decoded
        (_decoding(10, 1.0, 1), _decoding(5, 0.5, 1)),  # the engine restarted
    ],
)
def test_no_decode_window_without_decoding(last: ModelMetrics, now: ModelMetrics) -> None:
    assert decode_window(H100, last, now) is None
