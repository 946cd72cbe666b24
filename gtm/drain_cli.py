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
ones; ``--force`` drains it anyway. ``gtm undrain`` of an id that is neither drained nor
known is refused the same way, naming what is drained. Both name what they changed, the
store revision, what was there before and the command that undoes it (``drained region
eu-west at store revision 57 (was: serving); undo: gtm undrain region eu-west --state
…``); the write is a compare-and-swap on what was read, so "was" is what was replaced.
Exit status: 0 done, 1 the store or the API failed, 2 a bad target, id or option.
"""

from __future__ import annotations

import asyncio
import getpass
import shlex
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import click

from gtm.admin_auth import LOCAL_TOKEN_NAME, default_admin_dir, read_token
from gtm.cli_types import HttpURL, StateURL, existing_file
from gtm.clock import SystemClock
from gtm.drains import PLURAL, known_ids, unknown_message
from gtm.errors import CodecError, GtmError
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget
from gtm.state import codec, keys
from gtm.state.store import KeyValue, StateStore
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
        was = _was(_record_in(answer))
        click.echo(
            f"drained {target} {target_id} at store revision {answer.get('revision')} "
            f"(was: {was}); undo: {_undo_drain(target, target_id, _record_in(answer), api=api)}"
        )
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

    async def work() -> tuple[int, Drain | None] | str:
        store = open_store(state_url, clock=SystemClock(), registry=new_registry(), timeout=timeout)
        try:
            previous = await store.get(key)
            if previous is None and not force:
                known = await known_ids(store, record.target)
                if target_id not in known:
                    return unknown_message(record.target, target_id, known)
            done = await store.compare_and_swap(
                key,
                codec.encode(record),
                expected_mod_revision=previous.mod_revision if previous else 0,
            )
            if not done.succeeded:
                raise click.ClickException(_CHANGED.format(what=f"{target} {target_id}"))
            return done.revision, _decoded(key, previous)
        finally:
            await store.aclose()

    outcome = _run(work)
    if isinstance(outcome, str):
        raise click.BadParameter(outcome, param_hint="ID")
    revision, previous = outcome
    click.echo(
        f"drained {target} {target_id} at store revision {revision} (was: {_was(previous)}); "
        f"undo: {_undo_drain(target, target_id, previous, state=str(state_url))}"
    )


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
    """Undo a drain of a region, zone or GPU.

    Prints the drain it ended and the command that puts it back. An id that is neither
    drained nor known to the store is refused (exit 2), naming what is drained.
    """
    key = _key(target, target_id)
    if api is not None:
        answer = _run(lambda: _call_api("DELETE", api, target, target_id, token_file, timeout))
        if answer.get("existed") is not True:
            click.echo(f"{target} {target_id} was not drained; nothing changed")
            return
        previous = _record_in(answer)
        redo = _redo(target, target_id, previous, ["--api", api])
        click.echo(f"undrained {target} {target_id} (was: {_was(previous)}); undo: {redo}")
        return
    state_url = parse_state_url(state_text)
    _require_shared(state_url)
    drain_target = DrainTarget(target)

    async def work() -> tuple[int, Drain | None] | str | None:
        store = open_store(state_url, clock=SystemClock(), registry=new_registry(), timeout=timeout)
        try:
            previous = await store.get(key)
            if previous is None:
                known = await known_ids(store, drain_target)
                if target_id in known:
                    return None
                return unknown_message(
                    drain_target, target_id, known, hint=await _drained_hint(store, drain_target)
                )
            done = await store.compare_and_delete(key, expected_mod_revision=previous.mod_revision)
            if not done.succeeded:
                raise click.ClickException(_CHANGED.format(what=f"{target} {target_id}"))
            return done.revision, _decoded(key, previous)
        finally:
            await store.aclose()

    outcome = _run(work)
    if outcome is None:
        click.echo(f"{target} {target_id} was not drained; nothing changed")
        return
    if isinstance(outcome, str):
        raise click.BadParameter(outcome, param_hint="ID")
    revision, previous = outcome
    redo = _redo(target, target_id, previous, ["--state", str(state_url)])
    click.echo(
        f"undrained {target} {target_id} at store revision {revision} "
        f"(was: {_was(previous)}); undo: {redo}"
    )


# ---------------------------------------------------------------------------- what changed

_CHANGED = "the drain of {what} changed while this command ran; nothing was written — run it again"


def _decoded(key: str, kv: KeyValue | None) -> Drain | None:
    if kv is None:
        return None
    try:
        return codec.decode(key, kv.value, Drain)
    except CodecError:
        return None  # unreadable: it is replaced or deleted all the same


def _record_in(answer: dict[str, object]) -> Drain | None:
    """The drain record a drain API answer says was in force before (``was``)."""
    was = answer.get("was")
    if not isinstance(was, dict):
        return None
    try:
        return Drain.model_validate(was)
    except ValueError:
        return None


def _was(previous: Drain | None) -> str:
    """What the target was before: ``serving``, or the drain that was in force."""
    if previous is None:
        return "serving"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(previous.at))
    who = f" by {previous.by}" if previous.by else ""
    why = f": {previous.reason}" if previous.reason else ""
    return f"drained{who} since {when}{why}"


def _undo_drain(
    target: str, target_id: str, previous: Drain | None, *, state: str = "", api: str = ""
) -> str:
    """The command that undoes a drain: an undrain, or the drain that was there before."""
    where = ["--api", api] if api else ["--state", state]
    if previous is None:
        return shlex.join(["gtm", "undrain", target, target_id, *where])
    return _redo(target, target_id, previous, where)


def _redo(target: str, target_id: str, previous: Drain | None, where: list[str]) -> str:
    """The command that writes ``previous`` again (who and why, where known)."""
    command = ["gtm", "drain", target, target_id, *where, "--force"]
    if previous is not None and previous.reason:
        command += ["--reason", previous.reason]
    if previous is not None and previous.by and "--state" in where:
        command += ["--by", previous.by]
    return shlex.join(command)


async def _drained_hint(store: StateStore, target: DrainTarget) -> str:
    """Which ids of ``target`` kind are drained, for an undrain of an unknown one."""
    listing = await store.range(keys.prefix(keys.Kind.DRAIN, target.value))
    drained = sorted(kv.key.rsplit("/", 1)[-1] for kv in listing.kvs)
    plural = PLURAL[target]
    return f"drained {plural}: {', '.join(drained)}" if drained else f"no {plural} are drained"


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
