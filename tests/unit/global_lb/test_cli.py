from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gtmctl.cli import cli
from tests.unit.global_lb.helpers import maxmind_test_db


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_route_prints_the_trace_over_the_example_topology() -> None:
    code, out, _ = run(
        "route", "--client-ip", "81.2.69.142", "--tenant", "demo-global",
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--geoip-db", str(maxmind_test_db()),
    )  # fmt: skip
    assert code == 0
    assert "region:    eu-west" in out
    assert "filter residency: 6 left" in out
    assert "client:    GB" in out


def test_route_refusal_exits_1_with_the_reason() -> None:
    code, out, _ = run(
        "route", "--client-ip", "89.160.20.112", "--tenant", "acme-health", "--model", "m",
        "--geoip-db", str(maxmind_test_db()), "--json",
    )  # fmt: skip
    assert code == 1
    decision = json.loads(out)
    assert decision["refusal"] == "residency"
    assert decision["residency"]["denied_by"] == ["gdpr-stays-in-eea"]


def test_route_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    code, _, err = run("route", "--client-ip", "not-an-ip", "--tenant", "t", "--model", "m")
    assert code == 2
    assert "--client-ip" in err
    bad = tmp_path / "topology.yaml"
    bad.write_text("regions: [{id: x}]")
    code, _, err = run(
        "route", "--client-ip", "127.0.0.1", "--tenant", "demo-global", "--model", "m",
        "--topology", str(bad),
    )  # fmt: skip
    assert code == 2
    assert "invalid topology" in err


def test_global_help_lists_the_architecture_flags() -> None:
    code, out, _ = run("global", "--help")
    assert code == 0
    for flag in ("--dns-listen", "--http-listen", "--state", "--policies", "--geoip-db"):
        assert flag in out


def test_global_dns_workers_flag_is_checked_and_reaches_the_config() -> None:
    from global_lb.cli import _config

    code, out, _ = run("global", "--help")
    assert "--dns-workers" in out
    code, _, err = run("global", "--dns-workers", "0")
    assert code == 2
    assert "--dns-workers" in err
    options = {
        "dns_listen": "127.0.0.1:0", "http_listen": "off", "state": "memory", "policies": (),
        "geoip_db": None, "geo_map": None, "topology": None, "audit_dir": None,
        "zone": "inference.example.", "ttl": 30, "rrl_rate": 0.0, "trusted": (),
        "require_summaries": False, "reuse_port": False, "dns_workers": 3,
    }  # fmt: skip
    assert _config(options).dns_workers == 3


def test_global_audit_anchor_interval_reaches_the_config() -> None:
    from global_lb.cli import _config

    code, out, _ = run("global", "--help")
    assert "--audit-anchor-interval" in out
    code, _, err = run("global", "--audit-anchor-interval", "0")
    assert code == 2
    assert "--audit-anchor-interval" in err
    options = {
        "dns_listen": "off", "http_listen": "off", "state": "memory", "policies": (),
        "geoip_db": None, "geo_map": None, "topology": None, "audit_dir": "/tmp/audit",
        "zone": "inference.example.", "ttl": 30, "rrl_rate": 0.0, "trusted": (),
        "require_summaries": False, "reuse_port": False, "dns_workers": 1,
        "audit_anchor_interval": 2.5,
    }  # fmt: skip
    assert _config(options).audit_anchor_interval_s == 2.5
