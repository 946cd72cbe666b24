"""One small real deployment per test module: ``gtm up --processes`` with two regions of
one zone and one GPU each, a 3-member etcd and every kind of fault-proxy link."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from chaos.deployment import Deployment, LaunchSpec
from gtm.topology import GpuGroup, RegionSpec, Topology, ZoneSpec, on_private_block, write_topology
from gtmctl.up.control import LinkKind

CHAT = "meta-llama/Llama-3.1-8B-Instruct"
#: Bound on waiting for an effect (a restart, a registration, a DNS change).
CONVERGE_S = 20.0


def small_topology(path: Path) -> Path:
    """eu-west and eu-central, one zone of one L4 each, on a random 127.x.y.0/24."""
    regions = tuple(
        RegionSpec(
            id=region,
            address=f"127.0.0.{i}",  # moved to a private block below
            zones=(
                ZoneSpec(id=f"{region}-a", gpus=(GpuGroup(type="L4", count=1, models=(CHAT,)),)),
            ),
        )
        for i, region in enumerate(("eu-west", "eu-central"), start=1)
    )
    topology = on_private_block(Topology(regions=regions, models=(CHAT,)), random.Random())
    return write_topology(topology, path)


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + CONVERGE_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {CONVERGE_S} s: {what}")
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def deployment(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    root = tmp_path_factory.mktemp("deployment")
    spec = LaunchSpec(
        topology=small_topology(root / "topology.yaml"),
        speedup=50.0,
        etcd_members=3,
        run_dir=root / "run",
        chaos_links=tuple(LinkKind),
        ready_timeout_s=60.0,
    )
    async with Deployment.launch(spec) as launched:
        yield launched
