"""A new GeoIP database reaches DNS answers: the responder forgets what it located with
the old one, and the global tier counts reloads (gtm_global_geoip_reloads_total)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import dns.edns
import dns.message

from global_lb.app import GlobalTier
from global_lb.config import GlobalConfig
from global_lb.dns.responder import Responder
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.zone import ZoneConfig
from global_lb.geo import ChainLocator, ReloadingDatabase, ReloadOutcome
from global_lb.metrics import GlobalMetrics
from global_lb.router import GlobalRouter
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from tests.unit.global_lb.helpers import CITY_NETWORKS, address_of, view, write_city_db

SUBNET = ("81.2.69.0", 24)
#: The next version of the database: the London /24 moved to Tokyo (as blocks do when
#: they change hands).
MOVED = tuple(
    ("81.2.69.0/24", "JP", 35.6762, 139.6503) if n[0] == "81.2.69.0/24" else n
    for n in CITY_NETWORKS
)


def install_moved(path: Path) -> None:
    write_city_db(path.with_suffix(".new"), MOVED)
    os.replace(path.with_suffix(".new"), path)


def ask(responder: Responder, udp: bool = True) -> list[str]:
    query = dns.message.make_query(
        "api.inference.example.", "A", use_edns=0, options=[dns.edns.ECSOption(*SUBNET)]
    )
    raw = responder.respond(query.to_wire(), ipaddress.ip_address("127.0.0.1"), udp=udp)
    assert raw is not None
    return [rd.to_text() for rrset in dns.message.from_wire(raw).answer for rd in rrset]


def test_answers_follow_the_new_database_once_locations_are_forgotten(
    tmp_path: Path, dns_router: GlobalRouter
) -> None:
    clock = FakeClock()
    path = write_city_db(tmp_path / "city.mmdb")
    database = ReloadingDatabase(path, clock=clock, interval=1.0)
    current = view()
    responder = Responder(
        ZoneConfig(),
        view=lambda: current,
        router=dns_router,
        locator=ChainLocator(database),
        metrics=GlobalMetrics(new_registry()),
        clock=clock,
        rrl=RrlConfig(rate=0),
    )
    assert ask(responder) == [address_of("eu-west")]
    assert ask(responder, udp=False) == [address_of("eu-west")]
    install_moved(path)
    clock.advance_nowait(1.0)
    assert database.poll() is ReloadOutcome.RELOADED
    # The fast path still holds the whole response found with the old database ...
    assert ask(responder) == [address_of("eu-west")]
    responder.forget_locations()
    # ... until the reload makes the responder forget it, on both transports.
    assert ask(responder) == [address_of("ap-northeast")]
    assert ask(responder, udp=False) == [address_of("ap-northeast")]


def test_the_tier_polls_counts_and_clears_the_front_doors_cache(tmp_path: Path) -> None:
    clock = FakeClock()
    path = write_city_db(tmp_path / "city.mmdb")
    config = GlobalConfig(
        dns_listen=None, http_listen=None, geoip_db=str(path), geoip_reload_interval_s=30.0
    )
    registry = new_registry()
    tier = GlobalTier(config, clock=clock, registry=registry)
    assert tier.geo_database is not None
    london = ipaddress.ip_address("81.2.69.7")
    located = tier.front_door._locate(london)
    assert located is not None
    assert located.country == "GB"

    def count(outcome: str) -> float | None:
        return registry.get_sample_value("gtm_global_geoip_reloads_total", {"outcome": outcome})

    assert (count("reloaded"), count("failed")) == (0.0, 0.0)
    install_moved(path)
    assert tier.poll_geo() is None  # not yet: once per interval
    clock.advance_nowait(30.0)
    assert tier.poll_geo() is ReloadOutcome.RELOADED
    assert count("reloaded") == 1.0
    located = tier.front_door._locate(london)
    assert located is not None
    assert located.country == "JP"
    (tmp_path / "bad.mmdb").write_bytes(b"not a database")
    os.replace(tmp_path / "bad.mmdb", path)
    clock.advance_nowait(30.0)
    assert tier.poll_geo() is ReloadOutcome.FAILED
    assert count("failed") == 1.0
    located = tier.front_door._locate(london)
    assert located is not None
    assert located.country == "JP"  # the last good database serves on


def test_without_an_interval_or_a_file_nothing_is_followed(tmp_path: Path) -> None:
    path = write_city_db(tmp_path / "city.mmdb")
    fixed = GlobalConfig(
        dns_listen=None, http_listen=None, geoip_db=str(path), geoip_reload_interval_s=0
    )
    tier = GlobalTier(fixed, clock=FakeClock(), registry=new_registry())
    assert tier.geo_database is None
    assert tier.poll_geo() is None
