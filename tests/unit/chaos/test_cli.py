import pytest
from click.testing import CliRunner

from chaos.cli import chaos, is_loopback
from gtmctl.cli import cli


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_non_loopback_host_is_refused_without_allow_remote() -> None:
    result = CliRunner().invoke(chaos, ["proxy", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "no authentication" in result.output
    assert "--allow-remote" in result.output


def test_proxy_help_is_reachable_from_gtm() -> None:
    result = CliRunner().invoke(cli, ["chaos", "proxy", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--config", "--allow-remote", "--seed"):
        assert option in result.output


def test_missing_config_file_is_a_usage_error() -> None:
    result = CliRunner().invoke(chaos, ["proxy", "--config", "/nonexistent.json"])
    assert result.exit_code == 2
    assert "does not exist" in result.output
