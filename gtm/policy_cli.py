"""``gtm policy``: the policies package's commands plus ``apply`` and ``export``, which
need the state store (and so live in gtm, which may import policies — not the reverse),
and the GeoIP lookup of ``explain --client-ip``: the front door's locator (:mod:`gtm.geo`)
with its default database, handed to the policies command through the click context.

The group is built from the policies group's commands without modifying it, so
``python -m policies policy`` stays store-free.

``apply`` cannot surprise an operator:

* it writes and replaces only the documents it is given (by kind and name); a stored
  document it was not given is kept — deleting one takes ``--prune``, and the documents
  it deletes are listed before anything is written (an apply of a directory without the
  load-test tenant used to delete that tenant, silently);
* ``--dry-run`` prints every document's fate and each changed field, and writes nothing;
* before writing, it saves the generation it replaces, whole, in a directory of its own
  (``--backup``, :mod:`gtm.policy_backup`: a production operator expects the previous
  state kept where the command says, as ``terraform`` keeps its state backup, and the
  store keeps no history that outlives compaction); its output names every document it
  added, replaced and deleted, the generation and store revision it committed, that
  directory, and the one command that puts the previous generation back (``apply
  --prune`` of the directory, expecting the generation just committed, so it cannot
  undo someone else's later change).

It stays one commit: the documents of the next generation are cross-checked whole and
committed by compare-and-swap (:mod:`gtm.policy_store`), or nothing is.
"""

from __future__ import annotations

import asyncio
import getpass
import ipaddress
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from gtm.cli_types import shared_store
from gtm.clock import SystemClock
from gtm.errors import ConfigError, StateError
from gtm.geo import ChainLocator, LocationSource, MaxMindLocator, bundled_database
from gtm.metrics import new_registry
from gtm.policy_backup import BackupError, backup_home, save_previous, write_documents
from gtm.policy_plan import ApplyPlan, Change
from gtm.policy_store import (
    ApplyResult,
    CommittedDocument,
    StalePolicyRevision,
    apply,
    committed_documents,
    plan_apply,
)
from gtm.state.url import StateUrl, open_store
from policies import cli as policies_cli
from policies.errors import PolicyConflictError, PolicyValidationError
from policies.loader import (
    DEFAULT_MAX_BYTES,
    LoadOptions,
    builtin_jurisdictions_path,
    load_documents,
    load_file,
)
from policies.policyset import LoadedDocument

_STORE_FORM = "etcd://HOST:PORT[,HOST:PORT…]"


@click.command("apply")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--state", required=True, help=f"Store to apply to: {_STORE_FORM}.")
@click.option(
    "--expected-revision",
    type=click.IntRange(min=0),
    help="Fail unless the store is at this policy generation (0: nothing applied yet).",
)
@click.option(
    "--prune",
    is_flag=True,
    help="Make the files the whole policy: delete every stored document they do not hold "
    "(listed before anything is written). Without it, those documents are kept.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what would be added, changed, kept and deleted (with each changed field) "
    "and write nothing.",
)
@click.option(
    "--backup",
    "backup_root",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="GTM_POLICY_BACKUP_DIR",
    default=None,
    help="Where the generation being replaced is saved before anything is written, one "
    "directory per apply (default: $GTM_POLICY_BACKUP_DIR, else "
    "$XDG_STATE_HOME/gtm/policy-backups, i.e. ~/.local/state/gtm/policy-backups).",
)
@click.option(
    "--max-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_BYTES,
    show_default=True,
    help="Refuse policy files larger than this.",
)
def apply_command(
    paths: tuple[Path, ...],
    state: str,
    expected_revision: int | None,
    prune: bool,
    dry_run: bool,
    backup_root: Path | None,
    max_bytes: int,
) -> None:
    """Validate policy documents and commit them to the state store as a new generation.

    Each document given is added, or replaces the stored one of the same kind and name;
    stored documents not given are kept (--prune deletes them). The next generation is
    checked whole, kept documents included, and nothing is written unless it is valid.
    The output names every document added, replaced and deleted, where the generation it
    replaced was saved, and the command that puts it back. Tiers watching the store
    switch to the new generation; one they cannot load leaves the old one in force.

    Exit status: 0 applied (or unchanged, or a dry run), 1 invalid documents or a store
    failure (someone applied in between, say), 2 a bad option.
    """
    url = _shared_store(state)
    given = _load_given(paths, max_bytes)
    options = _ApplyOptions(expected_revision, prune, dry_run, backup_root or backup_home())
    try:
        asyncio.run(_apply(url, given, options))
    except (PolicyValidationError, PolicyConflictError) as exc:
        for problem in exc.problems:
            click.echo(str(problem))
        kept = "" if prune else " (the documents given, with the stored ones they keep)"
        click.echo(
            f"{len(exc.problems)} problem(s) in the next generation{kept}; nothing was written",
            err=True,
        )
        sys.exit(policies_cli.EXIT_INVALID)
    except (StateError, BackupError) as exc:
        click.echo(f"gtm policy apply: {exc}", err=True)
        sys.exit(policies_cli.EXIT_INVALID)


@click.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--state", required=True, help=f"Store to read from: {_STORE_FORM}.")
def export_command(directory: Path, state: str) -> None:
    """Write the committed policy documents to DIRECTORY, one JSON file per document.

    `gtm policy apply --prune DIRECTORY` makes them the policy again. DIRECTORY must not
    exist or be empty.
    """
    url = _shared_store(state)

    async def read() -> tuple[int, tuple[CommittedDocument, ...]]:
        store = open_store(url, clock=SystemClock(), registry=new_registry())
        try:
            return await committed_documents(store)
        finally:
            await store.aclose()

    try:
        generation, documents = asyncio.run(read())
        if not documents:
            raise BackupError(f"{url} holds no committed policy")
        written = write_documents(directory, documents, generation=generation, state=str(url))
    except (StateError, BackupError) as exc:
        click.echo(f"gtm policy export: {exc}", err=True)
        sys.exit(policies_cli.EXIT_INVALID)
    click.echo(f"exported generation {generation} to {directory} ({written} document(s))")


def _shared_store(state: str) -> StateUrl:
    return shared_store(
        state, instead="; give it the files with `gtm up --policies DIR`, or apply to etcd://…"
    )


def _load_given(paths: tuple[Path, ...], max_bytes: int) -> tuple[LoadedDocument, ...]:
    """The documents of ``paths``, each valid on its own, and the built-in
    jurisdictions unless the files hold a document of that kind and name (a backup or
    an export does)."""
    options = LoadOptions(max_bytes=max_bytes, include_defaults=False)
    try:
        given = load_documents(paths, options)
    except PolicyValidationError as exc:
        for problem in exc.problems:
            click.echo(str(problem))
        click.echo(f"{len(exc.problems)} problem(s); nothing was loaded", err=True)
        sys.exit(policies_cli.EXIT_INVALID)
    refs = {(d.kind, d.name) for d in given}
    builtin = [d for d in load_file(builtin_jurisdictions_path()) if (d.kind, d.name) not in refs]
    return (*builtin, *given)


@dataclass(frozen=True, slots=True)
class _ApplyOptions:
    expected: int | None
    prune: bool
    dry_run: bool
    backup_root: Path


async def _apply(url: StateUrl, given: tuple[LoadedDocument, ...], options: _ApplyOptions) -> None:
    clock = SystemClock()
    store = open_store(url, clock=clock, registry=new_registry())
    try:
        plan = await plan_apply(store, given, prune=options.prune)
        if options.expected is not None and options.expected != plan.base_generation:
            raise StalePolicyRevision(options.expected, plan.base_generation)
        if options.dry_run:
            _echo_dry_run(url, plan)
            return
        if not plan.writes:
            click.echo(
                f"unchanged: generation {plan.base_generation} already has these policies "
                f"({plan.counts()})"
            )
            return
        deleting = plan.of(Change.DELETED)
        if deleting:
            click.echo(f"--prune: deleting {len(deleting)} document(s) not given:")
            for change in deleting:
                click.echo(f"  will delete  {change.ref}")
        backup = await save_previous(store, str(url), plan, options.backup_root)
        result = await apply(
            store, plan.policy_set, plan.base_generation, clock=clock, applied_by=_who()
        )
    finally:
        await store.aclose()
    if not result.changed:  # only leftovers differed: nothing to commit
        click.echo(f"unchanged: generation {result.generation} already has these policies")
        return
    _echo_applied(url, plan, result, backup)


def _echo_dry_run(url: StateUrl, plan: ApplyPlan) -> None:
    base = f"generation {plan.base_generation} (store revision {plan.base_revision})"
    verdict = (
        f"applying would commit generation {plan.base_generation + 1}"
        if plan.writes
        else "applying would change nothing"
    )
    click.echo(f"dry run: policies in {url} at {base}; {verdict}")
    labels = {
        Change.ADDED: "would add",
        Change.CHANGED: "would change",
        Change.UNCHANGED: "unchanged",
        Change.KEPT: "kept",
        Change.DELETED: "would delete",
        Change.DISCARDED: "would discard",
    }
    for change in plan.changes:
        click.echo(f"  {labels[change.change]:<13} {change.ref}{_note(change.change)}")
        for line in change.fields():
            click.echo(f"      {line}")
    click.echo(f"dry run: nothing written ({plan.counts()})")


def _note(change: Change) -> str:
    if change is Change.KEPT:
        return " (not given; --prune would delete it)"
    if change is Change.DISCARDED:
        return " (written by an apply that did not commit; never in force)"
    return ""


def _echo_applied(url: StateUrl, plan: ApplyPlan, result: ApplyResult, backup: Path | None) -> None:
    click.echo(
        f"applied generation {result.generation} (digest {plan.policy_set.digest[:16]}, "
        f"store revision {result.revision}; was generation {plan.base_generation}): "
        f"{plan.counts()}"
    )
    labels = {
        Change.ADDED: "added",
        Change.CHANGED: "replaced",
        Change.DELETED: "deleted",
        Change.KEPT: "kept",
        Change.DISCARDED: "discarded",
    }
    for change in plan.changes:
        if change.change in labels:
            click.echo(f"  {labels[change.change]:<9} {change.ref}{_note(change.change)}")
    if backup is None:
        click.echo(
            "undo: there was no policy before generation 1; apply the policy you want with --prune"
        )
        return
    click.echo(f"generation {plan.base_generation} was saved in {backup}")
    undo = ["gtm", "policy", "apply", "--prune", "--expected-revision", str(result.generation)]
    click.echo(f"undo: {shlex.join([*undo, '--state', str(url), str(backup)])}")


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def locate(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, geoip_db: Path | None
) -> tuple[str | None, str]:
    """Where the front door would place ``address``: its special-purpose networks, then
    ``geoip_db`` or, by default, the database it uses by default (bundled GeoLite2-City)."""
    try:
        database = MaxMindLocator(geoip_db if geoip_db is not None else bundled_database())
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--geoip-db") from None
    try:
        location = ChainLocator(database).locate(address)
    finally:
        database.close()
    source = str(geoip_db) if geoip_db is not None else "the bundled GeoLite2-City database"
    if location.source is LocationSource.CIDR_MAP:
        return None, "a private or special-purpose address: location unknown"
    if location.country is None:
        return None, f"not in {source}: location unknown"
    return location.country, f"{source}, network {location.network}"


@click.pass_context
def _with_locator(ctx: click.Context) -> None:
    ctx.meta[policies_cli.LOCATE_KEY] = locate


policy = click.Group(
    name="policy",
    help="Check, apply, export, explain policy files; print their schema; hash API keys.",
    commands={**policies_cli.policy.commands, "apply": apply_command, "export": export_command},
    callback=_with_locator,
)
