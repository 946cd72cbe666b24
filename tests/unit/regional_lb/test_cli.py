from __future__ import annotations

from click.testing import CliRunner

from gtmctl.cli import cli
from regional_lb.cli import _zone_urls


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(cli, ["regional", "--help"])
    assert result.exit_code == 0
    for option in ("--region", "--state", "--listen", "--policies", "--replica-id", "--zone-url"):
        assert option in result.output
    assert "--split [capacity|envoy]" in result.output


def test_bad_arguments_are_usage_errors() -> None:
    runner = CliRunner()
    bad_listen = runner.invoke(cli, ["regional", "--region", "eu-west", "--listen", "nowhere"])
    assert bad_listen.exit_code == 2
    assert "HOST:PORT" in bad_listen.output
    bad_region = runner.invoke(cli, ["regional", "--region", "EU West"])
    assert bad_region.exit_code == 2
    assert "lowercase id" in bad_region.output
    bad_zone = runner.invoke(cli, ["regional", "--region", "eu-west", "--zone-url", "a=ftp://x"])
    assert bad_zone.exit_code == 2
    assert "ZONE=URL" in bad_zone.output
    bad_split = runner.invoke(cli, ["regional", "--region", "eu-west", "--split", "random"])
    assert bad_split.exit_code == 2
    assert "'capacity', 'envoy'" in bad_split.output


def test_a_region_outside_the_policy_set_is_refused() -> None:
    from policies.loader import examples_path

    result = CliRunner().invoke(
        cli, ["regional", "--region", "mars-1", "--policies", str(examples_path())]
    )
    assert result.exit_code == 2
    assert "not a region of the policy set" in result.output


def test_zone_urls_parse() -> None:
    assert _zone_urls(("a=http://h:1/", "b=https://x")) == {"a": "http://h:1", "b": "https://x"}
