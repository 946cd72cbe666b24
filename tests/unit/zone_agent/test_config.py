from __future__ import annotations

import pytest

from gtm.errors import ConfigError
from zone_agent.config import UNKNOWN_GPU_TYPE, ZoneConfig, parse_worker


@pytest.mark.parametrize(
    ("spec", "id", "gpu", "models", "labels"),
    [
        ("http://127.0.0.1:8001", "w-127-0-0-1-8001", UNKNOWN_GPU_TYPE, (), ()),
        ("http://10.0.0.5:9000/,gpu=H100", "w-10-0-0-5-9000", "H100", (), ()),
        (
            "https://gpu.example:443,id=gpu-7,model=m1,model=m2,label:canary=true",
            "gpu-7",
            UNKNOWN_GPU_TYPE,
            ("m1", "m2"),
            (("canary", "true"),),
        ),
    ],
)
def test_worker_specs(
    spec: str, id: str, gpu: str, models: tuple[str, ...], labels: tuple[tuple[str, str], ...]
) -> None:
    worker = parse_worker(spec)
    assert (worker.id, worker.gpu_type, worker.models, worker.labels) == (id, gpu, models, labels)
    record = worker.record("z", "r")
    assert record.zone_id == "z"
    assert record.url == worker.url


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("127.0.0.1:8001", "expected http"),
        ("http://h:1,gpu", "not KEY=VALUE"),
        ("http://h:1,colour=red", "unknown option"),
        ("http://h:1,id=Not_Valid", "id"),
    ],
)
def test_bad_worker_specs(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_worker(spec)


def test_defaults() -> None:
    config = ZoneConfig(zone="z", region="r")
    assert config.scrape_interval_s == 0.25
    assert config.max_attempts == 3
    assert config.summary_interval_s == 1.0
