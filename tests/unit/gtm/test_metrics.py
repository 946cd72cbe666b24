from __future__ import annotations

import asyncio
import platform
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import Counter, Enum, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gtm._version import __version__
from gtm.metrics import (
    BUILD_INFO,
    OTHER_MODEL,
    ModelLabel,
    build_commit,
    exposition,
    new_registry,
    register_runtime,
)


def test_runtime_collectors_and_build_info_once_per_registry() -> None:
    registry = new_registry()
    register_runtime(registry)
    register_runtime(registry)  # a second app on the same registry: nothing twice
    names = {family.name for family in registry.collect()}
    assert {"process_cpu_seconds", "python_info", "python_gc_collections", "gtm_build_info"} <= (
        names
    )
    (family,) = (f for f in registry.collect() if f.name == BUILD_INFO)
    (sample,) = family.samples
    assert sample.value == 1
    assert sample.labels["version"] == __version__
    assert sample.labels["python"] == platform.python_version()
    assert sample.labels["commit"]


def test_a_new_registry_has_no_runtime_collectors() -> None:
    assert list(new_registry().collect()) == []


def test_build_commit_from_env_then_git_then_unknown(tmp_path: Path) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert build_commit({"GTM_BUILD_COMMIT": "abc"}, tmp_path) == "abc"
    assert build_commit({}, tmp_path) == "unknown"
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs\n{sha} refs/heads/main\n")
    assert build_commit({}, tmp_path) == sha
    (git / "refs" / "heads" / "main").write_text(sha.replace("0", "f") + "\n")
    assert build_commit({}, tmp_path) == sha.replace("0", "f")
    (git / "HEAD").write_text(sha + "\n")  # detached
    assert build_commit({}, tmp_path) == sha


def test_model_label_is_bounded_and_folds_unknown_models() -> None:
    label = ModelLabel(limit=2)
    assert label("a") == "a"
    assert label("b") == "b"
    assert label("c") == OTHER_MODEL  # past the limit
    assert label("a") == "a"  # a value already in use stays
    assert label("a", known=False) == OTHER_MODEL  # the view does not serve it


class _Wide(Collector):
    """``families`` gauge families of ``samples`` samples each, made one at a time."""

    def __init__(self, families: int, samples: int) -> None:
        self.families, self.samples = families, samples

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for f in range(self.families):
            family = GaugeMetricFamily(f"gtm_test_wide_{f}", "A wide family.", labels=["gpu"])
            for i in range(self.samples):
                family.add_metric([f"gpu-{i}"], i / 7)
            yield family


async def test_exposition_is_generate_latest_byte_for_byte() -> None:
    registry = new_registry()  # (no process collector: its CPU seconds move meanwhile)
    Counter("gtm_test_requests", "Requests.", ["code"], registry=registry).labels("200").inc(3)
    Gauge("gtm_test_up", "Up, with a \\ and a\nnewline.", registry=registry).set(1.5)
    Histogram("gtm_test_seconds", "Latency.", registry=registry).observe(0.3)
    Summary("gtm_test_bytes", "Sizes.", registry=registry).observe(1024)
    Info("gtm_test_build", "Build.", registry=registry).info({"version": 'a"b'})
    Enum("gtm_test_state", "State.", states=["up", "down"], registry=registry).state("down")
    registry.register(_Wide(3, 50))
    assert await exposition(registry) == generate_latest(registry)


async def test_exposition_lets_the_loop_turn_between_families() -> None:
    registry = new_registry()
    registry.register(_Wide(40, 2_000))
    turns = 0
    done = False

    async def count() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    async def render() -> bytes:
        nonlocal done
        try:
            return await exposition(registry)
        finally:
            done = True

    _, text = await asyncio.gather(count(), render())
    assert text == generate_latest(registry)
    assert turns > 5  # 80,000 samples: many milliseconds, sliced
