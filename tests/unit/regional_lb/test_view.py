from __future__ import annotations

import math
from types import MappingProxyType

import pytest

from gtm.clock import FakeClock
from gtm.models import (
    Drain,
    DrainTarget,
    Endpoint,
    GeoPoint,
    Region,
    RegionSummary,
    Zone,
    ZoneSummary,
)
from gtm.state.snapshot import FleetSnapshot
from regional_lb.plugins.ttft import predicted_ttft_ms
from regional_lb.rtt import INTRA_REGION_RTT_MS, LOCAL_ZONE_RTT_MS, RegionRtt
from regional_lb.view import (
    ViewBuilder,
    ViewSettings,
    ZoneAccounting,
    capacity_health,
    is_saturated,
    zone_candidates,
)
from tests.unit.regional_lb.helpers import MODEL, NOW, model_load, view, zone


def snapshot(**tables: dict[str, object]) -> FleetSnapshot:
    return FleetSnapshot(7, **{k: MappingProxyType(v) for k, v in tables.items()})  # type: ignore[arg-type]


def summary(zone_id: str, region: str = "r1", **load: object) -> ZoneSummary:
    return ZoneSummary(
        zone_id=zone_id,
        region_id=region,
        published_at=NOW,
        models=(model_load(**load),),  # type: ignore[arg-type]
        prefix_sketch=(1, 2),
    )


def test_builder_collects_zones_urls_drains_and_peers() -> None:
    snap = snapshot(
        zones={
            "a": Zone(id="a", region_id="r1", endpoints=(Endpoint(url="http://zone-a:1/"),)),
            "x": Zone(id="x", region_id="r2"),
        },
        zone_summaries={"a": summary("a"), "b": summary("b"), "y": summary("y", region="r2")},
        drains={"zone/b": Drain(target=DrainTarget.ZONE, id="b")},
        regions={
            "r1": Region(id="r1", location=GeoPoint(lat=0, lon=0), jurisdiction="x", country="US"),
            "r2": Region(
                id="r2",
                location=GeoPoint(lat=0, lon=10),
                jurisdiction="x",
                country="US",
                endpoints=(Endpoint(url="http://r2-record"),),
            ),
        },
        region_summaries={
            "r3": RegionSummary(
                region_id="r3", published_at=NOW, endpoints=(Endpoint(url="http://r3-lb"),)
            )
        },
    )
    settings = ViewSettings(local_zone="a", zone_urls=MappingProxyType({"b": "http://static-b"}))
    built = ViewBuilder("r1", rtt=RegionRtt({}), settings=settings).build(snap, None, now_wall=NOW)
    assert list(built.zones) == ["a", "b"]
    assert built.zones["a"].url == "http://zone-a:1"
    assert built.zones["a"].rtt_ms == LOCAL_ZONE_RTT_MS
    assert built.zones["a"].sketch == frozenset({1, 2})
    assert built.zones["b"].url == "http://static-b"
    assert built.zones["b"].drained
    assert built.zones["b"].rtt_ms == INTRA_REGION_RTT_MS
    assert set(built.peers) == {"r2", "r3"}
    assert built.peers["r2"].url == "http://r2-record"
    assert built.peers["r2"].rtt_ms == pytest.approx(26 + 0.0143 * 1111.95, rel=1e-3)
    assert built.peers["r3"].url == "http://r3-lb"
    assert built.snapshot_revision == 7


def test_a_vanished_zone_stays_as_lost_capacity_for_a_while() -> None:
    builder = ViewBuilder("r1", settings=ViewSettings(dark_zone_memory_s=60.0))
    builder.build(snapshot(zone_summaries={"a": summary("a", gpus=4)}), None, now_wall=NOW)
    dark = builder.build(snapshot(), None, now_wall=NOW + 30)
    assert dark.zones["a"].summary is None
    assert dark.zones["a"].last_summary is not None
    assert capacity_health(zone_candidates(dark, MODEL), MODEL) == (0, 4)
    gone = builder.build(snapshot(), None, now_wall=NOW + 61)
    assert gone.zones == {}


def test_accounting_counts_what_the_summary_cannot_know_yet() -> None:
    regional = view([zone("a")])
    accounting = ZoneAccounting()
    accounting.start("a", MODEL, 100)
    accounting.observe(regional.zones)  # the summary now includes that request
    accounting.start("a", MODEL, 200)
    assert accounting.unseen("a", MODEL) == (1, 200)
    accounting.observe(regional.zones)  # same summary: nothing changes
    assert accounting.unseen("a", MODEL) == (1, 200)
    accounting.finish("a", MODEL, 100)
    accounting.finish("a", MODEL, 200)
    assert accounting.unseen("a", MODEL) == (0, 0)
    assert accounting.total_in_flight() == 0
    accounting.finish("nowhere", MODEL, 5)  # unknown: ignored
    (candidate,) = zone_candidates(regional, MODEL, accounting)
    assert candidate.unseen_requests == 0


@pytest.mark.parametrize(
    ("load", "unseen", "full"),
    [
        (model_load(gpus=2, running=16, waiting=9), 0, False),  # 25 < 16 + 2 x 5 = 26
        (model_load(gpus=2, running=16, waiting=9), 1, True),
        (model_load(gpus=2, healthy=0), 0, True),
        (model_load(max_running=0), 0, True),
        (model_load(kv=(100, 21)), 0, False),
        (model_load(kv=(100, 20)), 0, True),  # 80 % of the KV cache in use
    ],
)
def test_saturation(load: object, unseen: int, full: bool) -> None:
    assert is_saturated(load, unseen, ViewSettings()) is full  # type: ignore[arg-type]


def test_candidates_and_predicted_ttft() -> None:
    regional = view(
        [
            zone("a", model_load(queued=2_000, rate=10_000.0, gpus=2)),
            zone("b", model_load(model="other")),
        ]
    )
    a, b = zone_candidates(regional, MODEL)
    assert a.healthy
    assert a.serves_model
    assert not a.saturated
    assert not b.serves_model
    assert b.saturated
    assert predicted_ttft_ms(a, 500) == pytest.approx(2.0 + 200.0 + 100.0)
    assert predicted_ttft_ms(b, 500) == math.inf
    assert a.utilisation() == 0.0
    assert b.utilisation() == 1.0
    assert a.kv_free_fraction() == 1.0


def test_an_empty_snapshot_has_no_zones(fake_clock: FakeClock) -> None:
    built = ViewBuilder("r1").build(FleetSnapshot(0), None, now_wall=fake_clock.wall())
    assert built.zones == {}
    assert built.policy_generation == 0
