"""Where ``gtm load``'s clients are: world cities by population, each behind a
documentation prefix that ``gtm up``'s front door locates with its geo map.

Load comes from one machine, so the client's place travels in ``X-Forwarded-For``
(the front door of ``gtm up`` trusts loopback peers as proxies). The addresses are from
the IPv6 documentation prefix ``2001:db8::/32`` (RFC 3849): they can never be anyone
real, and no GeoIP database knows them, so the geo map that ``gtm up`` installs is the
only thing that places them. City *i* of :func:`bundled_cities` owns ``2001:db8:i::/48``.
Both commands read the same bundled list, so they agree without talking to each other.
"""

from __future__ import annotations

import bisect
import csv
import io
import ipaddress
import itertools
import random
from dataclasses import dataclass
from importlib import resources
from typing import Any

from gtm.errors import ConfigError
from gtm.models import GeoPoint

#: RFC 3849: reserved for documentation; never routed, never in a GeoIP database.
CLIENT_SUPERNET = ipaddress.IPv6Network("2001:db8::/32")
#: Each city gets a /48 of it (the third hextet is the city's index).
CITY_PREFIXLEN = 48
CITIES_RESOURCE = "cities.csv"


@dataclass(frozen=True, slots=True)
class City:
    name: str
    country: str
    location: GeoPoint
    population: int


def read_cities(text: str, source: str = CITIES_RESOURCE) -> tuple[City, ...]:
    """Parse ``city,country,lat,lon,population`` rows (``#`` lines are comments)."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    cities: list[City] = []
    for row_number, row in enumerate(csv.DictReader(io.StringIO("\n".join(lines))), start=2):
        try:
            cities.append(
                City(
                    name=row["city"],
                    country=row["country"],
                    location=GeoPoint(lat=float(row["lat"]), lon=float(row["lon"])),
                    population=int(row["population"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: row {row_number}: {exc}") from None
    if not cities:
        raise ConfigError(f"{source}: no cities")
    if len(cities) > 1 << 16:
        raise ConfigError(f"{source}: at most 65536 cities (one /48 of 2001:db8::/32 each)")
    return tuple(cities)


def bundled_cities() -> tuple[City, ...]:
    """The 500 most populous places of GeoNames, shipped in ``gtm/data/cities.csv``."""
    return read_cities((resources.files("gtm.data") / CITIES_RESOURCE).read_text("utf-8"))


def city_network(index: int) -> ipaddress.IPv6Network:
    """City ``index``'s /48 inside :data:`CLIENT_SUPERNET`."""
    if not 0 <= index < 1 << 16:
        raise ValueError(f"city index {index} out of range")
    base = int(CLIENT_SUPERNET.network_address) | (index << (128 - CITY_PREFIXLEN))
    return ipaddress.IPv6Network((base, CITY_PREFIXLEN))


def geo_map(cities: tuple[City, ...]) -> dict[str, Any]:
    """The front door's ``--geo-map`` document placing every city's prefix."""
    networks = [
        {
            "network": str(city_network(i)),
            "country": city.country,
            "location": {"lat": city.location.lat, "lon": city.location.lon},
            "name": city.name[:128],
        }
        for i, city in enumerate(cities)
    ]
    return {"networks": networks, "include_special_purpose": True}


@dataclass(frozen=True, slots=True)
class Client:
    city: City
    address: ipaddress.IPv6Address


class ClientSampler:
    """Draws clients: a city with probability proportional to its population, then a
    random address inside the city's prefix (seeded, so a run is reproducible)."""

    def __init__(self, cities: tuple[City, ...], rng: random.Random) -> None:
        self._cities = cities
        self._rng = rng
        self._cumulative = list(itertools.accumulate(c.population for c in cities))
        if not self._cumulative or self._cumulative[-1] <= 0:
            raise ConfigError("the client cities have no population to sample from")

    def sample(self) -> Client:
        point = self._rng.uniform(0, self._cumulative[-1])
        index = min(bisect.bisect_right(self._cumulative, point), len(self._cities) - 1)
        network = city_network(index)
        host = self._rng.getrandbits(128 - CITY_PREFIXLEN) | 1  # never the subnet anycast
        return Client(self._cities[index], network.network_address + host)
