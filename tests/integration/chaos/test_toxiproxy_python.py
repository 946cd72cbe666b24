"""toxiproxy-python 0.1.1 against our server, through the adapter that fixes its pitfalls.

The library is synchronous (``requests``), so each test runs its client code in a worker
thread while the server runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
import pytest
import toxiproxy  # type: ignore[import-untyped]

from chaos.proxy import FaultProxyServer, FaultProxyService, errors
from chaos.proxy.client import ToxiproxyClient
from chaos.proxy.service import TOXIPROXY_VERSION
from gtm.metrics import new_registry
from tests.integration.chaos.conftest import Api, Upstream, connect, is_up, read_exactly

pytestmark = pytest.mark.integration

T = TypeVar("T")


async def in_thread(function: Callable[[], T]) -> T:
    return await asyncio.to_thread(function)


@pytest.fixture
def client(api: Api) -> ToxiproxyClient:
    return ToxiproxyClient(api.url, timeout=5.0)


async def test_the_library_drives_every_call_it_supports(
    client: ToxiproxyClient, echo: Upstream
) -> None:
    def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        with client.library() as tp:
            seen["running"] = tp.running()
            seen["version"] = tp.version()
            proxy = tp.create(upstream=echo.address, name="db")
            seen["listen"] = proxy.listen
            tp.create(upstream=echo.address, name="cold", enabled=False)
            seen["names"] = sorted(tp.proxies())
            seen["get_proxy"] = tp.get_proxy("db").upstream
            seen["missing"] = tp.get_proxy("nope")
            proxy.add_toxic(type="latency", attributes={"latency": 100})
            proxy.add_toxic(type="bandwidth", stream="upstream", name="bw", toxicity=0.5)
            toxics = proxy.toxics()
            seen["toxics"] = {n: (t.type, t.stream, t.toxicity) for n, t in toxics.items()}
            seen["latency"] = proxy.get_toxic("latency_downstream").attributes
            seen["destroy_toxic"] = proxy.destroy_toxic("bw")
            proxy.disable()
            seen["disabled"] = tp.get_proxy("db").enabled
            proxy.enable()
            with proxy.down():
                seen["down"] = tp.get_proxy("db").enabled
            seen["after_down"] = tp.get_proxy("db").enabled
            created = tp.populate(
                [{"name": "pop", "upstream": echo.address, "listen": "127.0.0.1:0"}]
            )
            seen["populated"] = [p.name for p in created]
            seen["reset"] = tp.reset()
            seen["after_reset"] = tp.get_proxy("db").toxics()
            seen["destroy"] = tp.destroy(tp.get_proxy("cold"))
            tp.destroy_all()
            seen["left"] = tp.proxies()
        return seen

    seen = await in_thread(scenario)
    assert seen["running"] is True
    assert seen["version"] == f'{{"version": "{TOXIPROXY_VERSION}"}}\n'.encode()  # raw bytes
    assert seen["listen"].startswith("127.0.0.1:")
    assert seen["names"] == ["cold", "db"]
    assert seen["get_proxy"] == echo.address
    assert seen["missing"] is None
    assert seen["toxics"] == {
        "bw": ("bandwidth", "upstream", 0.5),
        "latency_downstream": ("latency", "downstream", 1),
    }
    assert seen["latency"] == {"latency": 100, "jitter": 0}
    assert seen["destroy_toxic"] is True
    assert (seen["disabled"], seen["down"], seen["after_down"]) == (False, False, True)
    assert seen["populated"] == ["pop"]
    assert seen["reset"] is True
    assert seen["after_reset"] == {}
    assert seen["destroy"] is True
    assert seen["left"] == {}


async def test_library_objects_carry_traffic(client: ToxiproxyClient, echo: Upstream) -> None:
    def create() -> str:
        with client.library() as tp:
            proxy = tp.create(upstream=echo.address, name="db")
            proxy.add_toxic(type="latency", attributes={"latency": 100})
            return str(proxy.listen)

    listen = await in_thread(create)
    reader, writer = await connect(listen)
    start = time.perf_counter()
    writer.write(b"ping")
    assert await read_exactly(reader, 4) == b"ping"
    assert 0.1 <= time.perf_counter() - start < 0.3
    writer.close()


async def test_failures_the_library_would_swallow_raise_typed_errors(
    client: ToxiproxyClient, echo: Upstream
) -> None:
    first = await in_thread(lambda: client.create_proxy("a", echo.address))

    def library_create_on_taken_port() -> None:
        with client.library() as tp:
            tp.create(upstream=echo.address, name="b", listen=first.listen)

    # Bare toxiproxy-python raises KeyError: 'name' here (pitfall 1).
    with pytest.raises(errors.ToxiproxyServerError, match="address already in use") as caught:
        await in_thread(library_create_on_taken_port)
    assert caught.value.status == 500

    await in_thread(
        lambda: client.create_proxy("b", echo.address, listen=first.listen, enabled=False)
    )

    def library_enable_on_taken_port() -> None:
        with client.library() as tp:
            tp.get_proxy("b").enable()  # bare library: sets enabled=True and moves on

    with pytest.raises(errors.ToxiproxyServerError, match="address already in use"):
        await in_thread(library_enable_on_taken_port)
    assert not (await in_thread(lambda: client.get_proxy("b"))).enabled


async def test_library_client_errors_are_typed_too(client: ToxiproxyClient, echo: Upstream) -> None:
    await in_thread(lambda: client.create_proxy("db", echo.address))

    def bad_toxic() -> None:
        with client.library() as tp:
            tp.get_proxy("db").add_toxic(type="latency", stream="walrustream")

    with pytest.raises(errors.ToxiproxyBadRequest, match="stream was invalid"):
        await in_thread(bad_toxic)

    def missing_toxic() -> None:
        with client.library() as tp:
            tp.get_proxy("db").destroy_toxic("nope")

    with pytest.raises(errors.ToxiproxyNotFound, match="toxic not found"):
        await in_thread(missing_toxic)


async def test_typed_methods(client: ToxiproxyClient, echo: Upstream) -> None:
    def scenario() -> None:
        assert client.version() == TOXIPROXY_VERSION
        assert client.is_running()
        created = client.create_proxy("db", echo.address, listen="localhost:0")
        assert created.listen.startswith("127.0.0.1:")
        assert client.get_proxy("db") == created
        assert list(client.proxies()) == ["db"]
        toxic = client.add_toxic("db", "latency", attributes={"latency": 100, "jitter": 5})
        assert (toxic.name, toxic.attributes) == (
            "latency_downstream",
            {"latency": 100, "jitter": 5},
        )
        updated = client.update_toxic(
            "db", "latency_downstream", toxicity=0.5, attributes={"latency": 7}
        )
        assert (updated.toxicity, updated.attributes) == (0.5, {"latency": 7, "jitter": 5})
        assert client.get_toxic("db", "latency_downstream") == updated
        assert client.toxics("db") == [updated]
        client.delete_toxic("db", "latency_downstream")
        assert client.toxics("db") == []
        moved = client.update_proxy("db", upstream="127.0.0.1:1")
        assert moved.upstream == "127.0.0.1:1"
        assert client.disable("db").enabled is False
        assert client.enable("db").enabled is True
        client.reset()
        client.delete_proxy("db")
        assert client.proxies() == {}
        with pytest.raises(errors.ToxiproxyNotFound):
            client.get_proxy("db")
        client.create_proxy("x", echo.address)
        with pytest.raises(errors.ToxiproxyConflict):
            client.create_proxy("x", echo.address)

    await in_thread(scenario)


async def test_populate_is_server_side_and_keeps_toxics(
    client: ToxiproxyClient, echo: Upstream
) -> None:
    def scenario() -> tuple[list[str], list[str], list[str]]:
        created = client.create_proxy("db", echo.address, listen="localhost:0")
        port = created.listen.rsplit(":", 1)[1]
        client.add_toxic("db", "latency")
        spec = [{"name": "db", "upstream": echo.address, "listen": f"localhost:{port}"}]
        kept = client.populate(spec)
        after_adapter = [t.name for t in client.get_proxy("db").toxics]
        # The bare library compares raw listen strings, so it recreates the proxy and
        # loses its toxics (pitfall 5).
        with client.library() as tp:
            tp.populate(spec)
        after_library = [t.name for t in client.get_proxy("db").toxics]
        return [p.name for p in kept], after_adapter, after_library

    kept, after_adapter, after_library = await in_thread(scenario)
    assert kept == ["db"]
    assert after_adapter == ["latency_downstream"]
    assert after_library == []


async def test_down_restores_the_previous_state(client: ToxiproxyClient, echo: Upstream) -> None:
    def scenario() -> tuple[bool, bool, bool]:
        client.create_proxy("cold", echo.address, enabled=False)
        client.create_proxy("hot", echo.address)
        with client.down("cold") as view:
            inside = view.enabled
        with client.down("hot"):
            pass
        return inside, client.get_proxy("cold").enabled, client.get_proxy("hot").enabled

    assert await in_thread(scenario) == (False, False, True)


async def test_names_are_escaped_in_urls(client: ToxiproxyClient, echo: Upstream) -> None:
    def scenario() -> str:
        client.create_proxy("my db?x=1", echo.address)
        client.add_toxic("my db?x=1", "noop", name="a b")
        return client.get_toxic("my db?x=1", "a b").name

    assert await in_thread(scenario) == "a b"


async def test_two_servers_in_one_process(api: Api, echo: Upstream) -> None:
    registry = new_registry()
    other = FaultProxyServer(FaultProxyService(registry=registry, rng=random.Random(2)), registry)
    await other.start("127.0.0.1", 0)
    try:
        first, second = ToxiproxyClient(api.url), ToxiproxyClient(other.url)

        def scenario() -> tuple[list[str], list[str]]:
            with first.library() as tp:
                tp.create(upstream=echo.address, name="on-first")
                second.create_proxy("on-second", echo.address)  # nested binding restores
                tp.create(upstream=echo.address, name="also-first")
            return list(first.proxies()), list(second.proxies())

        assert await in_thread(scenario) == (["also-first", "on-first"], ["on-second"])
        async with aiohttp.ClientSession() as session, session.get(other.url + "/proxies") as reply:
            assert list(json.loads(await reply.read())) == ["on-second"]
    finally:
        await other.close()


async def test_a_hung_server_times_out() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]
    client = ToxiproxyClient(f"http://127.0.0.1:{port}", timeout=0.2)
    try:
        start = time.perf_counter()
        with pytest.raises(errors.ToxiproxyUnavailable, match="GET /proxies"):
            await in_thread(client.proxies)
        assert time.perf_counter() - start < 2.0
        assert not await in_thread(client.is_running)
    finally:
        client.close()
        silent.close()


async def test_nothing_listening_is_unavailable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    client = ToxiproxyClient(f"http://127.0.0.1:{port}", timeout=1.0)
    with pytest.raises(errors.ToxiproxyUnavailable):
        await in_thread(client.version)
    assert not await is_up(f"127.0.0.1:{port}")


def test_library_binding_is_restored_afterwards() -> None:
    consumer = toxiproxy.api.APIConsumer
    before = (consumer.host, consumer.port, toxiproxy.api.requests)
    with ToxiproxyClient("http://127.0.0.2:9999").library():
        assert (consumer.host, consumer.port) == ("127.0.0.2", 9999)
    assert (consumer.host, consumer.port, toxiproxy.api.requests) == before
