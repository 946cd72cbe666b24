"""``gtm admin token create|list|revoke``: manage the bearer tokens of the admin APIs.

The token file holds salted SHA-256 hashes only (see :mod:`gtm.admin_auth`); ``create``
prints the new token once, on stdout, and nowhere else. Servers re-read the file when it
changes, so a created or revoked token takes effect without a restart.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from gtm.admin_auth import TOKEN_FILE_NAME, AdminAuthError, Role, TokenFile, default_admin_dir

_FILE = click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Token file (default: $GTM_ADMIN_DIR/{TOKEN_FILE_NAME}, i.e. "
    f"~/.config/gtm/admin/{TOKEN_FILE_NAME}; the file `gtm up` uses).",
)


def _file(path: Path | None) -> TokenFile:
    return TokenFile(path if path is not None else default_admin_dir() / TOKEN_FILE_NAME)


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
    """Create a token; prints it once (only its salted hash is stored)."""
    tokens = _file(token_file)
    try:
        secret, record = tokens.create(Role(role), now=time.time())
    except AdminAuthError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(secret)
    click.echo(
        f"created {record.role.value} token {record.id} in {tokens.path}; it is shown only "
        "now: send it as 'Authorization: Bearer <token>'",
        err=True,
    )


@token.command("list")
@_FILE
def list_tokens(token_file: Path | None) -> None:
    """List token ids and roles (never the tokens)."""
    tokens = _file(token_file)
    try:
        records = tokens.records()
    except AdminAuthError as exc:
        raise click.ClickException(str(exc)) from None
    if not records:
        click.echo(f"no tokens in {tokens.path}", err=True)
    for record in records.values():
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        click.echo(f"{record.id}\t{record.role.value}\t{created}")


@token.command("revoke")
@click.argument("token_id", metavar="ID")
@_FILE
def revoke(token_id: str, token_file: Path | None) -> None:
    """Revoke a token by its id (servers stop accepting it at their next request)."""
    tokens = _file(token_file)
    try:
        removed = tokens.revoke(token_id)
    except AdminAuthError as exc:
        raise click.ClickException(str(exc)) from None
    if not removed:
        raise click.ClickException(f"no token with id {token_id!r} in {tokens.path}")
    click.echo(f"revoked {token_id}")
