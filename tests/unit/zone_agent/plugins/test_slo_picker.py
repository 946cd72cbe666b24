"""``slo-picker`` and the ``goodput`` profile: the default's choice while some GPU is on
time, the deepest queue within the cap when every GPU is late because of its queue, and
the fast path deciding as the plugins one by one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from gtm.errors import PluginError
from gtm.routing.registry import load_profile_spec
from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from tests.unit.zone_agent.test_fast_paths import zones
from zone_agent.accounting import Accounting
from zone_agent.batch import ZoneBatch
from zone_agent.health import HealthStatus
from zone_agent.plugins.slo_picker import LatePlacement, Params, SloPicker
from zone_agent.plugins.ttft_scorer import TtftScorer
from zone_agent.profiles import BUILTIN_PROFILES, build_zone_profile, builtin_profile


def loaded_zone(queued: dict[str, float], ramp: float = 1.0) -> tuple[Accounting, list[Gpu]]:
    """Three H100s with ``queued`` prompt tokens in flight on each (their own requests)."""
    acc = Accounting()
    gpus = [Gpu(g, health=HealthStatus(True, weight=ramp, ramp=ramp)) for g in ("a", "b", "c")]
    for gpu_id, tokens in queued.items():
        acc.start(gpu_id, prefill_tokens=tokens)
    return acc, gpus


def decide(
    profile: str, queued: dict[str, float], *, tokens: int = 1_000, ramp: float = 1.0
) -> str:
    acc, gpus = loaded_zone(queued, ramp)
    view = make_view(gpus, acc)
    decision = builtin_profile(profile).decide(make_request(tokens=tokens), view)
    return decision.gpu_id


def seconds_of_queue(seconds: float) -> float:
    """Prompt tokens an H100 takes about ``seconds`` to prefill (the cost model's rate)."""
    acc, gpus = loaded_zone({})
    b = batch(make_view(gpus, acc), make_request(tokens=1))
    return seconds * 1000.0 / float(b.index.ms_per_token[0])


def test_with_a_gpu_on_time_it_chooses_as_the_default() -> None:
    queued = {"a": seconds_of_queue(0.5), "b": seconds_of_queue(4), "c": seconds_of_queue(6)}
    assert decide("goodput", queued) == decide("default", queued) == "a"


def test_when_every_gpu_is_late_the_lateness_is_concentrated() -> None:
    queued = {"a": seconds_of_queue(3), "b": seconds_of_queue(6), "c": seconds_of_queue(20)}
    assert decide("default", queued) == "a"  # spreads: the shortest queue
    assert decide("goodput", queued) == "b"  # the deepest within the 10 s cap


def test_a_prompt_late_by_itself_gets_its_best_gpu() -> None:
    """A prompt that misses the SLO on an idle H100 is not made to wait for others."""
    queued = {"a": seconds_of_queue(3), "b": seconds_of_queue(6), "c": seconds_of_queue(7)}
    long_prompt = int(seconds_of_queue(2.5))
    assert decide("goodput", queued, tokens=long_prompt) == "a"


def test_slow_start_does_not_make_an_idle_zone_late() -> None:
    """A zone that just came up predicts 10× at ramp 0.1; taken out, it is on time."""
    queued = {"a": seconds_of_queue(0.3), "b": seconds_of_queue(0.6), "c": seconds_of_queue(0.9)}
    assert decide("goodput", queued, ramp=0.1) == decide("default", queued, ramp=0.1) == "a"


def test_a_cost_times_its_ramp_is_the_cost_without_slow_start() -> None:
    """The rule's reading of a prediction without slow start holds only while the whole
    TTFT cost (queue, own prefill, per-pass extra) scales as 1 / weight."""
    queued = {"a": 30_000.0, "b": 5_000.0, "c": 0.0}
    scorer = TtftScorer()
    request = make_request(tokens=9_000)
    views = []
    for ramp in (1.0, 0.25):
        acc, gpus = loaded_zone(queued, ramp)
        for gpu in gpus:
            gpu.running, gpu.kv_usage = 40.0, 0.3  # a running batch: per-pass extra
        views.append(batch(make_view(gpus, acc), request))
    steady, ramping = views
    assert (ramping.index.ramp == 0.25).all()
    for costs in (scorer.costs_ms, scorer.alone_costs_ms, scorer.own_costs_ms):
        assert costs(ramping) * ramping.index.ramp == pytest.approx(costs(steady), rel=1e-12)
    assert (scorer.costs_ms(ramping) > 3 * scorer.costs_ms(steady)).all()  # not a no-op


def goodput_spec(**parameters: object) -> dict[str, Any]:
    data = BUILTIN_PROFILES["goodput"].model_dump(mode="json", by_alias=True)
    for plugin in data["plugins"]:
        if plugin["type"] == "slo-picker":
            plugin["parameters"] = {**plugin.get("parameters", {}), **parameters}
    return data


def test_spread_turns_the_rule_off() -> None:
    queued = {"a": seconds_of_queue(3), "b": seconds_of_queue(6), "c": seconds_of_queue(20)}
    profile = build_zone_profile(load_profile_spec(goodput_spec(when_late="spread")))
    acc, gpus = loaded_zone(queued)
    assert profile.decide(make_request(), make_view(gpus, acc)).gpu_id == "a"


def test_a_cap_below_the_slo_is_refused_naming_both() -> None:
    with pytest.raises(PluginError, match=r"late_cap_ms .* ttft_slo_ms"):
        build_zone_profile(load_profile_spec(goodput_spec(late_cap_ms=1_000)))


def test_a_profile_without_a_cost_model_is_refused() -> None:
    data = goodput_spec()
    del data["profile"]["cost_model"]
    with pytest.raises(PluginError, match="reads the profile's cost model"):
        build_zone_profile(load_profile_spec(data))


def test_a_cost_model_that_does_not_predict_ttft_is_refused() -> None:
    picker = SloPicker(params=Params())
    with pytest.raises(PluginError, match="needs a cost model that predicts TTFT"):
        picker.bind_cost_model(object())
    picker.bind_cost_model(TtftScorer())
    assert picker.when_late is LatePlacement.CONCENTRATE


GOODPUT = builtin_profile("goodput")
REFERENCE = GOODPUT.without_fast_paths()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(zone=zones())
def test_the_fast_path_decides_as_the_plugins_one_by_one(
    zone: tuple[ZoneBatch, np.random.Generator],
) -> None:
    """Random zones, most of them loaded past the SLO: every GPU gets up to 150k more
    prompt tokens in flight (an H100 prefills some 10k a second)."""
    b, rng = zone
    for gpu_id in b.index.ids:
        b.view.accounting.start(gpu_id, prefill_tokens=float(rng.integers(0, 150_000)))
    assert GOODPUT.runner.fast_paths == ("fused-filters", "slo-blend-pick")
    fast = GOODPUT.decide(b.request, b.view)
    reference = REFERENCE.decide(b.request, b.view)
    assert fast.gpu_id == reference.gpu_id
