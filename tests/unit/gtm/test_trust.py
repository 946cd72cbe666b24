"""The trust boundary of the tiers: signed x-gtm- headers, and where a location came from."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pytest
from multidict import CIMultiDict

from gtm import headers as h
from gtm.geo import ChainLocator, MaxMindLocator
from gtm.trust import (
    MAX_AGE_S,
    AuthResult,
    ClientLocation,
    LocationOrigin,
    TierKey,
    assert_location,
    asserted_location,
    inbound,
    locate_peer,
)
from tests.unit.global_lb.helpers import write_city_db

NOW = 1_750_000_000.0
KEY = TierKey("a-shared-tier-key")
PROXY = (ipaddress.ip_network("10.0.0.0/8"),)


def signed(
    issuer: str = "global", now: float = NOW, extra: Mapping[str, str] = MappingProxyType({})
) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict(
        {"x-request-id": "req-1", "content-type": "application/json", **extra}
    )
    assert_location(headers, ClientLocation("DE", LocationOrigin.GEOIP))
    headers[h.HOPS] = "1"
    KEY.sign(headers, issuer=issuer, now=now)
    return headers


def test_a_signed_request_is_believed_whole() -> None:
    headers = signed()
    found = inbound(headers, KEY, now=NOW + 1)
    assert (found.result, found.issuer, found.dropped) == (AuthResult.VALID, "global", ())
    location = asserted_location(found.headers)
    assert location == ClientLocation("DE", LocationOrigin.SIGNED_UPSTREAM, LocationOrigin.GEOIP)
    assert location.forwarded_origin is LocationOrigin.GEOIP


def test_an_unsigned_client_keeps_only_what_a_client_may_ask_for() -> None:
    headers = CIMultiDict(
        {
            "x-request-id": "req-1",
            "X-GTM-Client-Country": "US",
            "x-gtm-hops": "1",
            "x-gtm-spilled-from": "eu-west",
            "x-gtm-peer-token": "guess",
            "x-gtm-something-new": "1",
            "x-gtm-data-class": "pii",
            "x-gtm-priority": "batch",
        }
    )
    found = inbound(headers, KEY, now=NOW)
    assert found.result is AuthResult.ABSENT
    assert not found.trusted
    assert found.dropped == (
        "x-gtm-client-country",
        "x-gtm-hops",
        "x-gtm-peer-token",
        "x-gtm-something-new",
        "x-gtm-spilled-from",
    )
    assert dict(found.headers) == {
        "x-request-id": "req-1",
        "x-gtm-data-class": "pii",
        "x-gtm-priority": "batch",
    }
    assert asserted_location(found.headers) is None


@pytest.mark.parametrize(
    ("change", "result"),
    [
        ({h.CLIENT_COUNTRY: "US"}, AuthResult.BAD_SIGNATURE),  # the country forged
        ({h.LOCATION_SOURCE: "unknown-policy"}, AuthResult.BAD_SIGNATURE),
        ({h.HOPS: "0"}, AuthResult.BAD_SIGNATURE),
        ({"x-request-id": "req-2"}, AuthResult.BAD_SIGNATURE),  # replayed on another id
        ({h.TIER_AUTH: "v1;global;123;abc"}, AuthResult.MALFORMED),
        ({h.TIER_AUTH: "v2;global;1;" + "0" * 64}, AuthResult.MALFORMED),
        ({h.TIER_AUTH: "v1;client;1;" + "0" * 64}, AuthResult.MALFORMED),
    ],
)
def test_a_tampered_signature_is_not_believed(change: dict[str, str], result: AuthResult) -> None:
    headers = signed()
    for name, value in change.items():
        headers[name] = value
    found = inbound(headers, KEY, now=NOW)
    assert found.result is result
    assert h.CLIENT_COUNTRY in found.dropped
    assert h.CLIENT_COUNTRY not in found.headers
    assert asserted_location(found.headers) is None


def test_another_key_and_a_stale_or_future_signature_are_refused() -> None:
    assert inbound(signed(), TierKey("another-key"), now=NOW).result is AuthResult.BAD_SIGNATURE
    assert inbound(signed(), KEY, now=NOW + MAX_AGE_S + 1).result is AuthResult.STALE
    assert inbound(signed(now=NOW + MAX_AGE_S + 1), KEY, now=NOW).result is AuthResult.STALE
    assert inbound(signed(), KEY, now=NOW + MAX_AGE_S - 1).result is AuthResult.VALID


def test_a_tier_without_a_key_believes_no_one() -> None:
    found = inbound(signed(), None, now=NOW)
    assert found.result is AuthResult.NO_KEY
    assert h.CLIENT_COUNTRY not in found.headers


def test_the_key_itself_still_proves_an_older_peer_and_is_never_sent() -> None:
    headers = CIMultiDict({h.PEER_TOKEN: "a-shared-tier-key", h.SPILLED_FROM: "us-east"})
    found = inbound(headers, KEY, now=NOW)
    assert found.result is AuthResult.PEER_TOKEN
    assert found.from_region
    assert h.PEER_TOKEN not in signed(extra={h.PEER_TOKEN: "a-shared-tier-key"})
    assert "a-shared-tier-key" not in repr(KEY)


def test_an_mtls_identity_of_a_tier_proves_one_and_no_other_does() -> None:
    unsigned = CIMultiDict({h.CLIENT_COUNTRY: "DE", h.SPILLED_FROM: "eu-west"})
    found = inbound(unsigned, None, now=NOW, identities=("region/eu-west",))
    assert found.result is AuthResult.MTLS_IDENTITY
    assert found.from_region
    assert found.headers[h.CLIENT_COUNTRY] == "DE"
    front = inbound(unsigned, KEY, now=NOW, identities=("global/front-1",))
    assert (front.trusted, front.issuer, front.from_region) == (True, "global", False)
    for identity in ("zone/eu-west-a", "ops/alice", "gpu/g1", "region/Bad_Name"):
        found = inbound(unsigned, KEY, now=NOW, identities=(identity,))
        assert not found.trusted, identity
        assert h.CLIENT_COUNTRY not in found.headers


def test_a_garbled_asserted_country_is_no_assertion() -> None:
    assert asserted_location(CIMultiDict({h.CLIENT_COUNTRY: "Germany"})) is None
    unknown = asserted_location(CIMultiDict({h.LOCATION_SOURCE: "unknown-policy"}))
    assert unknown == ClientLocation(
        None, LocationOrigin.SIGNED_UPSTREAM, LocationOrigin.UNKNOWN_POLICY
    )


@pytest.fixture(scope="module")
def locator(tmp_path_factory: pytest.TempPathFactory) -> ChainLocator:
    path: Path = write_city_db(tmp_path_factory.mktemp("geo") / "city.mmdb")
    return ChainLocator(MaxMindLocator(path))


def test_the_peer_is_located_itself(locator: ChainLocator) -> None:
    found = locate_peer("198.51.100.7", None, PROXY, locator)
    assert found == ClientLocation("DE", LocationOrigin.GEOIP)


def test_a_trusted_proxy_names_the_client(locator: ChainLocator) -> None:
    found = locate_peer("10.1.2.3", "81.2.69.142", PROXY, locator)
    assert found == ClientLocation("GB", LocationOrigin.TRUSTED_PROXY_XFF)
    # A client's own claim left of what the proxy appended is not believed.
    found = locate_peer("10.1.2.3", "216.160.83.56, 198.51.100.7", PROXY, locator)
    assert found == ClientLocation("DE", LocationOrigin.TRUSTED_PROXY_XFF)


def test_an_untrusted_peers_forwarded_for_changes_nothing(locator: ChainLocator) -> None:
    found = locate_peer("198.51.100.7", "216.160.83.56", PROXY, locator)
    assert found == ClientLocation("DE", LocationOrigin.GEOIP)


def test_an_address_no_one_knows_leaves_it_to_the_policy(locator: ChainLocator) -> None:
    assert locate_peer("127.0.0.1", None, PROXY, locator).origin is LocationOrigin.UNKNOWN_POLICY
    assert locate_peer("not-an-ip", None, PROXY, locator).country is None
