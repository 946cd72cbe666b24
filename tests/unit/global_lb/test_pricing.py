"""The global tier prices a region by the GPU that would take a request there (issue 22,
item 2): on an idle fleet of the example topology, a London client's long prompt goes to
the EU, whose fastest GPUs idle beside slower ones, not across the Atlantic to a region
whose *average* GPU is faster. Summaries without GPU classes still price as before."""

from __future__ import annotations

import ipaddress
import math

import pytest

from global_lb.geo import Location, LocationSource
from global_lb.router import GlobalRouter
from global_lb.view import model_terms
from gtm.gpu_profiles import get_profile
from gtm.models import (
    GeoPoint,
    GpuClassLoad,
    ModelLoad,
    RegionSummary,
    RouteRequest,
    merge_classes,
)
from gtm.topology import load_topology
from tests.unit.global_lb.helpers import MODEL, summary, view

LONDON = GeoPoint(lat=51.51, lon=-0.09)


def region_gpus(region_id: str) -> list[str]:
    """The GPU types serving MODEL in ``region_id`` of the example topology."""
    region = next(r for r in load_topology().regions if r.id == region_id)
    return [
        g.type for z in region.zones for g in z.gpus for _ in range(g.count) if MODEL in g.models
    ]


def idle_load(gpu_types: list[str], *, with_classes: bool = True, free: bool = True) -> ModelLoad:
    """What a region of idle GPUs of ``gpu_types`` publishes for MODEL."""
    profiles = [get_profile(t, MODEL) for t in gpu_types]
    classes = merge_classes(
        [
            (
                GpuClassLoad(
                    gpu_class=p.gpu_type,
                    healthy_gpus=1,
                    prefill_tokens_per_s=p.prefill_tokens_per_s,
                    free_gpus=1 if free else 0,
                ),
            )
            for p in profiles
        ]
    )
    return ModelLoad(
        model=MODEL,
        gpus=len(profiles),
        healthy_gpus=len(profiles),
        prefill_tokens_per_s=math.fsum(p.prefill_tokens_per_s for p in profiles),
        max_running_requests=sum(p.max_num_seqs for p in profiles),
        classes=classes if with_classes else (),
    )


def fleet(*, with_classes: bool = True) -> list[RegionSummary]:
    ids = ("ap-northeast", "ap-southeast", "eu-central", "eu-west", "us-east", "us-west")
    return [summary(rid, idle_load(region_gpus(rid), with_classes=with_classes)) for rid in ids]


def london() -> Location:
    return Location("GB", LONDON, ipaddress.ip_network("81.2.69.0/24"), LocationSource.DATABASE)


def ask(router: GlobalRouter, tokens: int, *, with_classes: bool = True) -> tuple[str, float]:
    request = RouteRequest(model=MODEL, input_tokens=tokens, tenant="demo-global")
    outcome = router.decide(request, view(summaries=fleet(with_classes=with_classes)), london())
    assert outcome.region is not None
    assert outcome.predicted_ttft_ms is not None
    return outcome.region, outcome.predicted_ttft_ms


def test_the_example_topology_mixes_gpu_classes_in_the_eu() -> None:
    # The premise of the issue: us-east's average GPU is faster than eu-west's, though
    # both have an H100.
    def average(types: list[str]) -> float:
        return sum(get_profile(t, MODEL).prefill_tokens_per_s for t in types) / len(types)

    assert "H100" in region_gpus("eu-west")
    assert "H100" in region_gpus("us-east")
    assert average(region_gpus("us-east")) > average(region_gpus("eu-west"))


@pytest.mark.parametrize("tokens", [0, 500, 3_000, 6_000, 12_000, 60_000])
def test_a_london_prompt_of_any_size_goes_to_the_idle_eu(router: GlobalRouter, tokens: int) -> None:
    region, predicted = ask(router, tokens)
    assert region == "eu-west"
    # Priced on eu-west's free H100: its RTT and the prompt at one H100's rate.
    h100 = get_profile("H100", MODEL).prefill_tokens_per_s
    assert predicted == pytest.approx(38.0 + 1000.0 * tokens / h100, abs=15.0)


def test_old_summaries_priced_by_the_average_send_a_long_prompt_across_the_atlantic(
    router: GlobalRouter,
) -> None:
    # What the global tier did before GPU classes (and still does for a summary without
    # them): it priced each region by its average GPU.
    assert ask(router, 500, with_classes=False)[0] == "eu-west"
    assert ask(router, 12_000, with_classes=False)[0] == "us-east"


def test_a_busy_region_is_priced_by_its_pooled_backlog_as_before() -> None:
    busy = idle_load(region_gpus("eu-west"), free=False).model_copy(
        update={"queued_prefill_tokens": 50_000}
    )
    old = busy.model_copy(update={"classes": ()})
    assert model_terms(busy, 1, 300) == model_terms(old, 1, 300)
    assert model_terms(busy).queue_ms == 1000.0 * 50_000 / busy.prefill_tokens_per_s


def test_requests_sent_since_the_summary_take_the_free_fast_gpus_first() -> None:
    idle = idle_load(region_gpus("eu-west"))
    per_token = [1000.0 / get_profile(t, MODEL).prefill_tokens_per_s for t in ("H100", "A100-80GB")]
    assert model_terms(idle).queue_ms == 0.0
    assert model_terms(idle).ms_per_token == pytest.approx(per_token[0])
    # The ledger's one unseen request took the H100: the free A100 is slower than the
    # region's average GPU, so one line for every prompt size is the pooled backlog.
    pooled = model_terms(idle, 1, 4_000)
    assert per_token[1] > pooled.ms_per_token == 1000.0 * 4 / idle.prefill_tokens_per_s
    assert pooled.queue_ms == 1000.0 * 4_000 / idle.prefill_tokens_per_s
    assert model_terms(idle, 4, 4_000)[:2] == pooled[:2]
