"""``gtm up --worker-api-key-file``: the key is read before anything starts, the emulated
GPUs get it in vLLM's variable (and only they; a shell's own ``VLLM_API_KEY`` never
reaches a child), every zone agent gets the file — in both deployment modes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gtm.errors import ConfigError
from gtmctl.up.config import UpConfig
from gtmctl.up.fleet import make_plan
from gtmctl.up.inprocess import _api_keys, zone_config
from gtmctl.up.processes import Child, ProcessFleet, TierKind, zone_argv


def test_the_key_goes_to_the_gpus_and_the_file_to_the_zones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "worker.key"
    key_file.write_text("sk-worker\n")
    plan = make_plan(UpConfig(run_dir=str(tmp_path / "run"), worker_api_key_file=str(key_file)))
    zone = plan.deployment.zones[0]
    argv = zone_argv(zone, "etcd://x:1", 0.25, worker_key_file=plan.config.worker_api_key_file)
    assert argv[argv.index("--worker-api-key-file") + 1] == str(key_file)
    assert zone_config(plan, zone).worker_keys.file == key_file
    assert [k.get_secret_value() for k in _api_keys(plan)] == ["sk-worker"]
    assert "sk-worker" not in repr(plan)

    monkeypatch.setenv("VLLM_API_KEY", "from-the-shell")
    monkeypatch.setenv("GTM_API_KEY", "another-key-from-the-shell")
    fleet = SimpleNamespace(plan=plan)
    for kind, expected in ((TierKind.GPU, "sk-worker"), (TierKind.ZONE, None)):
        child = Child("c", kind, [], tmp_path / "log")
        env = ProcessFleet._environment(fleet, child)  # type: ignore[arg-type]
        assert env.get("VLLM_API_KEY") == expected
        assert "GTM_API_KEY" not in env


def test_without_the_option_no_key_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = make_plan(UpConfig(run_dir=str(tmp_path / "run")))
    zone = plan.deployment.zones[0]
    assert "--worker-api-key-file" not in zone_argv(zone, "etcd://x:1", 0.25)
    assert zone_config(plan, zone).worker_keys.file is None
    assert _api_keys(plan) == ()
    monkeypatch.setenv("VLLM_API_KEY", "from-the-shell")
    child = Child("g", TierKind.GPU, [], tmp_path / "log")
    env = ProcessFleet._environment(SimpleNamespace(plan=plan), child)  # type: ignore[arg-type]
    assert "VLLM_API_KEY" not in env


def test_an_empty_key_file_stops_gtm_up_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty.key"
    empty.write_text("")
    with pytest.raises(ConfigError, match=f"file {empty} is empty"):
        make_plan(UpConfig(run_dir=str(tmp_path / "run"), worker_api_key_file=str(empty)))
