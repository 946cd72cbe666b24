"""Every command's malformed flag is one line on stderr and exit status 2 (issue 22 §7).

Each case runs the ``gtm`` command as the console script does (``gtmctl.cli.cli``), so
the one-line presentation of :mod:`gtmctl.cli` is what is checked. A value that slipped
through would start a daemon here and time the test out: every bad value must be
refused while the command line is parsed, before anything listens.
"""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from gtmctl.cli import EXIT_USAGE, cli

MISSING = "/nonexistent/gtm-test/missing"

#: (command, what the line must mention) — every entry point and kind of value: state
#: URLs, listen addresses, ports, URLs, networks, addresses, files that do not exist.
CASES: tuple[tuple[str, str], ...] = (
    ("global --state foo://", "--state"),
    ("global --dns-listen nonsense", "--dns-listen"),
    ("global --http-listen nonsense", "--http-listen"),
    ("global --dns-listen 127.0.0.1:99999", "--dns-listen"),
    ("global --dns-listen 'bad host:53'", "--dns-listen"),
    ("global --trusted-proxy notanet", "--trusted-proxy"),
    (f"global --policies {MISSING}", "--policies"),
    (f"global --geoip-db {MISSING}", "--geoip-db"),
    ("route --client-ip nonsense --tenant a --model m", "--client-ip"),
    ("route --client-ip 81.2.69.1 --tenant a --model m --state foo://", "--state"),
    ("regional --region eu-west --state foo://", "--state"),
    ("regional --region eu-west --listen nonsense", "--listen"),
    ("regional --region eu-west --listen 127.0.0.1:70000", "--listen"),
    ("regional --region eu-west --advertise-url nonsense", "--advertise-url"),
    ("regional --region eu-west --zone-url x", "ZONE=URL"),
    (f"regional --region eu-west --policies {MISSING}", "--policies"),
    ("zone --zone a --region b --state foo://", "--state"),
    ("zone --zone a --region b --listen nonsense", "--listen"),
    ("zone --zone a --region b --worker nonsense", "--worker"),
    ("zone --zone a --region b --scrape-interval -1", "--scrape-interval"),
    ("gpu-sim --state foo://", "--state"),
    ("gpu-sim --port 70000", "--port"),
    ("gpu-sim --host 'bad host'", "--host"),
    ("gpu-sim --advertise-url ftp://x", "--advertise-url"),
    (f"gpu-sim --admin-token-file {MISSING}", "--admin-token-file"),
    ("up --state foo://", "--state"),
    ("up --dns-listen nonsense", "--dns-listen"),
    ("up --http-listen nonsense:80", "--http-listen"),
    ("up --status-listen x", "--status-listen"),
    (f"up --topology {MISSING}", "--topology"),
    (f"up --geoip-db {MISSING}", "--geoip-db"),
    ("up --chaos-links bogus", "--chaos-links"),
    ("up --speedup -1", "--speedup"),
    ("load --url nonsense", "--url"),
    (f"load --path {MISSING}", "--path"),
    (f"load --json {MISSING}/summary.json", "--json"),
    (f"sim --trace-path {MISSING}", "--trace-path"),
    ("sim --policy bogus", "bogus"),
    ("chaos proxy --port 70000", "--port"),
    (f"chaos proxy --config {MISSING}", "--config"),
    (f"chaos run {MISSING}.yaml", "missing"),
    ("chaos run chaos/scenarios/flash-crowd.yaml --attach nonsense", "--attach"),
    ("chaos run chaos/scenarios/flash-crowd.yaml --toxiproxy-url ftp://x", "--toxiproxy-url"),
    ("drain region planet-x --state foo://", "--state"),
    ("drain region planet-x --api nonsense", "--api"),
    (f"drain region eu-west --api http://127.0.0.1:1 --token-file {MISSING}", "--token-file"),
    ("drain planet x --state etcd://127.0.0.1:1", "planet"),
    ("undrain region eu-west --state foo://", "--state"),
    ("policy explain --tenant a --model m --client-ip nonsense", "--client-ip"),
    (f"policy explain --tenant a --model m --policies {MISSING}", "--policies"),
    ("policy apply --state foo:// policies", "--state"),
    (f"policy check {MISSING}", "missing"),
    (f"audit verify {MISSING}", "missing"),
    ("state get --state foo:// /gtm/v1/regions/x", "--state"),
    ("frobnicate", "frobnicate"),
)


@pytest.mark.parametrize(("command", "mentions"), CASES, ids=[c for c, _ in CASES])
def test_a_bad_flag_is_one_line_and_exit_2(command: str, mentions: str) -> None:
    result = CliRunner().invoke(cli, shlex.split(command), prog_name="gtm")
    assert isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == EXIT_USAGE, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    assert mentions in lines[0]


def test_the_line_names_the_command_and_where_help_is() -> None:
    result = CliRunner().invoke(cli, ["drain", "region", "x", "--state", "foo://"], prog_name="gtm")
    assert result.stderr.startswith("gtm drain: Invalid value for '--state': ")
    assert result.stderr.rstrip().endswith("(see 'gtm drain --help')")
