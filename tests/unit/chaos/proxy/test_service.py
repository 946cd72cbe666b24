"""Service semantics that need no socket: proxies stay disabled (nothing binds)."""

import json
import random

import pytest
from prometheus_client import CollectorRegistry

from chaos.proxy.errors import ApiError
from chaos.proxy.models import Direction
from chaos.proxy.service import FaultProxyService
from gtm.clock import FakeClock
from gtm.metrics import new_registry


def body(value: object) -> bytes:
    return json.dumps(value).encode()


@pytest.fixture
def registry() -> CollectorRegistry:
    return new_registry()


@pytest.fixture
def svc(fake_clock: FakeClock, registry: CollectorRegistry) -> FaultProxyService:
    return FaultProxyService(registry=registry, clock=fake_clock, rng=random.Random(0))


def active_toxics(registry: CollectorRegistry, direction: str) -> float | None:
    return registry.get_sample_value(
        "gtm_chaos_proxy_active_toxics", {"proxy": "db", "direction": direction}
    )


async def make(svc: FaultProxyService, name: str = "db") -> None:
    await svc.create_proxy(
        body(
            {"name": name, "upstream": "127.0.0.1:5432", "listen": "127.0.0.1:0", "enabled": False}
        )
    )


async def error_of(awaitable: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await awaitable  # type: ignore[misc]
    return caught.value


async def test_create_requires_name_then_upstream(svc: FaultProxyService) -> None:
    error = await error_of(svc.create_proxy(body({})))
    assert (error.status, error.message) == (400, "missing required field: name")
    error = await error_of(svc.create_proxy(body({"name": "x"})))
    assert (error.status, error.message) == (400, "missing required field: upstream")


async def test_create_disabled_keeps_the_raw_listen(svc: FaultProxyService) -> None:
    view = await svc.create_proxy(
        body(
            {
                "name": "m",
                "listen": "localhost:3310",
                "upstream": "localhost:20001",
                "enabled": False,
            }
        )
    )
    assert view.to_wire() == {
        "name": "m",
        "listen": "localhost:3310",
        "upstream": "localhost:20001",
        "enabled": False,
        "toxics": [],
    }


async def test_duplicate_name_is_409(svc: FaultProxyService) -> None:
    await make(svc)
    error = await error_of(make(svc))
    assert (error.status, error.message) == (409, "proxy already exists")


async def test_unknown_proxy_is_404_before_the_body_is_read(svc: FaultProxyService) -> None:
    for call in (
        svc.update_proxy("nope", b"not json"),
        svc.create_toxic("nope", b"not json"),
        svc.delete_proxy("nope"),
    ):
        error = await error_of(call)
        assert (error.status, error.message) == (404, "proxy not found")


async def test_update_keeps_absent_fields(svc: FaultProxyService) -> None:
    await make(svc)
    view = await svc.update_proxy("db", body({"upstream": "127.0.0.1:6543", "name": "ignored"}))
    assert (view.name, view.upstream, view.listen, view.enabled) == (
        "db",
        "127.0.0.1:6543",
        "127.0.0.1:0",
        False,
    )


async def test_toxic_defaults(svc: FaultProxyService) -> None:
    await make(svc)
    view = await svc.create_toxic("db", body({"type": "latency"}))
    assert view.to_wire() == {
        "attributes": {"latency": 0, "jitter": 0},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1,
    }


async def test_stream_is_echoed_as_sent_and_names_the_default(svc: FaultProxyService) -> None:
    await make(svc)
    view = await svc.create_toxic("db", body({"type": "noop", "stream": "UPSTREAM"}))
    assert (view.name, view.stream) == ("noop_UPSTREAM", "UPSTREAM")
    (upstream,) = svc.live_proxy("db").toxics.chain(Direction.UPSTREAM)
    assert upstream.name == "noop_UPSTREAM"
    assert [t.name for t in svc.toxics("db")] == ["noop_UPSTREAM"]


async def test_toxic_create_checks_in_toxiproxy_order(svc: FaultProxyService) -> None:
    await make(svc)
    await svc.create_toxic("db", body({"type": "latency", "name": "taken"}))
    cases = [
        ({"type": 1}, 400, "bad request body"),  # JSON types first
        ({"type": "bogus", "stream": "sideways"}, 400, "stream was invalid"),
        ({"type": "bogus", "name": "taken"}, 400, "invalid toxic type"),
        ({"type": "", "name": "taken"}, 400, "invalid toxic type"),
        ({"type": "latency", "name": "taken", "attributes": {"latency": "x"}}, 409, "toxic"),
        ({"type": "latency", "stream": "upstream", "name": "taken"}, 409, "toxic already exists"),
        ({"type": "latency", "attributes": {"latency": 1.5}}, 400, "number 1.5"),
        ({"type": "slicer", "attributes": {"average_size": 0}}, 400, "average_size"),
    ]
    for request, status, fragment in cases:
        error = await error_of(svc.create_toxic("db", body(request)))
        assert error.status == status, request
        assert fragment in error.message, (request, error.message)
    assert [t.name for t in svc.toxics("db")] == ["taken"]


async def test_unknown_attributes_are_ignored(svc: FaultProxyService) -> None:
    await make(svc)
    view = await svc.create_toxic(
        "db", body({"type": "bandwidth", "attributes": {"rate": 5, "burst": 9}})
    )
    assert view.attributes == {"rate": 5}


async def test_toxicity_is_float32(svc: FaultProxyService) -> None:
    await make(svc)
    view = await svc.create_toxic("db", body({"type": "noop", "toxicity": 0.2}))
    assert view.to_wire()["toxicity"] == 0.2


async def test_update_merges_attributes_and_keeps_toxicity(svc: FaultProxyService) -> None:
    # Port of api_test.go TestUpdateToxics.
    await make(svc)
    await svc.create_toxic(
        "db", body({"type": "latency", "attributes": {"latency": 100, "jitter": 10}})
    )
    view = await svc.update_toxic(
        "db", "latency_downstream", body({"toxicity": 0.5, "attributes": {"latency": 1000}})
    )
    assert (view.toxicity, view.attributes) == (0.5, {"latency": 1000, "jitter": 10})
    view = await svc.update_toxic(
        "db", "latency_downstream", body({"attributes": {"latency": 500}})
    )
    assert (view.toxicity, view.attributes) == (0.5, {"latency": 500, "jitter": 10})
    assert svc.get_toxic("db", "latency_downstream") == view


async def test_a_bad_update_changes_nothing(svc: FaultProxyService) -> None:
    await make(svc)
    await svc.create_toxic("db", body({"type": "latency", "attributes": {"latency": 100}}))
    error = await error_of(
        svc.update_toxic(
            "db", "latency_downstream", body({"attributes": {"latency": 5, "jitter": "x"}})
        )
    )
    assert error.status == 400
    assert svc.get_toxic("db", "latency_downstream").attributes == {"latency": 100, "jitter": 0}


async def test_unknown_toxic_is_404_whatever_the_body(svc: FaultProxyService) -> None:
    await make(svc)
    for call in (
        svc.update_toxic("db", "nope", b"{{{"),
        svc.delete_toxic("db", "nope"),
    ):
        error = await error_of(call)
        assert (error.status, error.message) == (404, "toxic not found")
    with pytest.raises(ApiError, match="toxic not found"):
        svc.get_toxic("db", "nope")


async def test_populate_validates_everything_first(svc: FaultProxyService) -> None:
    result = await svc.populate(
        body(
            [
                {"name": "one", "upstream": "127.0.0.1:1", "enabled": False},
                {"name": "", "upstream": "127.0.0.1:2"},
            ]
        )
    )
    assert result.proxies is None
    assert result.error is not None
    assert (result.error.status, result.error.message) == (
        400,
        "missing required field: name at proxy 2",
    )
    assert svc.proxy_views() == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{}", "cannot unmarshal object into Go value of type []struct"),
        (b"[1]", "cannot unmarshal number into Go value of type toxiproxy.Proxy"),
        (b"", "bad request body: EOF"),
    ],
)
async def test_populate_bad_bodies(svc: FaultProxyService, raw: bytes, message: str) -> None:
    result = await svc.populate(raw)
    assert result.error is not None
    assert result.error.status == 400
    assert message in result.error.message


async def test_populate_empty_is_none(svc: FaultProxyService) -> None:
    assert (await svc.populate(b"[]")).proxies is None
    assert (await svc.populate(b"null")).proxies is None


async def test_populate_keeps_an_unchanged_proxy_and_its_toxics(svc: FaultProxyService) -> None:
    await make(svc)
    await svc.create_toxic("db", body({"type": "noop"}))
    # A disabled proxy stores its raw listen, so only the identical string matches.
    result = await svc.populate(
        body([{"name": "db", "upstream": "127.0.0.1:5432", "listen": "127.0.0.1:0"}])
    )
    assert result.error is None
    assert result.proxies is not None
    assert [t.name for t in result.proxies[0].toxics] == ["noop_downstream"]
    assert not result.proxies[0].enabled  # kept untouched, body's default ignored


async def test_populate_replaces_a_changed_proxy(svc: FaultProxyService) -> None:
    await make(svc)
    await svc.create_toxic("db", body({"type": "noop"}))
    result = await svc.populate(
        body(
            [
                {
                    "name": "db",
                    "upstream": "127.0.0.1:9999",
                    "listen": "127.0.0.1:0",
                    "enabled": False,
                }
            ]
        )
    )
    assert result.proxies is not None
    assert result.proxies[0].upstream == "127.0.0.1:9999"
    assert result.proxies[0].toxics == ()


async def test_delete_toxic_then_proxy(svc: FaultProxyService, registry: CollectorRegistry) -> None:
    await make(svc)
    await svc.create_toxic("db", body({"type": "noop"}))
    await svc.delete_toxic("db", "noop_downstream")
    assert svc.toxics("db") == ()
    await svc.delete_proxy("db")
    assert svc.proxy_views() == {}
    assert active_toxics(registry, "downstream") is None


async def test_active_toxics_gauge(svc: FaultProxyService, registry: CollectorRegistry) -> None:
    await make(svc)
    await svc.create_toxic("db", body({"type": "noop", "stream": "upstream"}))
    assert active_toxics(registry, "upstream") == 1
    assert active_toxics(registry, "downstream") == 0
