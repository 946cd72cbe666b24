"""``gtm global``'s zone options (--ns, --soa-*) and their GTM_ variables."""

from __future__ import annotations

import ipaddress

import click
import pytest
from click.testing import CliRunner

from global_lb.cli import _config, global_cmd
from global_lb.dns.zone import NameServer, SerialPolicy, ZoneConfig
from gtmctl.cli import cli


def zone_of(*args: str, env: dict[str, str] | None = None) -> ZoneConfig:
    """The ZoneConfig ``gtm global ARGS`` would run with (parsed, not started)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        ctx = global_cmd.make_context("global", list(args))
    return _config(ctx.params).zone


def test_ns_and_soa_options_reach_the_zone() -> None:
    zone = zone_of(
        "--zone", "gtm.example.com.", "--ttl", "20",
        "--ns", "ns1=192.0.2.53,2001:db8::53", "--ns", "ns.provider.net.",
        "--soa-rname", "dns@example.com", "--soa-serial", "7", "--soa-refresh", "7200",
        "--soa-retry", "900", "--soa-expire", "1209600", "--soa-minimum", "10",
    )  # fmt: skip
    assert zone.name_servers == (
        NameServer(
            name="ns1",
            addresses=(ipaddress.ip_address("192.0.2.53"), ipaddress.ip_address("2001:db8::53")),
        ),
        NameServer(name="ns.provider.net."),
    )
    assert (zone.hostmaster, zone.serial_policy, zone.serial) == (
        "dns@example.com",
        SerialPolicy.FIXED,
        7,
    )
    assert (zone.refresh, zone.retry, zone.expire, zone.negative_ttl, zone.ttl) == (
        7200, 900, 1_209_600, 10, 20,
    )  # fmt: skip


def test_defaults_keep_the_old_zone() -> None:
    zone = zone_of()
    assert zone == ZoneConfig()
    assert zone_of("--ttl", "45").negative_ttl == 45  # MINIMUM follows the TTL


def test_environment_variables_set_them_too() -> None:
    zone = zone_of(
        env={
            "GTM_NS": "ns1=192.0.2.53 ns2=192.0.2.54",
            "GTM_SOA_RNAME": "ops@example.org",
            "GTM_SOA_SERIAL": "unixtime",
            "GTM_SOA_MINIMUM": "5",
        }
    )
    assert [ns.name for ns in zone.name_servers] == ["ns1", "ns2"]
    assert zone.hostmaster == "ops@example.org"
    assert zone.serial_policy is SerialPolicy.UNIXTIME
    assert zone.negative_ttl == 5


@pytest.mark.parametrize(
    ("args", "option", "why"),
    [
        (("--ns", "ns1=not-an-ip"), "--ns", "is not an IP address"),
        (("--ns", "ns1.sub"), "--ns", "one label under the zone"),
        (("--ns", "ns.provider.net.=192.0.2.1"), "--ns", "outside the zone"),
        (("--ns", "api=192.0.2.1"), "--ns", "routed name"),
        (("--soa-serial", "soon"), "--soa-serial", "unixtime"),
        (("--soa-rname", "@example.com"), "--soa-rname", "not a mailbox"),
        (("--soa-mname", "a..b."), "--soa-mname", "not a domain name"),
        (("--soa-expire", "100"), "--soa-expire", "shorter than refresh + retry"),
        (("--soa-refresh", "0"), "--soa-refresh", "0"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(
    args: tuple[str, ...], option: str, why: str
) -> None:
    result = CliRunner().invoke(cli, ["global", "--dns-listen", "off", *args])
    assert result.exit_code == 2
    assert option in result.stderr
    assert why in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_the_zone_options_with_their_variables() -> None:
    out = CliRunner().invoke(cli, ["global", "--help"], terminal_width=200).stdout
    for flag, variable in (("--ns", "GTM_NS"), ("--soa-serial", "GTM_SOA_SERIAL")):
        assert flag in out
        assert variable in out


def test_zone_options_are_click_options_of_gtm_global() -> None:
    names = {p.name for p in global_cmd.params if isinstance(p, click.Option)}
    assert {"ns", "soa_mname", "soa_rname", "soa_serial", "soa_minimum"} <= names


def test_geoip_reload_interval_reaches_the_config() -> None:
    ctx = global_cmd.make_context("global", ["--geoip-reload-interval", "15"])
    assert _config(ctx.params).geoip_reload_interval_s == 15.0
    assert _config(global_cmd.make_context("global", []).params).geoip_reload_interval_s == 60.0
    result = CliRunner().invoke(cli, ["global", "--geoip-reload-interval", "-1"])
    assert result.exit_code == 2
    assert "--geoip-reload-interval" in result.stderr


@pytest.mark.parametrize(
    ("args", "warned"),
    [
        (("--dns-listen", "0.0.0.0:53"), True),  # reachable, ns1 without an address
        (("--dns-listen", "0.0.0.0:53", "--ns", "ns1=192.0.2.53"), False),
        (("--dns-listen", "0.0.0.0:53", "--ns", "ns1.example.net."), False),
        (("--dns-listen", "127.0.0.1:5353"), False),  # local, as gtm up's
        (("--dns-listen", "localhost:5353"), False),
        (("--dns-listen", "off"), False),
    ],
)
def test_a_reachable_server_without_glue_is_warned_about(
    args: tuple[str, ...], warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from global_lb.cli import _warn_if_undelegatable

    _warn_if_undelegatable(_config(global_cmd.make_context("global", list(args)).params))
    assert ("a parent zone cannot delegate to it" in caplog.text) is warned
    if warned:
        assert "ns1.inference.example." in caplog.text
