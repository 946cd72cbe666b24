from __future__ import annotations

from types import MappingProxyType

import pytest

from global_lb.metrics import GlobalMetrics
from gtm.metrics import new_registry
from gtm.models import (
    Drain,
    DrainTarget,
    GpuWorker,
    ModelLoad,
    ModelTtft,
    RegionSummary,
    ZoneSummary,
)
from gtm.state.snapshot import FleetSnapshot
from gtm.topology import Deployment, load_topology, resolve
from gtmctl.up.status import (
    FORWARDS,
    GLOBAL_REFUSALS,
    REGIONAL_REJECTIONS,
    SPILLS,
    CounterKey,
    CounterWindow,
    fleet_document,
    page_html,
    parse_counters,
    region_status,
)
from policies import load_examples
from regional_lb.metrics import RegionalMetrics

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"

GLOBAL_METRICS = """\
# HELP gtm_global_forward_attempts_total Forwarding attempts.
# TYPE gtm_global_forward_attempts_total counter
gtm_global_forward_attempts_total{region="eu-west",result="ok"} 10.0
gtm_global_forward_attempts_total{region="eu-west",result="connect-error"} 3.0
gtm_global_forward_attempts_total{region="us-east",result="http-429"} 2.0
# HELP gtm_global_refusals_total Refusals.
# TYPE gtm_global_refusals_total counter
gtm_global_refusals_total{channel="http",reason="residency"} 4.0
# HELP gtm_global_other Something else.
# TYPE gtm_global_other gauge
gtm_global_other 1.0
"""

REGIONAL_METRICS = """\
# TYPE gtm_regional_spills counter
gtm_regional_spills_total{peer="eu-central",reason="saturated"} 6.0
# TYPE gtm_regional_rejected counter
gtm_regional_rejected_total{reason="requests",tenant="demo-global"} 2.0
"""


def key(name: str, source: str, **labels: str) -> CounterKey:
    return (name, tuple(sorted({**labels, "source": source}.items())))


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    return resolve(load_topology(), load_examples().regions)


def test_parse_counters_keeps_only_the_counters_of_interest() -> None:
    counters = parse_counters(GLOBAL_METRICS, "global")
    assert counters[key(FORWARDS, "global", region="eu-west", result="ok")] == 10.0
    assert counters[key(GLOBAL_REFUSALS, "global", channel="http", reason="residency")] == 4.0
    assert len(counters) == 4
    regional = parse_counters(REGIONAL_METRICS, "regional:eu-west")
    assert regional[key(SPILLS, "regional:eu-west", peer="eu-central", reason="saturated")] == 6


def test_window_rates_and_recent_counts() -> None:
    k = key(FORWARDS, "global", region="eu-west", result="ok")
    window = CounterWindow(keep_s=60.0)
    assert window.rates() == {}
    window.add(0.0, {k: 0.0})
    window.add(5.0, {k: 10.0})
    window.add(10.0, {k: 40.0})
    assert window.rates(over_s=5.0) == {k: 6.0}  # (40 - 10) / 5
    assert window.rates(over_s=10.0) == {k: 4.0}
    span, recent = window.recent()
    assert (span, recent) == (10.0, {k: 40.0})


def test_window_survives_a_restarted_process() -> None:
    k = key(SPILLS, "regional:a", peer="b", reason="x")
    window = CounterWindow()
    window.add(0.0, {k: 50.0})
    window.add(1.0, {k: 3.0})  # the counter went down: the process restarted
    assert window.rates(over_s=1.0) == {k: 3.0}


def test_window_forgets_readings_older_than_it_keeps() -> None:
    window = CounterWindow(keep_s=10.0)
    for t in range(30):
        window.add(float(t), {})
    assert window.readings[0][0] >= 18.0
    assert len(window.readings) <= 12


def _summary(region: str, **changes: object) -> RegionSummary:
    base = RegionSummary(
        region_id=region, published_at=1.0, zones_total=2, zones_healthy=2, saturation=0.2
    )
    return base.model_copy(update=changes)


@pytest.mark.parametrize(
    ("summary", "drained", "expected"),
    [
        (None, False, "down"),
        (_summary("r"), True, "drained"),
        (_summary("r", healthy=False), False, "down"),
        (_summary("r", zones_healthy=0), False, "down"),
        (_summary("r", zones_healthy=1), False, "degraded"),
        (_summary("r", saturation=0.95), False, "saturated"),
        (_summary("r"), False, "healthy"),
    ],
)
def test_region_status(summary: RegionSummary | None, drained: bool, expected: str) -> None:
    drains = {"region/r": Drain(target=DrainTarget.REGION, id="r")} if drained else {}
    snapshot = FleetSnapshot(revision=3, drains=MappingProxyType(drains))
    assert region_status("r", summary, snapshot, zones=2) == expected


def test_fleet_document(deployment: Deployment) -> None:
    load = ModelLoad(
        model=LLAMA,
        gpus=2,
        healthy_gpus=2,
        prefill_tokens_per_s=10_000.0,
        queued_prefill_tokens=500,
        running_requests=3,
        waiting_requests=1,
        max_running_requests=12,
    )
    snapshot = FleetSnapshot(
        revision=42,
        zone_summaries=MappingProxyType(
            {
                "eu-west-a": ZoneSummary(
                    zone_id="eu-west-a", region_id="eu-west", published_at=1.0, models=(load,)
                )
            }
        ),
        region_summaries=MappingProxyType(
            {
                "eu-west": _summary(
                    "eu-west", predicted_ttft=(ModelTtft(model=LLAMA, ttft_ms=42.25),)
                )
            }
        ),
        gpus=MappingProxyType(
            {
                "eu-west-a-h100-1": GpuWorker(
                    id="eu-west-a-h100-1",
                    zone_id="eu-west-a",
                    region_id="eu-west",
                    url="http://127.0.1.3:1",
                    gpu_type="H100",
                    models=(LLAMA,),
                )
            }
        ),
        drains=MappingProxyType({"zone/eu-west-b": Drain(target=DrainTarget.ZONE, id="eu-west-b")}),
    )
    window = CounterWindow()
    window.add(0.0, {})
    window.add(
        5.0,
        parse_counters(GLOBAL_METRICS, "global")
        | parse_counters(REGIONAL_METRICS, "regional:eu-west"),
    )
    document = fleet_document(deployment, snapshot, window, now=123.0)
    assert document["revision"] == 42
    regions = {r["id"]: r for r in document["regions"]}
    eu_west = regions["eu-west"]
    assert eu_west["status"] == "healthy"
    assert eu_west["requests_per_s"] == 2.0  # 10 ok in 5 s; connect errors did not arrive
    assert regions["us-east"]["requests_per_s"] == 0.4  # an HTTP 429 reached the region
    assert regions["us-west"]["status"] == "down"  # no summary
    assert eu_west["predicted_ttft_ms"] == {LLAMA: 42.2}
    zone_a, zone_b = eu_west["zones"]
    assert zone_a["utilisation"] == 0.25
    assert zone_a["models"][0]["queue_delay_ms"] == 50.0
    assert zone_a["gpus"][0]["state"] == "ready"
    assert zone_a["gpus"][1]["state"] == "missing"  # not registered
    assert zone_b["drained"] is True
    assert document["flows"] == [{"from": "eu-west", "to": "eu-central", "per_s": 1.2}]
    assert document["refusals"]["by_reason"] == {
        "global/http: residency": 4.0,
        "regional: requests": 2.0,
    }
    assert document["totals"]["gpus"] == 24
    assert document["totals"]["gpus_ready"] == 1
    assert document["drains"] == ["zone/eu-west-b"]


def test_counter_names_match_what_the_tiers_register() -> None:
    # A rename in a tier would blank parts of the page silently: pin them here.
    # Each component has its own registry, as in gtm up (shared names such as
    # gtm_stream_breaks_total would collide on one).
    global_registry, regional_registry = new_registry(), new_registry()
    GlobalMetrics(global_registry)
    RegionalMetrics(regional_registry, lambda band: 0)
    families = {
        f.name
        for registry in (global_registry, regional_registry)
        for f in registry.collect()
        if f.type == "counter"
    }
    for name in (FORWARDS, GLOBAL_REFUSALS, SPILLS, REGIONAL_REJECTIONS):
        assert name.removesuffix("_total") in families


def test_page_inlines_the_world_map_and_needs_nothing_external() -> None:
    html = page_html()
    assert "{{WORLD_PATH}}" not in html
    assert 'class="land" d="M' in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "").replace(
        '"http://www.w3.org/2000/svg"', ""
    )
    assert "/api/v1/fleet" in html
