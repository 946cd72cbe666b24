from __future__ import annotations

import pytest
from pydantic import ValidationError

from gtm.errors import ConfigError
from gtmctl.up.config import HostPort, Mode, UpConfig, parse_listen


def test_defaults_are_architecture_9() -> None:
    config = UpConfig()
    assert config.dns == HostPort("127.0.0.1", 5353)
    assert config.http == HostPort("127.0.0.1", 8080)
    assert config.state == "memory"
    assert config.mode is Mode.IN_PROCESS
    assert config.status() is None  # served on the front door


def test_processes_get_a_status_port_of_their_own() -> None:
    config = UpConfig(processes=True, state="etcd://127.0.0.1:2379")
    assert config.uses_etcd
    assert config.status() == HostPort("127.0.0.1", 8081)
    assert UpConfig(processes=True, status_listen="127.0.0.1:9999").status() == HostPort(
        "127.0.0.1", 9999
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:53", HostPort("127.0.0.1", 53)), ("[::1]:8080", HostPort("::1", 8080))],
)
def test_parse_listen(text: str, expected: HostPort) -> None:
    assert parse_listen(text, "--x") == expected


@pytest.mark.parametrize("text", ["8080", "localhost:8080", "127.0.0.1:99999", "127.0.0.1:"])
def test_bad_listen_addresses_name_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="--http-listen"):
        parse_listen(text, "--http-listen")


def test_ipv6_url_is_bracketed() -> None:
    assert HostPort("::1", 8080).url == "http://[::1]:8080"


@pytest.mark.parametrize(
    "options",
    [{"state": "redis://x"}, {"speedup": 0.0}, {"dns_listen": "nowhere"}],
)
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises((ValidationError, ConfigError)):
        UpConfig.model_validate(options)
