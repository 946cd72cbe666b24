"""``gtm up --tls``: a local CA, one certificate per tier instance, mTLS everywhere inside.

On first run a CA and a certificate for every identity of the deployment —
``global/gtm-up``, ``region/<id>``, ``zone/<id>``, ``gpu/<id>`` and ``ops/gtm-up`` (gtm
up's own status scraper) — are written to ``--tls-dir`` (default
``$XDG_STATE_HOME/gtm/tls``, i.e. ``~/.local/state/gtm/tls``: kept across runs so that a
client that trusts the CA keeps working); later runs reuse them and issue only what is
missing or near expiry (:func:`gtm.pki.ensure_local_pki`).

Every listener between tiers then serves TLS only and demands a client certificate with
the identity its tier expects (:data:`gtm.tls.DEFAULT_CLIENTS`); every connection between
tiers verifies the server's identity (:data:`gtm.tls.DEFAULT_PEERS`). The front door
stays plain HTTP on loopback: its clients are end users (curl, the OpenAI SDK, ``gtm
load``) and in production it sits behind the operator's own TLS terminator (``gtm global
--front-door-tls`` serves it over TLS when wanted).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gtm.clock import Clock
from gtm.metrics import new_registry
from gtm.tls import DEFAULT_CLIENTS, DEFAULT_PEERS, TlsConfig, TlsMaterial
from gtm.topology import Deployment
from gtmctl.up.config import UpConfig
from gtmctl.up.fleet import Plan

if TYPE_CHECKING:  # the PKI (cryptography) is imported only when --tls makes one
    from gtm.pki import LocalPki

GLOBAL_IDENTITY = "global/gtm-up"
OPS_IDENTITY = "ops/gtm-up"


def default_tls_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/gtm/tls`` (XDG Base Directory spec: state that should persist
    between restarts), falling back to ``~/.local/state/gtm/tls``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gtm" / "tls"


def identities(deployment: Deployment) -> list[str]:
    """Every identity a deployment's processes present."""
    return [
        GLOBAL_IDENTITY,
        OPS_IDENTITY,
        *(f"region/{r.id}" for r in deployment.regions),
        *(f"zone/{z.id}" for z in deployment.zones),
        *(f"gpu/{g.id}" for g in deployment.gpus),
    ]


def https(url: str) -> str:
    """``http://…`` → ``https://…`` (other URLs unchanged)."""
    return "https://" + url.removeprefix("http://") if url.startswith("http://") else url


@dataclass(frozen=True, slots=True)
class LocalTls:
    """The deployment's certificates and, per process, its TLS configuration."""

    pki: LocalPki

    @classmethod
    def prepare(cls, deployment: Deployment, directory: Path | None = None) -> LocalTls:
        # Regional LBs and zone agents also name their addresses, so that curl (which
        # checks host names, not gtm identities) can reach them with an ops certificate.
        hosts = {f"region/{r.id}": (r.host,) for r in deployment.regions} | {
            f"zone/{z.id}": (z.host,) for z in deployment.zones
        }
        from gtm.pki import ensure_local_pki

        pki = ensure_local_pki(directory or default_tls_dir(), identities(deployment), hosts)
        return cls(pki)

    @property
    def ca(self) -> Path:
        return self.pki.ca_cert

    @property
    def directory(self) -> Path:
        return self.pki.directory

    def config(self, identity: str, tier: str) -> TlsConfig:
        """``identity``'s files, with ``tier``'s expected peers and clients."""
        files = self.pki.files(identity)
        return TlsConfig(self.ca, files.cert, files.key, DEFAULT_PEERS[tier], DEFAULT_CLIENTS[tier])

    def material(
        self, identity: str, tier: str, *, clock: Clock, registry: CollectorRegistry
    ) -> TlsMaterial:
        return TlsMaterial(self.config(identity, tier), clock=clock, registry=registry)

    def argv(self, identity: str) -> list[str]:
        """``--tls-ca/--tls-cert/--tls-key`` for a child process (``gtm up --processes``)."""
        files = self.pki.files(identity)
        return [
            "--tls-ca",
            str(self.ca),
            "--tls-cert",
            str(files.cert),
            "--tls-key",
            str(files.key),
        ]

    @staticmethod
    def urls(deployment: Deployment) -> dict[str, str]:
        """Region and zone id → the https URL the tier above dials (for ``seed_store``)."""
        found = {r.id: https(r.url) for r in deployment.regions}
        return found | {z.id: https(z.url) for z in deployment.zones}


def moved_urls(
    deployment: Deployment, tls: LocalTls | None, links: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """``seed_store``'s ``urls``: fault-proxy links (if any) over the https URLs (if TLS)."""
    merged: dict[str, str] = dict(LocalTls.urls(deployment)) if tls is not None else {}
    for key, url in (links or {}).items():
        merged[key] = https(url) if tls is not None else url
    return merged or None


def ops_context(plan: Plan, *, clock: Clock) -> ssl.SSLContext | None:
    """A client context with gtm up's ``ops`` identity (its status page scrapes the
    regional LBs' /metrics with it); None without ``--tls``."""
    directory = tls_directory(plan.config)
    if directory is None:
        return None
    tls = LocalTls.prepare(plan.deployment, directory)  # issued already: only reads
    material = tls.material(OPS_IDENTITY, "global", clock=clock, registry=new_registry())
    return material.client_context()


def tls_directory(config: UpConfig) -> Path | None:
    """Where ``gtm up`` keeps its certificates (None without ``--tls``)."""
    if not config.tls:
        return None
    return Path(config.tls_dir) if config.tls_dir else default_tls_dir()


def describe(config: UpConfig) -> tuple[str, ...]:
    """Banner lines: where the CA and certificates are (none without ``--tls``)."""
    directory = tls_directory(config)
    if directory is None:
        return ()
    return (
        f"  {'mTLS between tiers':<22}CA {directory / 'ca.pem'}",
        f"  {'':<22}certificates in {directory} (reused on the next run)",
    )
