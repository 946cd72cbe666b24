"""``gtm state``: look into the state store — list keys, read one, follow changes.

Meant for etcd (``--state etcd://HOST:PORT``, or ``GTM_STATE``). With the default
``--state memory`` each command sees a fresh, empty embedded store, which is only good
for trying the commands out.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import click

from gtm.clock import SystemClock
from gtm.errors import ConfigError, GtmError
from gtm.metrics import new_registry
from gtm.state.store import KeyValue, StateStore, WatchEvent
from gtm.state.url import ACCEPTED_FORMS, StateUrl, open_store, parse_state_url

T = TypeVar("T")


def _parse_state(ctx: click.Context, param: click.Parameter, value: str) -> StateUrl:
    try:
        return parse_state_url(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


_state_option = click.option(
    "--state",
    "state_url",
    metavar="URL",
    callback=_parse_state,
    envvar="GTM_STATE",
    default="memory",
    show_default=True,
    help=f"State store: {ACCEPTED_FORMS}. Read from GTM_STATE when not given.",
)
_timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=0.05),
    default=2.0,
    show_default=True,
    help="Seconds to wait for each answer from the store.",
)


def _run(url: StateUrl, timeout: float, work: Callable[[StateStore], Awaitable[T]]) -> T:
    """Open the store, run ``work`` on it, close it; store errors become clean exits."""

    async def main() -> T:
        store = open_store(url, clock=SystemClock(), registry=new_registry(), timeout=timeout)
        try:
            return await work(store)
        finally:
            await store.aclose()

    try:
        return asyncio.run(main())
    except GtmError as exc:
        raise click.ClickException(str(exc)) from exc


def _value_fields(value: bytes) -> dict[str, str]:
    try:
        return {"value": value.decode()}
    except UnicodeDecodeError:
        return {"value_base64": base64.b64encode(value).decode()}


def _kv_json(kv: KeyValue) -> dict[str, Any]:
    return {
        "key": kv.key,
        **_value_fields(kv.value),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease": kv.lease,
    }


def _event_json(revision: int, event: WatchEvent) -> str:
    return json.dumps({"revision": revision, "type": event.type.value, **_kv_json(event.kv)})


@click.group(name="state")
def state() -> None:
    """Inspect the state store (etcd, or the embedded one).

    \b
    Examples:
      gtm state ls /gtm/v1/regions/ --state etcd://127.0.0.1:2379
      gtm state get /gtm/v1/regions/eu-west
      GTM_STATE=etcd://127.0.0.1:2379 gtm state watch /gtm/v1/summaries/
    """


@state.command("ls")
@click.argument("prefix", default="/gtm/v1/")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per key, with its value.")
@_state_option
@_timeout_option
def ls(prefix: str, as_json: bool, state_url: StateUrl, timeout: float) -> None:
    """List the keys under PREFIX (default /gtm/v1/), sorted.

    Prints one line per key: the key, its mod revision, version, lease (hex, 0 for none)
    and value size in bytes; then, on stderr, the store revision the listing is from.
    PREFIX is a plain string prefix: end it with / to list a "directory".
    """
    result = _run(state_url, timeout, lambda store: store.range(prefix))
    for kv in result.kvs:
        if as_json:
            click.echo(json.dumps(_kv_json(kv)))
        else:
            click.echo(f"{kv.key}\t{kv.mod_revision}\t{kv.version}\t{kv.lease:#x}\t{len(kv.value)}")
    click.echo(f"# {len(result.kvs)} keys at revision {result.revision}", err=True)


@state.command("get")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print the key's metadata and value as JSON.")
@_state_option
@_timeout_option
def get(key: str, as_json: bool, state_url: StateUrl, timeout: float) -> None:
    """Print the value stored at KEY (exit status 1 if there is none).

    The raw value goes to stdout as is; --json prints it with its revisions, version
    and lease (values that are not UTF-8 text come base64-encoded as value_base64).
    """
    kv = _run(state_url, timeout, lambda store: store.get(key))
    if kv is None:
        raise click.ClickException(f"no key {key!r} in {state_url}")
    if as_json:
        click.echo(json.dumps(_kv_json(kv)))
        return
    sys.stdout.buffer.write(kv.value)
    if not kv.value.endswith(b"\n"):
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()


@state.command("watch")
@click.argument("prefix", default="/gtm/v1/")
@click.option(
    "--from-revision",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Replay changes from this revision first (0: only changes from now on).",
)
@click.option(
    "--count",
    type=click.IntRange(min=0),
    default=0,
    help="Stop after this many events (0: run until Ctrl-C).",
)
@_state_option
@_timeout_option
def watch(prefix: str, from_revision: int, count: int, state_url: StateUrl, timeout: float) -> None:
    """Print every change under PREFIX as a JSON line until Ctrl-C.

    Each line has the batch revision, the event type (put/delete), the key, the value
    (or value_base64), and the key's revisions, version and lease. A watch that asks for
    compacted history, or loses the store, ends with an error message and status 1.
    """

    async def follow(store: StateStore) -> None:
        seen = 0
        async with aclosing(store.watch(prefix, start_revision=from_revision)) as batches:
            async for batch in batches:
                for event in batch.events:
                    click.echo(_event_json(batch.revision, event))
                    seen += 1
                    if count and seen >= count:
                        return

    try:
        _run(state_url, timeout, follow)
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
