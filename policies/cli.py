"""``policy`` and ``audit`` commands. ``gtm`` mounts them (``gtm policy …``,
``gtm audit …``); ``python -m policies`` runs them without the rest of gtm.

``gtm policy apply`` and ``export`` need the state store, so they live in
:mod:`gtm.policy_cli`; so does the GeoIP lookup of ``gtm policy explain --client-ip``
(the front door's database), which this package reaches through :data:`LOCATE_KEY` in
the click context's ``meta`` rather than by importing gtm. Without it (``python -m
policies``) only private and loopback addresses are accepted.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from policies.apikeys import ScryptCost, generate_key, hash_key, key_id
from policies.audit import (
    Chain,
    Head,
    StoredAnchor,
    VerifyReport,
    find_chains,
    match_anchors,
    orphan_anchors,
    verify,
    verify_chain,
)
from policies.documents import Kind, json_schema
from policies.errors import ApiKeyError, AuditError, PolicyValidationError
from policies.loader import DEFAULT_MAX_BYTES, LoadOptions, examples_path, load_paths
from policies.policyset import PolicySet
from policies.residency import ResidencyEngine, ResidencyQuery, Verdict, compile
from policies.rules import CompiledRule, describe_specificity

EXIT_INVALID = 1
EXIT_USAGE = 2
#: ``policy explain``: no region may serve the request (as ``gtm route``).
EXIT_REFUSED = 1

#: ``ctx.meta`` key of a client-address locator: ``(address, geoip_db) -> (country or
#: None, what said so)``; raises click.BadParameter when it cannot look addresses up.
LOCATE_KEY = "policies.locate"
Locate = Callable[
    [ipaddress.IPv4Address | ipaddress.IPv6Address, Path | None], tuple[str | None, str]
]
#: ``ctx.meta`` key of the audit anchors' reader: ``(state URL) -> anchors``; raises a
#: click exception when the store cannot be read. ``gtm audit`` provides it
#: (:mod:`gtm.audit_cli`); ``python -m policies`` cannot read a store.
ANCHORS_KEY = "policies.anchors"
ReadAnchors = Callable[[str], Sequence[StoredAnchor]]

_paths_argument = click.argument(
    "paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path)
)
_max_bytes_option = click.option(
    "--max-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_BYTES,
    show_default=True,
    help="Refuse policy files larger than this.",
)


def load_or_exit(
    paths: tuple[Path, ...], max_bytes: int = DEFAULT_MAX_BYTES, *, status: int = EXIT_INVALID
) -> PolicySet:
    """Load policies, or print every problem (``file:line: path: message``) and exit
    ``status`` (1: the files are what is checked; 2: they are an input of the command)."""
    try:
        return load_paths(paths, LoadOptions(max_bytes=max_bytes))
    except PolicyValidationError as exc:
        for problem in exc.problems:
            click.echo(str(problem))
        click.echo(f"{len(exc.problems)} problem(s); nothing was loaded", err=True)
        sys.exit(status)


@click.group(name="policy")
def policy() -> None:
    """Check, explain and print the schema of policy files; hash API keys."""


@policy.command()
@_paths_argument
@_max_bytes_option
def check(paths: tuple[Path, ...], max_bytes: int) -> None:
    """Validate policy files and directories (exit 0 if valid, 1 if not).

    Errors are printed one per line as FILE:LINE: FIELD.PATH: MESSAGE.
    """
    policy_set = load_or_exit(paths, max_bytes)
    click.echo(
        f"OK: {len(policy_set.documents)} documents, {len(policy_set.regions)} regions, "
        f"{len(policy_set.rules)} rules, {len(policy_set.tenants)} tenants, "
        f"{len(policy_set.profiles)} routing profiles (digest {policy_set.digest[:16]})"
    )


@policy.command()
@click.argument("kind", required=False, type=click.Choice([k.value for k in Kind]))
def schema(kind: str | None) -> None:
    """Print the JSON Schema of one KIND of document, or of any policy document."""
    click.echo(json.dumps(json_schema(Kind(kind) if kind else None), indent=2))


@policy.command()
@click.option("--tenant", required=True, help="Tenant id.")
@click.option("--model", required=True, help="Model name as the client sends it.")
@click.option("--data-class", default="default", show_default=True)
@click.option("--country", help="Client country (ISO 3166-1 alpha-2).")
@click.option(
    "--client-ip",
    help="Client address, located as the front door does: private and loopback addresses "
    "mean 'location unknown', public ones are looked up in the GeoIP database.",
)
@click.option(
    "--geoip-db",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="MaxMind City/Country .mmdb for --client-ip (default: the front door's default, "
    "the bundled GeoLite2-City).",
)
@click.option(
    "--policies",
    "policy_paths",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Policy files or directories (default: the shipped examples).",
)
def explain(
    tenant: str,
    model: str,
    data_class: str,
    country: str | None,
    client_ip: str | None,
    geoip_db: Path | None,
    policy_paths: tuple[Path, ...],
) -> None:
    """Show which regions may serve a request and which rules decided, offline.

    Exit status: 0 ALLOWED (some region may serve it), 1 REFUSED (none may), 2 bad
    options or invalid policy files (their problems are printed).
    """
    country, located = _client_country(country, client_ip, geoip_db)
    paths = policy_paths or (examples_path(),)
    engine = compile(load_or_exit(paths, status=EXIT_USAGE))
    query = ResidencyQuery(
        tenant=tenant, model=model, data_class=data_class, client_country=country
    )
    verdict = engine.allowed_regions(query)
    if located:
        click.echo(f"client: {client_ip} → {country or 'unknown'} ({located})")
    for line in explain_lines(engine, query, verdict):
        click.echo(line)
    sys.exit(EXIT_REFUSED if verdict.refused else 0)


def _client_country(
    country: str | None, client_ip: str | None, geoip_db: Path | None
) -> tuple[str | None, str]:
    """The client's country and what said so ("" when --country or nothing gave it)."""
    if country and client_ip:
        raise click.UsageError("give --country or --client-ip, not both")
    if country is not None:
        if len(country) != 2 or not country.isalpha():
            raise click.BadParameter(
                f"{country!r} is not a two-letter country code", param_hint="--country"
            )
        return country.upper(), ""
    if client_ip is None:
        if geoip_db is not None:
            raise click.UsageError("--geoip-db locates --client-ip; give one")
        return None, ""
    try:
        address = ipaddress.ip_address(client_ip)
    except ValueError:
        raise click.BadParameter(
            f"{client_ip!r} is not an IP address", param_hint="--client-ip"
        ) from None
    locate: Locate | None = click.get_current_context().meta.get(LOCATE_KEY)
    if locate is not None:
        return locate(address, geoip_db)
    if not (address.is_private or address.is_loopback or address.is_link_local):
        raise click.BadParameter(
            f"{client_ip} is a public address and `python -m policies` has no GeoIP "
            "database; use `gtm policy explain`, or pass --country",
            param_hint="--client-ip",
        )
    return None, "a private address: location unknown"


def _rule_line(rule: CompiledRule, note: str = "") -> str:
    effect = rule.effect.value
    regions = ", ".join(sorted(rule.regions)) or "no region"
    spec = describe_specificity(rule.specificity)
    return f"  {effect:5} {rule.name} [{spec}] → {{{regions}}}  ({rule.source}:{rule.line}){note}"


def explain_lines(engine: ResidencyEngine, query: ResidencyQuery, verdict: Verdict) -> list[str]:
    """Human-readable explanation of one verdict."""
    policy_set = engine.policy_set
    client = query.client_country or "unknown"
    lines = [
        f"query: tenant={query.tenant} model={query.model} data_class={query.data_class} "
        f"client_country={client}",
        f"policy digest: {policy_set.digest[:16]}",
    ]
    if verdict.assumed_jurisdiction:
        lines.append(f"client location unknown: assumed {verdict.assumed_jurisdiction!r}")
    status = "REFUSED" if verdict.refused else "ALLOWED"
    regions = ", ".join(sorted(verdict.allowed)) or "none"
    lines.append(f"verdict: {status} ({verdict.reason.value}) regions: {regions}")
    lines.append(f"on saturation: {verdict.on_saturation.value}")
    matching = engine.matching_rules(query)
    if matching:
        lines.append("matching rules (most specific first):")
        for rule in matching:
            if rule.name == verdict.rule:
                note = "  ← decides the allowed set"
            elif rule.name in verdict.denied_by:
                note = "  ← removes regions (deny wins)"
            elif rule.effect.value == "allow":
                note = "  (less specific: not used)"
            else:
                note = "  (none of its regions were left to remove)"
            lines.append(_rule_line(rule, note))
    elif not verdict.refused or verdict.rule is None:
        lines.append("matching rules: none")
    tenant = policy_set.tenants.get(query.tenant)
    models = tenant.allowed_models if tenant is not None else None
    if models is not None and query.model not in models:
        lines.append(f"note: tenant {query.tenant!r} may not use model {query.model!r}")
    return lines


@policy.command("hash-key")
@click.option(
    "--stdin",
    "from_stdin",
    is_flag=True,
    help="Hash the key read from standard input instead of generating a new one.",
)
@click.option(
    "--scrypt-n",
    type=int,
    default=ScryptCost().n,
    show_default=True,
    help="scrypt cost (a power of two; memory ≈ 128·n·8 bytes).",
)
def hash_key_command(from_stdin: bool, scrypt_n: int) -> None:
    """Print a tenants-file entry (key id + salted scrypt hash) for an API key.

    Without --stdin a new random key is generated and printed once, on standard error;
    standard output gets only the YAML entry, ready to paste under `api_keys:`.
    """
    try:
        cost = ScryptCost(n=scrypt_n)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--scrypt-n") from None
    if from_stdin:
        key = sys.stdin.readline().strip()
    else:
        key = generate_key()
        click.echo(f"# new API key (shown once, store only the hash): {key}", err=True)
    try:
        ident = key_id(key)
    except ApiKeyError as exc:
        raise click.BadParameter(str(exc), param_hint="key") from None
    click.echo(f"- id: {ident}\n  hash: {hash_key(key, cost)}")


# ---------------------------------------------------------------------------- audit


@click.group(name="audit")
def audit() -> None:
    """Inspect the hash-chained residency audit log."""


@audit.command("verify")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--head",
    "head_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Head file the chain must reach (default: the .head file of a directory given).",
)
@click.option("--expect-head", help="SEQ:HASH the chain must reach (from a trusted copy).")
@click.option(
    "--state",
    envvar="GTM_STATE",
    help="State store holding the chains' anchors (etcd://HOST:PORT[,…]; read from "
    "GTM_STATE when not given): each chain must reach the head its writer last anchored "
    "there. Without it a cut tail whose .head was deleted too cannot be seen.",
)
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Do not require the first file to start the chain (older files were deleted).",
)
@click.option("--check-records", is_flag=True, help="Also validate every record's fields.")
@click.pass_context
def audit_verify(
    ctx: click.Context,
    paths: tuple[Path, ...],
    head_file: Path | None,
    expect_head: str | None,
    state: str | None,
    allow_partial: bool,
    check_records: bool,
) -> None:
    """Verify audit FILES (in chain order) or directories; exit 1 on any tampering.

    Detects edited, deleted, inserted and reordered records, and truncation, and
    prints where: FILE:LINE: MESSAGE.

    A directory is searched, subdirectories included, for chains — one per writer, in a
    directory of its own: `gtm up`'s run directory holds audit/global,
    audit/regional-REGION and admin-audit — and each chain is verified on its own against
    its .head file, one line per chain saying which. FILES given are one chain, in order.

    With --state, each chain is also checked against the anchor its writer keeps in the
    state store: a chain that ends below it lost its tail ("tail may be missing", exit
    1), even if its .head file was deleted or cut with it; records after the anchor are
    counted as not yet anchored (a warning); an anchor of a directory given whose chain
    is gone fails too.
    """
    try:
        head = Head.read(head_file) if head_file else _parse_head(expect_head)
    except AuditError as exc:
        raise click.BadParameter(str(exc), param_hint="--head") from None
    anchors = _read_anchors(ctx, state)
    if not all(path.is_dir() for path in paths):
        chain = _files_chain(paths)
        anchor = match_anchors([chain], anchors or ()).get(chain) if chain else None
        report = verify(
            paths,
            head=head,
            anchor=anchor,
            from_genesis=not allow_partial,
            check_records=check_records,
        )
        status = _print_report(report, "")
        _warn_unanchored(report, "", anchors is not None)
        sys.exit(status)
    chains = [chain for path in paths for chain in find_chains(path)]
    orphans = orphan_anchors(paths, chains, anchors or ())
    if not chains and not orphans:
        click.echo(f"FAILED: no audit chain in {', '.join(map(str, paths))}", err=True)
        sys.exit(EXIT_INVALID)
    if len(chains) > 1 and head is not None:
        raise click.UsageError(
            f"--head and --expect-head name one chain's head, and {len(chains)} chains were "
            "found: give that chain's directory"
        )
    matched = match_anchors(chains, anchors or ())
    # The chain of the one directory given needs no name; chains found below it do.
    walked = len(chains) + len(orphans) > 1 or chains[0].directory != paths[0]
    failed = 0
    for chain in chains:
        named = f"{chain.directory} ({chain.prefix} chain): " if walked else ""
        try:
            report = (
                verify(
                    chain.files,
                    head=head,
                    anchor=matched.get(chain),
                    from_genesis=not allow_partial,
                    check_records=check_records,
                )
                if head is not None
                else verify_chain(
                    chain,
                    anchor=matched.get(chain),
                    from_genesis=not allow_partial,
                    check_records=check_records,
                )
            )
        except AuditError as exc:
            raise click.BadParameter(str(exc), param_hint="PATHS") from None
        failed += _print_report(report, named) != 0
        _warn_unanchored(report, named, anchors is not None)
    for orphan in orphans:
        gone = orphan.anchor
        click.echo(
            f"{gone.directory}: {orphan.describe()} records {gone.seq} records of the "
            f"{gone.prefix} chain (in {gone.file}), and no chain files are there (deleted?)"
        )
        click.echo(f"FAILED: {gone.directory} ({gone.prefix} chain): chain missing", err=True)
        failed += 1
    if walked:
        total = len(chains) + len(orphans)
        click.echo(f"verified {total} chain(s): {total - failed} OK, {failed} FAILED")
    sys.exit(EXIT_INVALID if failed else 0)


def _read_anchors(ctx: click.Context, state: str | None) -> Sequence[StoredAnchor] | None:
    """The anchors in ``state``; None (and a warning) without a store."""
    if state is None:
        click.echo(
            "warning: no state store given (--state or GTM_STATE): a tail cut together with "
            "its .head file cannot be seen; verifying the files alone",
            err=True,
        )
        return None
    read: ReadAnchors | None = ctx.meta.get(ANCHORS_KEY)
    if read is None:
        raise click.UsageError(
            "`python -m policies` cannot read a state store; use `gtm audit verify --state`"
        )
    return read(state)


def _files_chain(paths: tuple[Path, ...]) -> Chain | None:
    """The chain FILES given belong to, when they are one directory's one prefix."""
    chains = {Chain(path.parent, path.name.rsplit("-", 1)[0]) for path in paths if "-" in path.name}
    return next(iter(chains)) if len(chains) == 1 else None


def _warn_unanchored(report: VerifyReport, named: str, with_store: bool) -> None:
    if not report.ok:
        return
    if report.anchor is None:
        if with_store:
            click.echo(
                f"warning: {named}no anchor in the state store for this chain: its tail "
                "cannot be checked",
                err=True,
            )
        return
    if report.unanchored:
        click.echo(
            f"warning: {named}{report.unanchored} record(s) after seq "
            f"{report.anchor.anchor.seq} not yet anchored (written after "
            f"{report.anchor.describe()}): a cut among them would not show",
            err=True,
        )


def _print_report(report: VerifyReport, named: str) -> int:
    """Print a chain's problems and its verdict line; its exit status."""
    for problem in report.problems:
        click.echo(str(problem))
    if not report.ok:
        click.echo(
            f"FAILED: {named}{len(report.problems)} problem(s) in {report.records} records",
            err=True,
        )
        return EXIT_INVALID
    end = f"; head seq {report.head.seq} hash {report.head.hash}" if report.head else ""
    if report.anchor is not None:
        end += f"; OK up to {report.anchor.describe()}: seq {report.anchor.anchor.seq}"
    click.echo(f"OK: {named}{report.records} records in {report.files} file(s){end}")
    return 0


def _parse_head(text: str | None) -> Head | None:
    if text is None:
        return None
    seq, sep, digest = text.partition(":")
    if not sep or not seq.isdigit() or len(digest) != 64:
        raise click.BadParameter("expected SEQ:HASH (64 hex digits)", param_hint="--expect-head")
    return Head(int(seq), digest.lower())


@click.group(name="policies")
def main() -> None:
    """Compliance policy tools (also available as `gtm policy` and `gtm audit`)."""


main.add_command(policy)
main.add_command(audit)
