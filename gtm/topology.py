"""The deployment topology: which zones and GPUs each region has, and where they listen.

Regions themselves — id, name, location, country, jurisdiction — have one source of
truth, the policies' ``Regions`` document (``policies/examples/regions.yaml``). A
topology only adds what a *deployment* needs on top of them:

* the loopback (or real) address each region's regional LB listens on — the address
  that DNS answers for the region carry (ARCHITECTURE §9: ``127.0.1.N`` locally);
* the region's zones, and the GPU workers of each zone: GPU type, models, how many;
* the ports of the regional LBs and zone agents.

The example deployment of ``gtm up`` ships as package data
(``gtm/data/example-topology.yaml``); ``gtm up --print-topology`` prints it, and an
edited copy goes back in with ``--topology FILE``. :func:`resolve` checks a topology
against a policy set and gives the :class:`~gtm.models.Region` and
:class:`~gtm.models.Zone` records a deployment writes to the state store.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, model_validator

from gtm.errors import ConfigError
from gtm.gpu_profiles import UnknownProfile, get_profile
from gtm.models import Endpoint, Frozen, GeoPoint, Identifier, ModelName, Region, Zone
from policies.documents import Region as PolicyRegion

#: The shipped example (six regions on four continents, two zones each).
EXAMPLE_RESOURCE = "example-topology.yaml"

#: Ports are the same on every region's address: the regional LB answers where the
#: front door does (so ``curl http://<DNS answer>:8080/v1/...`` works), zone agents
#: follow from 8101 (8100 is ``gtm zone``'s default, kept free for a hand-run agent).
DEFAULT_REGIONAL_PORT = 8080
DEFAULT_ZONE_PORT_BASE = 8101

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class GpuGroup(Frozen):
    """``count`` emulated workers of one GPU type, each serving ``models``."""

    type: str = Field(min_length=1, max_length=63)
    models: tuple[ModelName, ...] = Field(min_length=1)
    count: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _profiles_exist(self) -> GpuGroup:
        for model in self.models:
            try:
                get_profile(self.type, model)
            except UnknownProfile as exc:
                raise ValueError(str(exc)) from None
        return self


class ZoneSpec(Frozen):
    id: Identifier
    gpus: tuple[GpuGroup, ...] = Field(min_length=1)
    #: The zone agent's port (default: ``zone_port_base`` + the zone's index in its region).
    port: int | None = Field(default=None, ge=1, le=65535)

    @property
    def gpu_count(self) -> int:
        return sum(g.count for g in self.gpus)


class RegionSpec(Frozen):
    """A deployed region: its address and zones (the rest is in the policies)."""

    id: Identifier
    #: Where its regional LB and zone agents listen; DNS answers carry it.
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    zones: tuple[ZoneSpec, ...] = Field(min_length=1)


class Topology(Frozen):
    """A whole deployment (``--topology FILE``)."""

    regions: tuple[RegionSpec, ...] = Field(min_length=1, max_length=256)
    #: The models the deployment serves (when given, every GPU's models must be among
    #: them: a typo in one GPU line is an error, not a model nobody else serves).
    models: tuple[ModelName, ...] = ()
    regional_port: int = Field(default=DEFAULT_REGIONAL_PORT, ge=1, le=65535)
    zone_port_base: int = Field(default=DEFAULT_ZONE_PORT_BASE, ge=1, le=65535)

    @model_validator(mode="after")
    def _unique(self) -> Topology:
        _no_duplicates("region", [r.id for r in self.regions])
        # Zone ids are global: zone agents find their GPUs by zone id alone.
        _no_duplicates("zone", [z.id for r in self.regions for z in r.zones])
        _no_duplicates("address", [str(r.address) for r in self.regions])
        for region in self.regions:
            ports = [self.zone_port(region, z) for z in region.zones]
            _no_duplicates(f"zone port in region {region.id}", [str(p) for p in ports])
            if self.regional_port in ports:
                raise ValueError(
                    f"region {region.id}: a zone agent port equals the regional LB port "
                    f"{self.regional_port}"
                )
        if self.models:
            stray = sorted(set(self.served_models) - set(self.models))
            if stray:
                raise ValueError(f"GPUs serve {', '.join(stray)}, which 'models' does not list")
        return self

    def zone_port(self, region: RegionSpec, zone: ZoneSpec) -> int:
        if zone.port is not None:
            return zone.port
        index = next(i for i, z in enumerate(region.zones) if z.id == zone.id)
        return self.zone_port_base + index

    @property
    def gpu_count(self) -> int:
        return sum(z.gpu_count for r in self.regions for z in r.zones)

    @property
    def served_models(self) -> tuple[str, ...]:
        """Every model served somewhere, in first-seen order."""
        seen = (m for r in self.regions for z in r.zones for g in z.gpus for m in g.models)
        return tuple(dict.fromkeys(seen))


def _no_duplicates(what: str, values: list[str]) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{what} {value!r} is listed twice")
        seen.add(value)


# ---------------------------------------------------------------------------- loading


def example_text() -> str:
    """The example topology's YAML, comments included (``gtm up --print-topology``)."""
    return (resources.files("gtm.data") / EXAMPLE_RESOURCE).read_text("utf-8")


def parse_topology(text: str, source: str = "<topology>") -> Topology:
    """Parse and validate a topology; ConfigError naming ``source`` and the field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a topology is a mapping with a 'regions' list")
    try:
        return Topology.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            ".".join(str(p) for p in e["loc"]) + ": " + e["msg"]
            for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"{source}: invalid topology: {problems}") from None


def load_topology(path: str | Path | None = None) -> Topology:
    """The topology in ``path``, or the shipped example when ``path`` is None."""
    if path is None:
        return parse_topology(example_text(), EXAMPLE_RESOURCE)
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the topology: {exc.strerror}") from None
    return parse_topology(text, str(path))


def on_private_block(topology: Topology, rng: random.Random) -> Topology:
    """``topology`` moved to a random 127.x.y.0/24 block (region i at .i) with a random
    zone-port base: a deployment that never collides with ``make up`` (127.0.1.N:8101…)
    or another run on the machine. Game days, tests and benchmarks launch on it."""
    block = f"127.{rng.randrange(100, 250)}.{rng.randrange(1, 250)}"
    data = topology.model_dump()
    for i, region in enumerate(data["regions"], start=1):
        region["address"] = f"{block}.{i}"
    data["zone_port_base"] = rng.randrange(20_000, 30_000)
    return Topology.model_validate(data)  # validated again, as a file would be


def write_topology(topology: Topology, path: Path) -> Path:
    """``topology`` as a file ``gtm up --topology`` reads."""
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")), "utf-8")
    return path


# ---------------------------------------------------------------------------- resolving


@dataclass(frozen=True, slots=True)
class GpuPlacement:
    """One emulated worker of a resolved deployment."""

    id: str
    region: str
    zone: str
    gpu_type: str
    models: tuple[str, ...]
    host: str
    seed: int


@dataclass(frozen=True, slots=True)
class ZonePlacement:
    id: str
    region: str
    host: str
    port: int
    gpus: tuple[GpuPlacement, ...]

    @property
    def url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.port}"

    def record(self) -> Zone:
        return Zone(id=self.id, region_id=self.region, endpoints=(Endpoint(url=self.url),))


@dataclass(frozen=True, slots=True)
class RegionPlacement:
    """A deployed region: its policy record, its regional LB's listener, its zones."""

    region: Region
    host: str
    port: int
    zones: tuple[ZonePlacement, ...]

    @property
    def id(self) -> str:
        return self.region.id

    @property
    def url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.port}"


@dataclass(frozen=True, slots=True)
class Deployment:
    """A topology resolved against the policies' regions."""

    regions: tuple[RegionPlacement, ...]
    #: Policy regions the topology does not deploy (they stay unavailable).
    undeployed: tuple[str, ...]

    @property
    def zones(self) -> tuple[ZonePlacement, ...]:
        return tuple(z for r in self.regions for z in r.zones)

    @property
    def gpus(self) -> tuple[GpuPlacement, ...]:
        return tuple(g for z in self.zones for g in z.gpus)

    def region(self, region_id: str) -> RegionPlacement:
        return next(r for r in self.regions if r.id == region_id)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def region_record(spec: PolicyRegion, endpoints: tuple[Endpoint, ...] = ()) -> Region:
    """A policy region as the store's :class:`~gtm.models.Region` record. Without a
    jurisdiction label of its own, the region is labelled by its country code."""
    return Region(
        id=spec.id,
        name=spec.name,
        location=GeoPoint(lat=spec.location.lat, lon=spec.location.lon),
        jurisdiction=spec.jurisdiction or spec.country.lower(),
        country=spec.country,
        endpoints=endpoints,
    )


def resolve(
    topology: Topology,
    policy_regions: Mapping[str, PolicyRegion],
    *,
    regional_port: int | None = None,
) -> Deployment:
    """Check ``topology`` against the policies' regions; place every LB, agent and GPU.

    ``regional_port`` overrides the topology's (``gtm up`` passes the front door's port,
    so a region answers on the same port as the front door). Raises ConfigError when
    the topology deploys a region the policies do not define.
    """
    unknown = [r.id for r in topology.regions if r.id not in policy_regions]
    if unknown:
        raise ConfigError(
            f"the topology deploys {', '.join(unknown)}, which the policies do not define "
            f"(policy regions: {', '.join(sorted(policy_regions)) or 'none'}); regions come "
            "from the policies' Regions document"
        )
    port = regional_port or topology.regional_port
    placements = tuple(
        _place_region(topology, spec, policy_regions[spec.id], port, index)
        for index, spec in enumerate(topology.regions)
    )
    deployed = {r.id for r in topology.regions}
    undeployed = tuple(sorted(set(policy_regions) - deployed))
    return Deployment(placements, undeployed)


def _place_region(
    topology: Topology, spec: RegionSpec, policy: PolicyRegion, port: int, index: int
) -> RegionPlacement:
    host = str(spec.address)
    url = f"http://{_url_host(host)}:{port}"
    record = region_record(policy, (Endpoint(url=url, address=spec.address),))
    zones = tuple(
        ZonePlacement(
            id=zone.id,
            region=spec.id,
            host=host,
            port=topology.zone_port(spec, zone),
            gpus=_place_gpus(spec.id, zone, host, seed=1000 * index + 100 * zi),
        )
        for zi, zone in enumerate(spec.zones)
    )
    return RegionPlacement(record, host, port, zones)


def _place_gpus(region: str, zone: ZoneSpec, host: str, *, seed: int) -> tuple[GpuPlacement, ...]:
    placed: list[GpuPlacement] = []
    for group in zone.gpus:
        for _ in range(group.count):
            n = len(placed) + 1
            gpu_id = f"{zone.id}-{group.type.lower()}-{n}"
            placed.append(
                GpuPlacement(gpu_id, region, zone.id, group.type, group.models, host, seed + n)
            )
    return tuple(placed)
