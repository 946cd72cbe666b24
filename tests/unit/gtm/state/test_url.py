from __future__ import annotations

import pytest

from gtm.clock import FakeClock
from gtm.errors import ConfigError
from gtm.metrics import new_registry
from gtm.state.etcd import EtcdStore
from gtm.state.memory import MemoryStore
from gtm.state.url import MEMORY, Endpoint, StateUrl, StoreKind, open_store, parse_state_url


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("memory", MEMORY),
        (" memory:// ", MEMORY),
        ("etcd://127.0.0.1:2379", StateUrl(StoreKind.ETCD, (Endpoint("127.0.0.1", 2379),))),
        (
            "etcd://Etcd-0.example:23790",
            StateUrl(StoreKind.ETCD, (Endpoint("etcd-0.example", 23790),)),
        ),
        ("etcd://etcd", StateUrl(StoreKind.ETCD, (Endpoint("etcd", 2379),))),
        ("ETCD://[::1]:2379", StateUrl(StoreKind.ETCD, (Endpoint("::1", 2379),))),
        (
            "etcd://10.0.0.1:2379,10.0.0.2,[fe80::1]:1",
            StateUrl(
                StoreKind.ETCD,
                (Endpoint("10.0.0.1", 2379), Endpoint("10.0.0.2", 2379), Endpoint("fe80::1", 1)),
            ),
        ),
    ],
)
def test_accepted_forms(text: str, expected: StateUrl) -> None:
    assert parse_state_url(text) == expected


def test_str_is_canonical_and_round_trips() -> None:
    url = parse_state_url("etcd://EXAMPLE.org,[::1]:2380")
    assert str(url) == "etcd://example.org:2379,[::1]:2380"
    assert parse_state_url(str(url)) == url
    assert str(MEMORY) == "memory"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "expected 'memory'"),
        ("redis://localhost:6379", "expected 'memory'"),
        ("127.0.0.1:2379", "expected 'memory'"),
        ("etcd://", "no etcd endpoint"),
        ("etcd://host:0", "out of range"),
        ("etcd://host:70000", "out of range"),
        ("etcd://host:port", "not HOST"),
        ("etcd://host:2379/path", "not HOST"),
        ("etcd://user@host:2379", "not a host name"),
        ("etcd://a,,b", "not HOST"),
        ("etcd://300.1.1.1", "not an IPv4 address"),
        ("etcd://[nonsense]:1", "not an IPv6 address"),
        ("etcd://-bad-:1", "not a host name"),
        ("etcd://a:1,a:1", "listed twice"),
        ("etcd://a\n,b", "not a host name"),
        ("etcd://a:1\n,b", "not HOST"),
    ],
)
def test_bad_urls_say_what_is_accepted(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as raised:
        parse_state_url(text)
    assert "etcd://HOST:PORT" in str(raised.value)
    assert repr(text) in str(raised.value)


async def test_open_store_memory_and_etcd() -> None:
    clock = FakeClock()
    memory = open_store("memory", clock=clock, registry=new_registry())
    assert isinstance(memory, MemoryStore)
    await memory.aclose()
    # Opening etcd contacts nothing (an unreachable etcd fails calls, not the open).
    etcd = open_store(
        parse_state_url("etcd://127.0.0.1:9,[::1]:9"),
        clock=clock,
        registry=new_registry(),
        timeout=0.5,
    )
    assert isinstance(etcd, EtcdStore)
    assert etcd.endpoint == Endpoint("127.0.0.1", 9)
    await etcd.aclose()
    with pytest.raises(ConfigError):
        open_store("mem", clock=clock, registry=new_registry())
