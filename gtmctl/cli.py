"""The ``gtm`` command: the one composition root that wires the tiers together.

Installed as the ``gtm`` console script; ``python -m gtmctl`` runs the same command (how
``gtm up --processes`` starts its children with the interpreter it runs on). It is the top
of the import layers (pyproject.toml): nothing imports it.

Subcommands are loaded lazily (``gtm --help`` must not import aiohttp, aetcd and every
tier), each from the package that owns it. Subcommands of the public interface
(ARCHITECTURE §9) that are not built yet are still registered and say so, with a
non-zero exit status, instead of being missing.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import IO, Any

import click

from gtm import heaptrim
from gtm._version import __version__
from gtm.errors import ConfigError
from gtm.logs import LogFormat, configure

#: Exit status of a subcommand that is part of the interface but not built yet.
EXIT_NOT_AVAILABLE = 3
#: Exit status of a malformed command line or option value (click's own).
EXIT_USAGE = 2


@dataclass(frozen=True, slots=True)
class _Entry:
    help: str
    target: str | None  # "module:attribute" of a click command, or None if not built yet
    issue: str = ""  # which piece of work will build it


_COMMANDS: dict[str, _Entry] = {
    "up": _Entry("Start a whole local multi-region deployment.", "gtmctl.up.cli:up"),
    "load": _Entry("Replay a real inference trace through a deployment.", "gtmctl.up.cli:load"),
    "global": _Entry("Run the global tier (GeoDNS + HTTP front door).", "global_lb.cli:global_cmd"),
    "anycast": _Entry("Announce anycast prefixes over BGP.", "global_lb.anycast.cli:anycast"),
    "regional": _Entry("Run one region's regional LB.", "regional_lb.cli:regional"),
    "zone": _Entry("Run one zone's zone agent.", "zone_agent.cli:zone"),
    "gpu-sim": _Entry("Run an emulated vLLM-compatible GPU worker.", "gpusim.cli:gpu_sim"),
    "policy": _Entry(
        "Check, apply, explain policy files; print their schema.", "gtm.policy_cli:policy"
    ),
    "route": _Entry("Ask for a routing decision and print its trace.", "global_lb.cli:route"),
    "drain": _Entry("Drain a region, zone or GPU.", "gtm.drain_cli:drain"),
    "undrain": _Entry("Undo a drain.", "gtm.drain_cli:undrain"),
    "audit": _Entry("Verify the hash-chained audit log.", "gtm.audit_cli:audit"),
    "admin": _Entry("Admin API tokens (create, list, revoke).", "gtm.admin_cli:admin"),
    "chaos": _Entry("Fault proxy (Toxiproxy API) and game-day runner.", "chaos.cli:chaos"),
    "sim": _Entry("Run the discrete-event fleet simulator.", "fleetsim.cli:sim"),
    "bench": _Entry("Side-by-side routing benchmarks.", "fleetsim.cli:bench"),
    "state": _Entry("Inspect the state store (etcd or embedded).", "gtm.state.cli:state", ""),
}


def _not_available(name: str, entry: _Entry) -> click.Command:
    @click.command(
        name=name,
        help=f"{entry.help} (not available yet)",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )
    def command() -> None:
        click.echo(
            f"gtm {name}: not available yet in gtm {__version__} — it is being built "
            f"as part of the {entry.issue} work. See CHANGELOG.md for what is available.",
            err=True,
        )
        sys.exit(EXIT_NOT_AVAILABLE)

    return command


class _OneLineUsageError(click.UsageError):
    """A usage error shown as one line: ``gtm CMD: MESSAGE (see 'gtm CMD --help')``.

    click's own presentation (a usage line, a hint, a blank line, the error) puts the
    reason on the fourth line; scripts and log collectors keep the first.
    """

    def __init__(self, message: str, ctx: click.Context | None, *, path: str = "") -> None:
        super().__init__(" ".join(message.split()), ctx)
        self.path = path or (ctx.command_path if ctx is not None else "gtm")

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(
            f"{self.path}: {self.format_message()} (see '{self.path} --help')",
            file=file,
            err=True,
        )


class _LazyGroup(click.Group):
    """The ``gtm`` group: subcommands imported on first use; every usage error, and any
    :class:`~gtm.errors.ConfigError` a subcommand lets escape, is one line with exit
    status 2 (:data:`EXIT_USAGE`), never a traceback."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _OneLineUsageError(exc.format_message(), exc.ctx) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _OneLineUsageError:
            raise
        except click.UsageError as exc:
            raise _OneLineUsageError(exc.format_message(), exc.ctx) from None
        except ConfigError as exc:
            # A bad value the subcommand did not check while parsing: still the user's
            # input, so still one line and status 2.
            path = " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))
            raise _OneLineUsageError(str(exc), None, path=path) from None
        except ModuleNotFoundError as exc:
            # An optional dependency (gtm.extras): one line naming the extra, status 2.
            from gtm.extras import missing_extra

            path = " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))
            missing = missing_extra(exc)
            if missing is None:
                raise
            click.echo(f"{path}: {missing}", err=True)
            sys.exit(EXIT_USAGE)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _COMMANDS.get(cmd_name)
        if entry is None:
            return None
        if entry.target is None:
            return _not_available(cmd_name, entry)
        module_name, _, attribute = entry.target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{entry.target} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table, so --help imports nothing heavy.
        rows = [
            (name, e.help + ("" if e.target else " (not available yet)"))
            for name, e in sorted(_COMMANDS.items())
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=lambda ctx, _param, value: _print_version(ctx) if value else None,
    help="Show the version and whether the routing kernels are compiled, and exit.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    envvar="GTM_LOG_LEVEL",
    help="Logging verbosity (structured key=value lines on stderr).",
)
@click.option(
    "--log-format",
    type=click.Choice([f.value for f in LogFormat]),
    default=LogFormat.TEXT.value,
    show_default=True,
    envvar="GTM_LOG_FORMAT",
    help="Log lines on stderr as text (key=value) or JSON (one object per line); "
    "gtm up passes it to every process it starts.",
)
def cli(log_level: str, log_format: str) -> None:
    """gtm — a multi-region global traffic manager for AI-inference GPU fleets.

    Routes each inference request to a region, a zone and a GPU by predicted
    time-to-first-token, inside the regions its data-residency policy allows.
    """
    configure(log_level, LogFormat(log_format))
    heaptrim.start()  # free heap pages back to the system every minute (gtm.heaptrim)
    if os.environ.get("GTM_TRACEMALLOC_DIR"):  # diagnosis only (gtm.memdebug)
        from gtm.memdebug import install_from_env

        install_from_env()


def _print_version(ctx: click.Context) -> None:
    from gtm import native

    click.echo(f"gtm, version {__version__}")
    click.echo(f"  python {native.interpreter()}")
    for kernel in native.kernels():
        click.echo(f"  kernel {kernel.describe()}")
    ctx.exit()


def main() -> None:
    cli(prog_name="gtm")


if __name__ == "__main__":
    main()
