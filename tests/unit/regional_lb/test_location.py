"""The regional LB's trust boundary and client location (regional_lb.location)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from gtm.clock import FakeClock
from gtm.geo import ChainLocator, MaxMindLocator, open_locator
from gtm.trust import ClientLocation, LocationOrigin, TierKey
from regional_lb.location import ClientLocator
from tests.unit.global_lb.helpers import maxmind_test_db, write_city_db
from tests.unit.gtm.test_geo_reload import install

KEY = "regional-test-key"
PROXY = "10.0.0.9"


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = write_city_db(tmp_path_factory.mktemp("geo") / "city.mmdb")
    return path


def make(database: Path, *, key: str | None = KEY) -> tuple[ClientLocator, CollectorRegistry]:
    registry = CollectorRegistry()
    locator = ClientLocator(
        region="us-east",
        key=TierKey(key) if key else None,
        locator=ChainLocator(MaxMindLocator(database)),
        trusted_proxies=(ipaddress.ip_network("10.0.0.0/8"),),
        clock=FakeClock(),
        registry=registry,
    )
    return locator, registry


def request(peer: str, headers: dict[str, str] | CIMultiDict[str]) -> Any:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    return make_mocked_request("POST", "/v1/chat/completions", headers=headers, transport=transport)


def count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_direct_client_is_located_by_its_own_address(database: Path) -> None:
    locator, registry = make(database)
    sent = request("198.51.100.7", {"x-gtm-client-country": "US"})
    sender = locator.inbound(sent)
    assert locator.locate(sent, sender) == ClientLocation("DE", LocationOrigin.GEOIP)
    assert count(registry, "gtm_regional_untrusted_headers_total", header="x-gtm-client-country")
    assert count(registry, "gtm_regional_tier_auth_total", result="absent") == 1
    assert count(registry, "gtm_regional_client_location_total", source="geoip") == 1


def test_behind_a_trusted_proxy_the_forwarded_client_counts(database: Path) -> None:
    locator, _ = make(database)
    sent = request(PROXY, {"X-Forwarded-For": "216.160.83.56"})
    found = locator.locate(sent, locator.inbound(sent))
    assert found == ClientLocation("US", LocationOrigin.TRUSTED_PROXY_XFF)
    # From an untrusted peer the same header is the client's own claim: not believed.
    forged = request("198.51.100.7", {"X-Forwarded-For": "216.160.83.56"})
    assert locator.locate(forged, locator.inbound(forged)).country == "DE"


def test_a_signed_assertion_is_believed_and_a_stale_one_counted(database: Path) -> None:
    locator, registry = make(database)
    headers: CIMultiDict[str] = CIMultiDict(
        {"x-request-id": "r1", "x-gtm-client-country": "SE", "x-gtm-location-source": "geoip"}
    )
    TierKey(KEY).sign(headers, issuer="global", now=FakeClock().wall())
    sent = request(PROXY, headers)
    found = locator.locate(sent, locator.inbound(sent))
    assert found == ClientLocation("SE", LocationOrigin.SIGNED_UPSTREAM, LocationOrigin.GEOIP)
    stale: CIMultiDict[str] = CIMultiDict({"x-request-id": "r1", "x-gtm-client-country": "SE"})
    TierKey(KEY).sign(stale, issuer="global", now=FakeClock().wall() - 3600)
    late = request("198.51.100.7", stale)
    assert locator.locate(late, locator.inbound(late)).country == "DE"
    assert count(registry, "gtm_regional_tier_auth_total", result="stale") == 1


def test_a_replica_without_the_key_believes_no_signature(database: Path) -> None:
    locator, registry = make(database, key=None)
    headers: CIMultiDict[str] = CIMultiDict({"x-request-id": "r1", "x-gtm-client-country": "SE"})
    TierKey(KEY).sign(headers, issuer="global", now=FakeClock().wall())
    sent = request("127.0.0.1", headers)
    found = locator.locate(sent, locator.inbound(sent))
    assert found == ClientLocation(None, LocationOrigin.UNKNOWN_POLICY)
    assert count(registry, "gtm_regional_tier_auth_total", result="no-key") == 1


def test_spills_are_signed_as_this_region(database: Path) -> None:
    locator, _ = make(database)
    headers: CIMultiDict[str] = CIMultiDict({"x-request-id": "r1", "x-gtm-hops": "2"})
    locator.sign(headers)
    assert headers["x-gtm-tier-auth"].startswith("v1;region/us-east;")
    assert locator.check(headers).from_region


async def test_a_new_geoip_file_is_swapped_in_and_the_cache_forgotten(tmp_path: Path) -> None:
    # A client going straight to a regional LB is located with the database the operator
    # installed last, as at the front door (gtm.geo.ReloadingDatabase), not the one the
    # replica started with; a broken version keeps the last good one serving.
    path = tmp_path / "GeoIP.mmdb"
    install(maxmind_test_db("GeoLite2-Country-Test"), path)
    clock = FakeClock()
    registry = CollectorRegistry()
    locator = ClientLocator(
        region="eu-west",
        key=None,
        locator=open_locator(path, reload=(clock, 60.0)),
        trusted_proxies=(),
        clock=clock,
        registry=registry,
    )
    sent = request("81.2.69.142", {})  # GB in every MaxMind test database
    assert locator.locate(sent, locator.inbound(sent)).country == "GB"
    assert locator.database is not None
    assert locator.database.current.database_type == "GeoLite2-Country"
    install(maxmind_test_db("GeoIP2-City-Test"), path)
    await locator.poll_database()  # before the interval: the file is not looked at
    assert count(registry, "gtm_regional_geoip_reloads_total", outcome="reloaded") == 0
    clock.advance_nowait(60.0)
    await locator.poll_database()
    assert count(registry, "gtm_regional_geoip_reloads_total", outcome="reloaded") == 1
    assert locator.database.current.database_type == "GeoIP2-City"
    assert len(locator._cached) == 0  # found with the old database: forgotten
    assert locator.locate(sent, locator.inbound(sent)).country == "GB"
    path.write_bytes(b"not a database")
    clock.advance_nowait(60.0)
    await locator.poll_database()
    assert count(registry, "gtm_regional_geoip_reloads_total", outcome="failed") == 1
    assert locator.database.current.database_type == "GeoIP2-City"


def test_a_fixed_database_is_not_followed(database: Path) -> None:
    locator, registry = make(database)
    assert locator.database is None
    assert count(registry, "gtm_regional_geoip_reloads_total", outcome="reloaded") == 0
