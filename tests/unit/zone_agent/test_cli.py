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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--admission", "always"], "Invalid value for '--admission'"),
        (["--tpot-slo-ms", "0"], "--tpot-slo-ms"),
        (["--admission-max-waiting", "0"], "--admission-max-waiting"),
        (["--admission-order", "lifo"], "Invalid value for '--admission-order'"),
        (["--admission-rescrape", "0"], "--admission-rescrape"),
    ],
)
def test_bad_admission_options_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["zone", "--zone", "z", "--region", "r", *args])
    assert result.exit_code == 2
    assert message in result.output + result.stderr


def test_admission_options_reach_the_agent_s_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import zone_agent.cli as zone_cli
    from zone_agent.config import ZoneConfig
    from zone_agent.flow import AdmissionMode, QueueOrder

    seen: list[ZoneConfig] = []

    async def nothing() -> None:
        pass

    def serve(config: ZoneConfig, *args: object, **kwargs: object) -> object:
        seen.append(config)
        return nothing()

    def run(coroutine: object, kind: object) -> None:
        coroutine.close()  # type: ignore[attr-defined]

    monkeypatch.setattr(zone_cli, "serve", serve)
    monkeypatch.setattr(zone_cli, "run", run)
    args = ["zone", "--zone", "z", "--region", "r", "--admission", "slo", "--tpot-slo-ms", "50"]
    args += ["--admission-queue-ms", "250", "--admission-max-wait", "3", "--admission-order"]
    args += ["fcfs", "--admission-max-waiting", "10", "--ttft-slo-ms", "1500"]
    args += ["--admission-rescrape", "0.2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    [config] = [c.admission for c in seen]
    assert config.mode is AdmissionMode.SLO
    assert (config.tpot_slo_ms, config.queue_budget_ms, config.max_wait_s) == (50.0, 250.0, 3.0)
    assert (config.order, config.max_waiting, config.ttft_slo_ms) == (QueueOrder.FCFS, 10, 1500.0)
    assert config.rescrape_s == 0.2
