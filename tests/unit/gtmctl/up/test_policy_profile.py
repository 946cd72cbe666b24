"""``gtm up --policy-profile NAME``: the simulator's policy of that name reaches every
daemon ``gtm up`` starts (in-process configurations and --processes command lines), the
baselines' regions are pooled under one zone agent, and an unknown name is one line
naming the known ones, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from fleetsim.policies import policy
from global_lb.profiles import NEAREST_PROFILE_NAME, REQUEST_PROFILE_NAME
from gtm.errors import ConfigError
from gtm.topology import load_topology
from gtmctl.up.cli import up
from gtmctl.up.config import HostPort, UpConfig
from gtmctl.up.fleet import Plan, make_plan
from gtmctl.up.inprocess import global_config, regional_settings, zone_config
from gtmctl.up.policy_profile import TierPolicy, live_policies, pooled, tier_policy
from gtmctl.up.processes import global_argv, regional_argv, zone_argv
from regional_lb.spill import NO_SPILL, SpillSettings

BASELINES = ("llm-d-blend", "sglang-cache-aware")


def plan_for(tmp_path: Path, name: str | None) -> Plan:
    return make_plan(UpConfig(run_dir=str(tmp_path), policy_profile=name))


def test_gtm_policies_keep_the_tiers_defaults_but_affinity() -> None:
    assert tier_policy(None) == TierPolicy()
    assert tier_policy("gtm") == TierPolicy(name="gtm")
    no_affinity = tier_policy("gtm-no-affinity")
    assert no_affinity == TierPolicy(name="gtm-no-affinity", affinity=False)
    assert not policy("gtm-no-affinity").affinity


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_run_nearest_region_no_spill_one_pool_their_balancer(name: str) -> None:
    tiers = tier_policy(name)
    assert tiers.global_profile == NEAREST_PROFILE_NAME
    assert (tiers.affinity, tiers.spill, tiers.region_pool) == (False, False, True)
    assert tiers.zone_profile == policy(name).zone_profile == name


def test_only_policies_with_a_live_form_are_offered() -> None:
    known = live_policies()
    assert {"gtm", "gtm-no-affinity", *BASELINES} <= set(known)
    # Region rules with no live counterpart, and the ledger ablation, are not.
    assert not {"gorgo", "skywalker", "geodns-least-connections", "gtm-no-ledger"} & set(known)


def test_an_unknown_name_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown policy profile 'gorgo'; known: gtm, "):
        tier_policy("gorgo")
    with pytest.raises(ValidationError, match="llm-d-blend"):
        UpConfig(policy_profile="nope")


def test_cli_refuses_an_unknown_name_in_one_line_exit_2() -> None:
    result = CliRunner().invoke(up, ["--policy-profile", "nope"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert any("unknown policy profile 'nope'" in line and "sglang-cache-aware" in line
               for line in lines)  # fmt: skip
    assert "Traceback" not in result.output


def test_cli_help_says_what_it_does() -> None:
    result = CliRunner().invoke(up, ["--help"])
    assert result.exit_code == 0
    assert "--policy-profile" in result.output


def test_defaults_add_nothing_to_the_daemons_command_lines(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, None)
    dns = http = HostPort("127.0.0.1", 1)
    zone, region = plan.deployment.zones[0], plan.deployment.regions[0]
    argv = [
        *global_argv(plan, "etcd://x:1", dns, http),
        *regional_argv(region, "etcd://x:1", tmp_path, plan=plan),
        *zone_argv(zone, "etcd://x:1", 0.25, plan.config.tiers),
    ]
    assert "--no-affinity" not in argv
    assert "--no-spill" not in argv
    assert "--profile" not in argv


def test_no_affinity_reaches_every_daemon(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "gtm-no-affinity")
    zone, region = plan.deployment.zones[0], plan.deployment.regions[0]
    # In one process ...
    assert not global_config(plan, http_listen=None).front_door.affinity
    assert not regional_settings(plan, region, region.url).affinity
    assert not zone_config(plan, zone).affinity
    assert zone_config(plan, zone).profile == "default"
    # ... and as processes.
    dns = http = HostPort("127.0.0.1", 1)
    assert "--no-affinity" in global_argv(plan, "etcd://x:1", dns, http)
    assert "--no-affinity" in regional_argv(region, "etcd://x:1", tmp_path, plan=plan)
    assert "--no-affinity" in zone_argv(zone, "etcd://x:1", 0.25, plan.config.tiers)
    assert "--profile" not in global_argv(plan, "etcd://x:1", dns, http)


def test_a_baseline_reaches_every_daemon(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "llm-d-blend")
    zone, region = plan.deployment.zones[0], plan.deployment.regions[0]
    front = global_config(plan, http_listen=None)
    assert front.profile == NEAREST_PROFILE_NAME
    assert not front.front_door.affinity
    settings = regional_settings(plan, region, region.url)
    assert settings.router.spill == NO_SPILL
    assert not settings.affinity
    assert zone_config(plan, zone).profile == "llm-d-blend"
    dns = http = HostPort("127.0.0.1", 1)
    g = global_argv(plan, "etcd://x:1", dns, http)
    assert g[g.index("--profile") + 1] == NEAREST_PROFILE_NAME
    assert "--no-spill" in regional_argv(region, "etcd://x:1", tmp_path, plan=plan)
    z = zone_argv(zone, "etcd://x:1", 0.25, plan.config.tiers)
    assert z[z.index("--profile") + 1] == "llm-d-blend"


def test_gtm_runs_the_defaults(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "gtm")
    region = plan.deployment.regions[0]
    assert global_config(plan, http_listen=None).profile == REQUEST_PROFILE_NAME
    assert regional_settings(plan, region, region.url).router.spill == SpillSettings()


def test_a_baseline_pools_each_regions_gpus_under_one_zone(tmp_path: Path) -> None:
    example = load_topology(None)
    plan = plan_for(tmp_path, "sglang-cache-aware")
    assert plan.topology == pooled(example)
    assert len(plan.deployment.zones) == len(example.regions)
    for spec in example.regions:
        (zone,) = [z for z in plan.deployment.zones if z.region == spec.id]
        assert zone.id == spec.zones[0].id
        assert len(zone.gpus) == sum(z.gpu_count for z in spec.zones)
    assert plan.topology.gpu_count == example.gpu_count
    # gtm's own policies keep the zones.
    assert plan_for(tmp_path, "gtm").topology == example
