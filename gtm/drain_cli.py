"""``gtm drain`` / ``gtm undrain``: put or remove an operator's drain of a region, zone
or GPU in the state store.

A drain is a :class:`gtm.models.Drain` record at ``keys.drain(target, id)``; every tier
follows it through its fleet snapshot: the global tier stops choosing a drained region,
a regional LB a drained zone (and spills a drained region's traffic), a zone agent a
drained GPU. In-flight requests finish. The record stays until ``gtm undrain``.

Drains are meant for a shared store (``--state etcd://HOST:PORT`` or ``GTM_STATE``): the
embedded ``memory`` store lives inside one process, so a drain written there by this
command would vanish with it. For a ``gtm up`` on its embedded store, ``--api URL`` drains
through its drain API instead, sending the operator token ``gtm up`` created
(:mod:`gtm.admin_auth`).
"""

from __future__ import annotations

import asyncio
import getpass
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import click

from gtm.admin_auth import LOCAL_TOKEN_NAME, default_admin_dir, read_token
from gtm.clock import SystemClock
from gtm.errors import ConfigError, GtmError
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget
from gtm.state import codec, keys
from gtm.state.url import ACCEPTED_FORMS, StateUrl, StoreKind, open_store, parse_state_url

T = TypeVar("T")


def _parse_state(ctx: click.Context, param: click.Parameter, value: str) -> StateUrl:
    try:
        url = parse_state_url(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc
    return url


def _require_shared(url: StateUrl) -> None:
    if url.kind is StoreKind.MEMORY:
        raise click.BadParameter(
            "drains must go to a shared store (etcd://HOST:PORT, or set GTM_STATE): the "
            "embedded memory store ends with this command. For a `gtm up` on its embedded "
            "store, use its drain API: --api http://127.0.0.1:8080 (it sends the operator "
            "token gtm up created)",
            param_hint="--state",
        )


_TARGET = click.argument("target", type=click.Choice([t.value for t in DrainTarget]))
_ID = click.argument("target_id", metavar="ID")
_STATE = click.option(
    "--state",
    "state_url",
    metavar="URL",
    callback=_parse_state,
    envvar="GTM_STATE",
    default="memory",
    help=f"State store: {ACCEPTED_FORMS}. Read from GTM_STATE when not given.",
)
_API = click.option(
    "--api",
    metavar="URL",
    envvar="GTM_DRAIN_API",
    default=None,
    help="Drain through this `gtm up`'s drain API (e.g. http://127.0.0.1:8080) instead of "
    "writing to --state. Read from GTM_DRAIN_API when not given.",
)
_TOKEN = click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Admin token sent to --api (default: the {LOCAL_TOKEN_NAME} that `gtm up` "
    "created in $GTM_ADMIN_DIR, i.e. ~/.config/gtm/admin).",
)
_TIMEOUT = click.option(
    "--timeout",
    type=click.FloatRange(min=0.05),
    default=2.0,
    show_default=True,
    help="Seconds to wait for the store (or the --api).",
)


def _key(target: str, target_id: str) -> str:
    try:
        return keys.drain(DrainTarget(target), target_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ID") from None


@click.command("drain", context_settings={"help_option_names": ["-h", "--help"]})
@_TARGET
@_ID
@_STATE
@_API
@_TOKEN
@_TIMEOUT
@click.option(
    "--reason", default="", help="Why (kept in the record, shown to operators; --state only)."
)
@click.option(
    "--by",
    "by",
    default=None,
    help="Who drains (default: the login name; --state only: the drain API records the "
    "token's id).",
)
def drain(
    target: str,
    target_id: str,
    state_url: StateUrl,
    api: str | None,
    token_file: Path | None,
    timeout: float,
    reason: str,
    by: str | None,
) -> None:
    """Drain a region, zone or GPU: it takes no new requests until undrained."""
    key = _key(target, target_id)
    if api is not None:
        answer = _run(lambda: _call_api("POST", api, target, target_id, token_file, timeout))
        click.echo(f"drained {target} {target_id} (revision {answer.get('revision')})")
        return
    _require_shared(state_url)
    try:
        record = Drain(
            target=DrainTarget(target),
            id=target_id,
            reason=reason,
            by=by if by is not None else getpass.getuser(),
            at=SystemClock().wall(),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None

    async def work() -> int:
        store = open_store(state_url, clock=SystemClock(), registry=new_registry(), timeout=timeout)
        try:
            return await store.put(key, codec.encode(record))
        finally:
            await store.aclose()

    revision = _run(work)
    click.echo(f"drained {target} {target_id} (revision {revision})")


@click.command("undrain", context_settings={"help_option_names": ["-h", "--help"]})
@_TARGET
@_ID
@_STATE
@_API
@_TOKEN
@_TIMEOUT
def undrain(
    target: str,
    target_id: str,
    state_url: StateUrl,
    api: str | None,
    token_file: Path | None,
    timeout: float,
) -> None:
    """Undo a drain of a region, zone or GPU."""
    key = _key(target, target_id)
    if api is not None:
        answer = _run(lambda: _call_api("DELETE", api, target, target_id, token_file, timeout))
        existed = answer.get("existed") is True
        click.echo(
            f"undrained {target} {target_id}"
            if existed
            else f"{target} {target_id} was not drained"
        )
        return
    _require_shared(state_url)

    async def work() -> bool:
        store = open_store(state_url, clock=SystemClock(), registry=new_registry(), timeout=timeout)
        try:
            return await store.delete(key)
        finally:
            await store.aclose()

    if _run(work):
        click.echo(f"undrained {target} {target_id}")
    else:
        click.echo(f"{target} {target_id} was not drained")


async def _call_api(
    method: str, api: str, target: str, target_id: str, token_file: Path | None, limit_s: float
) -> dict[str, object]:
    """One call to a `gtm up` drain API; any refusal becomes a clean exit with its reason."""
    token = read_token(token_file or default_admin_dir() / LOCAL_TOKEN_NAME)
    url = f"{api.rstrip('/')}/api/v1/drains/{target}/{target_id}"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit_s)) as session,
            session.request(method, url, headers=headers) as response,
        ):
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise click.ClickException(
            f"cannot reach the drain API at {api}: {exc or 'timeout'}"
        ) from None
    if not isinstance(body, dict):
        raise click.ClickException(f"{url}: HTTP {response.status} without a JSON body")
    if response.status != 200:
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        raise click.ClickException(f"{url}: HTTP {response.status}: {message}")
    return body


def _run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``work``; store errors become a clean exit with the reason."""
    try:
        return asyncio.run(work())
    except GtmError as exc:
        raise click.ClickException(str(exc)) from exc
