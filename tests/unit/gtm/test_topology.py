from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from gtm.errors import ConfigError
from gtm.gpu_profiles import BGE_LARGE, LLAMA_8B, LLAMA_70B
from gtm.topology import example_text, load_topology, on_private_block, parse_topology, resolve
from policies import load_examples


def test_example_has_six_regions_on_four_continents_two_zones_each() -> None:
    topology = load_topology()
    policies = load_examples()
    deployment = resolve(topology, policies.regions)
    assert [r.id for r in deployment.regions] == [
        "us-east", "us-west", "eu-west", "eu-central", "ap-northeast", "ap-southeast",
    ]  # fmt: skip
    assert all(len(r.zones) == 2 for r in deployment.regions)
    assert deployment.undeployed == ()
    assert {g.gpu_type for g in deployment.gpus} >= {"H100", "A100-80GB", "L4"}
    assert set(topology.served_models) == {LLAMA_8B, LLAMA_70B, BGE_LARGE}
    assert len(deployment.gpus) == 24


def test_regions_come_from_the_policies_with_the_topologys_address() -> None:
    deployment = resolve(load_topology(), load_examples().regions, regional_port=18080)
    eu_west = deployment.region("eu-west")
    assert eu_west.region.country == "IE"
    assert eu_west.region.jurisdiction == "eu"
    assert eu_west.url == "http://127.0.1.3:18080"
    assert str(eu_west.region.endpoints[0].address) == "127.0.1.3"
    assert [z.url for z in eu_west.zones] == ["http://127.0.1.3:8101", "http://127.0.1.3:8102"]
    record = eu_west.zones[0].record()
    assert record.region_id == "eu-west"
    assert record.endpoints[0].url == "http://127.0.1.3:8101"


def test_gpu_ids_are_unique_and_name_their_zone() -> None:
    deployment = resolve(load_topology(), load_examples().regions)
    ids = [g.id for g in deployment.gpus]
    assert len(set(ids)) == len(ids)
    assert all(g.id.startswith(g.zone + "-") for g in deployment.gpus)
    assert len({g.seed for g in deployment.gpus}) == len(ids)


def test_printed_example_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(example_text(), "utf-8")
    assert load_topology(path) == load_topology()


def test_a_subset_of_regions_leaves_the_rest_undeployed() -> None:
    data = yaml.safe_load(example_text())
    data["regions"] = data["regions"][:1]
    deployment = resolve(parse_topology(yaml.safe_dump(data)), load_examples().regions)
    assert [r.id for r in deployment.regions] == ["us-east"]
    assert "eu-west" in deployment.undeployed


def _with(change: dict[str, object], region: int = 0) -> str:
    data = yaml.safe_load(example_text())
    data["regions"][region].update(change)
    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a list", "a mapping"),
        ("regions: [", "not valid YAML"),
        (_with({"address": "127.0.1.2"}), "address '127.0.1.2' is listed twice"),
        (_with({"id": "us-west"}), "region 'us-west' is listed twice"),
        (
            _with({"zones": [{"id": "z-a", "gpus": [{"type": "TPU", "models": [LLAMA_8B]}]}]}),
            "TPU",
        ),
        (
            _with({"zones": [{"id": "z-a", "gpus": [{"type": "L4", "models": ["gpt-5"]}]}]}),
            "gpt-5",
        ),
        (_with({"zones": []}), "at least 1"),
        (_with({"bogus": 1}), "Extra inputs"),
    ],
)
def test_bad_topologies_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid topology|a mapping|YAML") as caught:
        parse_topology(text, "t.yaml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("t.yaml")


def test_models_list_catches_a_typo_in_one_gpu_line() -> None:
    data = yaml.safe_load(example_text())
    data["models"] = [LLAMA_8B, BGE_LARGE]
    with pytest.raises(ConfigError, match=r"Llama-3\.1-70B-Instruct, which 'models' does not list"):
        parse_topology(yaml.safe_dump(data))


def test_zone_port_must_not_be_the_regional_port() -> None:
    data = yaml.safe_load(example_text())
    data["zone_port_base"] = 8079
    with pytest.raises(ConfigError, match="regional LB port"):
        parse_topology(yaml.safe_dump(data))


def test_region_unknown_to_the_policies_is_refused() -> None:
    data = yaml.safe_load(example_text())
    data["regions"][0]["id"] = "mars-north"
    for zone in data["regions"][0]["zones"]:
        zone["id"] = "mars-" + zone["id"]
    with pytest.raises(ConfigError, match="mars-north, which the policies do not define"):
        resolve(parse_topology(yaml.safe_dump(data)), load_examples().regions)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the topology"):
        load_topology(tmp_path / "missing.yaml")


def test_a_topology_on_a_private_block_keeps_its_layout_and_moves_its_addresses() -> None:
    example = load_topology()
    moved = on_private_block(example, random.Random(7))
    again = on_private_block(example, random.Random(7))
    assert moved == again  # the rng decides, nothing else
    assert [r.id for r in moved.regions] == [r.id for r in example.regions]
    assert [r.zones for r in moved.regions] == [r.zones for r in example.regions]
    block = {str(r.address).rsplit(".", 1)[0] for r in moved.regions}
    assert len(block) == 1
    assert block != {str(example.regions[0].address).rsplit(".", 1)[0]}
    assert [str(r.address).rsplit(".", 1)[1] for r in moved.regions] == [
        str(i) for i in range(1, len(moved.regions) + 1)
    ]
    assert 20_000 <= moved.zone_port_base < 30_000
