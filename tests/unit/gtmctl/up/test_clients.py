from __future__ import annotations

import ipaddress
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from global_lb.geo import GeoMapFile, load_geo_map
from gtm.errors import ConfigError
from gtmctl.up.clients import (
    CLIENT_SUPERNET,
    ClientSampler,
    bundled_cities,
    city_network,
    geo_map,
    read_cities,
)


def test_bundled_cities_are_the_largest_first() -> None:
    cities = bundled_cities()
    assert len(cities) == 500
    assert cities[0].name == "Shanghai"
    assert cities[0].population >= cities[-1].population
    assert {c.country for c in cities} >= {"GB", "DE", "US", "JP", "IN", "BR"}


def test_each_city_owns_a_distinct_documentation_prefix() -> None:
    networks = [city_network(i) for i in range(500)]
    assert len(set(networks)) == 500
    assert all(n.subnet_of(CLIENT_SUPERNET) for n in networks)
    assert city_network(1) == ipaddress.IPv6Network("2001:db8:1::/48")
    with pytest.raises(ValueError, match="out of range"):
        city_network(1 << 16)


def test_geo_map_is_what_the_front_door_reads() -> None:
    document = geo_map(bundled_cities())
    parsed = GeoMapFile.model_validate(document)
    assert len(parsed.networks) == 500
    london = next(e for e in parsed.networks if e.name == "London")
    assert london.country == "GB"


def test_geo_map_locates_a_sampled_client(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps(geo_map(bundled_cities())))
    cidr = load_geo_map(path)
    sampler = ClientSampler(bundled_cities(), random.Random(7))
    for _ in range(50):
        client = sampler.sample()
        located = cidr.locate(client.address)
        assert located is not None
        assert located.country == client.city.country
        assert located.network.prefixlen == 48


def test_sampling_follows_population() -> None:
    cities = read_cities("city,country,lat,lon,population\nBig,AA,0,0,900\nSmall,BB,1,1,100\n")
    sampler = ClientSampler(cities, random.Random(1))
    counts = Counter(sampler.sample().city.name for _ in range(5000))
    assert 0.87 < counts["Big"] / 5000 < 0.93


def test_sampling_is_reproducible() -> None:
    first = [ClientSampler(bundled_cities(), random.Random(3)).sample() for _ in range(1)]
    second = [ClientSampler(bundled_cities(), random.Random(3)).sample() for _ in range(1)]
    assert first == second


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("city,country,lat,lon,population\n", "no cities"),
        ("city,country,lat,lon,population\nX,AA,north,0,1\n", "row 2"),
        ("city,country,lat,lon,population\nX,AA,95,0,1\n", "row 2"),
    ],
)
def test_bad_city_files_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_cities(text, "c.csv")


def test_no_population_cannot_be_sampled() -> None:
    cities = read_cities("city,country,lat,lon,population\nX,AA,0,0,0\n")
    with pytest.raises(ConfigError, match="no population"):
        ClientSampler(cities, random.Random(0))
