"""``MaxMindLocator`` reads raw records with ``maxminddb``; this checks it against
MaxMind's own ``geoip2`` reader (the reference) on every network of MaxMind's test
databases: same country (with the registered-country fallback), location and network."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import geoip2.database
import geoip2.errors
import geoip2.models
import maxminddb
import pytest

from gtm.geo import LocationSource, MaxMindLocator
from tests.unit.global_lb.helpers import MAXMIND_TEST_DBS

DATABASES = ("GeoIP2-City-Test.mmdb", "GeoLite2-City-Test.mmdb", "GeoLite2-Country-Test.mmdb")


def _probe_addresses(path: Path) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The first and last address of every network in the database, plus misses."""
    with maxminddb.open_database(str(path)) as reader:
        networks = [network for network, _ in reader]
    found = [a for n in networks for a in (n.network_address, n.broadcast_address)]
    misses = [ipaddress.ip_address("10.1.2.3"), ipaddress.ip_address("fd00::1")]
    return [*found, *misses]


def _reference(
    reader: geoip2.database.Reader,
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
    *,
    city: bool,
) -> geoip2.models.Country | None:
    try:
        return reader.city(address) if city else reader.country(address)
    except geoip2.errors.AddressNotFoundError:
        return None


@pytest.mark.parametrize("name", DATABASES)
def test_locator_agrees_with_geoip2_on_every_network(name: str) -> None:
    path = MAXMIND_TEST_DBS / name
    locator = MaxMindLocator(path)
    reference = geoip2.database.Reader(str(path))
    city = "City" in name
    checked = 0
    try:
        for address in _probe_addresses(path):
            got = locator.locate(address)
            model = _reference(reference, address, city=city)
            if model is None:
                assert got.source is LocationSource.UNKNOWN
                assert got.country is None
                continue
            expected_country = model.country.iso_code or model.registered_country.iso_code
            assert got.country == expected_country, address
            assert got.network == model.traits.network, address
            if city:
                lat = model.location.latitude  # type: ignore[attr-defined]
                lon = model.location.longitude  # type: ignore[attr-defined]
                if lat is None or lon is None:
                    assert got.point is None
                else:
                    assert got.point is not None
                    assert (got.point.lat, got.point.lon) == (lat, lon)
            checked += 1
    finally:
        reference.close()
        locator.close()
    assert checked > 100  # every test database has well over a hundred networks
