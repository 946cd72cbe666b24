"""``gtm up --processes --kv-events``: each emulated GPU publishes on sockets of its own,
registers them as its ``kv-events`` labels, and every zone agent reads them — so a zone
dials exactly its GPUs' endpoints, never another's."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gtm.kv_events import KVEventsConfig, endpoint_labels
from gtm.models import GpuWorker
from gtmctl.up.cli import up
from gtmctl.up.config import UpConfig
from gtmctl.up.fleet import make_plan
from gtmctl.up.processes import KV_EVENTS_TOPIC, gpu_argv, zone_argv
from zone_agent.cli import _kv_events_source
from zone_agent.cli import zone as zone_command


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_each_gpu_publishes_where_its_zone_dials(tmp_path: Path) -> None:
    plan = make_plan(UpConfig(run_dir=str(tmp_path / "run"), processes=True, kv_events=True))
    directory = tmp_path / "kv"
    seen: set[str] = set()
    zone = plan.deployment.zones[0]
    zone_args = zone_argv(zone, "etcd://x:1", 0.25, kv_events=True)
    # The zone's own command line parsed as `gtm zone` parses it.
    params = zone_command.make_context("zone", zone_args[zone_args.index("zone") + 1 :]).params
    source = _kv_events_source(
        params["kv_events"], params["kv_events_replay"], params["kv_events_topic"], None
    )
    assert source is not None
    assert source.topic == KV_EVENTS_TOPIC
    for gpu in plan.deployment.gpus:
        config = KVEventsConfig.model_validate_json(
            _after(gpu_argv(gpu, "etcd://x:1", 1.0, kv_events_dir=directory), "--kv-events-config")
        )
        assert config.publishing
        assert config.topic == KV_EVENTS_TOPIC
        worker = GpuWorker(
            id=gpu.id,
            zone_id=gpu.zone,
            region_id=gpu.region,
            url=f"http://{gpu.host}:8000",
            gpu_type=gpu.gpu_type,
            models=gpu.models,
            labels=endpoint_labels(config, gpu.host),
        )
        assert source.endpoints(worker) == (config.endpoint, config.replay_endpoint)
        seen |= {config.endpoint, str(config.replay_endpoint)}
    assert len(seen) == 2 * len(plan.deployment.gpus)  # no two sockets shared


def test_without_the_option_nothing_is_published() -> None:
    plan = make_plan(UpConfig(processes=True))
    gpu, zone = plan.deployment.gpus[0], plan.deployment.zones[0]
    assert "--kv-events-config" not in gpu_argv(gpu, "etcd://x:1", 1.0)
    assert "--kv-events" not in zone_argv(zone, "etcd://x:1", 0.25)


def test_a_bound_tcp_endpoint_is_registered_at_the_workers_host() -> None:
    config = KVEventsConfig(
        enable_kv_cache_events=True, endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558"
    )
    assert endpoint_labels(config, "::1") == (
        ("kv-events", "tcp://[::1]:5557"),
        ("kv-events-replay", "tcp://[::1]:5558"),
    )
    # An endpoint the publisher connects out of names nothing a subscriber dials.
    connecting = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://10.0.0.9:5557")
    assert endpoint_labels(connecting, "10.0.0.5") == ()
    assert endpoint_labels(KVEventsConfig(), "10.0.0.5") == ()


def test_in_process_mode_refuses_it_naming_the_option() -> None:
    result = CliRunner().invoke(up, ["--kv-events"])
    assert result.exit_code == 2
    assert "--kv-events" in result.output
    assert "--processes" in result.output
