"""``gtm up --dns-ns/--dns-soa-*``: the GeoDNS zone's NS set and SOA reach the global
tier, in one process and as the flags of its ``gtm global`` child."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from click.testing import CliRunner

from global_lb.cli import _config, global_cmd
from global_lb.dns.zone import NameServer, SerialPolicy, ZoneConfig
from gtmctl.up.cli import up
from gtmctl.up.config import HostPort, UpConfig
from gtmctl.up.fleet import DNS_ZONE, make_plan
from gtmctl.up.inprocess import global_config
from gtmctl.up.processes import global_argv

ZONE = ZoneConfig(
    zone=DNS_ZONE,
    name_servers=(
        NameServer(name="ns1", addresses=(ipaddress.ip_address("127.0.0.1"),)),
        NameServer(name="ns.provider.example."),
    ),
    hostmaster="ops@example.com",
    primary="ns.provider.example.",
    serial_policy=SerialPolicy.FIXED,
    serial=42,
    refresh=7200,
    retry=900,
    expire=1_209_600,
    negative_ttl=12,
)


def test_the_zone_reaches_the_global_tier_in_process_and_as_a_child(tmp_path: Path) -> None:
    plan = make_plan(UpConfig(run_dir=str(tmp_path), dns_zone=ZONE))
    assert global_config(plan, http_listen=None).zone == ZONE
    dns = http = HostPort("127.0.0.1", 1)
    argv = global_argv(plan, "etcd://x:1", dns, http)
    flags = argv[argv.index("global") + 1 :]
    # The child reads its flags back into the same zone.
    assert _config(global_cmd.make_context("global", flags).params).zone == ZONE


def test_defaults_pass_nothing_on(tmp_path: Path) -> None:
    plan = make_plan(UpConfig(run_dir=str(tmp_path)))
    assert global_config(plan, http_listen=None).zone == ZoneConfig(zone=DNS_ZONE)
    dns = http = HostPort("127.0.0.1", 1)
    assert not any(a.startswith(("--ns", "--soa-")) for a in global_argv(plan, "x", dns, http))


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("--dns-ns", "ns1=not-an-ip"), "--dns-ns"),
        (("--dns-ns", "ns.provider.example.=192.0.2.1"), "--dns-ns"),
        (("--dns-soa-expire", "10"), "--dns-soa-expire"),
        (("--dns-soa-serial", "later"), "--dns-soa-serial"),
    ],
)
def test_bad_zone_options_stop_gtm_up_before_it_starts(args: tuple[str, ...], option: str) -> None:
    result = CliRunner().invoke(up, list(args))
    assert result.exit_code == 2
    assert option in result.output
    assert "Traceback" not in result.output


def test_help_lists_them() -> None:
    out = CliRunner().invoke(up, ["--help"]).output
    for flag in ("--dns-ns", "--dns-soa-rname", "--dns-soa-serial", "--dns-soa-minimum"):
        assert flag in out
