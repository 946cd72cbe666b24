"""``gtm state`` through click's CliRunner against a real etcd."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid

from click.testing import CliRunner

from gtm.state.etcd import EtcdStore
from gtm.state.etcd_server import EtcdServer
from gtm.state.url import Endpoint
from gtmctl.cli import cli


def _seed(server: EtcdServer, items: dict[str, bytes]) -> list[int]:
    async def put_all() -> list[int]:
        store = EtcdStore([Endpoint(server.host, server.port)])
        try:
            return [await store.put(key, value) for key, value in items.items()]
        finally:
            await store.aclose()

    return asyncio.run(put_all())


def test_ls_get_and_watch(etcd_server: EtcdServer) -> None:
    prefix = f"/cli/{uuid.uuid4().hex[:8]}/"
    revisions = _seed(etcd_server, {prefix + "b": b"\xff\x00", prefix + "a": b"hello"})
    runner = CliRunner()
    state = ["--state", etcd_server.etcd_url]

    listed = runner.invoke(cli, ["state", "ls", prefix, *state])
    assert listed.exit_code == 0, listed.output
    lines = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [(fields[0], fields[4]) for fields in lines] == [
        (prefix + "a", "5"),
        (prefix + "b", "2"),
    ]
    assert "2 keys at revision" in listed.stderr

    got = runner.invoke(cli, ["state", "get", prefix + "a", *state])
    assert (got.exit_code, got.stdout) == (0, "hello\n")
    as_json = runner.invoke(cli, ["state", "get", prefix + "b", "--json", *state])
    record = json.loads(as_json.stdout)
    assert base64.b64decode(record["value_base64"]) == b"\xff\x00"
    assert record["mod_revision"] == revisions[0]
    missing = runner.invoke(cli, ["state", "get", prefix + "nope", *state])
    assert missing.exit_code == 1
    assert "no key" in missing.output

    watched = runner.invoke(
        cli,
        ["state", "watch", prefix, "--from-revision", str(revisions[0]), "--count", "2", *state],
    )
    assert watched.exit_code == 0, watched.output
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [(e["type"], e["key"], e["mod_revision"]) for e in events] == [
        ("put", prefix + "b", revisions[0]),
        ("put", prefix + "a", revisions[1]),
    ]
    assert events[1]["value"] == "hello"


def test_state_url_from_the_environment_and_unreachable_store(etcd_server: EtcdServer) -> None:
    runner = CliRunner()
    ok = runner.invoke(
        cli, ["state", "ls", "/nothing-here/"], env={"GTM_STATE": etcd_server.etcd_url}
    )
    assert ok.exit_code == 0, ok.output
    down = runner.invoke(
        cli, ["state", "ls", "/", "--state", "etcd://127.0.0.1:9", "--timeout", "0.2"]
    )
    assert down.exit_code == 1
    assert "unavailable" in down.output
    bad = runner.invoke(cli, ["state", "ls", "/", "--state", "etcd:/oops"])
    assert bad.exit_code == 2
    assert "etcd://HOST:PORT" in bad.output
