"""``gtm drain --api`` pointed at the wrong listener says what to use instead, in one line;
``gtm drain``/``gtm undrain`` name what they changed and print the undo."""

from __future__ import annotations

import asyncio
import shlex
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import click
import pytest
from aiohttp import web
from click.testing import CliRunner

from gtm import drain_cli
from gtm.clock import FakeClock
from gtm.drain_cli import _call_api
from gtm.models import Drain, DrainTarget
from gtm.net import bindable, free_port
from gtm.serve import HttpServer
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from gtmctl.cli import cli

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


# ---------------------------------------------------------------------------- --state


class KeptOpen(MemoryStore):
    """The CLI closes the store it opened; keep this one for the next command."""

    async def aclose(self) -> None:
        return None


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    shared = KeptOpen(FakeClock())
    asyncio.run(shared.put(keys.region("eu-west"), b"{}"))  # known_ids reads keys only
    monkeypatch.setattr(drain_cli, "open_store", lambda url, **_: shared)
    return shared


def gtm(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def undo_of(out: str) -> list[str]:
    """The command after ``undo: `` (without the leading ``gtm``)."""
    command = shlex.split(out.split("; undo: ", 1)[1])
    assert command[0] == "gtm"
    return command[1:]


def drain_record(store: MemoryStore) -> Drain | None:
    kv = asyncio.run(store.get(keys.drain(DrainTarget.REGION, "eu-west")))
    return None if kv is None else codec.decode(kv.key, kv.value, Drain)


def test_drain_and_undrain_name_the_change_and_print_the_undo(store: MemoryStore) -> None:
    state = ("--state", "etcd://h:1")
    code, out, err = gtm("drain", "region", "eu-west", *state, "--by", "ops", "--reason", "maint")
    assert code == 0, err
    revision = asyncio.run(store.current_revision())
    assert out.strip() == (
        f"drained region eu-west at store revision {revision} (was: serving); "
        "undo: gtm undrain region eu-west --state etcd://h:1"
    )
    drained = drain_record(store)
    assert drained is not None
    code, out, _ = gtm(*undo_of(out))
    assert code == 0
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(drained.at))
    assert out.strip() == (
        f"undrained region eu-west at store revision {revision + 1} "
        f"(was: drained by ops since {when}: maint); "
        "undo: gtm drain region eu-west --state etcd://h:1 --force --reason maint --by ops"
    )
    assert drain_record(store) is None
    # Its undo drains it again, for the same reason and in the same name.
    code, out, _ = gtm(*undo_of(out))
    assert (code, out.startswith("drained region eu-west at store revision ")) == (0, True)
    again = drain_record(store)
    assert again is not None
    assert (again.by, again.reason) == ("ops", "maint")
    # Draining a drained region says whose drain it replaced, and undoes to it.
    code, out, _ = gtm("drain", "region", "eu-west", *state, "--by", "bob")
    assert code == 0
    assert "(was: drained by ops since " in out
    assert out.strip().endswith("undo: gtm drain region eu-west --state etcd://h:1 --force "
                                "--reason maint --by ops")  # fmt: skip


def test_undrain_refuses_an_id_neither_drained_nor_known(store: MemoryStore) -> None:
    state = ("--state", "etcd://h:1")
    code, out, _ = gtm("undrain", "region", "eu-west", *state)
    assert (code, out.strip()) == (0, "region eu-west was not drained; nothing changed")
    assert gtm("drain", "region", "eu-central", *state, "--force")[0] == 0
    revision = asyncio.run(store.current_revision())
    code, _, err = gtm("undrain", "region", "eu-wset", *state)
    assert code == 2
    [line] = err.splitlines()
    assert "unknown region 'eu-wset'; known regions: eu-west (drained regions: eu-central)" in line
    assert asyncio.run(store.current_revision()) == revision
    # A drain forced ahead of its region's arrival can be undone.
    code, out, _ = gtm("undrain", "region", "eu-central", *state)
    assert (code, out.startswith("undrained region eu-central at store revision ")) == (0, True)


async def test_through_the_drain_api_the_output_says_what_was_there_and_the_undo(
    token: Path,
) -> None:
    previous = {"schema": 1, "target": "zone", "id": "eu-west-a", "reason": "maint",
                "by": "ops", "at": 0.0}  # fmt: skip

    async def drain(request: web.Request) -> web.Response:
        return web.json_response({"drained": "zone/eu-west-a", "revision": 7, "was": None})

    async def undrain(request: web.Request) -> web.Response:
        return web.json_response({"undrained": "zone/eu-west-a", "existed": True, "was": previous})

    app = web.Application()
    app.router.add_post("/api/v1/drains/{target}/{id}", drain)
    app.router.add_delete("/api/v1/drains/{target}/{id}", undrain)
    port = free_port("127.0.0.1")
    api = f"http://127.0.0.1:{port}"
    options = ("--api", api, "--token-file", str(token))
    async with _listening(app, port):
        drained = await asyncio.to_thread(gtm, "drain", "zone", "eu-west-a", *options)
        undrained = await asyncio.to_thread(gtm, "undrain", "zone", "eu-west-a", *options)
    assert drained[1].strip() == (
        f"drained zone eu-west-a at store revision 7 (was: serving); "
        f"undo: gtm undrain zone eu-west-a --api {api}"
    )
    assert undrained[1].strip() == (
        "undrained zone eu-west-a (was: drained by ops since 1970-01-01T00:00:00Z: maint); "
        f"undo: gtm drain zone eu-west-a --api {api} --force --reason maint"
    )
