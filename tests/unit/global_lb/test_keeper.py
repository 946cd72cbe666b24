from __future__ import annotations

from pathlib import Path

import pytest

from global_lb.health import HealthTable
from global_lb.keeper import ViewKeeper, build_view, load_topology
from global_lb.metrics import GlobalMetrics
from gtm.errors import ConfigError
from gtm.metrics import new_registry
from tests.unit.global_lb.helpers import example_policy, health_table, snapshot, summary, topology


def test_view_merges_policy_topology_and_store_regions() -> None:
    regions = topology()
    stored = regions[0].model_copy(update={"name": "from the store"})
    v = build_view(example_policy(), snapshot(regions=[stored]), HealthTable(), topology=regions)
    assert [r.id for r in v.regions] == sorted(r.id for r in regions)
    assert v.by_id[stored.id].name == "from the store"
    assert v.by_id["eu-west"].endpoints == regions[3].endpoints


def test_jurisdictions_contain_regions_by_country_and_label() -> None:
    v = build_view(example_policy(), snapshot(), HealthTable())
    assert v.jurisdictions["eu"] == {"eu-west", "eu-central"}
    assert v.jurisdictions["us"] == {"us-east", "us-west"}
    assert v.jurisdictions["world"] == frozenset(v.by_id)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"down": ["eu-west"]}, "health check"),
        ({"summaries": [summary("eu-west", healthy=False)]}, "reports unhealthy"),
        ({"require": True}, "no region summary"),
    ],
)
def test_unhealthy_reasons(kwargs: dict[str, object], reason: str) -> None:
    v = build_view(
        example_policy(),
        snapshot(summaries=kwargs.get("summaries", ())),  # type: ignore[arg-type]
        health_table(kwargs.get("down", ())),  # type: ignore[arg-type]
        require_summaries=bool(kwargs.get("require", False)),
    )
    region = v.by_id["eu-west"]
    assert not region.available
    assert reason in region.health_reason
    assert region.location in v.by_id["us-east"].outages


def test_drains_and_fail_open() -> None:
    v = build_view(
        example_policy(), snapshot(drained=["us-east"]), health_table(["eu-west"], fail_open=True)
    )
    assert v.by_id["us-east"].drained
    assert not v.by_id["us-east"].available
    assert v.by_id["eu-west"].available  # fail-open ignores the checks


def test_keeper_rebuilds_only_when_a_source_moves() -> None:
    snap = [snapshot(1)]
    table = [HealthTable()]
    targets: list[dict[str, str]] = []
    keeper = ViewKeeper(
        policy=example_policy,
        snapshot=lambda: snap[0],
        health=lambda: table[0],
        metrics=GlobalMetrics(new_registry()),
        topology=topology(),
        on_regions=lambda t: targets.append(dict(t)),
    )
    assert keeper.refresh()
    assert not keeper.refresh()
    first = keeper.view
    assert targets
    assert targets[0]["eu-west"] == "http://127.0.1.4:8000"
    table[0] = health_table(["eu-west"], epoch=2)
    assert keeper.refresh()
    assert keeper.view is not None
    assert keeper.view is not first
    assert not keeper.view.by_id["eu-west"].available
    snap[0] = snapshot(2, drained=["us-east"])
    assert keeper.refresh()
    assert keeper.view is not None
    assert keeper.view.by_id["us-east"].drained
    assert len(targets) == 1  # endpoints did not change


def test_keeper_waits_for_a_policy() -> None:
    keeper = ViewKeeper(
        policy=lambda: None,
        snapshot=lambda: snapshot(),
        health=HealthTable,
        metrics=GlobalMetrics(new_registry()),
    )
    assert not keeper.refresh()
    assert keeper.view is None


def test_topology_file(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "regions:\n  - id: r1\n    location: {lat: 1, lon: 2}\n"
        "    jurisdiction: xx\n    country: DE\n"
        "    endpoints: [{url: 'http://127.0.1.1:80', address: 127.0.1.1}]\n"
    )
    (region,) = load_topology(path)
    assert region.endpoints[0].url == "http://127.0.1.1:80"
    path.write_text("regions: [{id: r1}]\n")
    with pytest.raises(ConfigError, match=r"regions\.0\.location"):
        load_topology(path)
