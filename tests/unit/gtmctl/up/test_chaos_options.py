"""``gtm up``'s chaos options: --etcd-members and --chaos-links are checked before
anything starts, with a message naming the option."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from gtmctl.up.cli import up
from gtmctl.up.config import UpConfig
from gtmctl.up.control import LinkKind, link_name


def test_link_names_are_url_safe_and_readable() -> None:
    assert link_name("global", "regional/eu-west") == "global->regional.eu-west"
    assert link_name("zone/eu-west-a", "etcd/etcd-1") == "zone.eu-west-a->etcd.etcd-1"


def test_config_accepts_the_chaos_options_with_processes() -> None:
    config = UpConfig(processes=True, etcd_members=3, chaos_links=(LinkKind.ETCD,))
    assert config.etcd_members == 3
    assert config.chaos_links == (LinkKind.ETCD,)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"etcd_members": 3}, "--etcd-members and --chaos-links need --processes"),
        ({"chaos_links": (LinkKind.ETCD,)}, "need --processes"),
        (
            {"processes": True, "etcd_members": 3, "state": "etcd://127.0.0.1:2379"},
            "--etcd-members sizes gtm up's private etcd",
        ),
        ({"processes": True, "etcd_members": 2}, "Input should be 1 or 3"),
    ],
)
def test_config_refuses_chaos_options_that_cannot_work(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        UpConfig.model_validate(options)


def test_cli_names_an_unknown_link_kind() -> None:
    result = CliRunner().invoke(up, ["--processes", "--chaos-links", "global-regional,dns"])
    assert result.exit_code == 2
    assert "--chaos-links: unknown link kind 'dns'" in result.output
    assert "global-regional, regional-zone, etcd" in result.output


def test_cli_refuses_etcd_members_without_processes() -> None:
    result = CliRunner().invoke(up, ["--etcd-members", "3"])
    assert result.exit_code == 2
    assert "need --processes" in result.output


def test_cli_help_documents_the_options() -> None:
    result = CliRunner().invoke(up, ["--help"])
    assert result.exit_code == 0
    assert "--etcd-members" in result.output
    assert "--chaos-links" in result.output
