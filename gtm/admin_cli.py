"""``gtm admin token create|list|revoke``: manage the bearer tokens of the admin APIs.

The token file holds salted SHA-256 hashes only (see :mod:`gtm.admin_auth`); ``create``
prints the new token once, on stdout, and nowhere else. Servers re-read the file when it
changes, so a created or revoked token takes effect without a restart.

Each command names the file it read or changed and the token it changed, and ``create``
prints the ``revoke`` that undoes it; ``list`` and ``revoke`` refuse a token file that
does not exist (a typo is not "no tokens"), and ``revoke`` an id the file does not hold.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from pathlib import Path

import click

from gtm.admin_auth import (
    TOKEN_FILE_NAME,
    AdminAuthError,
    Role,
    TokenFile,
    TokenRecord,
    default_admin_dir,
)

_FILE = click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Token file (default: $GTM_ADMIN_DIR/{TOKEN_FILE_NAME}, i.e. "
    f"~/.config/gtm/admin/{TOKEN_FILE_NAME}; the file `gtm up` uses).",
)


def _file(path: Path | None) -> TokenFile:
    return TokenFile(path if path is not None else default_admin_dir() / TOKEN_FILE_NAME)


def _existing(path: Path | None) -> TokenFile:
    """The token file, which must exist: a typo in ``--token-file`` must not read as
    "no tokens" (or as a token that is not there)."""
    tokens = _file(path)
    if not tokens.path.is_file():
        raise click.BadParameter(
            f"{tokens.path}: no such token file (`gtm admin token create` makes one)",
            param_hint="--token-file",
        )
    return tokens


def _records(tokens: TokenFile) -> Mapping[str, TokenRecord]:
    try:
        return tokens.records()
    except AdminAuthError as exc:
        raise click.ClickException(str(exc)) from None


def _when(record: TokenRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))


@click.group("admin", context_settings={"help_option_names": ["-h", "--help"]})
def admin() -> None:
    """Admin API tokens (drain API, emulator fault API, fault proxy API)."""


@admin.group("token")
def token() -> None:
    """Create, list and revoke admin bearer tokens."""


@token.command("create")
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    required=True,
    help="read-only: GET the admin APIs; operator: also drain, inject faults, etc.",
)
@_FILE
def create(role: str, token_file: Path | None) -> None:
    """Create a token; prints it once (only its salted hash is stored).

    Standard output gets the token alone; standard error says which file holds its hash
    and the command that revokes it.
    """
    tokens = _file(token_file)
    new_file = not tokens.path.exists()
    try:
        secret, record = tokens.create(Role(role), now=time.time())
    except AdminAuthError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(secret)
    where = f"{tokens.path} (a new file)" if new_file else str(tokens.path)
    undo = shlex.join(
        ["gtm", "admin", "token", "revoke", record.id, "--token-file", str(tokens.path)]
    )
    click.echo(
        f"created {record.role.value} token {record.id} in {where}; it is shown only now: "
        f"send it as 'Authorization: Bearer <token>'; undo: {undo}",
        err=True,
    )


@token.command("list")
@_FILE
def list_tokens(token_file: Path | None) -> None:
    """List token ids and roles (never the tokens). A missing file is an error (exit 2)."""
    tokens = _existing(token_file)
    records = _records(tokens)
    if not records:
        click.echo(f"no tokens in {tokens.path}", err=True)
    for record in records.values():
        click.echo(f"{record.id}\t{record.role.value}\t{_when(record)}")


@token.command("revoke")
@click.argument("token_id", metavar="ID")
@_FILE
def revoke(token_id: str, token_file: Path | None) -> None:
    """Revoke a token by its id (servers stop accepting it at their next request).

    An id the file does not hold is refused (exit 2), naming the ids it holds. A revoked
    token cannot come back — only its hash was stored, and a token is revoked because it
    must stop working; the output names the command that creates a replacement.
    """
    tokens = _existing(token_file)
    record = _records(tokens).get(token_id)
    if record is None:
        held = ", ".join(_records(tokens)) or "none"
        raise click.BadParameter(
            f"no token with id {token_id!r} in {tokens.path} (its ids: {held})", param_hint="ID"
        )
    try:
        tokens.revoke(token_id)
    except AdminAuthError as exc:
        raise click.ClickException(str(exc)) from None
    replace = shlex.join(
        ["gtm", "admin", "token", "create", "--role", record.role.value, "--token-file",
         str(tokens.path)]
    )  # fmt: skip
    click.echo(
        f"revoked {record.role.value} token {token_id} (created {_when(record)}) from "
        f"{tokens.path}; a revoked token cannot be restored — to give the access back, "
        f"create a new one: {replace}"
    )
