"""``gtm audit``: the policies package's audit commands, with the state store's anchors.

``gtm audit verify --state URL`` checks each chain against the head its writer last
anchored in the store (:mod:`gtm.audit_anchor`). Reading the store needs gtm, which may
import policies — not the reverse — so the reader is handed to the policies command
through the click context (:data:`policies.cli.ANCHORS_KEY`), as ``gtm policy`` hands
over its GeoIP locator; ``python -m policies audit`` stays store-free.
"""

from __future__ import annotations

import asyncio

import click

from gtm.audit_anchor import read_anchors
from gtm.cli_types import shared_store
from gtm.clock import SystemClock
from gtm.errors import StateError
from gtm.metrics import new_registry
from gtm.state.url import StateUrl, open_store
from policies import cli as policies_cli
from policies.audit import StoredAnchor

#: The most ``verify`` waits for the store, seconds.
READ_TIMEOUT_S = 10.0


def anchors_from(state: str) -> list[StoredAnchor]:
    """Every audit anchor in the store ``state`` names; a click error if it cannot."""
    url = shared_store(
        state,
        instead=" and holds no anchors afterwards; give the etcd the tiers wrote to "
        "(etcd://HOST:PORT)",
    )
    try:
        return asyncio.run(_read(url))
    except (StateError, TimeoutError, OSError) as exc:
        raise click.ClickException(
            f"cannot read the audit anchors from {state}: {exc or type(exc).__name__}"
        ) from None


async def _read(url: StateUrl) -> list[StoredAnchor]:
    store = open_store(url, clock=SystemClock(), registry=new_registry())
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            return await read_anchors(store)
    finally:
        await store.aclose()


@click.pass_context
def _with_anchors(ctx: click.Context) -> None:
    ctx.meta[policies_cli.ANCHORS_KEY] = anchors_from


audit = click.Group(
    name="audit",
    help="Verify the hash-chained audit logs (against their anchors in the state store).",
    commands=dict(policies_cli.audit.commands),
    callback=_with_anchors,
)
