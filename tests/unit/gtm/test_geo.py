from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import pytest

from gtm.errors import ConfigError
from gtm.geo import (
    LOCATION_CACHE_ENTRIES,
    AssumedLocation,
    CachedLocator,
    ChainLocator,
    CidrEntry,
    CidrMap,
    IPAddress,
    Location,
    LocationSource,
    MaxMindLocator,
    bundled_database,
    load_geo_map,
    narrow,
    open_locator,
    special_purpose_entries,
)
from gtm.models import GeoPoint
from tests.unit.global_lb.helpers import maxmind_test_db, write_city_db

ip = ipaddress.ip_address
net = ipaddress.ip_network


@pytest.mark.parametrize("db", ["GeoIP2-City-Test", "GeoLite2-City-Test"])
@pytest.mark.parametrize(
    ("address", "country", "network"),
    [
        ("81.2.69.142", "GB", "81.2.69.142/31"),
        ("89.160.20.112", "SE", "89.160.20.112/28"),
        ("216.160.83.56", "US", "216.160.83.56/29"),
        ("2001:218::1", "JP", "2001:218::/32"),
    ],
)
def test_maxmind_city_test_databases(db: str, address: str, country: str, network: str) -> None:
    located = MaxMindLocator(maxmind_test_db(db)).locate(ip(address))
    assert located.country == country
    assert located.point is not None
    assert located.network == net(network)
    assert located.source is LocationSource.DATABASE


def test_maxmind_city_known_coordinates() -> None:
    located = MaxMindLocator(maxmind_test_db()).locate(ip("81.2.69.142"))
    assert located.point == GeoPoint(lat=51.5142, lon=-0.0931)


def test_country_database_has_country_but_no_point() -> None:
    locator = MaxMindLocator(maxmind_test_db("GeoLite2-Country-Test"))
    located = locator.locate(ip("89.160.20.112"))
    assert (located.country, located.point) == ("SE", None)


def test_miss_is_unknown_with_the_empty_network() -> None:
    located = MaxMindLocator(maxmind_test_db()).locate(ip("127.0.0.1"))
    assert located.country is None
    assert located.source is LocationSource.UNKNOWN
    assert located.network == net("127.0.0.0/8")


def test_database_without_countries_is_refused() -> None:
    with pytest.raises(ConfigError, match="has no countries"):
        MaxMindLocator(maxmind_test_db().parent / "GeoLite2-ASN-Test.mmdb")


def test_unreadable_database_is_a_config_error(tmp_path: Path) -> None:
    bogus = tmp_path / "x.mmdb"
    bogus.write_bytes(b"not a database")
    with pytest.raises(ConfigError, match="not a readable MaxMind database"):
        MaxMindLocator(bogus)


def test_generated_database(tmp_path: Path) -> None:
    locator = MaxMindLocator(write_city_db(tmp_path / "city.mmdb"))
    assert locator.locate(ip("81.2.69.7")).network == net("81.2.69.0/24")
    assert locator.locate(ip("2a02:c7f::9")).country == "DE"


def test_bundled_geolite2_locates_real_addresses_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert bundled_database().is_file()
    with caplog.at_level(logging.WARNING, logger="gtm.geo"):
        locator = open_locator(None)
    assert "STALE" in caplog.text
    london = locator.locate(ip("81.2.69.142"))
    assert london.country == "GB"
    assert locator.locate(ip("2001:218::1")).country == "JP"


def test_cidr_map_longest_prefix_wins() -> None:
    cidr = CidrMap(
        [
            CidrEntry(network=net("10.0.0.0/8"), country="US"),
            CidrEntry(network=net("10.1.0.0/16"), country="DE"),
        ]
    )
    assert cidr.locate(ip("10.1.2.3")).country == "DE"  # type: ignore[union-attr]
    assert cidr.locate(ip("10.2.2.3")).country == "US"  # type: ignore[union-attr]
    assert cidr.locate(ip("11.0.0.1")) is None


def test_cidr_scope_is_narrowed_around_a_more_specific_entry() -> None:
    cidr = CidrMap(
        [
            CidrEntry(network=net("10.0.0.0/8"), country="US"),
            CidrEntry(network=net("10.1.0.0/16"), country="DE"),
        ]
    )
    found = cidr.locate(ip("10.2.0.1"))
    assert found is not None
    assert found.network == net("10.2.0.0/15")
    assert not found.network.overlaps(net("10.1.0.0/16"))


@pytest.mark.parametrize(
    ("address", "expected"),
    [("10.2.0.1", "10.2.0.0/15"), ("10.128.0.1", "10.128.0.0/9"), ("10.1.0.1", "10.0.0.0/8")],
)
def test_narrow(address: str, expected: str) -> None:
    entries = [CidrEntry(network=net("10.1.0.0/16"))]
    assert narrow(ip(address), net("10.0.0.0/8"), entries) == net(expected)


def test_chain_prefers_map_then_database_then_assumption(tmp_path: Path) -> None:
    database = MaxMindLocator(write_city_db(tmp_path / "city.mmdb"))
    cidr = CidrMap(
        [CidrEntry(network=net("81.2.69.128/25"), country="FR"), *special_purpose_entries()]
    )
    chain = ChainLocator(database, cidr, AssumedLocation(country="IE"))
    assert chain.locate(ip("81.2.69.200")).country == "FR"
    london = chain.locate(ip("81.2.69.1"))
    assert london.country == "GB"
    # The database's /24 is cut so it does not cover the mapped /25.
    assert london.network == net("81.2.69.0/25")
    loopback = chain.locate(ip("127.0.0.1"))
    assert (loopback.country, loopback.source) == ("IE", LocationSource.ASSUMED)
    assert loopback.network == net("127.0.0.0/8")


def test_chain_without_assumption_leaves_unknown() -> None:
    chain = ChainLocator(None)
    found = chain.locate(ip("192.168.1.1"))
    assert (found.country, found.source) == (None, LocationSource.CIDR_MAP)
    public = chain.locate(ip("8.8.8.8"))
    assert (public.country, public.network) == (None, net("8.8.8.8/32"))


def test_geo_map_file(tmp_path: Path) -> None:
    path = tmp_path / "map.yaml"
    path.write_text(
        "networks:\n  - {network: 192.0.2.0/24, country: GB, location: {lat: 51.5, lon: -0.1}}\n"
    )
    cidr = load_geo_map(path)
    assert cidr.locate(ip("192.0.2.9")).country == "GB"  # type: ignore[union-attr]
    assert cidr.locate(ip("127.0.0.1")) is not None  # special-purpose ranges included


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("networks: [{network: 300.0.0.0/8}]", "networks.0.network"),
        ("networks: [{network: 10.0.0.0/8, country: gb}]", "networks.0.country"),
        ("networks: [{network: 10.0.0.0/8, colour: red}]", "colour"),
        ("networks: [", "not valid YAML"),
    ],
)
def test_geo_map_errors_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "map.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_geo_map(path)


def test_cached_locator_answers_as_its_locator_and_keeps_only_recent_addresses() -> None:
    looked_up: list[IPAddress] = []
    inner = ChainLocator(None)

    class Counting:
        def locate(self, address: IPAddress, /) -> Location:
            looked_up.append(address)
            return inner.locate(address)

    cached = CachedLocator(Counting(), capacity=2)
    a, b, c = (ipaddress.ip_address(f"2001:db8::{k}") for k in (1, 2, 3))
    assert cached.locate(a) == inner.locate(a)
    cached.locate(a)
    cached.locate(b)
    assert looked_up == [a, b]  # a was remembered
    cached.locate(c)  # a, the least recently used, goes
    assert len(cached) == 2
    cached.locate(a)
    assert looked_up == [a, b, c, a]
    # A stream of new clients: the cache stays at its capacity.
    for k in range(100):
        cached.locate(ipaddress.ip_address(f"2001:db8::1:{k}"))
    assert len(cached) == 2
    assert CachedLocator(Counting())._found.capacity == LOCATION_CACHE_ENTRIES
