"""gtm.envvars: every option of every daemon has its ``GTM_…`` variable by one rule
(``--foo-bar`` ↔ ``GTM_FOO_BAR``), shown in ``--help``; the variables reach the
daemon's configuration, and a flag on the command line wins over its variable."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from chaos.cli import proxy_command
from global_lb import cli as global_cli
from global_lb.config import GlobalConfig
from gpusim.cli import gpu_sim
from gtm.envvars import RULE, envvar_name, from_environment
from gtm.tls import TlsConfig
from gtmctl.cli import cli
from regional_lb.cli import regional
from zone_agent.cli import zone

#: Every long-running command a service manager starts (deploy/systemd, deploy/k8s).
DAEMONS: dict[str, click.Command] = {
    "global": global_cli.global_cmd,
    "regional": regional,
    "zone": zone,
    "gpu-sim": gpu_sim,
    "chaos proxy": proxy_command,
}

#: Variables gtm reads for the whole process, outside any flag: no flag may take one.
PROCESS_VARIABLES = {
    "GTM_DATA_DIR", "GTM_PURE_PYTHON", "GTM_TRACEMALLOC_DIR", "GTM_TRACEMALLOC_FRAMES",
    "GTM_ETCD_PASSWORD", "GTM_ETCD_BIN", "GTM_LOG_LEVEL", "GTM_LOG_FORMAT",
    "GTM_CHAOS_MUTANT", "GTM_BUILD_COMMIT",
}  # fmt: skip


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_every_daemon_option_has_its_variable_by_the_rule(name: str) -> None:
    command = DAEMONS[name]
    options = _options(command)
    assert options
    for option in options:
        long_name = next(o for o in option.opts if o.startswith("--"))
        expected = "GTM_" + long_name[2:].replace("-", "_").upper()
        assert option.envvar == expected, (name, long_name)
        assert option.show_envvar, (name, long_name)
    names = [o.envvar for o in options]
    assert len(names) == len(set(names)), name
    assert not set(names) & PROCESS_VARIABLES, name
    assert command.epilog is not None
    assert command.epilog.endswith(RULE)


def test_the_variables_named_before_the_rule_keep_their_names() -> None:
    variables = {name: {o.envvar for o in _options(c)} for name, c in DAEMONS.items()}
    assert {"GTM_PEER_TOKEN", "GTM_STATE", "GTM_TLS_CA", "GTM_TLS_CERT"} <= variables["global"]
    assert {"GTM_PEER_TOKEN", "GTM_STATE", "GTM_TLS_KEY"} <= variables["regional"]


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_help_shows_each_variable_and_the_rule(name: str) -> None:
    result = CliRunner().invoke(cli, [*name.split(), "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # as wrapped for the terminal
    for option in _options(DAEMONS[name]):
        assert f"env var: {option.envvar}" in text, option.envvar
    assert "--foo-bar as GTM_FOO_BAR" in text


def test_the_rule_takes_the_first_long_name() -> None:
    assert envvar_name(click.Option(["-r", "--rrl-rate", "rate"])) == "GTM_RRL_RATE"
    assert envvar_name(click.Option(["--cold-start/--no-cold-start"])) == "GTM_COLD_START"
    with pytest.raises(ValueError, match="no long name"):
        envvar_name(click.Option(["-x"]))


def test_an_epilog_a_command_has_is_kept() -> None:
    @from_environment
    @click.command(epilog="See the README.")
    @click.option("--listen")
    def command(listen: str) -> None: ...

    assert command.epilog == f"See the README.\n\n{RULE}"


def test_variables_reach_the_global_tiers_configuration_and_flags_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[GlobalConfig] = []

    async def serve(
        config: GlobalConfig, tls: TlsConfig | None = None, **_: Any
    ) -> None:  # what would run the tier
        seen.append(config)

    monkeypatch.setattr(global_cli, "_serve", serve)
    env = {
        "GTM_DNS_LISTEN": "off",
        "GTM_HTTP_LISTEN": "127.0.0.1:0",
        "GTM_RRL_RATE": "7.5",
        "GTM_TTL": "60",  # the command line's --ttl wins
        "GTM_TRUSTED_PROXY": "10.0.0.0/8 192.0.2.0/24",  # repeatable: space-separated
        "GTM_REQUIRE_SUMMARIES": "true",
        "GTM_PEER_TOKEN": "from-the-environment",
        "GTM_ZONE": "gtm.example.",
    }
    result = CliRunner().invoke(cli, ["global", "--ttl", "5"], env=env)
    assert result.exit_code == 0, result.output
    (config,) = seen
    assert config.dns_listen is None
    assert config.http_listen == "127.0.0.1:0"
    assert config.rrl.rate == 7.5
    assert config.zone.ttl == 5
    assert config.zone.zone == "gtm.example."
    assert [str(n) for n in config.front_door.trusted_proxies] == ["10.0.0.0/8", "192.0.2.0/24"]
    assert config.require_summaries is True
    assert config.front_door.peer_token is not None
    assert config.front_door.peer_token.get_secret_value() == "from-the-environment"


def test_a_bad_variable_is_a_usage_error_naming_its_flag() -> None:
    result = CliRunner().invoke(cli, ["global"], env={"GTM_DNS_WORKERS": "0"})
    assert result.exit_code == 2
    assert "--dns-workers" in result.output
