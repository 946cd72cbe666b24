"""Server pieces that need no socket: configuration, profiles, the admin peer check, the CLI."""

from __future__ import annotations

from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request
from click.testing import CliRunner
from pydantic import ValidationError

from gpusim import openai_api as api
from gpusim.cli import gpu_sim
from gpusim.server import GpuSimConfig, GpuSimServer, build_profile
from gtm.errors import ConfigError
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.metrics import new_registry


def test_profile_overrides_apply() -> None:
    config = GpuSimConfig(gpu_type="h100", max_num_seqs=8, num_gpu_blocks=100)
    profile = build_profile(config, LLAMA_8B)
    assert profile.max_num_seqs == 8
    assert profile.num_gpu_blocks == 100
    assert profile.max_model_len == 1600  # what 100 blocks of 16 tokens hold
    assert build_profile(GpuSimConfig(gpu_type="H100"), LLAMA_8B) == get_profile("H100", LLAMA_8B)


def test_unknown_gpu_or_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown GPU type 'TPU-v5'.*--emulate TYPE"):
        GpuSimServer(GpuSimConfig(gpu_type="TPU-v5"), registry=new_registry())
    with pytest.raises(ConfigError, match="no profile for model 'm'"):
        GpuSimServer(GpuSimConfig(models=("m",)), registry=new_registry())


def test_emulate_runs_one_types_profile_under_another_name() -> None:
    config = GpuSimConfig(gpu_type="X1", emulate="H100")
    assert build_profile(config, LLAMA_8B) == get_profile("H100", LLAMA_8B)
    server = GpuSimServer(config, registry=new_registry())
    assert server.worker_id().startswith("sim-x1-")  # it declares X1
    with pytest.raises(ConfigError, match="unknown GPU type 'X2'") as info:
        build_profile(GpuSimConfig(gpu_type="X1", emulate="X2"), LLAMA_8B)
    assert "--emulate" not in str(info.value)  # it was given; no hint to give it


@pytest.mark.parametrize(
    "options",
    [{"speedup": 0}, {"port": 70000}, {"models": ()}, {"region": "Not_An_Id"}, {"max_queue": -1}],
)
def test_config_validation(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        GpuSimConfig.model_validate(options)


def _request_from(peer: str) -> object:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    return make_mocked_request("GET", "/admin/faults", transport=transport)


async def test_admin_endpoints_refuse_non_loopback_peers() -> None:
    # Without --admin-token-file the admin guard trusts loopback peers only.
    server = GpuSimServer(GpuSimConfig(), registry=new_registry())
    guard = server._admin
    with pytest.raises(api.ApiError) as info:
        guard.authorize(_request_from("192.0.2.10"))  # type: ignore[arg-type]
    assert info.value.status == 403
    assert info.value.body()["error"]["type"] == "permission_error"
    with pytest.raises(api.ApiError):
        guard.authorize(_request_from("2001:db8::1"))  # type: ignore[arg-type]
    assert guard.authorize(_request_from("127.0.0.1")).who == "loopback"  # type: ignore[arg-type]
    assert guard.authorize(_request_from("::ffff:127.0.0.1")).who == "loopback"  # type: ignore[arg-type]
    response = await server._admin_faults(_request_from("127.0.0.1"))  # type: ignore[arg-type]
    assert response.status == 200


def test_cli_reports_bad_options_clearly() -> None:
    runner = CliRunner()
    result = runner.invoke(gpu_sim, ["--gpu-type", "TPU-v5", "--port", "0"])
    assert result.exit_code == 2
    assert "unknown GPU type 'TPU-v5'" in result.output
    result = runner.invoke(gpu_sim, ["--speedup", "0"])
    assert result.exit_code == 2
    assert "--speedup" in result.output
    # Fields whose flag is not their name: the message names the flag the user typed.
    for flag in ("--lag-probe-interval", "--lease-ttl"):
        result = runner.invoke(gpu_sim, [flag, "0"])
        assert result.exit_code == 2
        assert f"{flag}: Input should be greater" in result.output
    result = runner.invoke(gpu_sim, ["--help"])
    assert result.exit_code == 0
    assert "--metrics-flavor" in result.output
    assert "--lag-probe-interval" in result.output
