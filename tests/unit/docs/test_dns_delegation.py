"""docs/dns-delegation.md stays true: its ``gtm global`` command and its environment
file configure the same zone, the parent-zone records it shows are exactly that zone's NS
set and glue, and every option, path and metric it names exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import dns.name
import dns.rdatatype
import dns.rrset
import pytest

from global_lb.cli import _config, global_cmd
from global_lb.dns.zone import ZoneConfig, absolute_name
from gtmctl.up.cli import up

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "dns-delegation.md"
#: The options of the command that shape the zone (the rest name files of the reader's).
ZONE_FLAGS = ("--zone", "--ttl", "--ns", "--soa-")


def blocks(kind: str) -> list[str]:
    """The fenced blocks whose info string is ``kind`` ("" for none)."""
    found: list[str] = []
    current: list[str] | None = None
    for line in GUIDE.read_text("utf-8").splitlines():
        if current is None and line.startswith("```"):
            current = [] if line[3:].strip() == kind else None
            if current is None:
                current = ["\0"]  # another kind: skipped to its end
        elif current is not None and line.startswith("```"):
            if current[:1] != ["\0"]:
                found.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return found


def documented_command() -> list[str]:
    (command,) = [b for b in blocks("sh") if b.startswith("gtm global")]
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:2] == ["gtm", "global"]
    pairs = list(zip(words[2::2], words[3::2], strict=True))
    return [w for flag, value in pairs if flag.startswith(ZONE_FLAGS) for w in (flag, value)]


def documented_environment() -> dict[str, str]:
    (env,) = [b for b in blocks("sh") if b.startswith("GTM_")]
    return dict(line.split("=", 1) for line in env.splitlines() if line.strip())


def zone_from(args: list[str], env: dict[str, str] | None = None) -> ZoneConfig:
    with pytest.MonkeyPatch.context() as patch:
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        return _config(global_cmd.make_context("global", args).params).zone


def test_the_command_and_the_environment_file_configure_the_same_zone() -> None:
    by_flags = zone_from(documented_command())
    assert zone_from([], documented_environment()) == by_flags
    assert by_flags.zone == "gtm.example.com."
    assert len(by_flags.name_servers) >= 2


def test_the_parent_records_are_the_zones_ns_set_and_glue() -> None:
    config = zone_from(documented_command())
    origin = dns.name.from_text(config.zone)
    expected_ns = {absolute_name(ns.name, origin).to_text() for ns in config.name_servers}
    expected_glue = {
        (absolute_name(ns.name, origin).to_text(), str(address))
        for ns in config.name_servers
        for address in ns.addresses
    }
    (records,) = [b for b in blocks("") if " IN NS " in b]
    ns: set[str] = set()
    glue: set[tuple[str, str]] = set()
    for line in records.splitlines():
        name, ttl, rdclass, rdtype, rdata = line.split(None, 4)
        rrset = dns.rrset.from_text(name, int(ttl), rdclass, rdtype, rdata)
        if rrset.rdtype == dns.rdatatype.NS:
            assert rrset.name.to_text() == config.zone
            ns |= {rd.to_text() for rd in rrset}
        else:
            glue |= {(rrset.name.to_text(), rd.to_text()) for rd in rrset}
    assert ns == expected_ns
    assert glue == expected_glue


def test_every_option_it_names_exists() -> None:
    options = {
        name
        for command in (global_cmd, up)
        for param in command.params
        if isinstance(param, click.Option)
        for name in param.opts
    }
    text = GUIDE.read_text("utf-8")
    named = {f for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text) if not f.endswith("-")}
    named -= {"--foo-bar"}  # the naming rule's example
    assert named
    assert named <= options, sorted(named - options)
    for variable in set(re.findall(r"\bGTM_[A-Z_]+", text)) - {"GTM_FOO_BAR"}:
        assert variable in {f"GTM_{o[2:].upper().replace('-', '_')}" for o in options}, variable


def test_every_path_and_metric_it_names_exists() -> None:
    text = GUIDE.read_text("utf-8")
    for path in re.findall(r"`((?:tests|deploy|docs|global_lb|gtm)/[\w./-]+)`", text):
        assert (ROOT / path).exists(), path
    for metric in set(re.findall(r"\bgtm_[a-z_]+", text)):
        sources = "".join(p.read_text("utf-8") for p in (ROOT / "global_lb").glob("*.py"))
        assert f'"{metric}"' in sources, metric
