"""``gtm drain --api`` pointed at the wrong listener says what to use instead, in one line."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import click
import pytest
from aiohttp import web

from gtm.drain_cli import _call_api
from gtm.net import bindable, free_port
from gtm.serve import HttpServer

STATE = "etcd://127.0.0.1:23790"


def _adjacent_ports() -> int:
    """A port whose next port is free too (the front door and gtm up's status listener)."""
    for _ in range(50):
        port = free_port("127.0.0.1")
        if bindable(socket.AF_INET, "127.0.0.1", port + 1):
            return port
    raise AssertionError("no two adjacent free ports")


@asynccontextmanager
async def _listening(app: web.Application, port: int) -> AsyncIterator[None]:
    server = HttpServer(app, "127.0.0.1", port)
    await server.start()
    try:
        yield
    finally:
        await server.stop()


def _status_listener() -> web.Application:
    async def deployment(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == "Bearer secret"
        return web.json_response({"state": STATE, "status_url": "ignored"})

    app = web.Application()
    app.router.add_get("/api/v1/deployment", deployment)
    return app


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "operator.token"
    path.write_text("secret\n")
    return path


def _front_door(json_errors: bool) -> web.Application:
    """No drain API: a 404 in plain text (aiohttp's) or as an OpenAI error body."""
    app = web.Application()
    if json_errors:

        async def not_found(request: web.Request) -> web.Response:
            body = {"error": {"message": "Invalid URL", "type": "invalid_request_error"}}
            return web.json_response(body, status=404)

        app.router.add_route("*", "/{tail:.*}", not_found)
    return app


@pytest.mark.parametrize("json_errors", [False, True], ids=["plain-404", "json-404"])
async def test_the_front_door_of_gtm_up_processes_names_the_state_to_use(
    token: Path, json_errors: bool
) -> None:
    port = _adjacent_ports()
    front_door = _front_door(json_errors)
    async with _listening(front_door, port), _listening(_status_listener(), port + 1):
        with pytest.raises(click.ClickException) as raised:
            await _call_api("POST", f"http://127.0.0.1:{port}", "region", "eu-west", token, 5.0)
    message = raised.value.format_message()
    assert "\n" not in message
    assert f"http://127.0.0.1:{port} is not a drain API (HTTP 404" in message
    assert f"--state {STATE}" in message
    assert f"--api http://127.0.0.1:{port + 1}" in message


async def test_without_a_deployment_beside_it_the_message_says_where_to_look(token: Path) -> None:
    port = _adjacent_ports()
    async with _listening(web.Application(), port):
        with pytest.raises(click.ClickException) as raised:
            await _call_api("POST", f"http://127.0.0.1:{port}", "region", "eu-west", token, 5.0)
    message = raised.value.format_message()
    assert "status page address `gtm up` printed" in message
    assert "--state" in message


async def test_an_unknown_id_from_the_drain_api_is_a_usage_error(token: Path) -> None:
    async def refuse(request: web.Request) -> web.Response:
        assert "force" not in request.query
        body = {"error": "unknown region 'planet-x'; known regions: eu-west", "known": ["eu-west"]}
        return web.json_response(body, status=404)

    app = web.Application()
    app.router.add_post("/api/v1/drains/{target}/{id}", refuse)
    port = free_port("127.0.0.1")
    async with _listening(app, port):
        with pytest.raises(click.BadParameter) as raised:
            await _call_api(
                "POST", f"http://127.0.0.1:{port}/status", "region", "planet-x", token, 5.0
            )
    assert raised.value.exit_code == 2
    assert "known regions: eu-west" in raised.value.format_message()
