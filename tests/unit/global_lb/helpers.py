"""Shared builders for the global tier's tests: policies, regions, views, geo databases."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from mmdb_writer import MmdbF64, MMDBWriter
from netaddr import IPSet  # type: ignore[import-untyped]

from global_lb.health import HealthTable
from global_lb.keeper import build_view, merged_regions
from global_lb.view import GlobalView, LatencyModel
from gtm.models import Drain, DrainTarget, Endpoint, ModelLoad, Region, RegionSummary
from gtm.policy_store import ActivePolicy, activate
from gtm.state.snapshot import FleetSnapshot
from policies import load_examples

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAXMIND_TEST_DBS = Path(__file__).resolve().parents[3] / "data" / "geo" / "maxmind_test_dbs"

#: The example regions in id order; region i listens on 127.0.1.(i+1) and fd00::(i+1).
REGION_IDS = ("ap-northeast", "ap-southeast", "eu-central", "eu-west", "us-east", "us-west")

#: Networks of the generated test City database: (network, country, lat, lon).
CITY_NETWORKS: tuple[tuple[str, str, float, float], ...] = (
    ("81.2.69.0/24", "GB", 51.5142, -0.0931),  # London
    ("89.160.20.0/24", "SE", 58.4167, 15.6167),  # Linköping (GDPR)
    ("216.160.83.0/24", "US", 47.2513, -122.3149),  # Milton, WA
    ("198.51.100.0/24", "DE", 50.1109, 8.6821),  # Frankfurt (documentation prefix)
    ("203.0.113.0/25", "JP", 35.6762, 139.6503),  # Tokyo
    ("203.0.113.128/25", "SG", 1.3521, 103.8198),  # Singapore
    ("2001:218::/32", "JP", 35.6854, 139.7531),
    ("2a02:c7f::/32", "DE", 50.1109, 8.6821),
)


@functools.cache
def example_policy() -> ActivePolicy:
    return activate(1, load_examples())


def maxmind_test_db(name: str = "GeoIP2-City-Test") -> Path:
    path = MAXMIND_TEST_DBS.resolve() / f"{name}.mmdb"
    assert path.is_file(), f"missing MaxMind test database {path}"
    return path


def write_city_db(
    path: Path, networks: Iterable[tuple[str, str, float, float]] = CITY_NETWORKS
) -> Path:
    writer = MMDBWriter(
        ip_version=6, database_type="GeoIP2-City", languages=["en"], ipv4_compatible=True
    )
    for network, country, lat, lon in networks:
        writer.insert_network(
            IPSet([network]),
            {
                "country": {"iso_code": country},
                "location": {"latitude": MmdbF64(lat), "longitude": MmdbF64(lon)},
            },
        )
    writer.to_db_file(str(path))
    return path


def topology(port: int = 8000, ports: Mapping[str, int] | None = None) -> tuple[Region, ...]:
    """The example regions with a regional LB endpoint each (127.0.1.N and fd00::N)."""
    base = merged_regions(example_policy(), (), FleetSnapshot(revision=0))
    out = []
    for index, rid in enumerate(REGION_IDS):
        p = (ports or {}).get(rid, port)
        endpoints = (
            Endpoint(
                url=f"http://127.0.1.{index + 1}:{p}",
                address=ipaddress.ip_address(f"127.0.1.{index + 1}"),
            ),
            Endpoint(
                url=f"http://[fd00::{index + 1}]:{p}",
                address=ipaddress.ip_address(f"fd00::{index + 1}"),
            ),
        )
        out.append(base[rid].model_copy(update={"endpoints": endpoints}))
    return tuple(out)


def address_of(region_id: str, version: int = 4) -> str:
    index = REGION_IDS.index(region_id) + 1
    return f"127.0.1.{index}" if version == 4 else f"fd00::{index}"


def load(
    *,
    model: str = MODEL,
    running: int = 0,
    waiting: int = 0,
    max_running: int = 100,
    queued: int = 0,
    prefill: float = 20_000.0,
    gpus: int = 4,
    healthy_gpus: int | None = None,
) -> ModelLoad:
    return ModelLoad(
        model=model,
        gpus=gpus,
        healthy_gpus=gpus if healthy_gpus is None else healthy_gpus,
        prefill_tokens_per_s=prefill,
        queued_prefill_tokens=queued,
        running_requests=running,
        waiting_requests=waiting,
        max_running_requests=max_running,
    )


def summary(region_id: str, *loads: ModelLoad, healthy: bool = True) -> RegionSummary:
    return RegionSummary(
        region_id=region_id,
        published_at=1.0,
        healthy=healthy,
        zones_total=2,
        zones_healthy=2 if healthy else 0,
        models=loads or (load(),),
    )


def snapshot(
    revision: int = 1,
    summaries: Iterable[RegionSummary] = (),
    drained: Iterable[str] = (),
    regions: Iterable[Region] = (),
) -> FleetSnapshot:
    drains = {f"region/{r}": Drain(target=DrainTarget.REGION, id=r) for r in drained}
    return FleetSnapshot(
        revision=revision,
        regions=MappingProxyType({r.id: r for r in regions}),
        region_summaries=MappingProxyType({s.region_id: s for s in summaries}),
        drains=MappingProxyType(drains),
    )


def health_table(down: Iterable[str] = (), epoch: int = 1, fail_open: bool = False) -> HealthTable:
    status = {
        rid: (rid not in set(down), "" if rid not in set(down) else "refused") for rid in REGION_IDS
    }
    return HealthTable(epoch, MappingProxyType(status), fail_open)


def view(
    *,
    summaries: Iterable[RegionSummary] = (),
    down: Iterable[str] = (),
    drained: Iterable[str] = (),
    revision: int = 1,
    policy: ActivePolicy | None = None,
    latency: LatencyModel | None = None,
    require_summaries: bool = False,
) -> GlobalView:
    return build_view(
        policy or example_policy(),
        snapshot(revision, summaries, drained),
        health_table(down, epoch=revision),
        topology=topology(),
        latency=latency,
        require_summaries=require_summaries,
    )
