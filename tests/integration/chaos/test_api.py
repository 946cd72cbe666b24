"""The Toxiproxy 2.12 API contract over real HTTP (assertions ported from api_test.go)."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from chaos.proxy import server as server_module
from chaos.proxy.service import TOXIPROXY_VERSION
from tests.integration.chaos.conftest import Api, Reply, Upstream, connect, is_up, read_to_eof

pytestmark = pytest.mark.integration

ERROR_HEADERS = {"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"}


def assert_error(reply: Reply, status: int, message: str) -> None:
    assert reply.status == status
    assert (
        reply.body
        == (json.dumps({"error": message, "status": status}, separators=(",", ":")) + "\n").encode()
    )
    for header, value in ERROR_HEADERS.items():
        assert reply.headers[header] == value


# ---------------------------------------------------------------- server behaviour
async def test_request_id_on_every_routed_response(api: Api) -> None:
    for method, path in (("GET", "/version"), ("GET", "/proxies/nope"), ("PUT", "/proxies")):
        reply = await api.call(method, path)
        assert len(reply.headers["X-Toxiproxy-Request-Id"]) == 20
    first = await api.call("GET", "/version")
    second = await api.call("GET", "/version")
    assert first.headers["X-Toxiproxy-Request-Id"] != second.headers["X-Toxiproxy-Request-Id"]


async def test_browsers_get_403(api: Api) -> None:
    reply = await api.call(
        "GET", "/proxies", headers={"User-Agent": "Mozilla/5.0 (Linux; Android 4.4.2)"}
    )
    assert reply.status == 403
    assert reply.body == b"User agent not allowed\n"
    assert "X-Toxiproxy-Request-Id" in reply.headers
    reply = await api.call("GET", "/proxies", headers={"User-Agent": "Wget/2.1"})
    assert reply.status == 200


async def test_unknown_path_is_404_text(api: Api) -> None:
    for path in ("/", "/nope", "/proxies/", "/proxies/a/", "/proxies/a/toxics/b/c"):
        reply = await api.call("GET", path)
        assert reply.status == 404, path
        assert reply.body == b"404 page not found\n"
        assert "X-Toxiproxy-Request-Id" not in reply.headers


async def test_wrong_method_is_405_empty(api: Api) -> None:
    for method, path in (
        ("PUT", "/proxies"),
        ("DELETE", "/proxies"),
        ("GET", "/reset"),
        ("GET", "/populate"),
        ("PATCH", "/proxies/x/toxics"),
        ("POST", "/version"),
        ("HEAD", "/version"),
    ):
        reply = await api.call(method, path)
        assert reply.status == 405, (method, path)
        assert reply.body == b""


async def test_version(api: Api) -> None:
    reply = await api.call("GET", "/version")
    assert reply.status == 200
    assert reply.body == f'{{"version": "{TOXIPROXY_VERSION}"}}\n'.encode()
    assert reply.headers["Content-Type"] == "application/json;charset=utf-8"


async def test_index_with_no_proxies_is_an_empty_object(api: Api) -> None:
    reply = await api.call("GET", "/proxies")
    assert (reply.status, reply.body) == (200, b"{}")
    assert reply.headers["Content-Type"] == "application/json"


# ---------------------------------------------------------------- proxies
async def test_create_requires_name_and_upstream(api: Api) -> None:
    assert_error(await api.call("POST", "/proxies", {}), 400, "missing required field: name")
    assert_error(
        await api.call("POST", "/proxies", {"name": "test"}),
        400,
        "missing required field: upstream",
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "bad request body: EOF"),
        (b"{", "bad request body: unexpected EOF"),
        (
            b"[]",
            "bad request body: json: cannot unmarshal array into Go value of type toxiproxy.Proxy",
        ),
        (
            b'{"name": "a", "upstream": "b", "enabled": "yes"}',
            "bad request body: json: cannot unmarshal string into Go struct field Proxy.enabled "
            "of type bool",
        ),
    ],
)
async def test_malformed_bodies_are_400_json(api: Api, data: bytes, message: str) -> None:
    assert_error(await api.call("POST", "/proxies", data=data), 400, message)


async def test_create_and_get(api: Api, echo: Upstream) -> None:
    reply = await api.call(
        "POST",
        "/proxies",
        {"name": "mysql_master", "listen": "localhost:0", "upstream": echo.address},
    )
    assert reply.status == 201
    created = reply.json()
    assert list(created) == ["name", "listen", "upstream", "enabled", "toxics"]
    assert created["listen"].startswith("127.0.0.1:")
    assert created["listen"] != "127.0.0.1:0"
    assert (created["upstream"], created["enabled"], created["toxics"]) == (echo.address, True, [])
    assert (await api.call("GET", "/proxies/mysql_master")).json() == created
    assert (await api.call("GET", "/proxies")).json() == {"mysql_master": created}
    assert await is_up(created["listen"])


async def test_create_disabled_then_enable_and_disable(api: Api, echo: Upstream) -> None:
    created = await api.create("db", echo.address, listen="127.0.0.1:0", enabled=False)
    assert (created["listen"], created["enabled"]) == ("127.0.0.1:0", False)
    enabled = (await api.call("PATCH", "/proxies/db", {"enabled": True})).json()
    assert enabled["enabled"]
    assert await is_up(enabled["listen"])
    disabled = (await api.call("POST", "/proxies/db", {"enabled": False})).json()
    assert not disabled["enabled"]
    assert disabled["listen"] == enabled["listen"]
    assert not await is_up(enabled["listen"])


async def test_delete(api: Api, echo: Upstream) -> None:
    created = await api.create("db", echo.address)
    reply = await api.call("DELETE", "/proxies/db")
    assert (reply.status, reply.body) == (204, b"")
    assert not await is_up(created["listen"])
    assert_error(await api.call("DELETE", "/proxies/db"), 404, "proxy not found")
    assert_error(await api.call("GET", "/proxies/db"), 404, "proxy not found")


async def test_port_conflict_is_500_with_the_bind_error(api: Api, echo: Upstream) -> None:
    first = await api.create("mysql_master", echo.address)
    port = first["listen"].rsplit(":", 1)[1]
    reply = await api.call(
        "POST",
        "/proxies",
        {"name": "test", "listen": f"localhost:{port}", "upstream": echo.address},
    )
    assert_error(reply, 500, f"listen tcp 127.0.0.1:{port}: bind: address already in use")
    assert (await api.call("GET", "/proxies/test")).status == 404
    assert (await api.call("DELETE", "/proxies/mysql_master")).status == 204
    reply = await api.call(
        "POST",
        "/proxies",
        {"name": "test", "listen": f"localhost:{port}", "upstream": echo.address},
    )
    assert reply.status == 201


async def test_name_conflict_is_409(api: Api, echo: Upstream) -> None:
    await api.create("mysql_master", echo.address)
    assert_error(
        await api.call(
            "POST", "/proxies", {"name": "mysql_master", "listen": "127.0.0.1:0", "upstream": "x:1"}
        ),
        409,
        "proxy already exists",
    )


async def test_changing_listen_restarts_the_listener(api: Api, echo: Upstream) -> None:
    created = await api.create("db", echo.address)
    reader, writer = await connect(created["listen"])
    updated = (await api.call("PATCH", "/proxies/db", {"listen": "127.0.0.1:0"})).json()
    assert updated["enabled"]
    assert updated["listen"] != created["listen"]
    assert await read_to_eof(reader) == b""  # its connections were dropped
    writer.close()
    assert not await is_up(created["listen"])
    assert await is_up(updated["listen"])


async def test_update_with_the_same_resolved_listen_keeps_connections(
    api: Api, echo: Upstream
) -> None:
    created = await api.create("db", echo.address)
    port = created["listen"].rsplit(":", 1)[1]
    reader, writer = await connect(created["listen"])
    reply = await api.call("PATCH", "/proxies/db", {"listen": f"localhost:{port}"})
    assert reply.json()["listen"] == created["listen"]
    writer.write(b"still here")
    assert await asyncio.wait_for(reader.readexactly(10), 5) == b"still here"
    writer.close()


async def test_unresolvable_listen_on_update_is_500(api: Api, echo: Upstream) -> None:
    await api.create("db", echo.address)
    reply = await api.call("PATCH", "/proxies/db", {"listen": "local373"})
    assert_error(reply, 500, "address local373: missing port in address")


async def test_reenable_on_a_taken_port_is_500(api: Api, echo: Upstream) -> None:
    first = await api.create("a", echo.address)
    await api.create("b", echo.address, enabled=False)
    reply = await api.call("PATCH", "/proxies/b", {"listen": first["listen"], "enabled": True})
    assert reply.status == 500
    assert "address already in use" in reply.json()["error"]
    assert not (await api.call("GET", "/proxies/b")).json()["enabled"]


# ---------------------------------------------------------------- populate
async def test_populate_creates_and_returns_201(api: Api, echo: Upstream) -> None:
    reply = await api.call(
        "POST",
        "/populate",
        [
            {"name": "one", "listen": "localhost:0", "upstream": echo.address},
            {"name": "two", "listen": "localhost:0", "upstream": echo.address, "enabled": False},
        ],
    )
    assert reply.status == 201
    assert reply.headers["Content-Type"] == "application/json"
    proxies = reply.json()["proxies"]
    assert [p["name"] for p in proxies] == ["one", "two"]
    assert [p["enabled"] for p in proxies] == [True, False]
    assert await is_up(proxies[0]["listen"])


async def test_populate_keeps_an_existing_proxy_with_its_toxics(api: Api, echo: Upstream) -> None:
    one = await api.create("one", echo.address, listen="localhost:0")
    await api.toxic("one", type="latency", stream="downstream")
    port = one["listen"].rsplit(":", 1)[1]
    reply = await api.call(
        "POST",
        "/populate",
        [
            # resolves to the bound 127.0.0.1:port: same proxy, kept
            {"name": "one", "listen": f"localhost:{port}", "upstream": echo.address},
            {"name": "two", "listen": "127.0.0.1:0", "upstream": echo.address},
        ],
    )
    assert reply.status == 201
    one_after, two = reply.json()["proxies"]
    assert one_after["listen"] == f"127.0.0.1:{port}"
    assert [t["type"] for t in one_after["toxics"]] == ["latency"]
    assert await is_up(two["listen"])


async def test_populate_with_a_bad_name_changes_nothing(api: Api) -> None:
    reply = await api.call(
        "POST",
        "/populate",
        [{"name": "one", "listen": "127.0.0.1:0", "upstream": "x:1"}, {"name": "", "listen": ""}],
    )
    assert reply.status == 400
    assert reply.json() == {
        "error": "missing required field: name at proxy 2",
        "status": 400,
        "proxies": None,
    }
    assert reply.headers["Content-Type"] == "application/json"
    assert (await api.call("GET", "/proxies")).json() == {}


async def test_populate_failing_part_way_keeps_earlier_items(api: Api, echo: Upstream) -> None:
    reply = await api.call(
        "POST",
        "/populate",
        [
            {"name": "one", "listen": "127.0.0.1:0", "upstream": echo.address},
            {"name": "two", "listen": "local373", "upstream": echo.address},
            {"name": "three", "listen": "127.0.0.1:0", "upstream": echo.address},
        ],
    )
    assert reply.status == 500
    body = reply.json()
    assert body["error"] == "listen tcp: address local373: missing port in address"
    assert [p["name"] for p in body["proxies"]] == ["one"]
    assert list((await api.call("GET", "/proxies")).json()) == ["one"]


async def test_populate_empty_is_201_null(api: Api) -> None:
    reply = await api.call("POST", "/populate", [])
    assert (reply.status, reply.json()) == (201, {"proxies": None})


async def test_populate_then_add_toxic(api: Api, echo: Upstream) -> None:
    reply = await api.call(
        "POST", "/populate", [{"name": "one", "listen": "127.0.0.1:0", "upstream": echo.address}]
    )
    assert reply.status == 201
    assert (await api.toxic("one", type="latency"))["name"] == "latency_downstream"


# ---------------------------------------------------------------- reset
async def test_reset_enables_everything_and_removes_toxics(api: Api, echo: Upstream) -> None:
    created = await api.create("mysql_master", echo.address)
    latency = await api.toxic(
        "mysql_master", type="latency", attributes={"latency": 100, "jitter": 10}
    )
    assert latency["attributes"] == {"latency": 100, "jitter": 10}
    await api.call("PATCH", "/proxies/mysql_master", {"enabled": False})
    reply = await api.call("POST", "/reset", data=b"ignored body")
    assert (reply.status, reply.body) == (204, b"")
    proxy = (await api.call("GET", "/proxies")).json()["mysql_master"]
    assert proxy["enabled"]
    assert proxy["toxics"] == []
    assert await is_up(created["listen"])


# ---------------------------------------------------------------- toxics
async def test_listing_toxics_upstream_first(api: Api, echo: Upstream) -> None:
    await api.create("db", echo.address)
    assert (await api.call("GET", "/proxies/db/toxics")).body == b"[]"
    await api.toxic("db", type="latency", name="d1")
    await api.toxic("db", type="latency", name="u1", stream="upstream")
    await api.toxic("db", type="slow_close", name="d2")
    toxics = (await api.call("GET", "/proxies/db/toxics")).json()
    assert [t["name"] for t in toxics] == ["u1", "d1", "d2"]
    assert list(toxics[0]) == ["attributes", "name", "type", "stream", "toxicity"]
    assert (await api.call("GET", "/proxies/db")).json()["toxics"] == toxics


async def test_add_toxic_returns_200_with_every_attribute(api: Api, echo: Upstream) -> None:
    await api.create("db", echo.address)
    reply = await api.call(
        "POST",
        "/proxies/db/toxics",
        {"name": "foobar", "type": "latency", "attributes": {"latency": 100, "jitter": 10}},
    )
    assert reply.status == 200
    assert reply.json() == {
        "attributes": {"latency": 100, "jitter": 10},
        "name": "foobar",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1,
    }
    assert (await api.call("GET", "/proxies/db/toxics/foobar")).json() == reply.json()


async def test_toxic_names_are_unique_across_streams(api: Api, echo: Upstream) -> None:
    await api.create("db", echo.address)
    await api.toxic("db", type="latency", name="foobar", stream="upstream")
    for toxic in (
        {"type": "slow_close", "name": "foobar"},
        {"type": "latency", "name": "foobar", "stream": "downstream"},
    ):
        assert_error(
            await api.call("POST", "/proxies/db/toxics", toxic), 409, "toxic already exists"
        )
    # Default names carry the stream, so both streams can have "latency".
    await api.toxic("db", type="latency", stream="upstream")
    await api.toxic("db", type="latency", stream="downstream")
    names = [t["name"] for t in (await api.call("GET", "/proxies/db/toxics")).json()]
    assert names == ["foobar", "latency_upstream", "latency_downstream"]


async def test_toxicity_and_noop(api: Api, echo: Upstream) -> None:
    await api.create("db", echo.address)
    latency = await api.toxic("db", type="latency", toxicity=0.2, attributes={"latency": 100})
    assert latency["toxicity"] == 0.2
    noop = await api.toxic("db", type="noop", name="foobar")
    assert (noop["type"], noop["stream"], noop["toxicity"], noop["attributes"]) == (
        "noop",
        "downstream",
        1,
        {},
    )


async def test_update_toxic_with_patch_and_post(api: Api, echo: Upstream) -> None:
    await api.create("db", echo.address)
    await api.toxic("db", type="latency", attributes={"latency": 100, "jitter": 10})
    reply = await api.call(
        "PATCH",
        "/proxies/db/toxics/latency_downstream",
        {"toxicity": 0.5, "attributes": {"latency": 1000}},
    )
    assert reply.status == 200
    assert (reply.json()["toxicity"], reply.json()["attributes"]) == (
        0.5,
        {"latency": 1000, "jitter": 10},
    )
    reply = await api.call(
        "POST", "/proxies/db/toxics/latency_downstream", {"attributes": {"latency": 500}}
    )
    assert (reply.json()["toxicity"], reply.json()["attributes"]) == (
        0.5,
        {"latency": 500, "jitter": 10},
    )


async def test_remove_toxic(api: Api, echo: Upstream) -> None:
    await api.create("db", echo.address)
    await api.toxic("db", type="latency")
    reply = await api.call("DELETE", "/proxies/db/toxics/latency_downstream")
    assert (reply.status, reply.body) == (204, b"")
    assert (await api.call("GET", "/proxies/db/toxics")).json() == []
    assert_error(
        await api.call("DELETE", "/proxies/db/toxics/latency_downstream"), 404, "toxic not found"
    )


@pytest.mark.parametrize(
    ("toxic", "status", "message"),
    [
        (
            {"type": "latency", "stream": "walrustream"},
            400,
            "stream was invalid, can be either upstream or downstream",
        ),
        ({"type": "frobnicate"}, 400, "invalid toxic type"),
        (
            {"type": "latency", "attributes": {"latency": "100"}},
            400,
            "bad request body: json: cannot unmarshal string into Go struct field "
            "ToxicWrapper.attributes.latency of type int64",
        ),
        (
            {"type": "slicer", "attributes": {"average_size": 0}},
            400,
            "bad request body: slicer average_size must be at least 1 (0 never terminates "
            "in Toxiproxy)",
        ),
    ],
)
async def test_invalid_toxics(
    api: Api, echo: Upstream, toxic: dict[str, object], status: int, message: str
) -> None:
    await api.create("db", echo.address)
    assert_error(await api.call("POST", "/proxies/db/toxics", toxic), status, message)


async def test_toxic_calls_on_a_missing_proxy_are_404(api: Api) -> None:
    for method, path in (
        ("GET", "/proxies/x/toxics"),
        ("POST", "/proxies/x/toxics"),
        ("GET", "/proxies/x/toxics/t"),
        ("PATCH", "/proxies/x/toxics/t"),
        ("DELETE", "/proxies/x/toxics/t"),
    ):
        assert_error(await api.call(method, path), 404, "proxy not found")


# ---------------------------------------------------------------- metrics
async def test_metrics_report_connections_bytes_and_toxics(api: Api, echo: Upstream) -> None:
    created = await api.create("db", echo.address)
    await api.toxic("db", type="noop", stream="upstream")
    reader, writer = await connect(created["listen"])
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
    writer.close()
    assert await read_to_eof(reader) == b""
    await api.service.live_proxy("db").stop()  # waits until the connection is gone
    reply = await api.call("GET", "/metrics")
    assert reply.status == 200
    text = reply.body.decode()
    assert 'gtm_chaos_proxy_connections_total{proxy="db"} 1.0' in text
    assert 'gtm_chaos_proxy_received_bytes_total{direction="upstream",proxy="db"} 4.0' in text
    assert 'gtm_chaos_proxy_sent_bytes_total{direction="downstream",proxy="db"} 4.0' in text
    assert 'gtm_chaos_proxy_active_toxics{direction="upstream",proxy="db"} 1.0' in text
    assert 'gtm_chaos_proxy_active_connections{proxy="db"} 0.0' in text
    assert "toxiproxy_proxy_sent_bytes_total{" in text
    sample = api.registry.get_sample_value(
        "toxiproxy_proxy_received_bytes_total",
        {
            "direction": "upstream",
            "proxy": "db",
            "listener": created["listen"],
            "upstream": echo.address,
        },
    )
    assert sample == 4.0


# ---------------------------------------------------------------- robustness
async def test_a_handler_past_its_deadline_is_503_empty(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    never = asyncio.Event()

    async def stuck() -> None:
        await never.wait()

    monkeypatch.setattr(server_module, "HANDLER_TIMEOUT_SECONDS", 0.05)
    monkeypatch.setattr(api.service, "reset", stuck)
    reply = await api.call("POST", "/reset")
    assert (reply.status, reply.body) == (503, b"")
    assert "X-Toxiproxy-Request-Id" in reply.headers


async def test_an_internal_error_is_a_500_body_not_a_traceback(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(api.service, "proxy_views", broken)
    assert_error(await api.call("GET", "/proxies"), 500, "internal error (see the server log)")
    assert (await api.call("GET", "/version")).status == 200  # still serving


async def test_an_oversized_body_is_refused(api: Api) -> None:
    oversized = io.BytesIO(b" " * (server_module.MAX_BODY_BYTES + 1))
    async with api.session.post(api.url + "/populate", data=oversized) as reply:
        assert reply.status == 413
        assert json.loads(await reply.read())["status"] == 413
