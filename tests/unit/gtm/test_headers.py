"""The ``x-gtm-*`` headers are named in gtm.headers alone: a tier that sets one and the
tier that reads it cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from gtm import headers

ROOT = Path(__file__).resolve().parents[3]


def test_every_header_is_lower_case_and_named_once() -> None:
    names = [
        value
        for key, value in vars(headers).items()
        if key.isupper() and isinstance(value, str) and key != "PREFIX"
    ]
    assert all(name == name.lower() for name in names)
    assert len(names) == len(set(names))


def test_every_request_header_is_either_a_clients_request_or_a_tiers_assertion() -> None:
    requests = {headers.HOPS, headers.SPILLED_FROM, headers.CLIENT_COUNTRY}
    requests |= {headers.LOCATION_SOURCE, headers.DATA_CLASS, headers.PRIORITY}
    requests |= {headers.PEER_TOKEN, headers.CANARY, headers.VERSION, headers.TIER_AUTH}
    assert requests <= headers.CLIENT_REQUESTS | set(headers.TIER_ONLY)
    assert headers.CLIENT_REQUESTS.isdisjoint(headers.TIER_ONLY)
    assert all(headers.is_tier_only(name) for name in headers.TIER_ONLY)
    assert headers.is_tier_only("X-GTM-Anything-New")
    assert not headers.is_tier_only("X-GTM-Data-Class")
    assert not headers.is_tier_only("x-request-id")


def test_no_tier_spells_an_inter_tier_header_of_its_own() -> None:
    # The zone's /v1/assign header form (x-gtm-upstream, -model, -input-tokens) is read by
    # the zone alone and stays in zone_agent/api.py.
    own = {"x-gtm-upstream", "x-gtm-model", "x-gtm-input-tokens"}
    for tier in ("global_lb", "regional_lb", "zone_agent", "gpusim", "fleetsim"):
        for module in (ROOT / tier).rglob("*.py"):
            text = module.read_text()
            spelled = set(re.findall(r'"(x-gtm-[a-z-]+)"', text)) - own
            assert not spelled, (module, spelled)
            assert '"x-request-id"' not in text, module
