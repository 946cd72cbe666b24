"""``gtm chaos``: the fault proxy now, the game-day runner later.

``gtm chaos proxy`` serves the Toxiproxy 2.x API. Like Toxiproxy it has no
authentication, so it binds loopback unless ``--allow-remote`` says otherwise.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import signal
import sys
from pathlib import Path

import click

from chaos.proxy.server import FaultProxyServer
from chaos.proxy.service import TOXIPROXY_VERSION, FaultProxyService
from gtm.cli import EXIT_NOT_AVAILABLE
from gtm.errors import ConfigError
from gtm.metrics import new_registry

log = logging.getLogger(__name__)

#: Toxiproxy's default API port (``cmd/server/server.go``).
DEFAULT_PORT = 8474


def is_loopback(host: str) -> bool:
    """Only loopback hosts are safe for an API without authentication."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.group(name="chaos")
def chaos() -> None:
    """Fault proxy (Toxiproxy API) and game-day runner."""


@chaos.command(name="proxy")
@click.option("--host", default="127.0.0.1", show_default=True, help="API listen host.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="API port (0 picks a free one).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON array of proxies to create at start-up (the body of POST /populate).",
)
@click.option("--seed", type=int, help="Seed for toxicity, jitter and slicing draws.")
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow a non-loopback --host. The API has NO authentication: anyone who can "
    "reach it can redirect and break traffic.",
)
def proxy_command(
    host: str, port: int, config_file: Path | None, seed: int | None, allow_remote: bool
) -> None:
    """Serve the Toxiproxy 2.x API (proxies, toxics, /populate, /reset, /version)."""
    if not is_loopback(host):
        if not allow_remote:
            raise click.UsageError(
                f"--host {host} is not a loopback address. The fault proxy API has no "
                "authentication; pass --allow-remote to expose it anyway."
            )
        click.echo(
            f"WARNING: the fault proxy API on {host} has no authentication; anyone who "
            "can reach it can redirect and break traffic.",
            err=True,
        )
    config = config_file.read_bytes() if config_file is not None else None
    try:
        asyncio.run(_serve(host, port, config, seed))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


async def _serve(host: str, port: int, config: bytes | None, seed: int | None) -> None:
    registry = new_registry()
    service = FaultProxyService(registry=registry, rng=random.Random(seed))
    server = FaultProxyServer(service, registry)
    await server.start(host, port)
    try:
        if config is not None:
            result = await service.populate(config)
            if result.error is not None:
                raise ConfigError(f"--config: {result.error.message}")
            click.echo(f"populated {len(result.proxies or ())} proxies from --config", err=True)
        click.echo(
            f"gtm chaos proxy (Toxiproxy API {TOXIPROXY_VERSION}) listening on {server.url}",
            err=True,
        )
        await _until_signalled()
    finally:
        await server.close()


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


@chaos.command(
    name="run",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_command(args: tuple[str, ...]) -> None:
    """Run a game-day scenario (not available yet)."""
    click.echo(
        "gtm chaos run: not available yet — the scenario runner is being built as part "
        "of the chaos work; `gtm chaos proxy` is available.",
        err=True,
    )
    sys.exit(EXIT_NOT_AVAILABLE)


__all__ = ["chaos", "is_loopback"]
