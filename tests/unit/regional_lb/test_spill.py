from __future__ import annotations

import math

import pytest

from gtm.models import GpuClassLoad, ModelTtft
from regional_lb.plugins.ttft import prefill_ms
from regional_lb.spill import SpillLimiter, SpillSettings, peer_ttft_ms, spill_options, why_not
from tests.unit.regional_lb.helpers import NOW, model_load, peer, route_request, view

SETTINGS = SpillSettings()
ALLOWED = frozenset({"r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"})


@pytest.mark.parametrize(
    ("candidate", "reason"),
    [
        (peer("r2"), None),
        (peer("r10"), "not allowed by residency"),
        (peer("r1"), "already on the request's path"),
        (peer("r2", drained=True), "drained"),
        (peer("r2", url=None), "no regional LB endpoint"),
        (peer("r2", summary=False), "no region summary"),
        (peer("r2", healthy=False), "unhealthy"),
        (peer("r2", model_load(model="other")), "does not serve m"),
        (peer("r2", model_load(healthy=0)), "does not serve m"),
        (peer("r2", saturation=0.95), "saturated"),
        (peer("r2", saturated_models=("m",)), "saturated"),
        (peer("r2", spill_out_per_s=1.0), "spilling out itself"),
    ],
)
def test_why_a_peer_cannot_take_a_request(candidate: object, reason: str | None) -> None:
    found = why_not(
        candidate,  # type: ignore[arg-type]
        route_request(),
        allowed=ALLOWED | {"r1"},
        excluded=frozenset({"r1"}),
        now_wall=NOW,
        settings=SETTINGS,
    )
    assert found == reason


def test_a_stale_summary_is_not_trusted() -> None:
    found = why_not(
        peer("r2"),
        route_request(),
        allowed=ALLOWED,
        excluded=frozenset(),
        now_wall=NOW + 11,
        settings=SETTINGS,
    )
    assert found == "region summary is stale"


def test_peer_ttft_uses_the_published_queueing_time() -> None:
    summary = peer("r2", model_load(gpus=2, rate=10_000.0, queued=1_000)).summary
    assert summary is not None
    # queue 100 ms + 1000 tokens on one of two GPUs (5k tok/s) = 200 ms
    assert peer_ttft_ms(summary, route_request(tokens=1000)) == pytest.approx(300.0)
    published = summary.model_copy(update={"predicted_ttft": (ModelTtft(model="m", ttft_ms=7.0),)})
    assert peer_ttft_ms(published, route_request(tokens=1000)) == pytest.approx(207.0)
    none = peer("r3", model_load(model="x")).summary
    assert none is not None
    assert peer_ttft_ms(none, route_request()) == math.inf


def test_a_peer_is_priced_by_the_gpu_that_would_take_the_request() -> None:
    # One idle H100 beside three L4s: a spilled request starts at once on the H100, so
    # the peer costs what the regional cost (peer_terms) says, not its average GPU.
    fast = GpuClassLoad(
        gpu_class="H100", healthy_gpus=1, prefill_tokens_per_s=20_000.0, free_gpus=1
    )
    slow = GpuClassLoad(gpu_class="L4", healthy_gpus=3, prefill_tokens_per_s=15_000.0)
    load = model_load(gpus=4, rate=35_000.0).model_copy(update={"classes": (fast, slow)})
    candidate = peer("r2", load, rtt=10.0)
    assert candidate.summary is not None
    request = route_request(tokens=1000)
    on_h100 = prefill_ms(1000, 1, 20_000.0)
    assert peer_ttft_ms(candidate.summary, request) == pytest.approx(on_h100)
    assert on_h100 < prefill_ms(1000, 4, 35_000.0)  # the average GPU is slower
    (option,) = spill_options(
        view([], [candidate]), request, allowed=ALLOWED, hops=0, now_wall=NOW, settings=SETTINGS
    )
    assert option.ttft_ms == peer_ttft_ms(candidate.summary, request)


def test_options_are_ranked_by_rtt_plus_ttft_and_stop_at_the_hop_limit() -> None:
    regional = view(
        [],
        [
            peer("r2", model_load(queued=50_000), rtt=10.0),  # 5 s of queue
            peer("r3", rtt=150.0),
            peer("r4", rtt=80.0),
        ],
    )
    options = spill_options(
        regional, route_request(), allowed=ALLOWED, hops=0, now_wall=NOW, settings=SETTINGS
    )
    assert [o.region for o in options] == ["r4", "r3", "r2"]
    assert options[0].cost_ms == pytest.approx(80.0 + 200.0)
    assert (
        spill_options(
            regional, route_request(), allowed=ALLOWED, hops=2, now_wall=NOW, settings=SETTINGS
        )
        == ()
    )
    assert [
        o.region
        for o in spill_options(
            regional,
            route_request(),
            allowed=ALLOWED,
            spilled_from=("r4",),
            hops=1,
            now_wall=NOW,
            settings=SETTINGS,
        )
    ] == ["r3", "r2"]


def test_limiter_is_a_bucket_per_peer() -> None:
    limiter = SpillLimiter(SpillSettings(per_peer_rate=1.0, per_peer_burst=2.0))
    assert [limiter.allow("a", 0.0) for _ in range(3)] == [True, True, False]
    assert limiter.allow("b", 0.0)
    assert limiter.allow("a", 1.0)
