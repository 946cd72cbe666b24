"""What every ``gtm up`` mode shares: the plan (policies, the topology resolved against
them, the run directory), seeding the store, and waiting until the deployment answers.

A deployment is *ready* when every deployed zone publishes a summary in which every
GPU of every model it serves is healthy, every region publishes a summary with all of
its zones healthy, the DNS server answers ``<region>.api.<zone>`` with the region's
address for every region, and the front door's ``/readyz`` says yes. Only then does
``gtm up`` print its examples, so the first copy-pasted command works.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Protocol, TypeVar

import aiohttp
import dns.asyncquery
import dns.exception
import dns.message
import dns.rdatatype

from gtm.clock import Clock
from gtm.credentials import KeyRef, KeySource, WorkerKey, read_key
from gtm.errors import ConfigError, GtmError, StateError
from gtm.models import Region, RegionSummary, Zone, ZoneSummary
from gtm.policy_backup import save_previous
from gtm.policy_plan import Change
from gtm.policy_store import apply, plan_apply
from gtm.state import codec, keys
from gtm.state.store import StateStore
from gtm.topology import Deployment, Topology, ZonePlacement, load_topology, resolve
from gtm.trust import TIER_KEY_ENV
from gtmctl.up.clients import bundled_cities, geo_map
from gtmctl.up.config import HostPort, UpConfig
from gtmctl.up.policy_profile import pooled
from policies import PolicyError, PolicySet, load_paths
from policies.loader import examples_path

log = logging.getLogger(__name__)

#: The DNS zone ``gtm up`` serves (ARCHITECTURE §9).
DNS_ZONE = "inference.example."

#: How often readiness is re-checked while the deployment comes up, s.
READY_POLL_S = 0.25


class NotReady(GtmError):
    """The deployment did not answer within the time allowed; says what is missing."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything decided before anything starts."""

    config: UpConfig
    policy_set: PolicySet
    topology: Topology
    deployment: Deployment
    run_dir: Path
    owns_run_dir: bool
    geo_map_path: Path
    #: The key the tiers sign their headers with (:mod:`gtm.trust`), new for each run
    #: unless the environment gives one (``GTM_PEER_TOKEN``); never written to disk.
    tier_key: str = field(
        default_factory=lambda: os.environ.get(TIER_KEY_ENV) or secrets.token_urlsafe(32),
        repr=False,
    )
    #: The emulated workers' API key (``--worker-api-key-file``), read before anything
    #: starts so that a bad file stops ``gtm up`` with its name.
    worker_key: WorkerKey | None = field(default=None, repr=False)

    @property
    def dns(self) -> HostPort:
        return self.config.dns

    @property
    def http(self) -> HostPort:
        return self.config.http

    def regional_port(self) -> int:
        """The regional LBs answer on the front door's port (on their own addresses)."""
        return self.config.http.port or self.topology.regional_port


#: Added to the example policies (only to them): ``gtm load``'s tenant, without quotas.
LOAD_TENANT_RESOURCE = "load-tenant.yaml"


def load_policies(paths: tuple[str, ...]) -> PolicySet:
    """The given policy files, or the shipped examples plus the load-test tenant."""
    try:
        if paths:
            return load_paths(list(paths))
        with resources.as_file(resources.files("gtm.data") / LOAD_TENANT_RESOURCE) as extra:
            return load_paths([examples_path(), extra])
    except PolicyError as exc:
        raise ConfigError(f"policies: {exc}") from None


def make_plan(config: UpConfig) -> Plan:
    """Load and check everything; create the run directory. Raises ConfigError."""
    key_file = config.worker_api_key_file
    worker_key = None
    if key_file is not None:
        worker_key = read_key(KeyRef(source=KeySource.FILE, name=key_file), os.environ)
    policy_set = load_policies(config.policies)
    topology = load_topology(config.topology)
    if config.tiers.region_pool:
        topology = pooled(topology)
    port = config.http.port or topology.regional_port
    deployment = resolve(topology, policy_set.regions, regional_port=port)
    if config.run_dir is not None:
        run_dir = Path(config.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        owns = False
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="gtm-up-"))
        owns = True
    geo_map_path = run_dir / "geo-map.json"
    geo_map_path.write_text(json.dumps(geo_map(bundled_cities())), "utf-8")
    return Plan(
        config,
        policy_set,
        topology,
        deployment,
        run_dir,
        owns,
        geo_map_path,
        worker_key=worker_key,
    )


def remove_run_dir(plan: Plan) -> None:
    if plan.owns_run_dir:
        shutil.rmtree(plan.run_dir, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class Started:
    """Where a started deployment's front services listen (ports as bound)."""

    dns: HostPort
    http: HostPort
    status_url: str
    #: The store every tier uses (a private etcd's URL when ``gtm up`` started one).
    state: str


class Fleet(Protocol):
    """A running deployment, in one process or many."""

    @property
    def store(self) -> StateStore: ...

    async def start(self) -> Started: ...

    async def stop(self) -> None: ...

    def mark_ready(self) -> None:
        """Called once the deployment passed :func:`wait_ready`."""
        ...


# ---------------------------------------------------------------------------- the store


_Placed = TypeVar("_Placed", Region, Zone)


async def seed_store(
    store: StateStore,
    plan: Plan,
    clock: Clock,
    *,
    urls: Mapping[str, str] | None = None,
) -> int:
    """Apply the policies and write the region and zone records; return the policy
    generation in force. Records are static (no lease): the deployment owns them and
    :func:`unseed_store` removes them on the way out.

    ``urls`` (region or zone id → URL) replaces where the tier above reaches that
    region's LB or zone agent: ``--chaos-links`` puts a fault-proxy link there. DNS
    answers keep the region's own address."""
    moved = urls or {}
    await _say_what_is_replaced(store, plan)
    result = await apply(store, plan.policy_set, None, clock=clock, applied_by="gtm up")
    for region in plan.deployment.regions:
        record = _moved(region.region, moved.get(region.id))
        await store.put(keys.region(region.id), codec.encode(record))
        for zone in region.zones:
            zone_record = _moved(zone.record(), moved.get(zone.id))
            await store.put(keys.zone(region.id, zone.id), codec.encode(zone_record))
    return result.generation


async def _say_what_is_replaced(store: StateStore, plan: Plan) -> None:
    """``gtm up`` makes its policies the store's whole policy. On a store that already
    holds a generation (``--state`` of an etcd used before), say which documents that
    replaces or deletes and save the generation in the run directory first, so nothing
    an operator applied there disappears unsaid (:mod:`gtm.policy_backup`)."""
    replacing = await plan_apply(store, plan.policy_set.documents, prune=True)
    changed = replacing.of(Change.CHANGED, Change.DELETED)
    if not replacing.base_generation or not changed:
        return
    state = plan.config.state if plan.config.uses_etcd else "<gtm up's private etcd>"
    saved = await save_previous(store, state, replacing, plan.run_dir / "policy-backups")
    log.warning(
        "gtm up replaces policy generation %d of the store with its own policies: %s; "
        "the generation was saved in %s (gtm policy apply --prune --state %s %s puts it back)",
        replacing.base_generation,
        ", ".join(f"{c.change.value} {c.ref}" for c in changed),
        saved,
        state,
        saved,
    )


def _moved(record: _Placed, url: str | None) -> _Placed:
    if url is None or not record.endpoints:
        return record
    first = record.endpoints[0].model_copy(update={"url": url})
    return record.model_copy(update={"endpoints": (first, *record.endpoints[1:])})


async def unseed_store(store: StateStore, plan: Plan) -> None:
    """Remove the records :func:`seed_store` wrote (never raises: best effort)."""
    try:
        for region in plan.deployment.regions:
            for zone in region.zones:
                await store.delete(keys.zone(region.id, zone.id))
            await store.delete(keys.region(region.id))
    except StateError as exc:
        log.warning("could not remove the deployment's records from the store: %s", exc)


# ---------------------------------------------------------------------------- readiness


async def _summaries(store: StateStore) -> tuple[dict[str, ZoneSummary], dict[str, RegionSummary]]:
    zones: dict[str, ZoneSummary] = {}
    for kv in (await store.range(keys.prefix(keys.Kind.ZONE_SUMMARY))).kvs:
        summary = codec.decode(kv.key, kv.value, ZoneSummary)
        zones[summary.zone_id] = summary
    regions: dict[str, RegionSummary] = {}
    for kv in (await store.range(keys.prefix(keys.Kind.REGION_SUMMARY))).kvs:
        region_summary = codec.decode(kv.key, kv.value, RegionSummary)
        regions[region_summary.region_id] = region_summary
    return zones, regions


def zone_problem(zone: ZonePlacement, summary: ZoneSummary | None) -> str:
    """Why ``zone`` is not ready yet ("" when it is)."""
    if summary is None:
        return f"zone {zone.id}: no summary yet"
    wanted: dict[str, int] = {}
    for gpu in zone.gpus:
        for model in gpu.models:
            wanted[model] = wanted.get(model, 0) + 1
    for model, count in wanted.items():
        load = summary.load_for(model)
        healthy = 0 if load is None else load.healthy_gpus
        if healthy < count:
            return f"zone {zone.id}: {healthy}/{count} GPUs ready for {model}"
    return ""


def store_problems(
    deployment: Deployment, zones: Mapping[str, ZoneSummary], regions: Mapping[str, RegionSummary]
) -> list[str]:
    problems = [zone_problem(z, zones.get(z.id)) for z in deployment.zones]
    for region in deployment.regions:
        summary = regions.get(region.id)
        if summary is None:
            problems.append(f"region {region.id}: no summary yet")
        elif summary.zones_healthy < len(region.zones):
            problems.append(
                f"region {region.id}: {summary.zones_healthy}/{len(region.zones)} zones healthy"
            )
    return [p for p in problems if p]


async def dns_problems(dns_at: HostPort, deployment: Deployment) -> list[str]:
    """Regions whose own name does not resolve to their address yet."""
    problems = []
    for region in deployment.regions:
        name = f"{region.id}.api.{DNS_ZONE}"
        query = dns.message.make_query(name, dns.rdatatype.A)
        try:
            answer = await dns.asyncquery.udp(query, dns_at.host, timeout=1.0, port=dns_at.port)
        except (dns.exception.DNSException, OSError) as exc:
            problems.append(f"DNS {name}: {type(exc).__name__}")
            continue
        addresses = {rr.to_text() for rrset in answer.answer for rr in rrset}
        if region.host not in addresses:
            problems.append(f"DNS {name}: not answered yet")
    return problems


async def http_problems(session: aiohttp.ClientSession, http: HostPort) -> list[str]:
    try:
        async with session.get(f"{http.url}/readyz") as response:
            if response.status == 200:
                return []
            return [f"front door /readyz: HTTP {response.status}"]
    except (aiohttp.ClientError, TimeoutError) as exc:
        return [f"front door /readyz: {type(exc).__name__}"]


async def wait_ready(
    store: StateStore, plan: Plan, *, dns_at: HostPort, http: HostPort, limit_s: float
) -> float:
    """Wait until the deployment answers (see the module docstring); return how long
    it took. Raises NotReady naming what was still missing at the deadline."""
    started = time.monotonic()
    problems: list[str] = ["nothing checked yet"]
    timeouts = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeouts) as session:
        while time.monotonic() - started < limit_s:
            try:
                problems = store_problems(plan.deployment, *await _summaries(store))
            except StateError as exc:
                problems = [f"state store: {exc}"]
            if not problems:
                problems = await dns_problems(dns_at, plan.deployment)
            if not problems:
                problems = await http_problems(session, http)
            if not problems:
                return time.monotonic() - started
            await asyncio.sleep(READY_POLL_S)
    shown = "; ".join(problems[:6]) + (
        f" (and {len(problems) - 6} more)" if len(problems) > 6 else ""
    )
    raise NotReady(f"the deployment is not ready after {limit_s:.0f} s: {shown}")
