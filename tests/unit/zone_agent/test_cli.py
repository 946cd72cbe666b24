from __future__ import annotations

import pytest
from click.testing import CliRunner

from gtmctl.cli import cli


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nope"], "is not HOST:PORT"),
        (["--worker", "ftp://x"], "expected http"),
        (["--profile", "fastest"], "Invalid value for '--profile'"),
        (["--zone", "Bad_Zone"], "--zone"),
        (["--scrape-interval", "0"], "--scrape-interval"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    base = ["zone", "--zone", "z", "--region", "r"]
    result = CliRunner().invoke(cli, [*base, *args])
    assert result.exit_code == 2
    assert message in result.output + result.stderr


def test_help_names_the_profiles() -> None:
    result = CliRunner().invoke(cli, ["zone", "--help"])
    assert result.exit_code == 0
    assert "sglang-cache-aware" in result.output


def test_help_names_the_http_servers_and_their_variable() -> None:
    result = CliRunner().invoke(cli, ["zone", "--help"])
    assert "--http-server [lean|aiohttp]" in result.output
    assert "GTM_HTTP_SERVER" in result.output
    bad = CliRunner().invoke(cli, ["zone", "--zone", "z", "--region", "r", "--http-server", "h2"])
    assert bad.exit_code == 2
    assert "Invalid value for '--http-server'" in bad.output + bad.stderr
