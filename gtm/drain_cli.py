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
(:mod:`gtm.admin_auth`). With ``gtm up --processes`` that API is on the status listener
(the front door's port + 1), and the store is an etcd ``--state`` reaches too; pointed at
the front door instead, ``gtm drain`` finds the deployment and says which to use.

``gtm drain`` refuses an id the store does not know (:mod:`gtm.drains`), naming the known
ones; ``--force`` drains it anyway. Exit status: 0 done, 1 the store or the API failed,
2 a bad target, id or option.
"""

from __future__ import annotations

import asyncio
import getpass
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import click

from gtm.admin_auth import LOCAL_TOKEN_NAME, default_admin_dir, read_token
from gtm.cli_types import HttpURL, StateURL, existing_file
from gtm.clock import SystemClock
from gtm.drains import known_ids, unknown_message
from gtm.errors import GtmError
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget
from gtm.state import codec, keys
from gtm.state.url import ACCEPTED_FORMS, StateUrl, StoreKind, open_store, parse_state_url

T = TypeVar("T")


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
    "state_text",
    type=StateURL(),
    envvar="GTM_STATE",
    default="memory",
    help=f"State store: {ACCEPTED_FORMS}. Read from GTM_STATE when not given.",
)
_API = click.option(
    "--api",
    type=HttpURL(),
    envvar="GTM_DRAIN_API",
    default=None,
    help="Drain through this `gtm up`'s drain API instead of writing to --state: its front "
    "door (e.g. http://127.0.0.1:8080), or with --processes its status listener (the "
    "front door's port + 1). Read from GTM_DRAIN_API when not given.",
)
_TOKEN = click.option(
    "--token-file",
    type=existing_file(as_path=True),
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
@click.option(
    "--force",
    is_flag=True,
    help="Drain an id the store does not know (yet); without it an unknown id is an error "
    "naming the known ones.",
)
def drain(
    target: str,
    target_id: str,
    state_text: str,
    api: str | None,
    token_file: Path | None,
    timeout: float,
    reason: str,
    by: str | None,
    force: bool,
) -> None:
    """Drain a region, zone or GPU: it takes no new requests until undrained.

    Exit status: 0 drained, 1 the store or the drain API failed, 2 an unknown target or
    id, or a bad option.
    """
    key = _key(target, target_id)
    if api is not None:
        answer = _run(
            lambda: _call_api("POST", api, target, target_id, token_file, timeout, force=force)
        )
        click.echo(f"drained {target} {target_id} (revision {answer.get('revision')})")
        return
    state_url = parse_state_url(state_text)
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

    async def work() -> int | str:
        store = open_store(state_url, clock=SystemClock(), registry=new_registry(), timeout=timeout)
        try:
            if not force:
                known = await known_ids(store, record.target)
                if target_id not in known:
                    return unknown_message(record.target, target_id, known)
            return await store.put(key, codec.encode(record))
        finally:
            await store.aclose()

    revision = _run(work)
    if isinstance(revision, str):
        raise click.BadParameter(revision, param_hint="ID")
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
    state_text: str,
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
    state_url = parse_state_url(state_text)
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
    method: str,
    api: str,
    target: str,
    target_id: str,
    token_file: Path | None,
    limit_s: float,
    *,
    force: bool = False,
) -> dict[str, object]:
    """One call to a `gtm up` drain API; any refusal becomes a clean exit with its reason."""
    token = read_token(token_file or default_admin_dir() / LOCAL_TOKEN_NAME)
    base = api.removesuffix("/status")  # the status page's address, as gtm up prints it
    url = f"{base}/api/v1/drains/{target}/{target_id}"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit_s)) as session:
            status, body = await _request(
                session, method, url, headers, {"force": "1"} if force else {}
            )
            if not isinstance(body, dict) or (status in (404, 405) and "known" not in body):
                # Not the drain API (the front door of `gtm up --processes`, say).
                what = "without a JSON body" if not isinstance(body, dict) else "not found"
                hint = await _where_to_drain(session, base, headers)
                raise click.ClickException(
                    f"{api} is not a drain API (HTTP {status} {what}); {hint}"
                )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise click.ClickException(
            f"cannot reach the drain API at {api}: {str(exc) or f'no answer in {limit_s:g} s'}"
        ) from None
    if status != 200:
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if status == 404 and "known" in body:
            raise click.BadParameter(str(message), param_hint="ID")
        raise click.ClickException(f"{url}: HTTP {status}: {message}")
    return body


async def _request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    headers: dict[str, str],
    params: dict[str, str],
) -> tuple[int, object]:
    async with session.request(method, url, headers=headers, params=params) as response:
        try:
            return response.status, await response.json(content_type=None)
        except ValueError:
            return response.status, None


async def _where_to_drain(
    session: aiohttp.ClientSession, base: str, headers: dict[str, str]
) -> str:
    """What to do instead, in one clause: ``gtm up --processes`` serves its drain API on the
    status listener (the front door's port + 1), whose deployment document names the
    store; ask it, so the message can name the ``--state`` and ``--api`` to use."""
    parts = urlsplit(base)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    status_base = f"{parts.scheme}://{_netloc(parts.hostname or '', port + 1)}"
    try:
        _, document = await _request(
            session, "GET", f"{status_base}/api/v1/deployment", headers, {}
        )
    except (aiohttp.ClientError, TimeoutError):
        document = None
    if isinstance(document, dict) and isinstance(document.get("state"), str):
        state = document["state"]
        return (
            f"it is the front door of a `gtm up --processes`: drain with --state {state} "
            f"(or --api {status_base}, its status listener)"
        )
    return (
        "give --api the status page address `gtm up` printed (with --processes: the front "
        "door's port + 1), or --state the etcd it printed as its state"
    )


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``work``; store errors become a clean exit with the reason."""
    try:
        return asyncio.run(work())
    except GtmError as exc:
        raise click.ClickException(str(exc)) from exc
